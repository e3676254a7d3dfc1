#!/bin/sh
# Spark's Python workers: the interpreter Spark launches for the streaming source and for tasks.
#
# Spark puts its bundled pyspark.zip first on PYTHONPATH. Modules imported from a zip are
# compiled from source at every start (no cached bytecode), which triples a worker's start-up
# CPU; on a busy machine that pushes the streaming source's runner past Spark's fixed 10 s
# connect-back timeout. The same pyspark is installed in the environment, so drop the zip.
PYTHONPATH=$(printf '%s' "${PYTHONPATH:-}" | tr ':' '\n' | grep -v '/pyspark\.zip$' | paste -sd: -)
export PYTHONPATH
exec "${FRESHROUTE_WORKER_PYTHON:?set by the pipeline to its interpreter}" "$@"
