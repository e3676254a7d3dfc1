"""The routing core, shared by the router and the client: bounds, snapshot, selection, attempts, store transport."""
