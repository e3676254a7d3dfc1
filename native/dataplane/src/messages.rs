//! The read port's messages this path sends and receives (`proto/store.proto`, by field number): key reads, a
//! partition's group of keys and a key's windows out, their results back. Fields of the protocol it does not use
//! (versions, rows as of a time) are left out: prost skips them on the way in.

use bytes::Bytes;

#[derive(Clone, PartialEq, prost::Message)]
pub struct ReadBound {
    #[prost(int64, optional, tag = "1")]
    pub max_lag: Option<i64>,
    #[prost(int64, optional, tag = "2")]
    pub max_staleness_ms: Option<i64>,
    #[prost(int64, tag = "3")]
    pub min_offset: i64,
    /// A write token's input events (partition → offset) the answer must reflect: its row's input position is at or
    /// past each, or the replica has applied `after_offset` (0: no such offset known yet).
    #[prost(map = "int32, int64", tag = "4")]
    pub after_input: std::collections::HashMap<i32, i64>,
    #[prost(int64, tag = "5")]
    pub after_offset: i64,
}

impl ReadBound {
    /// The bound a node checks of a read under `bound`; None: unbounded.
    pub fn of(bound: crate::selection::Bound) -> Option<ReadBound> {
        (!bound.unbounded()).then(|| ReadBound { max_lag: bound.max_lag, max_staleness_ms: bound.max_staleness_ms,
                                                 min_offset: bound.min_offset, ..ReadBound::default() })
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ReplicaStatus {
    #[prost(string, tag = "1")]
    pub node: String,
    #[prost(int32, tag = "2")]
    pub role: i32,
    #[prost(int32, tag = "3")]
    pub state: i32,
    #[prost(int64, tag = "4")]
    pub applied_offset: i64,
    #[prost(int64, optional, tag = "5")]
    pub end_offset: Option<i64>,
    #[prost(int64, optional, tag = "6")]
    pub lag_offsets: Option<i64>,
    #[prost(int64, tag = "7")]
    pub staleness_ms: i64,
    #[prost(string, tag = "8")]
    pub failure: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyRead {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(string, tag = "2")]
    pub table: String,
    #[prost(int32, tag = "3")]
    pub partition: i32,
    #[prost(bytes = "vec", tag = "4")]
    pub key: Vec<u8>,
    #[prost(message, optional, tag = "5")]
    pub bound: Option<ReadBound>,
    /// A versioned table's key as of this time, not its latest value.
    #[prost(int64, optional, tag = "6")]
    pub as_of_ms: Option<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyResult {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int32, tag = "2")]
    pub status: i32,
    #[prost(bytes = "bytes", tag = "3")]
    pub value: Bytes,
    #[prost(message, optional, tag = "4")]
    pub replica: Option<ReplicaStatus>,
    #[prost(string, tag = "5")]
    pub message: String,
    /// An as-of read's version: when it became the key's, and when the next one did (unset: the latest).
    #[prost(int64, optional, tag = "6")]
    pub valid_from_ms: Option<i64>,
    #[prost(int64, optional, tag = "7")]
    pub valid_to_ms: Option<i64>,
}

/// Windows starting in [from_ms, to_ms), not expired (life_ms: window size + retention).
#[derive(Clone, PartialEq, prost::Message)]
pub struct WindowFilter {
    #[prost(int64, tag = "1")]
    pub from_ms: i64,
    #[prost(int64, tag = "2")]
    pub to_ms: i64,
    #[prost(int64, tag = "3")]
    pub life_ms: i64,
}

/// Rows of one table-partition in [start, end), in key order, from one replica.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeRead {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(string, tag = "2")]
    pub table: String,
    #[prost(int32, tag = "3")]
    pub partition: i32,
    #[prost(bytes = "vec", tag = "4")]
    pub start: Vec<u8>,
    #[prost(bytes = "vec", tag = "5")]
    pub end: Vec<u8>,
    #[prost(uint32, tag = "6")]
    pub limit: u32,
    #[prost(message, optional, tag = "7")]
    pub bound: Option<ReadBound>,
    #[prost(message, optional, tag = "8")]
    pub window: Option<WindowFilter>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ScanEntry {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeResult {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int32, tag = "2")]
    pub status: i32,
    #[prost(message, repeated, tag = "3")]
    pub entries: Vec<ScanEntry>,
    #[prost(message, optional, tag = "4")]
    pub replica: Option<ReplicaStatus>,
    #[prost(string, tag = "5")]
    pub message: String,
    /// The partition's watermark as of the answer; -1: none yet.
    #[prost(int64, tag = "6")]
    pub watermark_ms: i64,
}

/// Several keys of one table-partition, read from one replica under one bound check.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GroupRead {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(string, tag = "2")]
    pub table: String,
    #[prost(int32, tag = "3")]
    pub partition: i32,
    #[prost(bytes = "vec", repeated, tag = "4")]
    pub keys: Vec<Vec<u8>>,
    #[prost(message, optional, tag = "5")]
    pub bound: Option<ReadBound>,
}

