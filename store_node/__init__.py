"""Store nodes: tail changelog partitions into local RocksDB, report lag, serve bounded reads."""
