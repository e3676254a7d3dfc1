from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Bound(_message.Message):
    __slots__ = ("max_lag", "max_staleness_ms", "min_position", "max_input_lag_ms", "after", "wait_ms", "as_of", "version")
    MAX_LAG_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_MS_FIELD_NUMBER: _ClassVar[int]
    MIN_POSITION_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUT_LAG_MS_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    max_lag: int
    max_staleness_ms: int
    min_position: str
    max_input_lag_ms: int
    after: str
    wait_ms: int
    as_of: int
    version: int
    def __init__(self, max_lag: _Optional[int] = ..., max_staleness_ms: _Optional[int] = ..., min_position: _Optional[str] = ..., max_input_lag_ms: _Optional[int] = ..., after: _Optional[str] = ..., wait_ms: _Optional[int] = ..., as_of: _Optional[int] = ..., version: _Optional[int] = ...) -> None: ...

class Lag(_message.Message):
    __slots__ = ("offsets", "ms")
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    MS_FIELD_NUMBER: _ClassVar[int]
    offsets: int
    ms: int
    def __init__(self, offsets: _Optional[int] = ..., ms: _Optional[int] = ...) -> None: ...

class InputLag(_message.Message):
    __slots__ = ("records", "ms")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    MS_FIELD_NUMBER: _ClassVar[int]
    records: int
    ms: int
    def __init__(self, records: _Optional[int] = ..., ms: _Optional[int] = ...) -> None: ...

