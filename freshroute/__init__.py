"""freshroute: what the pipeline, store nodes and router share."""
