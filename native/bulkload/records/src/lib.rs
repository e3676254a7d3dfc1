//! What the bulk restore reader shares with the store node's Python, word for word, each held to it by a corpus
//! under `tests/data/`: the record checks of `freshroute.formats` and the input position rule of
//! `freshroute.input_position`. No Python and no Kafka here, so that the tests build in seconds.

#[cfg(test)]
mod corpus;
mod formats;
pub mod position;

pub use formats::{key_problem, value_problem, Format};