class ServedBy(_message.Message):
    __slots__ = ("node", "role")
    NODE_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    node: str
    role: str
    def __init__(self, node: _Optional[str] = ..., role: _Optional[str] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("table", "key", "bound", "typed_values")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    TYPED_VALUES_FIELD_NUMBER: _ClassVar[int]
    table: str
    key: str
    bound: Bound
    typed_values: bool
    def __init__(self, table: _Optional[str] = ..., key: _Optional[str] = ..., bound: _Optional[_Union[Bound, _Mapping]] = ..., typed_values: _Optional[bool] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("table", "key", "value_json", "partition", "served_by", "lag", "position", "found", "error", "value", "input_lag", "value_bytes", "valid_from", "valid_to", "final", "table_version")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    SERVED_BY_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    INPUT_LAG_FIELD_NUMBER: _ClassVar[int]
    VALUE_BYTES_FIELD_NUMBER: _ClassVar[int]
    VALID_FROM_FIELD_NUMBER: _ClassVar[int]
    VALID_TO_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    TABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    table: str
    key: str
    value_json: str
    partition: int
    served_by: ServedBy
    lag: Lag
    position: str
    found: bool
    error: KeyError
    value: _struct_pb2.Struct
    input_lag: InputLag
    value_bytes: bytes
    valid_from: int
    valid_to: int
    final: bool
    table_version: int
    def __init__(self, table: _Optional[str] = ..., key: _Optional[str] = ..., value_json: _Optional[str] = ..., partition: _Optional[int] = ..., served_by: _Optional[_Union[ServedBy, _Mapping]] = ..., lag: _Optional[_Union[Lag, _Mapping]] = ..., position: _Optional[str] = ..., found: _Optional[bool] = ..., error: _Optional[_Union[KeyError, _Mapping]] = ..., value: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., input_lag: _Optional[_Union[InputLag, _Mapping]] = ..., value_bytes: _Optional[bytes] = ..., valid_from: _Optional[int] = ..., valid_to: _Optional[int] = ..., final: _Optional[bool] = ..., table_version: _Optional[int] = ...) -> None: ...

class KeyError(_message.Message):
    __slots__ = ("code", "message", "status", "body_json")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    BODY_JSON_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    status: int
    body_json: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., status: _Optional[int] = ..., body_json: _Optional[str] = ...) -> None: ...

class BatchGetRequest(_message.Message):
    __slots__ = ("table", "keys", "bound", "typed_values")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    TYPED_VALUES_FIELD_NUMBER: _ClassVar[int]
    table: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    bound: Bound
    typed_values: bool
    def __init__(self, table: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., bound: _Optional[_Union[Bound, _Mapping]] = ..., typed_values: _Optional[bool] = ...) -> None: ...

class BatchGetResponse(_message.Message):
    __slots__ = ("results", "input_lag", "table_version")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    INPUT_LAG_FIELD_NUMBER: _ClassVar[int]
    TABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[GetResponse]
    input_lag: InputLag
    table_version: int
    def __init__(self, results: _Optional[_Iterable[_Union[GetResponse, _Mapping]]] = ..., input_lag: _Optional[_Union[InputLag, _Mapping]] = ..., table_version: _Optional[int] = ...) -> None: ...

class ScanRequest(_message.Message):
    __slots__ = ("table", "prefix", "start", "end", "limit", "page_token", "bound", "typed_values")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    TYPED_VALUES_FIELD_NUMBER: _ClassVar[int]
    table: str
    prefix: str
    start: str
    end: str
    limit: int
    page_token: str
    bound: Bound
    typed_values: bool
    def __init__(self, table: _Optional[str] = ..., prefix: _Optional[str] = ..., start: _Optional[str] = ..., end: _Optional[str] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ..., bound: _Optional[_Union[Bound, _Mapping]] = ..., typed_values: _Optional[bool] = ...) -> None: ...

class ScanItem(_message.Message):
    __slots__ = ("key", "value_json", "partition", "summary", "value", "value_bytes", "valid_from", "valid_to")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    VALUE_BYTES_FIELD_NUMBER: _ClassVar[int]
    VALID_FROM_FIELD_NUMBER: _ClassVar[int]
    VALID_TO_FIELD_NUMBER: _ClassVar[int]
    key: str
    value_json: str
    partition: int
    summary: ScanSummary
    value: _struct_pb2.Struct
    value_bytes: bytes
    valid_from: int
    valid_to: int
    def __init__(self, key: _Optional[str] = ..., value_json: _Optional[str] = ..., partition: _Optional[int] = ..., summary: _Optional[_Union[ScanSummary, _Mapping]] = ..., value: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., value_bytes: _Optional[bytes] = ..., valid_from: _Optional[int] = ..., valid_to: _Optional[int] = ...) -> None: ...

class ScanSummary(_message.Message):
    __slots__ = ("partitions", "next_page_token", "input_lag", "final", "table_version")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    INPUT_LAG_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    TABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[ScanPartition]
    next_page_token: str
    input_lag: InputLag
    final: bool
    table_version: int
    def __init__(self, partitions: _Optional[_Iterable[_Union[ScanPartition, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., input_lag: _Optional[_Union[InputLag, _Mapping]] = ..., final: _Optional[bool] = ..., table_version: _Optional[int] = ...) -> None: ...

class ScanPartition(_message.Message):
    __slots__ = ("partition", "served_by", "lag", "position")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    SERVED_BY_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    partition: int
    served_by: ServedBy
    lag: Lag
    position: str
    def __init__(self, partition: _Optional[int] = ..., served_by: _Optional[_Union[ServedBy, _Mapping]] = ..., lag: _Optional[_Union[Lag, _Mapping]] = ..., position: _Optional[str] = ...) -> None: ...

class WindowsRequest(_message.Message):
    __slots__ = ("table", "key", "from_ms", "to_ms", "bound", "typed_values")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    FROM_MS_FIELD_NUMBER: _ClassVar[int]
    TO_MS_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    TYPED_VALUES_FIELD_NUMBER: _ClassVar[int]
    table: str
    key: str
    from_ms: int
    to_ms: int
    bound: Bound
    typed_values: bool
    def __init__(self, table: _Optional[str] = ..., key: _Optional[str] = ..., from_ms: _Optional[int] = ..., to_ms: _Optional[int] = ..., bound: _Optional[_Union[Bound, _Mapping]] = ..., typed_values: _Optional[bool] = ...) -> None: ...

class Window(_message.Message):
    __slots__ = ("start_ms", "end_ms", "value_json", "final", "value")
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    start_ms: int
    end_ms: int
    value_json: str
    final: bool
    value: _struct_pb2.Struct
    def __init__(self, start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., value_json: _Optional[str] = ..., final: _Optional[bool] = ..., value: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class WindowsResponse(_message.Message):
    __slots__ = ("table", "key", "windows", "partition", "served_by", "lag", "position", "watermark_ms", "input_lag", "table_version")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    SERVED_BY_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_MS_FIELD_NUMBER: _ClassVar[int]
    INPUT_LAG_FIELD_NUMBER: _ClassVar[int]
    TABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    table: str
    key: str
    windows: _containers.RepeatedCompositeFieldContainer[Window]
    partition: int
    served_by: ServedBy
    lag: Lag
    position: str
    watermark_ms: int
    input_lag: InputLag
    table_version: int
    def __init__(self, table: _Optional[str] = ..., key: _Optional[str] = ..., windows: _Optional[_Iterable[_Union[Window, _Mapping]]] = ..., partition: _Optional[int] = ..., served_by: _Optional[_Union[ServedBy, _Mapping]] = ..., lag: _Optional[_Union[Lag, _Mapping]] = ..., position: _Optional[str] = ..., watermark_ms: _Optional[int] = ..., input_lag: _Optional[_Union[InputLag, _Mapping]] = ..., table_version: _Optional[int] = ...) -> None: ...

class VersionsRequest(_message.Message):
    __slots__ = ("table", "key", "from_ms", "to_ms", "limit", "page_token", "bound", "typed_values")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    FROM_MS_FIELD_NUMBER: _ClassVar[int]
    TO_MS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    TYPED_VALUES_FIELD_NUMBER: _ClassVar[int]
    table: str
    key: str
    from_ms: int
    to_ms: int
    limit: int
    page_token: str
    bound: Bound
    typed_values: bool
    def __init__(self, table: _Optional[str] = ..., key: _Optional[str] = ..., from_ms: _Optional[int] = ..., to_ms: _Optional[int] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ..., bound: _Optional[_Union[Bound, _Mapping]] = ..., typed_values: _Optional[bool] = ...) -> None: ...

class Version(_message.Message):
    __slots__ = ("value_json", "value_bytes", "valid_from", "valid_to", "deleted", "value")
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    VALUE_BYTES_FIELD_NUMBER: _ClassVar[int]
    VALID_FROM_FIELD_NUMBER: _ClassVar[int]
    VALID_TO_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value_json: str
    value_bytes: bytes
    valid_from: int
    valid_to: int
    deleted: bool
    value: _struct_pb2.Struct
    def __init__(self, value_json: _Optional[str] = ..., value_bytes: _Optional[bytes] = ..., valid_from: _Optional[int] = ..., valid_to: _Optional[int] = ..., deleted: _Optional[bool] = ..., value: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class VersionsResponse(_message.Message):
    __slots__ = ("table", "key", "versions", "next_page_token", "complete_to", "partition", "served_by", "lag", "position", "input_lag", "table_version")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_TO_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    SERVED_BY_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    INPUT_LAG_FIELD_NUMBER: _ClassVar[int]
    TABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    table: str
    key: str
    versions: _containers.RepeatedCompositeFieldContainer[Version]
    next_page_token: str
    complete_to: int
    partition: int
    served_by: ServedBy
    lag: Lag
    position: str
    input_lag: InputLag
    table_version: int
    def __init__(self, table: _Optional[str] = ..., key: _Optional[str] = ..., versions: _Optional[_Iterable[_Union[Version, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., complete_to: _Optional[int] = ..., partition: _Optional[int] = ..., served_by: _Optional[_Union[ServedBy, _Mapping]] = ..., lag: _Optional[_Union[Lag, _Mapping]] = ..., position: _Optional[str] = ..., input_lag: _Optional[_Union[InputLag, _Mapping]] = ..., table_version: _Optional[int] = ...) -> None: ...

class ScanWindowsRequest(_message.Message):
    __slots__ = ("table", "from_ms", "to_ms", "limit", "page_token", "bound", "typed_values")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    FROM_MS_FIELD_NUMBER: _ClassVar[int]
    TO_MS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    TYPED_VALUES_FIELD_NUMBER: _ClassVar[int]
    table: str
    from_ms: int
    to_ms: int
    limit: int
    page_token: str
    bound: Bound
    typed_values: bool
    def __init__(self, table: _Optional[str] = ..., from_ms: _Optional[int] = ..., to_ms: _Optional[int] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ..., bound: _Optional[_Union[Bound, _Mapping]] = ..., typed_values: _Optional[bool] = ...) -> None: ...

class WindowItem(_message.Message):
    __slots__ = ("key", "window", "partition", "summary")
    KEY_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    key: str
    window: Window
    partition: int
    summary: ScanSummary
    def __init__(self, key: _Optional[str] = ..., window: _Optional[_Union[Window, _Mapping]] = ..., partition: _Optional[int] = ..., summary: _Optional[_Union[ScanSummary, _Mapping]] = ...) -> None: ...

class KeyMetadataRequest(_message.Message):
    __slots__ = ("table", "key")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    table: str
    key: str
    def __init__(self, table: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class ReplicaInfo(_message.Message):
    __slots__ = ("node", "address", "role", "state", "alive", "lag", "applied_offset", "end_offset", "failure")
    NODE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    APPLIED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    node: str
    address: str
    role: str
    state: str
    alive: bool
    lag: Lag
    applied_offset: int
    end_offset: int
    failure: str
    def __init__(self, node: _Optional[str] = ..., address: _Optional[str] = ..., role: _Optional[str] = ..., state: _Optional[str] = ..., alive: _Optional[bool] = ..., lag: _Optional[_Union[Lag, _Mapping]] = ..., applied_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., failure: _Optional[str] = ...) -> None: ...

class KeyMetadataResponse(_message.Message):
    __slots__ = ("table", "key", "partition", "active", "standbys")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    STANDBYS_FIELD_NUMBER: _ClassVar[int]
    table: str
    key: str
    partition: int
    active: ReplicaInfo
    standbys: _containers.RepeatedCompositeFieldContainer[ReplicaInfo]
    def __init__(self, table: _Optional[str] = ..., key: _Optional[str] = ..., partition: _Optional[int] = ..., active: _Optional[_Union[ReplicaInfo, _Mapping]] = ..., standbys: _Optional[_Iterable[_Union[ReplicaInfo, _Mapping]]] = ...) -> None: ...

class ListTablesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TableInfo(_message.Message):
    __slots__ = ("name", "topic", "partitions", "standby_replicas", "key_column", "schema", "window", "input_lag", "pipeline", "key_format", "value_format", "origin", "pipeline_mode", "history_retention_ms", "query", "version", "versions")
    class SchemaEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    STANDBY_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    KEY_COLUMN_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    INPUT_LAG_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    KEY_FORMAT_FIELD_NUMBER: _ClassVar[int]
    VALUE_FORMAT_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_MODE_FIELD_NUMBER: _ClassVar[int]
    HISTORY_RETENTION_MS_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    topic: str
    partitions: int
    standby_replicas: int
    key_column: str
    schema: _containers.ScalarMap[str, str]
    window: TableWindow
    input_lag: InputLag
    pipeline: Pipeline
    key_format: str
    value_format: str
    origin: str
    pipeline_mode: str
    history_retention_ms: int
    query: str
    version: int
    versions: _containers.RepeatedCompositeFieldContainer[TableVersionInfo]
    def __init__(self, name: _Optional[str] = ..., topic: _Optional[str] = ..., partitions: _Optional[int] = ..., standby_replicas: _Optional[int] = ..., key_column: _Optional[str] = ..., schema: _Optional[_Mapping[str, str]] = ..., window: _Optional[_Union[TableWindow, _Mapping]] = ..., input_lag: _Optional[_Union[InputLag, _Mapping]] = ..., pipeline: _Optional[_Union[Pipeline, _Mapping]] = ..., key_format: _Optional[str] = ..., value_format: _Optional[str] = ..., origin: _Optional[str] = ..., pipeline_mode: _Optional[str] = ..., history_retention_ms: _Optional[int] = ..., query: _Optional[str] = ..., version: _Optional[int] = ..., versions: _Optional[_Iterable[_Union[TableVersionInfo, _Mapping]]] = ...) -> None: ...

class TableVersionInfo(_message.Message):
    __slots__ = ("version", "state", "fingerprint", "created_ms", "switched_ms", "retire_at_ms", "reason", "definition", "input_lag", "progress", "caught_up_in_ms")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    SWITCHED_MS_FIELD_NUMBER: _ClassVar[int]
    RETIRE_AT_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_FIELD_NUMBER: _ClassVar[int]
    INPUT_LAG_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    CAUGHT_UP_IN_MS_FIELD_NUMBER: _ClassVar[int]
    version: int
    state: str
    fingerprint: str
    created_ms: int
    switched_ms: int
    retire_at_ms: int
    reason: str
    definition: str
    input_lag: InputLag
    progress: float
    caught_up_in_ms: int
    def __init__(self, version: _Optional[int] = ..., state: _Optional[str] = ..., fingerprint: _Optional[str] = ..., created_ms: _Optional[int] = ..., switched_ms: _Optional[int] = ..., retire_at_ms: _Optional[int] = ..., reason: _Optional[str] = ..., definition: _Optional[str] = ..., input_lag: _Optional[_Union[InputLag, _Mapping]] = ..., progress: _Optional[float] = ..., caught_up_in_ms: _Optional[int] = ...) -> None: ...

class Pipeline(_message.Message):
    __slots__ = ("alive", "last_progress_ms")
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    LAST_PROGRESS_MS_FIELD_NUMBER: _ClassVar[int]
    alive: bool
    last_progress_ms: int
    def __init__(self, alive: _Optional[bool] = ..., last_progress_ms: _Optional[int] = ...) -> None: ...

class TablePipeline(_message.Message):
    __slots__ = ("table", "pipeline", "input_lag")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    INPUT_LAG_FIELD_NUMBER: _ClassVar[int]
    table: str
    pipeline: Pipeline
    input_lag: InputLag
    def __init__(self, table: _Optional[str] = ..., pipeline: _Optional[_Union[Pipeline, _Mapping]] = ..., input_lag: _Optional[_Union[InputLag, _Mapping]] = ...) -> None: ...

class TableWindow(_message.Message):
    __slots__ = ("size_ms", "slide_ms", "grace_ms", "retention_ms")
    SIZE_MS_FIELD_NUMBER: _ClassVar[int]
    SLIDE_MS_FIELD_NUMBER: _ClassVar[int]
    GRACE_MS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_MS_FIELD_NUMBER: _ClassVar[int]
    size_ms: int
    slide_ms: int
    grace_ms: int
    retention_ms: int
    def __init__(self, size_ms: _Optional[int] = ..., slide_ms: _Optional[int] = ..., grace_ms: _Optional[int] = ..., retention_ms: _Optional[int] = ...) -> None: ...

class ListTablesResponse(_message.Message):
    __slots__ = ("tables",)
    TABLES_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedCompositeFieldContainer[TableInfo]
    def __init__(self, tables: _Optional[_Iterable[_Union[TableInfo, _Mapping]]] = ...) -> None: ...

class ClusterRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("node", "address", "alive", "heartbeat_age_ms", "replicas", "read_address", "draining")
    NODE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    READ_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    node: str
    address: str
    alive: bool
    heartbeat_age_ms: int
    replicas: _containers.RepeatedCompositeFieldContainer[PartitionReplica]
    read_address: str
    draining: bool
    def __init__(self, node: _Optional[str] = ..., address: _Optional[str] = ..., alive: _Optional[bool] = ..., heartbeat_age_ms: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[PartitionReplica, _Mapping]]] = ..., read_address: _Optional[str] = ..., draining: _Optional[bool] = ...) -> None: ...

class AssignedPartition(_message.Message):
    __slots__ = ("table", "partition", "nodes")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    table: str
    partition: int
    nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, table: _Optional[str] = ..., partition: _Optional[int] = ..., nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class MetadataHealth(_message.Message):
    __slots__ = ("loaded", "age_ms", "redis_ok")
    LOADED_FIELD_NUMBER: _ClassVar[int]
    AGE_MS_FIELD_NUMBER: _ClassVar[int]
    REDIS_OK_FIELD_NUMBER: _ClassVar[int]
    loaded: bool
    age_ms: int
    redis_ok: bool
    def __init__(self, loaded: _Optional[bool] = ..., age_ms: _Optional[int] = ..., redis_ok: _Optional[bool] = ...) -> None: ...

class PartitionReplica(_message.Message):
    __slots__ = ("table", "partition", "replica")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    table: str
    partition: int
    replica: ReplicaInfo
    def __init__(self, table: _Optional[str] = ..., partition: _Optional[int] = ..., replica: _Optional[_Union[ReplicaInfo, _Mapping]] = ...) -> None: ...

class ClusterResponse(_message.Message):
    __slots__ = ("nodes", "assignment_generation", "assignment", "metadata", "pipelines")
    NODES_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_GENERATION_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    PIPELINES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    assignment_generation: int
    assignment: _containers.RepeatedCompositeFieldContainer[AssignedPartition]
    metadata: MetadataHealth
    pipelines: _containers.RepeatedCompositeFieldContainer[TablePipeline]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ..., assignment_generation: _Optional[int] = ..., assignment: _Optional[_Iterable[_Union[AssignedPartition, _Mapping]]] = ..., metadata: _Optional[_Union[MetadataHealth, _Mapping]] = ..., pipelines: _Optional[_Iterable[_Union[TablePipeline, _Mapping]]] = ...) -> None: ...
