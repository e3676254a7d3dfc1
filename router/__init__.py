"""The front door: routes each lookup to the freshest live replica within the caller's bound."""
