"""Who hosts what: the assignment the assignor lease holder computes from the tables and the nodes' reports, as pure
functions of them (store_node/assignor.py runs them and publishes what they return).

- assign.py   assign (the whole assignment, step by step) and repair (only what dead nodes' partitions need at once)
- lags.py     what the nodes report about each replica, judged: how caught up it is, whether it is warm
- picker.py   which node takes a new replica, or one moved off a node above its quota
- balance.py  evening out actives: hand-overs to warm standbys, and trades where none can
"""
