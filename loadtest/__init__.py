"""Load tests, benchmarks and measurements that drive freshroute from outside."""
