//! The problem's vocabulary, shared by the oracle, every kernel and the
//! verifier: dtypes, input views, options, cotangents, typed errors and
//! input validation. Plain Rust: no MPFR here.

mod dtype;
mod error;
mod problem;

pub use dtype::{pow2, Dtype, Element};
pub use error::SpecError;
pub use problem::{
    Cotangents, EntropyLogits, Logits, LogitsMut, Options, Problem, Shape, TemperatureDtype,
    DEFAULT_IGNORE_INDEX,
};
