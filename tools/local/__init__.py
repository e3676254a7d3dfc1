"""The embedded local stack: broker, Redis and freshroute's own processes on loopback."""
