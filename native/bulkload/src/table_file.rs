//! A sorted table file (SST) written through RocksDB's C API, for a store to ingest whole: a bulk load's rows
//! skip the memtable, the write-ahead log and the compactions a write of them would cost.
//!
//! Its table options are the replica store's (`store_node/replica_store.py`, held to these by
//! `tests/unit/test_bulkload_table_file.py`): whole-key bloom filters of 10 bits
//! a key, LZ4-compressed blocks. Uncompressed files cost a restore 4.4 times the disk (the demo's 200-byte JSON
//! rows) for no measurable speed: the compression runs on the writing threads, beside the reading.

use std::ffi::{c_char, c_double, c_int, c_uchar, c_void, CStr, CString};
use std::path::Path;

#[allow(non_camel_case_types)]
type rocksdb_t = c_void;

const LZ4_COMPRESSION: c_int = 4;
const BLOOM_BITS_PER_KEY: c_double = 10.0;

#[link(name = "rocksdb")]
extern "C" {
    fn rocksdb_options_create() -> *mut rocksdb_t;
    fn rocksdb_options_destroy(options: *mut rocksdb_t);
    fn rocksdb_options_set_compression(options: *mut rocksdb_t, compression: c_int);
    fn rocksdb_options_set_block_based_table_factory(options: *mut rocksdb_t, table: *mut rocksdb_t);
    fn rocksdb_block_based_options_create() -> *mut rocksdb_t;
    fn rocksdb_block_based_options_destroy(table: *mut rocksdb_t);
    fn rocksdb_block_based_options_set_filter_policy(table: *mut rocksdb_t, policy: *mut rocksdb_t);
    fn rocksdb_block_based_options_set_whole_key_filtering(table: *mut rocksdb_t, whole_key: c_uchar);
    fn rocksdb_filterpolicy_create_bloom_full(bits_per_key: c_double) -> *mut rocksdb_t;
    fn rocksdb_envoptions_create() -> *mut rocksdb_t;
    fn rocksdb_envoptions_destroy(env: *mut rocksdb_t);
    fn rocksdb_sstfilewriter_create(env: *const rocksdb_t, options: *const rocksdb_t) -> *mut rocksdb_t;
    fn rocksdb_sstfilewriter_open(writer: *mut rocksdb_t, name: *const c_char, err: *mut *mut c_char);
    fn rocksdb_sstfilewriter_put(writer: *mut rocksdb_t, key: *const c_char, key_len: usize, value: *const c_char,
                                 value_len: usize, err: *mut *mut c_char);
    fn rocksdb_sstfilewriter_delete(writer: *mut rocksdb_t, key: *const c_char, key_len: usize, err: *mut *mut c_char);
    fn rocksdb_sstfilewriter_finish(writer: *mut rocksdb_t, err: *mut *mut c_char);
    fn rocksdb_sstfilewriter_destroy(writer: *mut rocksdb_t);
    fn rocksdb_free(ptr: *mut c_void);
}

/// RocksDB's status text, taken from an error out-parameter (and freed).
fn status(err: *mut c_char) -> Result<(), String> {
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: a NUL-terminated message RocksDB allocated for the caller to free.
    let text = unsafe { CStr::from_ptr(err) }.to_string_lossy().into_owned();
    unsafe { rocksdb_free(err as *mut c_void) };
    Err(text)
}

/// The options every table file is written with; made once per reader.
pub struct TableOptions {
    env: *mut rocksdb_t,
    options: *mut rocksdb_t,
    table: *mut rocksdb_t,
}

// The options are only read once made, by one writer at a time.
unsafe impl Send for TableOptions {}

impl TableOptions {
    pub fn new() -> Self {
        // SAFETY: constructors without arguments; the table options are copied into the options, the filter
        // policy is owned by the table options.
        unsafe {
            let table = rocksdb_block_based_options_create();
            rocksdb_block_based_options_set_filter_policy(table, rocksdb_filterpolicy_create_bloom_full(BLOOM_BITS_PER_KEY));
            rocksdb_block_based_options_set_whole_key_filtering(table, 1);
            let options = rocksdb_options_create();
            rocksdb_options_set_block_based_table_factory(options, table);
            rocksdb_options_set_compression(options, LZ4_COMPRESSION);
            TableOptions { env: rocksdb_envoptions_create(), options, table }
        }
    }

    /// Write ``rows`` (sorted by key, distinct; None: a delete) as the table file ``path``.
    pub fn write<'a>(&self, path: &Path, rows: impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)>) -> Result<(), String> {
        let name = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| "a path with a NUL byte".to_string())?;
        // SAFETY: a writer made from live options, used on this thread only and destroyed before returning; keys
        // and values are borrowed slices with their lengths.
        unsafe {
            let writer = rocksdb_sstfilewriter_create(self.env, self.options);
            let written = (|| {
                let mut err = std::ptr::null_mut();
                rocksdb_sstfilewriter_open(writer, name.as_ptr(), &mut err);
                status(err)?;
                for (key, value) in rows {
                    match value {
                        Some(value) => rocksdb_sstfilewriter_put(writer, key.as_ptr().cast(), key.len(),
                                                                 value.as_ptr().cast(), value.len(), &mut err),
                        None => rocksdb_sstfilewriter_delete(writer, key.as_ptr().cast(), key.len(), &mut err),
                    }
                    status(err)?;
                }
                rocksdb_sstfilewriter_finish(writer, &mut err);
                status(err)
            })();
            rocksdb_sstfilewriter_destroy(writer);
            written
        }
    }
}

impl Drop for TableOptions {
    fn drop(&mut self) {
        // SAFETY: made in new() and not used after this.
        unsafe {
            rocksdb_options_destroy(self.options);
            rocksdb_block_based_options_destroy(self.table);
            rocksdb_envoptions_destroy(self.env);
        }
    }
}
