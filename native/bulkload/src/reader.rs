//! Reading changelog partitions to their end with librdkafka's batch call, on a thread of its own that gathers
//! each partition's records until a chunk's worth; then, on one of the writing threads (a partition always on the
//! same one, so that its chunks keep their order), each record checked, the rows sorted, each key's rows applied by
//! the input position rule (`freshroute_records::position`: a replayed older row is not), and the latest applied row
//! of each key written as a table file of that partition's store, the positions they leave as a second one.

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;
use rdkafka::bindings;
use rdkafka::consumer::{BaseConsumer, Consumer};

use freshroute_records::position::applies;
use freshroute_records::{key_problem, value_problem, Format};
use crate::table_file::TableOptions;

/// Skipped records reported by offset in each chunk (all are counted).
const PROBLEMS_KEPT: usize = 10;
/// What a row costs beyond its bytes, for sizing chunks.
const ROW_OVERHEAD: usize = 32;
/// Messages taken from librdkafka's queue at once: its batch call costs a fraction of a poll per message.
const BATCH: usize = 1000;
/// How long one batch call waits for messages (the stop flag is looked at in between).
const BATCH_WAIT_MS: i32 = 10;
/// The header of a row's input position (`freshroute.input_position.HEADER`).
const POSITION_HEADER: &CStr = c"freshroute.position";

/// A partition's changes from where its previous chunk ended to ``next_offset``, as one table file.
#[pyclass(frozen, get_all, module = "freshroute_bulkload")]
pub struct Chunk {
    partition: i32,
    /// The offset after the last record read (skipped ones included).
    next_offset: i64,
    /// The partition's high watermark as its latest fetch response gave it (-1: not known yet).
    end_offset: i64,
    /// When the reader saw the partition's end (ms since the epoch), in its last chunk (-1 in the others).
    end_seen_ms: i64,
    /// Records read, skipped ones included.
    records: u64,
    /// Records skipped: a null key, or a key or value not of the table's formats.
    skipped: u64,
    /// The first skipped records of the chunk: (offset, why).
    problems: Vec<(i64, &'static str)>,
    /// Records not applied: a row whose input position does not cover the one held for its key (a replay's).
    superseded: u64,
    /// Records applied without an input position (a micro-batch pipeline's, or by hand).
    unpositioned: u64,
    /// Rows in the file: one per key, its latest change (a delete included).
    rows: usize,
    /// The table file, in the partition's directory (None: no rows).
    file: Option<PathBuf>,
    /// The input positions the rows leave their keys, as a table file of the store's positions (None: none changed).
    positions: Option<PathBuf>,
    /// The partition was read to its end: no chunk of it follows.
    last: bool,
}

/// Partitions no longer wanted: their records are passed over and their rows never written.
#[derive(Default)]
pub struct Dropped {
    partitions: Mutex<HashSet<i32>>,
    /// Bumped by each drop, so the reading thread looks at the set only when it changed.
    count: AtomicUsize,
}

impl Dropped {
    pub fn add(&self, partition: i32) {
        self.partitions.lock().unwrap().insert(partition);
        self.count.fetch_add(1, Ordering::SeqCst);
    }

    fn contains(&self, partition: i32) -> bool {
        self.partitions.lock().unwrap().contains(&partition)
    }
}

pub enum Item {
    Chunk(Chunk),
    Failed(String),
}

/// A row of a chunk: its key, value and input position in the chunk's bytes, one after another (``value_len`` None: a
/// delete; ``position_len`` None: no position header), and its offset.
#[derive(Clone, Copy)]
struct Row {
    at: usize,
    key_len: usize,
    value_len: Option<usize>,
    position_len: Option<usize>,
    offset: i64,
}

impl Row {
    fn key<'a>(&self, data: &'a [u8]) -> &'a [u8] {
        &data[self.at..self.at + self.key_len]
    }

    fn value<'a>(&self, data: &'a [u8]) -> Option<&'a [u8]> {
        let start = self.at + self.key_len;
        self.value_len.map(|len| &data[start..start + len])
    }

    fn position<'a>(&self, data: &'a [u8]) -> Option<&'a [u8]> {
        let start = self.at + self.key_len + self.value_len.unwrap_or(0);
        self.position_len.map(|len| &data[start..start + len])
    }
}

/// The input position held for each key of a partition whose applied row had one, across its chunks.
pub type HeldPositions = HashMap<Box<[u8]>, Box<[u8]>>;

