"""Partitions, not only kills: the stack in network namespaces, links cut between its components under load."""
