//! A store node's bulk restore reader: changelog partitions read to their end by librdkafka on threads of their
//! own (one reading, two writing), each record checked against the table's formats, and each partition's rows
//! written, a chunk at a time, as sorted table files (one row per key: its latest change) that the partition's
//! RocksDB ingests whole.
//!
//! A restore applied record by record in Python spends most of its time creating a message object per record
//! and calling into it and into RocksDB; here the interpreter sees one call per chunk.

mod reader;
mod table_file;

use std::collections::HashMap;
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use freshroute_records::{key_problem, value_problem, Format};
use reader::{write_all, Chunk, Dropped, Item, Pending, Reading};

/// Threads that check, sort and write chunks: with the reading thread and librdkafka's, they keep two cores busy.
const WRITERS: usize = 2;

create_exception!(freshroute_bulkload, ReadFailed, PyRuntimeError, "The changelog could not be read, or a table file not written.");

/// Reads ``partitions`` of ``topic`` from the given offsets to their ends, on threads of its own.
#[pyclass(module = "freshroute_bulkload")]
struct ChangelogReader {
    receiver: Mutex<Receiver<Item>>,
    stop: Arc<AtomicBool>,
    dropped: Arc<Dropped>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// The nice value of the reader's threads, librdkafka's among them: a lookup on the node's other threads is
/// scheduled before them, so a restore takes the cores the node's reads leave.
const RESTORE_NICENESS: i32 = 10;

fn spawn<T: Send + 'static>(name: &str, run: impl FnOnce() -> T + Send + 'static) -> PyResult<JoinHandle<T>> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            // SAFETY: sets this thread's own scheduling priority (Linux: a thread id is a PRIO_PROCESS target);
            // lowering one's priority needs no privilege, and a refusal leaves the thread as it was.
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, RESTORE_NICENESS);
            }
            run()
        })
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start a thread: {e}")))
}

#[pymethods]
impl ChangelogReader {
    /// ``config``: librdkafka settings (strings). ``partitions``: (partition, first offset — 0: the start —,
    /// directory its table files go to). The reader holds at most ``chunk_bytes`` of rows (the fullest partition's
    /// are written when it would hold more); at most ``queued`` chunks wait to be taken.
    #[new]
    #[pyo3(signature = (config, topic, partitions, key_format, value_format, chunk_bytes = 128 << 20, queued = 2))]
    fn new(
        config: HashMap<String, String>,
        topic: String,
        partitions: Vec<(i32, i64, PathBuf)>,
        key_format: &str,
        value_format: &str,
        chunk_bytes: usize,
        queued: usize,
    ) -> PyResult<Self> {
        let (key_format, value_format) = (parse_format(key_format)?, parse_format(value_format)?);
        let mut client = ClientConfig::new();
        for (k, v) in &config {
            client.set(k, v);
        }
        let mut assignment = TopicPartitionList::new();
        for (partition, offset, _) in &partitions {
            let at = if *offset > 0 { Offset::Offset(*offset) } else { Offset::Beginning };
            assignment
                .add_partition_offset(&topic, *partition, at)
                .map_err(|e| PyValueError::new_err(format!("partition {partition}: {e}")))?;
        }
        // Made on a thread of the reader's priority: librdkafka's own threads (the fetching ones) take it from there.
        let consumer = spawn("bulkload-start", move || -> PyResult<BaseConsumer> {
            let consumer: BaseConsumer =
                client.create().map_err(|e| PyValueError::new_err(format!("cannot create the consumer: {e}")))?;
            consumer.assign(&assignment).map_err(|e| ReadFailed::new_err(format!("cannot assign: {e}")))?;
            Ok(consumer)
        })?
        .join()
        .map_err(|_| PyRuntimeError::new_err("the reader's start failed"))??;
        let (chunks, receiver) = sync_channel(queued.max(1));
        let mut threads = Vec::new();
        let mut writers = Vec::new();
        let stop = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(Dropped::default());
        let open = partitions.len();
        for _ in 0..WRITERS.min(partitions.len()).max(1) {
            let (writer, to_write) = sync_channel(1);
            let (chunks, stop, dropped) = (chunks.clone(), stop.clone(), dropped.clone());
            threads.push(spawn("bulkload-writer", move || {
                write_all(to_write, chunks, stop, dropped, key_format, value_format)
            })?);
            writers.push(writer);
        }
        let reading = Reading {
            consumer,
            topic: CString::new(topic).map_err(|_| PyValueError::new_err("topic holds a NUL byte"))?,
            pending: partitions.into_iter().map(|(p, o, dir)| (p, Pending::new(o, dir))).collect(),
            chunk_bytes,
            held: 0,
            writers,
            chunks,
            stop: stop.clone(),
            dropped: dropped.clone(),
            drops_seen: 0,
            open,
        };
        threads.push(spawn("bulkload-reader", move || reading.run())?);
        Ok(ChangelogReader { receiver: Mutex::new(receiver), stop, dropped, threads: Mutex::new(threads) })
    }

    /// The next chunk, waiting at most ``timeout_s``; None if none came, or every partition was read to its end.
    /// Raises ReadFailed if the changelog cannot be read or a file written (the reader has then stopped).
    fn next_chunk(&self, py: Python<'_>, timeout_s: f64) -> PyResult<Option<Chunk>> {
        let wait = Duration::from_secs_f64(timeout_s.max(0.0));
        let item = py.allow_threads(|| self.receiver.lock().unwrap().recv_timeout(wait));
        match item {
            Ok(Item::Chunk(chunk)) => Ok(Some(chunk)),
            Ok(Item::Failed(why)) => Err(ReadFailed::new_err(why)),
            Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => Ok(None),
        }
    }

    /// Stop reading ``partition``: its records are passed over and no file of it is written from now on (a chunk
    /// already written may still come).
    fn drop_partition(&self, partition: i32) {
        self.dropped.add(partition);
    }

    /// Stop reading and release the consumer. Files of chunks not taken stay where they are.
    fn close(&self, py: Python<'_>) {
        self.stop.store(true, Ordering::SeqCst);
        let threads = std::mem::take(&mut *self.threads.lock().unwrap());
        py.allow_threads(|| threads.into_iter().for_each(|t| drop(t.join())));
    }
}

impl Drop for ChangelogReader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        std::mem::take(&mut *self.threads.lock().unwrap()).into_iter().for_each(|t| drop(t.join()));
    }
}

fn parse_format(name: &str) -> PyResult<Format> {
    Format::parse(name).map_err(PyValueError::new_err)
}

/// Why a record (``key``, ``value``) is skipped under the formats, or None: the reader's checks, for tests.
#[pyfunction]
#[pyo3(signature = (key_format, value_format, key, value))]
fn problem(key_format: &str, value_format: &str, key: Option<&[u8]>, value: Option<&[u8]>) -> PyResult<Option<&'static str>> {
    let (key_format, value_format) = (parse_format(key_format)?, parse_format(value_format)?);
    Ok(key_problem(key_format, key).or_else(|| value_problem(value_format, value)))
}

#[pymodule]
fn freshroute_bulkload(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ChangelogReader>()?;
    m.add_class::<Chunk>()?;
    m.add("ReadFailed", m.py().get_type::<ReadFailed>())?;
    m.add_function(wrap_pyfunction!(problem, m)?)?;
    Ok(())
}
