"""The metadata schema in Redis: every key the roles write and read, under one namespace so that several stacks
(or tests) can share a Redis server.

The schema is made for clusters of a thousand nodes: what every node writes often is small, and what readers poll
is a version or a change log, never the whole cluster.

Keys (``ns`` is the namespace, ``freshroute`` by default):

- ``{ns}:tables``              hash  table name → TableSpec JSON (written by the pipeline)
- ``{ns}:tables:version``      str   changes with every write of the table specs or of a table's versions
- ``{ns}:table-versions``      hash  table name → VersionedTable JSON: which version is served, what became of
                                     the others (freshroute.metadata.version_store)
- ``{ns}:table-versions:building`` str the physical name of the one version being built, while one is
- ``{ns}:input``               hash  table name → InputLag JSON: where the pipeline is in the table's input, and
                                     the rate its lag has been falling at (written by the pipeline after every
                                     micro-batch it sees)
- ``{ns}:input:ends``          hash  input topic → InputEnds JSON: where it ends, and where it starts
                                     (written by the assignor lease holder)
- ``{ns}:input:marks``         hash  table name → its latest InputMarks, oldest first (written by the pipeline)
- ``{ns}:input:rejected``      hash  input topic → the latest records the pipeline rejected, with their reason
- ``{ns}:beats``               hash  node id → its latest heartbeat time (ms, the node's clock)
- ``{ns}:node:{id}``           str   NodeReport JSON, rewritten only when its shape changed (address,
                                     replicas, roles, states, warmth); every beat renews its TTL
- ``{ns}:reports``             zset  node id → sequence number of its latest report (what changed since)
- ``{ns}:positions:{id}``      str   NodePositions, packed: the report's replicas' positions as they move
                                     between reports (under writes, at every beat)
- ``{ns}:positions``           zset  node id → sequence number of its latest positions
- ``{ns}:reports:seq``         int   the sequence of both logs; starts at the server's clock in µs,
                                     so it only grows, even across a Redis that lost its state
- ``{ns}:assignment``          str   Assignment JSON (written only by the assignor lease holder)
- ``{ns}:assignment:version``  str   changes with every assignment written
- ``{ns}:placements``          hash  node id → Placement JSON, that node's part of the assignment
- ``{ns}:assignor``            str   "{node_id}:{generation}", the assignor lease (SET NX PX)
- ``{ns}:assignor:generation`` int   fencing generation, INCR'd by each new lease holder
- ``{ns}:rate:{principal}``    hash  a principal's read-rate bucket, shared by the routers (router/rate_limit.py)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    """Redis key names under one namespace."""

    ns: str = "freshroute"

    @property
    def tables(self) -> str:
        return f"{self.ns}:tables"

    @property
    def tables_version(self) -> str:
        return f"{self.ns}:tables:version"

    @property
    def table_versions(self) -> str:
        return f"{self.ns}:table-versions"

    @property
    def table_versions_building(self) -> str:
        return f"{self.ns}:table-versions:building"

    @property
    def table_deploys(self) -> str:
        return f"{self.ns}:table-versions:deploys"

    @property
    def table_deploy_answers(self) -> str:
        return f"{self.ns}:table-versions:deploy-answers"

    @property
    def input_lag(self) -> str:
        return f"{self.ns}:input"

    @property
    def input_ends(self) -> str:
        return f"{self.ns}:input:ends"

    @property
    def input_marks(self) -> str:
        return f"{self.ns}:input:marks"

    @property
    def input_rejected(self) -> str:
        return f"{self.ns}:input:rejected"

    @property
    def beats(self) -> str:
        return f"{self.ns}:beats"

    def node(self, node_id: str) -> str:
        return f"{self.ns}:node:{node_id}"

    def node_positions(self, node_id: str) -> str:
        return f"{self.ns}:positions:{node_id}"

    @property
    def positions(self) -> str:
        return f"{self.ns}:positions"

    @property
    def reports(self) -> str:
        return f"{self.ns}:reports"

    @property
    def reports_seq(self) -> str:
        return f"{self.ns}:reports:seq"

    @property
    def assignment(self) -> str:
        return f"{self.ns}:assignment"

    @property
    def assignment_version(self) -> str:
        return f"{self.ns}:assignment:version"

    @property
    def placements(self) -> str:
        return f"{self.ns}:placements"

    @property
    def assignor(self) -> str:
        return f"{self.ns}:assignor"

    @property
    def assignor_generation(self) -> str:
        return f"{self.ns}:assignor:generation"
