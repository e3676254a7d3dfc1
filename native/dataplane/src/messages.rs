//! The read port's messages this path sends and receives (`proto/store.proto`, by field number): key reads out,
//! key results back. Fields of the protocol it does not use (groups, ranges, versions) are left out: prost skips
//! them on the way in.

use bytes::Bytes;

#[derive(Clone, PartialEq, prost::Message)]
pub struct ReadBound {
    #[prost(int64, optional, tag = "1")]
    pub max_lag: Option<i64>,
    #[prost(int64, optional, tag = "2")]
    pub max_staleness_ms: Option<i64>,
    #[prost(int64, tag = "3")]
    pub min_offset: i64,
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
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ReadBatch {
    #[prost(message, repeated, tag = "1")]
    pub reads: Vec<KeyRead>,
    #[prost(string, tag = "3")]
    pub cluster_secret: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ResultBatch {
    #[prost(message, repeated, tag = "1")]
    pub results: Vec<KeyResult>,
    #[prost(string, tag = "3")]
    pub refused: String,
}

// ReadStatus, Role and ReplicaState values (store.proto).
pub const OK: i32 = 0;
pub const NOT_FOUND: i32 = 1;
pub const ROLE_ACTIVE: i32 = 1;
pub const ROLE_STANDBY: i32 = 2;
pub const SERVING_ACTIVE: i32 = 2;
