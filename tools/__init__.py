"""What operators and developers run: the ``freshroute`` command, the embedded local stack, the settings reference.

Tools may import the roles (``pipeline``, ``store_node``, ``router``); the library (``freshroute``) and the roles
never import tools, so the client installs and the roles run without them.
"""