/// One partition's rows read and not yet handed over. Their bytes go one after another into one buffer: a
/// record costs no allocation of its own (allocations contend with librdkafka's fetch thread for malloc's locks).
pub struct Pending {
    directory: PathBuf,
    next_offset: i64,
    records: u64,
    skipped: u64,
    problems: Vec<(i64, &'static str)>,
    data: Vec<u8>,
    rows: Vec<Row>,
    done: bool,
}

impl Pending {
    pub fn new(next_offset: i64, directory: PathBuf) -> Self {
        Pending { directory, next_offset, records: 0, skipped: 0, problems: Vec::new(), data: Vec::new(),
                  rows: Vec::new(), done: false }
    }

    fn push(&mut self, key: &[u8], value: Option<&[u8]>, position: Option<&[u8]>, offset: i64) {
        let at = self.data.len();
        self.data.extend_from_slice(key);
        self.data.extend_from_slice(value.unwrap_or_default());
        self.data.extend_from_slice(position.unwrap_or_default());
        self.rows.push(Row { at, key_len: key.len(), value_len: value.map(<[u8]>::len),
                             position_len: position.map(<[u8]>::len), offset });
    }

    fn bytes(&self) -> usize {
        self.data.len() + self.rows.len() * ROW_OVERHEAD
    }

