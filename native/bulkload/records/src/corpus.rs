//! The shared corpora under `tests/data/`, for the tests that hold this crate to the Python it mirrors.

use serde_json::Value;

/// The corpus file ``name``, read where cargo runs the test from when it runs: a build kept in a shared target
/// directory may have been made in another checkout.
pub fn corpus(name: &str) -> Value {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    serde_json::from_slice(&std::fs::read(format!("{dir}/../../../tests/data/{name}")).unwrap()).unwrap()
}

/// Bytes the corpus writes in hex.
pub fn unhex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}

/// A corpus value's bytes (None: a JSON null — a null key, a tombstone, no header).
pub fn bytes(value: &Value) -> Option<Vec<u8>> {
    value.as_str().map(unhex)
}
