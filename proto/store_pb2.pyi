from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ACTIVE: _ClassVar[Role]
    STANDBY: _ClassVar[Role]

class ReplicaState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATE_UNSPECIFIED: _ClassVar[ReplicaState]
    RESTORING: _ClassVar[ReplicaState]
    SERVING_ACTIVE: _ClassVar[ReplicaState]
    SERVING_STANDBY: _ClassVar[ReplicaState]
    FAILED: _ClassVar[ReplicaState]

class ReadStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OK: _ClassVar[ReadStatus]
    NOT_FOUND: _ClassVar[ReadStatus]
    TOO_STALE: _ClassVar[ReadStatus]
    NOT_HOSTED: _ClassVar[ReadStatus]
    ERROR: _ClassVar[ReadStatus]
    NOT_YET_VISIBLE: _ClassVar[ReadStatus]
ROLE_UNSPECIFIED: Role
ACTIVE: Role
STANDBY: Role
STATE_UNSPECIFIED: ReplicaState
RESTORING: ReplicaState
SERVING_ACTIVE: ReplicaState
SERVING_STANDBY: ReplicaState
FAILED: ReplicaState
OK: ReadStatus
NOT_FOUND: ReadStatus
TOO_STALE: ReadStatus
NOT_HOSTED: ReadStatus
ERROR: ReadStatus
NOT_YET_VISIBLE: ReadStatus

class ReadBound(_message.Message):
    __slots__ = ("max_lag", "max_staleness_ms", "min_offset", "after_input", "after_offset")
    class AfterInputEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    MAX_LAG_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_MS_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    AFTER_INPUT_FIELD_NUMBER: _ClassVar[int]
    AFTER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    max_lag: int
    max_staleness_ms: int
    min_offset: int
    after_input: _containers.ScalarMap[int, int]
    after_offset: int
    def __init__(self, max_lag: _Optional[int] = ..., max_staleness_ms: _Optional[int] = ..., min_offset: _Optional[int] = ..., after_input: _Optional[_Mapping[int, int]] = ..., after_offset: _Optional[int] = ...) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ("node", "role", "state", "applied_offset", "end_offset", "lag_offsets", "staleness_ms", "failure")
    NODE_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    APPLIED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    STALENESS_MS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    node: str
    role: Role
    state: ReplicaState
    applied_offset: int
    end_offset: int
    lag_offsets: int
    staleness_ms: int
    failure: str
    def __init__(self, node: _Optional[str] = ..., role: _Optional[_Union[Role, str]] = ..., state: _Optional[_Union[ReplicaState, str]] = ..., applied_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., lag_offsets: _Optional[int] = ..., staleness_ms: _Optional[int] = ..., failure: _Optional[str] = ...) -> None: ...

