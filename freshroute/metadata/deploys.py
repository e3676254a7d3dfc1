"""Deploys: a table given a new definition while the pipeline runs (``freshroute table deploy``). The request holds
the tables file whole; the pipeline takes it — it starts its queries again with the table's new version begun
beside the served one (:mod:`pipeline.deploys`) — and answers it, which the command waits for.

One deploy of a table at a time, and none while a version builds anywhere in the cluster: a second is refused
naming the first.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import orjson

from freshroute.errors import TableDeployInProgress
from freshroute.metadata.schema import Keys
from freshroute.metadata.store import text

# KEYS: the deploy requests, the building marker. ARGV: table, the request.
# Returns {1} asked, {2, request} one of the table is pending, {3, physical} a version is building.
_REQUEST = """
local pending = redis.call('HGET', KEYS[1], ARGV[1])
if pending then return {2, pending} end
local building = redis.call('GET', KEYS[2])
if building then return {3, building} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return {1}
"""

@dataclass(frozen=True)
class DeployRequest:
    """A table's new definition: the tables file it is in, whole, and who asked when."""

    table: str
    tables_file: str  # the file's text
    path: str  # where it was deployed from, to name
    by: str
    requested_ms: int

    def describe(self) -> str:
        return f"the deploy of table {self.table} from {self.path} by {self.by}"

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> "DeployRequest":
        d = orjson.loads(raw)
        return cls(d["table"], d["tables_file"], d["path"], d["by"], int(d["requested_ms"]))


@dataclass(frozen=True)
class DeployAnswer:
    """What the pipeline made of a deploy: the version begun, or why none was."""

    table: str
    requested_ms: int  # of the request it answers
    answered_ms: int
    version: int | None  # the version building by the deployed definition; None: refused
    message: str

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> "DeployAnswer":
        d = orjson.loads(raw)
        return cls(d["table"], int(d["requested_ms"]), int(d["answered_ms"]), d.get("version"), d["message"])


class Deploys:
    """The deploy requests and their answers, in Redis."""

    def __init__(self, client: Any, namespace: str = "freshroute") -> None:
        self.redis = client
        self.keys = Keys(namespace)
        self._request = client.register_script(_REQUEST)

    def request(self, request: DeployRequest) -> None:
        """Ask the pipeline for ``request``; refused while another deploy of the table is pending or a version of
        any table builds (TABLE_DEPLOY_IN_PROGRESS naming it)."""
        done = self._request(keys=[self.keys.table_deploys, self.keys.table_versions_building],
                             args=[request.table, request.to_json()])
        if done[0] == 2:
            pending = DeployRequest.from_json(done[1])
            raise TableDeployInProgress(f"{pending.describe()} is not taken yet: one deploy of a table at a time",
                                        table=request.table, pending=pending.path, by=pending.by)
        if done[0] == 3:
            raise TableDeployInProgress(f"version {text(done[1])} is still building: one table version builds at a "
                                        f"time", table=request.table, building=text(done[1]))

    def pending(self) -> dict[str, DeployRequest]:
        return {text(k): DeployRequest.from_json(v) for k, v in self.redis.hgetall(self.keys.table_deploys).items()}

    def answer(self, answer: DeployAnswer) -> None:
        """Answer the request pending for ``answer.table`` (no other can be made until it is answered)."""
        self.redis.hset(self.keys.table_deploy_answers, answer.table, answer.to_json())
        self.redis.hdel(self.keys.table_deploys, answer.table)

    def answered(self, table: str, requested_ms: int) -> DeployAnswer | None:
        """The answer to the request of ``table`` made at ``requested_ms``, once there is one."""
        raw = self.redis.hget(self.keys.table_deploy_answers, table)
        answer = None if raw is None else DeployAnswer.from_json(raw)
        return answer if answer is not None and answer.requested_ms == requested_ms else None
