//! The routing view the Python control plane pushes at every metadata refresh (router/data_plane.py writes it):
//! the tables this path serves and every replica's latest known lag, swapped in whole.

use std::collections::{HashMap, HashSet};

use serde::Deserialize;

/// A replica's state as its node reports it; `Unreported` (the assignment names it, no heartbeat does) cannot serve.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum State {
    Unreported,
    Restoring,
    Active,
    Standby,
    Failed,
}

#[derive(Clone, Debug)]
pub struct Replica {
    pub node: String,
    pub read_address: Option<String>,
    pub active: bool,
    pub state: State,
    pub applied: i64,
    pub end: Option<i64>,
    pub staleness_ms: i64,
    pub observed_ms: i64,
    pub alive: bool,
    pub draining: bool,
}

/// Where the pipeline is in a table's input and where that input ends (freshroute.metadata.progress).
#[derive(Clone, Debug, Deserialize)]
pub struct InputLag {
    pub records: i64,
    pub caught_up_ms: i64,
    pub at_ms: i64,
    pub alive_ms: i64,
    pub offsets: HashMap<i32, i64>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct InputEnds {
    pub at_ms: i64,
    pub ends: HashMap<i32, i64>,
}

/// Where a table's changelog ended once its query had processed its input up to `input` (partition → next offset):
/// a replica that applied `changelog` reflects every input record before it (freshroute.metadata.progress.InputMark).
#[derive(Clone, Debug, Deserialize)]
pub struct Mark {
    pub input: HashMap<i32, i64>,
    pub changelog: HashMap<i32, i64>,
}

pub const PIPELINE_EXPIRY_MS: i64 = 3000;
pub const INPUT_ENDS_TRUST_MS: i64 = 3000;

/// A windowed table's windows (freshroute.windows.WindowSpec), in milliseconds.
#[derive(Clone, Copy, Debug, Deserialize)]
pub struct WindowSpec {
    pub size_ms: i64,
    pub slide_ms: i64,
    pub retention_ms: i64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ValueFormat {
    Json,
    Text,
    Bytes,
}

#[derive(Debug)]
pub struct Table {
    /// Keyed, with string keys: its key lookups are answered here (others go to the Python path).
    pub served: bool,
    /// Windowed, with string keys: its keys' windows are answered here.
    pub window: Option<WindowSpec>,
    /// Versioned: how long it keeps a key's versions, which as-of reads are answered within.
    pub history_retention_ms: Option<i64>,
    pub value_format: ValueFormat,
    /// The table's default bound (the router's per-table override, else the pipeline's).
    pub max_lag: Option<i64>,
    pub max_staleness_ms: Option<i64>,
    pub input_lag: Option<InputLag>,
    pub input_ends: Option<InputEnds>,
    /// Replicas by partition, the active one first.
    pub partitions: Vec<Vec<Replica>>,
    /// The table's version read by its name (freshroute.metadata.table_versions), which every answer names.
    pub version: i32,
    /// That version's own table (`t-v2`; the table's name for version 1): what store reads and positions name.
    pub physical: String,
    /// The topic its pipeline reads, and its changelog's: what a write token's events name.
    pub input_topic: Option<String>,
    pub changelog_topic: Option<String>,
    /// Its latest marks, oldest first, and the input records the pipeline rejected (partition → offsets).
    pub marks: Vec<Mark>,
    pub rejected: HashMap<i32, HashSet<i64>>,
}

impl Table {
    /// (records, ms) the table's changelog is behind its input at `now`: freshroute.metadata.progress.input_lag_at.
    pub fn input_lag_at(&self, now: i64) -> (i64, i64) {
        let Some(lag) = &self.input_lag else { return (0, 0) };
        let alive = now - lag.alive_ms <= PIPELINE_EXPIRY_MS;
        let records = match &self.input_ends {
            Some(ends) if !lag.offsets.is_empty() && now - ends.at_ms <= INPUT_ENDS_TRUST_MS => ends
                .ends
                .iter()
                .map(|(p, end)| (end - lag.offsets.get(p).copied().unwrap_or(0)).max(0))
                .sum::<i64>(),
            _ if alive => {
                let ms = if lag.records != 0 { (now - lag.caught_up_ms).max(0) } else { 0 };
                return (lag.records, ms);
            }
            _ => return (lag.records, (now - lag.caught_up_ms).max(0)),
        };
        if records != 0 { (records, (now - lag.caught_up_ms).max(0)) } else { (0, 0) }
    }
}

#[derive(Default, Debug)]
pub struct Snapshot {
    pub tables: HashMap<String, Table>,
    pub built_ms: i64,
}

// ---- the pushed document -------------------------------------------------------------------------------------

#[derive(Deserialize)]
struct TableDoc {
    partitions: usize,
    served: bool,
    window: Option<WindowSpec>,
    history_retention_ms: Option<i64>,
    value_format: String,
    max_lag: Option<i64>,
    max_staleness_ms: Option<i64>,
    input_lag: Option<InputLag>,
    input_ends: Option<InputEnds>,
    /// A view written before tables had versions names none: the table as it always was.
    #[serde(default = "first_version")]
    version: i32,
    /// None in a view written before versions other than 1 were served here: the table's name.
    physical: Option<String>,
    /// None in a view written before write tokens were read here (a read after one goes to the Python path).
    #[serde(default)]
    input_topic: Option<String>,
    #[serde(default)]
    changelog_topic: Option<String>,
    /// (input, changelog) of each mark.
    #[serde(default)]
    marks: Vec<(HashMap<i32, i64>, HashMap<i32, i64>)>,
    #[serde(default)]
    rejected: HashMap<i32, HashSet<i64>>,
}

fn first_version() -> i32 {
    1
}

/// (node, read address, role, state, applied, end, staleness ms, observed ms, alive, draining)
type ReplicaDoc = (String, Option<String>, String, Option<String>, i64, Option<i64>, i64, i64, bool, bool);

#[derive(Deserialize)]
struct SnapshotDoc {
    tables: HashMap<String, TableDoc>,
    replicas: Vec<(String, usize, Vec<ReplicaDoc>)>,
    built_ms: i64,
}

impl Snapshot {
    pub fn parse(doc: &[u8]) -> Result<Snapshot, String> {
        let doc: SnapshotDoc = serde_json::from_slice(doc).map_err(|e| format!("routing snapshot: {e}"))?;
        let mut tables = HashMap::with_capacity(doc.tables.len());
        for (name, t) in doc.tables {
            let value_format = match t.value_format.as_str() {
                "json" => ValueFormat::Json,
                "string" => ValueFormat::Text,
                "bytes" => ValueFormat::Bytes,
                other => return Err(format!("routing snapshot: table {name}: value format {other:?}")),
            };
            let physical = t.physical.unwrap_or_else(|| name.clone());
            tables.insert(name, Table {
                served: t.served,
                window: t.window.filter(|w| w.size_ms > 0 && w.slide_ms > 0 && w.retention_ms >= 0),
                history_retention_ms: t.history_retention_ms.filter(|&ms| ms > 0),
                value_format,
                max_lag: t.max_lag,
                max_staleness_ms: t.max_staleness_ms,
                input_lag: t.input_lag,
                input_ends: t.input_ends,
                partitions: vec![Vec::new(); t.partitions],
                version: t.version,
                physical,
                input_topic: t.input_topic,
                changelog_topic: t.changelog_topic,
                marks: t.marks.into_iter().map(|(input, changelog)| Mark { input, changelog }).collect(),
                rejected: t.rejected,
            });
        }
        for (table, partition, replicas) in doc.replicas {
            let Some(t) = tables.get_mut(&table) else { continue };
            let Some(slot) = t.partitions.get_mut(partition) else { continue };
            for (node, read_address, role, state, applied, end, staleness_ms, observed_ms, alive, draining) in replicas {
                let state = match state.as_deref() {
                    None => State::Unreported,
                    Some("RESTORING") => State::Restoring,
                    Some("ACTIVE") => State::Active,
                    Some("STANDBY") => State::Standby,
                    Some(_) => State::Failed,
                };
                slot.push(Replica { node, read_address, active: role == "active", state, applied, end, staleness_ms,
                                    observed_ms, alive, draining });
            }
        }
        Ok(Snapshot { tables, built_ms: doc.built_ms })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tables_version_is_read_and_is_1_where_the_view_names_none() {
        let table = serde_json::json!({"partitions": 1, "served": true, "window": null, "history_retention_ms": null,
                                       "value_format": "json", "max_lag": null, "max_staleness_ms": null,
                                       "input_lag": null, "input_ends": null});
        let mut third = table.clone();
        third["version"] = 3.into();
        let doc = serde_json::json!({"tables": {"a": table, "b": third}, "replicas": [], "built_ms": 0});
        let snap = Snapshot::parse(doc.to_string().as_bytes()).unwrap();
        assert_eq!((snap.tables["a"].version, snap.tables["b"].version), (1, 3));
    }

    #[test]
    fn a_table_is_read_from_its_served_versions_own_table_and_from_its_own_name_where_the_view_names_none() {
        let table = serde_json::json!({"partitions": 1, "served": true, "window": null, "history_retention_ms": null,
                                       "value_format": "json", "max_lag": null, "max_staleness_ms": null,
                                       "input_lag": null, "input_ends": null, "version": 1});
        let mut second = table.clone();
        second["version"] = 2.into();
        second["physical"] = "b-v2".into();
        let replica = serde_json::json!(["n1", "127.0.0.1:7100", "active", "ACTIVE", 4, 4, 0, 0, true, false]);
        let doc = serde_json::json!({"tables": {"a": table, "b": second}, "replicas": [["b", 0, [replica]]],
                                     "built_ms": 0});
        let snap = Snapshot::parse(doc.to_string().as_bytes()).unwrap();
        assert_eq!((snap.tables["a"].physical.as_str(), snap.tables["b"].physical.as_str()), ("a", "b-v2"));
        // The served version's replicas, listed under the table's name, are the ones its reads go to.
        assert_eq!(snap.tables["b"].partitions[0].iter().map(|r| r.node.as_str()).collect::<Vec<_>>(), ["n1"]);
    }
}