class KeyRead(_message.Message):
    __slots__ = ("id", "table", "partition", "key", "bound", "as_of_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    AS_OF_MS_FIELD_NUMBER: _ClassVar[int]
    id: int
    table: str
    partition: int
    key: bytes
    bound: ReadBound
    as_of_ms: int
    def __init__(self, id: _Optional[int] = ..., table: _Optional[str] = ..., partition: _Optional[int] = ..., key: _Optional[bytes] = ..., bound: _Optional[_Union[ReadBound, _Mapping]] = ..., as_of_ms: _Optional[int] = ...) -> None: ...

class KeyResult(_message.Message):
    __slots__ = ("id", "status", "value", "replica", "message", "valid_from_ms", "valid_to_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    VALID_FROM_MS_FIELD_NUMBER: _ClassVar[int]
    VALID_TO_MS_FIELD_NUMBER: _ClassVar[int]
    id: int
    status: ReadStatus
    value: bytes
    replica: ReplicaStatus
    message: str
    valid_from_ms: int
    valid_to_ms: int
    def __init__(self, id: _Optional[int] = ..., status: _Optional[_Union[ReadStatus, str]] = ..., value: _Optional[bytes] = ..., replica: _Optional[_Union[ReplicaStatus, _Mapping]] = ..., message: _Optional[str] = ..., valid_from_ms: _Optional[int] = ..., valid_to_ms: _Optional[int] = ...) -> None: ...

class GroupRead(_message.Message):
    __slots__ = ("id", "table", "partition", "keys", "bound")
    ID_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    id: int
    table: str
    partition: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    bound: ReadBound
    def __init__(self, id: _Optional[int] = ..., table: _Optional[str] = ..., partition: _Optional[int] = ..., keys: _Optional[_Iterable[bytes]] = ..., bound: _Optional[_Union[ReadBound, _Mapping]] = ...) -> None: ...

class GroupResult(_message.Message):
    __slots__ = ("id", "status", "values", "replica", "message")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    id: int
    status: ReadStatus
    values: _containers.RepeatedScalarFieldContainer[bytes]
    replica: ReplicaStatus
    message: str
    def __init__(self, id: _Optional[int] = ..., status: _Optional[_Union[ReadStatus, str]] = ..., values: _Optional[_Iterable[bytes]] = ..., replica: _Optional[_Union[ReplicaStatus, _Mapping]] = ..., message: _Optional[str] = ...) -> None: ...

class WindowFilter(_message.Message):
    __slots__ = ("from_ms", "to_ms", "life_ms")
    FROM_MS_FIELD_NUMBER: _ClassVar[int]
    TO_MS_FIELD_NUMBER: _ClassVar[int]
    LIFE_MS_FIELD_NUMBER: _ClassVar[int]
    from_ms: int
    to_ms: int
    life_ms: int
    def __init__(self, from_ms: _Optional[int] = ..., to_ms: _Optional[int] = ..., life_ms: _Optional[int] = ...) -> None: ...

class RangeRead(_message.Message):
    __slots__ = ("id", "table", "partition", "start", "end", "limit", "bound", "window", "versions", "as_of_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    AS_OF_MS_FIELD_NUMBER: _ClassVar[int]
    id: int
    table: str
    partition: int
    start: bytes
    end: bytes
    limit: int
    bound: ReadBound
    window: WindowFilter
    versions: VersionFilter
    as_of_ms: int
    def __init__(self, id: _Optional[int] = ..., table: _Optional[str] = ..., partition: _Optional[int] = ..., start: _Optional[bytes] = ..., end: _Optional[bytes] = ..., limit: _Optional[int] = ..., bound: _Optional[_Union[ReadBound, _Mapping]] = ..., window: _Optional[_Union[WindowFilter, _Mapping]] = ..., versions: _Optional[_Union[VersionFilter, _Mapping]] = ..., as_of_ms: _Optional[int] = ...) -> None: ...

class VersionFilter(_message.Message):
    __slots__ = ("from_ms", "to_ms")
    FROM_MS_FIELD_NUMBER: _ClassVar[int]
    TO_MS_FIELD_NUMBER: _ClassVar[int]
    from_ms: int
    to_ms: int
    def __init__(self, from_ms: _Optional[int] = ..., to_ms: _Optional[int] = ...) -> None: ...

class ScanEntry(_message.Message):
    __slots__ = ("key", "value", "valid_from_ms", "valid_to_ms", "deleted")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    VALID_FROM_MS_FIELD_NUMBER: _ClassVar[int]
    VALID_TO_MS_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    value: bytes
    valid_from_ms: int
    valid_to_ms: int
    deleted: bool
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., valid_from_ms: _Optional[int] = ..., valid_to_ms: _Optional[int] = ..., deleted: _Optional[bool] = ...) -> None: ...

class RangeResult(_message.Message):
    __slots__ = ("id", "status", "entries", "replica", "message", "watermark_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_MS_FIELD_NUMBER: _ClassVar[int]
    id: int
    status: ReadStatus
    entries: _containers.RepeatedCompositeFieldContainer[ScanEntry]
    replica: ReplicaStatus
    message: str
    watermark_ms: int
    def __init__(self, id: _Optional[int] = ..., status: _Optional[_Union[ReadStatus, str]] = ..., entries: _Optional[_Iterable[_Union[ScanEntry, _Mapping]]] = ..., replica: _Optional[_Union[ReplicaStatus, _Mapping]] = ..., message: _Optional[str] = ..., watermark_ms: _Optional[int] = ...) -> None: ...

class ReadBatch(_message.Message):
    __slots__ = ("reads", "groups", "ranges", "cluster_secret")
    READS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_SECRET_FIELD_NUMBER: _ClassVar[int]
    reads: _containers.RepeatedCompositeFieldContainer[KeyRead]
    groups: _containers.RepeatedCompositeFieldContainer[GroupRead]
    ranges: _containers.RepeatedCompositeFieldContainer[RangeRead]
    cluster_secret: str
    def __init__(self, reads: _Optional[_Iterable[_Union[KeyRead, _Mapping]]] = ..., groups: _Optional[_Iterable[_Union[GroupRead, _Mapping]]] = ..., ranges: _Optional[_Iterable[_Union[RangeRead, _Mapping]]] = ..., cluster_secret: _Optional[str] = ...) -> None: ...

class ResultBatch(_message.Message):
    __slots__ = ("results", "groups", "ranges", "refused")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[KeyResult]
    groups: _containers.RepeatedCompositeFieldContainer[GroupResult]
    ranges: _containers.RepeatedCompositeFieldContainer[RangeResult]
    refused: str
    def __init__(self, results: _Optional[_Iterable[_Union[KeyResult, _Mapping]]] = ..., groups: _Optional[_Iterable[_Union[GroupResult, _Mapping]]] = ..., ranges: _Optional[_Iterable[_Union[RangeResult, _Mapping]]] = ..., refused: _Optional[str] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReplicaCounters(_message.Message):
    __slots__ = ("records_applied", "records_skipped", "restores", "resumed_from")
    RECORDS_APPLIED_FIELD_NUMBER: _ClassVar[int]
    RECORDS_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    RESTORES_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FROM_FIELD_NUMBER: _ClassVar[int]
    records_applied: int
    records_skipped: int
    restores: int
    resumed_from: int
    def __init__(self, records_applied: _Optional[int] = ..., records_skipped: _Optional[int] = ..., restores: _Optional[int] = ..., resumed_from: _Optional[int] = ...) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("node", "replicas", "tables", "counters", "draining")
    NODE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    node: str
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    tables: _containers.RepeatedScalarFieldContainer[str]
    counters: _containers.RepeatedCompositeFieldContainer[ReplicaCounters]
    draining: bool
    def __init__(self, node: _Optional[str] = ..., replicas: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ..., tables: _Optional[_Iterable[str]] = ..., counters: _Optional[_Iterable[_Union[ReplicaCounters, _Mapping]]] = ..., draining: _Optional[bool] = ...) -> None: ...