    /// The rows so far and the counts since the last chunk, for the writer.
    fn take(&mut self, partition: i32, end_offset: i64, last: bool) -> Gathered {
        Gathered {
            chunk: Chunk {
                partition,
                next_offset: self.next_offset,
                end_offset,
                // An end-of-partition event comes with the fetch response that found the end: it was seen then.
                end_seen_ms: if last { now_ms() } else { -1 },
                records: std::mem::take(&mut self.records),
                skipped: std::mem::take(&mut self.skipped),
                problems: std::mem::take(&mut self.problems),
                superseded: 0,
                unpositioned: 0,
                rows: 0,
                file: None,
                positions: None,
                last,
            },
            directory: self.directory.clone(),
            data: std::mem::take(&mut self.data),
            rows: std::mem::take(&mut self.rows),
        }
    }
}

/// A partition's rows as read, on their way from the reading thread to a writing one: the chunk they will be,
/// its file not written yet.
pub struct Gathered {
    chunk: Chunk,
    directory: PathBuf,
    data: Vec<u8>,
    rows: Vec<Row>,
}

impl Gathered {
    /// The rows that pass the formats' checks, applied by the input position rule from what ``held`` holds for
    /// their partition, written as one table file — sorted by key, the latest applied change of each key — and the
    /// positions they leave as another.
    pub fn write(self, table: &TableOptions, key_format: Format, value_format: Format, held: &mut HeldPositions)
                 -> Result<Chunk, String> {
        let Gathered { mut chunk, directory, data, mut rows } = self;
        rows.retain(|row| {
            match key_problem(key_format, Some(row.key(&data))).or_else(|| value_problem(value_format, row.value(&data))) {
                None => true,
                Some(problem) => {
                    chunk.skipped += 1;
                    chunk.problems.push((row.offset, problem));
                    false
                }
            }
        });
        chunk.problems.sort_by_key(|&(offset, _)| offset);
        chunk.problems.truncate(PROBLEMS_KEPT);
        // By key, then by place in the changelog: each key's rows in the order the tailer would apply them.
        rows.sort_unstable_by(|a, b| a.key(&data).cmp(b.key(&data)).then(a.at.cmp(&b.at)));
        let mut settled: Vec<Row> = Vec::with_capacity(rows.len());
        let mut moved: Vec<(&[u8], Option<&[u8]>)> = Vec::new();
        for same_key in rows.chunk_by(|a, b| a.key(&data) == b.key(&data)) {
            let key = same_key[0].key(&data);
            let before = held.get(key).map(|p| &p[..]);
            let mut now = before;
            // Where the key's position now comes from, when a row moved it: a row's own, or none (forgotten).
            let mut moved_by: Option<Option<Row>> = None;
            let mut latest = None;
            for row in same_key {
                let raw = row.position(&data);
                let Some(after) = applies(now, raw, row.value_len.is_none()) else {
                    chunk.superseded += 1;
                    continue;
                };
                let own = matches!((after, raw), (Some(a), Some(r)) if std::ptr::eq(a, r));
                if !own {
                    chunk.unpositioned += 1;
                }
                if own || after.is_none() {
                    moved_by = Some(own.then_some(*row));
                }
                now = after;
                latest = Some(*row);
            }
            settled.extend(latest);
            if let Some(by) = moved_by {
                let position = by.and_then(|row| row.position(&data));
                if position != before {
                    moved.push((key, position));
                }
            }
        }
        chunk.rows = settled.len();
        if !settled.is_empty() {
            let path = directory.join(format!("load-{}.sst", chunk.next_offset));
            table
                .write(&path, settled.iter().map(|row| (row.key(&data), row.value(&data))))
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            chunk.file = Some(path);
        }
        if !moved.is_empty() {
            let path = directory.join(format!("load-{}.positions.sst", chunk.next_offset));
            table.write(&path, moved.iter().copied()).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            chunk.positions = Some(path);
            for (key, position) in moved {
                match position {
                    Some(position) => held.insert(key.into(), position.into()),
                    None => held.remove(key),
                };
            }
        }
        Ok(chunk)
    }
}

/// Writes what the reading thread gathered, in order, and hands each chunk on.
pub fn write_all(gathered: Receiver<Gathered>, chunks: SyncSender<Item>, stop: Arc<AtomicBool>, dropped: Arc<Dropped>,
                 key_format: Format, value_format: Format) {
    let table = TableOptions::new();
    // A partition's chunks all come to one writer: what its earlier ones applied is here for its later ones.
    let mut held: HashMap<i32, HeldPositions> = HashMap::new();
    for g in gathered {
        let partition = g.chunk.partition;
        if dropped.contains(partition) {
            held.remove(&partition);
            continue;
        }
        let item = match g.write(&table, key_format, value_format, held.entry(partition).or_default()) {
            Ok(taken) => Item::Chunk(taken),
            Err(why) => Item::Failed(why),
        };
        let failed = matches!(item, Item::Failed(_));
        if !send(&chunks, item, &stop) || failed {
            return;
        }
    }
}

/// Send ``item``, waiting while the queue is full; false if the receiver is gone or reading was stopped.
fn send<T>(to: &SyncSender<T>, mut item: T, stop: &AtomicBool) -> bool {
    loop {
        match to.try_send(item) {
            Ok(()) => return true,
            Err(TrySendError::Disconnected(_)) => return false,
            Err(TrySendError::Full(back)) => {
                if stop.load(Ordering::SeqCst) {
                    return false;
                }
                item = back;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

pub struct Reading {
    pub consumer: BaseConsumer,
    pub topic: CString,
    pub pending: HashMap<i32, Pending>,
    /// The most rows a reader holds, in bytes: past it, the partition holding the most is handed over.
    pub chunk_bytes: usize,
    /// What the partitions hold now, in bytes.
    pub held: usize,
    /// To the writing threads: partition p's rows to writer p % n.
    pub writers: Vec<SyncSender<Gathered>>,
    /// Failures, straight to Python.
    pub chunks: SyncSender<Item>,
    pub stop: Arc<AtomicBool>,
    pub dropped: Arc<Dropped>,
    /// The drops seen so far.
    pub drops_seen: usize,
    /// Partitions not read to their end yet.
    pub open: usize,
}

impl Reading {
    pub fn run(mut self) {
        // SAFETY: the consumer's own queue, released below before the consumer itself.
        let queue = unsafe { bindings::rd_kafka_queue_get_consumer(self.consumer.client().native_ptr()) };
        let mut batch: Vec<*mut bindings::rd_kafka_message_t> = vec![std::ptr::null_mut(); BATCH];
        'reading: while self.open > 0 && !self.stopped() {
            self.pass_over_dropped();
            // SAFETY: room for BATCH message pointers; each one returned is destroyed below.
            let n = unsafe { bindings::rd_kafka_consume_batch_queue(queue, BATCH_WAIT_MS, batch.as_mut_ptr(), BATCH) };
            let taken = usize::try_from(n).unwrap_or(0);
            for (i, &message) in batch[..taken].iter().enumerate() {
                // SAFETY: a message librdkafka handed over, destroyed only after this.
                let m = unsafe { &*message };
                let going_on = if m.err == bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                    self.record(m)
                } else if m.err == bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__PARTITION_EOF {
                    self.end_of(m.partition)
                } else {
                    let _ = self.chunks.send(Item::Failed(error_text(m)));
                    false
                };
                if !going_on {
                    for &rest in &batch[i..taken] {
                        unsafe { bindings::rd_kafka_message_destroy(rest) };
                    }
                    break 'reading;
                }
                unsafe { bindings::rd_kafka_message_destroy(message) };
            }
        }
        unsafe { bindings::rd_kafka_queue_destroy(queue) };
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Take one record; false if reading ends (stopped, or a table file could not be written).
    fn record(&mut self, m: &bindings::rd_kafka_message_t) -> bool {
        let partition = m.partition;
        let Some(p) = self.pending.get_mut(&partition) else { return true };
        if p.done || m.offset < p.next_offset {
            return true;
        }
        // SAFETY: librdkafka's key and payload pointers with their lengths (NULL: absent), alive with the message.
        let key = unsafe { bytes_of(m.key as *const u8, m.key_len) };
        let value = unsafe { bytes_of(m.payload as *const u8, m.len) };
        p.next_offset = m.offset + 1;
        p.records += 1;
        match key {
            // The formats' checks are the writer's; a record without a key has nothing to check.
            None => {
                p.skipped += 1;
                if p.problems.len() < PROBLEMS_KEPT {
                    p.problems.push((m.offset, "null key"));
                }
            }
            Some(key) => {
                let before = p.bytes();
                p.push(key, value, unsafe { position_of(m) }, m.offset);
                self.held += p.bytes() - before;
            }
        }
        if self.held < self.chunk_bytes {
            return true;
        }
        let fullest = self.pending.iter().max_by_key(|(_, p)| p.bytes()).map(|(&partition, _)| partition);
        fullest.map_or(true, |partition| self.hand_over(partition, false))
    }

    /// A partition read to its end: its last chunk.
    fn end_of(&mut self, partition: i32) -> bool {
        match self.pending.get_mut(&partition) {
            Some(p) if !p.done => p.done = true,
            _ => return true,
        }
        self.open -= 1;
        self.hand_over(partition, true)
    }

    /// Forget the partitions dropped since the last look: done, their rows let go.
    fn pass_over_dropped(&mut self) {
        let drops = self.dropped.count.load(Ordering::SeqCst);
        if drops == self.drops_seen {
            return;
        }
        self.drops_seen = drops;
        let dropped = self.dropped.partitions.lock().unwrap().clone();
        for partition in dropped {
            if let Some(p) = self.pending.get_mut(&partition) {
                if !p.done {
                    p.done = true;
                    self.open -= 1;
                    self.held -= p.bytes();
                    p.data = Vec::new();
                    p.rows = Vec::new();
                }
            }
        }
    }

    /// Send ``partition``'s rows to the writing thread, waiting while it is busy; false if reading ends.
    fn hand_over(&mut self, partition: i32, last: bool) -> bool {
        let end_offset = self.high_watermark(partition);
        let pending = self.pending.get_mut(&partition).expect("a pending partition");
        self.held -= pending.bytes();
        let gathered = pending.take(partition, end_offset, last);
        let writer = &self.writers[partition.unsigned_abs() as usize % self.writers.len()];
        send(writer, gathered, &self.stop)
    }

    /// The high watermark of the partition's latest fetch response, without asking the broker (-1: none yet).
    fn high_watermark(&self, partition: i32) -> i64 {
        let (mut low, mut high) = (-1i64, -1i64);
        // SAFETY: a live client handle, a NUL-terminated topic name and two out-parameters, as the C API asks.
        let err = unsafe {
            bindings::rd_kafka_get_watermark_offsets(self.consumer.client().native_ptr(), self.topic.as_ptr(),
                                                     partition, &mut low, &mut high)
        };
        if err == bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR { high } else { -1 }
    }
}

fn now_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

unsafe fn bytes_of<'a>(ptr: *const u8, len: usize) -> Option<&'a [u8]> {
    if ptr.is_null() {
        None
    } else {
        Some(std::slice::from_raw_parts(ptr, len))
    }
}

/// The bytes of a message's input position header (its first), or None: no such header, or one without a value.
///
/// # Safety
/// ``m`` is a message librdkafka handed over and has not destroyed; the bytes live as long as it does.
unsafe fn position_of<'a>(m: &bindings::rd_kafka_message_t) -> Option<&'a [u8]> {
    let mut headers = std::ptr::null_mut();
    if bindings::rd_kafka_message_headers(m, &mut headers) != bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        return None; // none at all
    }
    let (mut value, mut size) = (std::ptr::null(), 0usize);
    let found = bindings::rd_kafka_header_get(headers, 0, POSITION_HEADER.as_ptr(), &mut value, &mut size);
    if found != bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        return None;
    }
    bytes_of(value as *const u8, size)
}

fn error_text(m: &bindings::rd_kafka_message_t) -> String {
    // SAFETY: librdkafka's static error name; an error message's payload, if any, is its text.
    let name = unsafe { CStr::from_ptr(bindings::rd_kafka_err2str(m.err)) }.to_string_lossy().into_owned();
    match unsafe { bytes_of(m.payload as *const u8, m.len) } {
        Some(text) if !text.is_empty() => format!("partition {}: {name}: {}", m.partition, String::from_utf8_lossy(text)),
        _ => format!("partition {}: {name}", m.partition),
    }
}
