"""The metadata store: the soft state in Redis the roles share — what is served, who is alive and how far behind,
who hosts what, and how far the pipeline is — and the records that cross role boundaries through it. Import from
the module that holds a name; this file re-exports nothing.

- roles.py       a replica's role in the assignment and its state as its node reports it
- tables.py      TableSpec: a table as the pipeline declares it
- reports.py     the heartbeat records: a node's report with each replica's lag, and the positions between reports
- assignment.py  the assignment (who hosts each partition, the active first) and one node's placement in it
- rounds.py      a membership round: what a node sends and learns in one round trip
- progress.py    the pipeline's progress: input lag, input ends, marks, rejected records
- schema.py      Keys: the Redis key of every record, under one namespace
- store.py       MetadataStore: the synchronous client that reads and writes them
"""