/// A group's answer: OK with one value per key (empty: no such key), or why none was read.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GroupResult {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int32, tag = "2")]
    pub status: i32,
    #[prost(bytes = "bytes", repeated, tag = "3")]
    pub values: Vec<Bytes>,
    #[prost(message, optional, tag = "4")]
    pub replica: Option<ReplicaStatus>,
    #[prost(string, tag = "5")]
    pub message: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ReadBatch {
    #[prost(message, repeated, tag = "1")]
    pub reads: Vec<KeyRead>,
    #[prost(message, repeated, tag = "2")]
    pub groups: Vec<GroupRead>,
    #[prost(string, tag = "3")]
    pub cluster_secret: String,
    #[prost(message, repeated, tag = "4")]
    pub ranges: Vec<RangeRead>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ResultBatch {
    #[prost(message, repeated, tag = "1")]
    pub results: Vec<KeyResult>,
    #[prost(message, repeated, tag = "2")]
    pub groups: Vec<GroupResult>,
    #[prost(string, tag = "3")]
    pub refused: String,
    #[prost(message, repeated, tag = "4")]
    pub ranges: Vec<RangeResult>,
}

/// A read this path sends a node: one key, or one key's windows.
#[derive(Clone, Debug)]
pub enum Read {
    Key(KeyRead),
    Range(RangeRead),
}

/// A node's answer to a [Read].
#[derive(Debug)]
pub enum Reply {
    Key(KeyResult),
    Range(RangeResult),
}

impl Reply {
    pub fn status(&self) -> i32 {
        match self {
            Reply::Key(r) => r.status,
            Reply::Range(r) => r.status,
        }
    }

    pub fn replica(&self) -> Option<&ReplicaStatus> {
        match self {
            Reply::Key(r) => r.replica.as_ref(),
            Reply::Range(r) => r.replica.as_ref(),
        }
    }
}

// ReadStatus, Role and ReplicaState values (store.proto).
pub const OK: i32 = 0;
pub const NOT_FOUND: i32 = 1;
pub const NOT_YET_VISIBLE: i32 = 5;
pub const ROLE_ACTIVE: i32 = 1;
pub const ROLE_STANDBY: i32 = 2;
pub const RESTORING: i32 = 1;
pub const SERVING_ACTIVE: i32 = 2;
pub const SERVING_STANDBY: i32 = 3;

/// The longest frame of the read port (freshroute.wire.MAX_FRAME), far above any batch a router sends or a node
/// answers: a longer one means the peer does not speak this protocol.
pub const MAX_FRAME: usize = 64 << 20;

// The public gRPC API's Router.Get (`proto/router.proto`, by field number): what the gRPC port answers itself.

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetBound {
    #[prost(int64, optional, tag = "1")]
    pub max_lag: Option<i64>,
    #[prost(int64, optional, tag = "2")]
    pub max_staleness_ms: Option<i64>,
    #[prost(string, tag = "3")]
    pub min_position: String,
    #[prost(int64, optional, tag = "4")]
    pub max_input_lag_ms: Option<i64>,
    #[prost(string, tag = "5")]
    pub after: String,
    #[prost(int64, optional, tag = "6")]
    pub wait_ms: Option<i64>,
    #[prost(int64, optional, tag = "7")]
    pub as_of: Option<i64>,
    /// A version of the table by number (building, serving or previous), which the Python path alone resolves.
    #[prost(int64, optional, tag = "8")]
    pub version: Option<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetRequest {
    #[prost(string, tag = "1")]
    pub table: String,
    #[prost(string, tag = "2")]
    pub key: String,
    #[prost(message, optional, tag = "3")]
    pub bound: Option<GetBound>,
    #[prost(bool, tag = "4")]
    pub typed_values: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ServedBy {
    #[prost(string, tag = "1")]
    pub node: String,
    #[prost(string, tag = "2")]
    pub role: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Lag {
    #[prost(int64, optional, tag = "1")]
    pub offsets: Option<i64>,
    #[prost(int64, optional, tag = "2")]
    pub ms: Option<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct InputLag {
    #[prost(int64, tag = "1")]
    pub records: i64,
    #[prost(int64, tag = "2")]
    pub ms: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetResponse {
    #[prost(string, tag = "1")]
    pub table: String,
    #[prost(string, tag = "2")]
    pub key: String,
    #[prost(string, tag = "3")]
    pub value_json: String,
    #[prost(int32, tag = "4")]
    pub partition: i32,
    #[prost(message, optional, tag = "5")]
    pub served_by: Option<ServedBy>,
    #[prost(message, optional, tag = "6")]
    pub lag: Option<Lag>,
    #[prost(string, tag = "7")]
    pub position: String,
    #[prost(bool, tag = "8")]
    pub found: bool,
    #[prost(message, optional, tag = "11")]
    pub input_lag: Option<InputLag>,
    #[prost(bytes = "vec", tag = "12")]
    pub value_bytes: Vec<u8>,
    #[prost(int64, optional, tag = "13")]
    pub valid_from: Option<i64>,
    #[prost(int64, optional, tag = "14")]
    pub valid_to: Option<i64>,
    #[prost(bool, tag = "15")]
    pub r#final: bool,
    #[prost(int32, tag = "16")]
    pub table_version: i32,
}
