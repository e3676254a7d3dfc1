//! What the compiled path counts, read by the router's metrics at a scrape (freshroute.routing.counts' labels and
//! buckets): lookups it answered by outcome and serving role, their latency, its hedges and the replicas it asked
//! again for a write token's events; requests it left to the
//! Python path.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

pub const LATENCY_BUCKETS: [f64; 13] = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];

#[derive(Default)]
pub struct Counts {
    /// [found, not found] × [active, standby]
    pub lookups: [[AtomicU64; 2]; 2],
    pub buckets: [AtomicU64; 14],
    pub sum_us: AtomicU64,
    pub hedges: AtomicU64,
    /// Replicas asked again for the events a read after a write token waits for (the retries' reason "after").
    pub after_retries: AtomicU64,
    /// Key route requests answered by the Python path, and connections handed to it.
    pub relayed: AtomicU64,
    pub handed_over: AtomicU64,
    /// Connections whose socket the Python front adopted (the rest of handed_over's: spliced).
    pub adopted: AtomicU64,
    pub connections: AtomicU64,
    /// gRPC calls relayed to the Python front, and connections the gRPC port accepted.
    pub grpc_relayed: AtomicU64,
    pub grpc_connections: AtomicU64,
}

impl Counts {
    pub fn lookup(&self, found: bool, active: bool, took: Duration) {
        self.lookups[usize::from(!found)][usize::from(!active)].fetch_add(1, Relaxed);
        let s = took.as_secs_f64();
        let bucket = LATENCY_BUCKETS.iter().position(|&b| s <= b).unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[bucket].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(took.as_micros() as u64, Relaxed);
    }

    pub fn hedge(&self) {
        self.hedges.fetch_add(1, Relaxed);
    }
}
