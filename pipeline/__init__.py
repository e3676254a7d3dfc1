"""The streaming pipeline: input topics → user-defined tables → compacted changelog topics."""
