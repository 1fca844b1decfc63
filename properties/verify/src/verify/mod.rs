//! `logprobe verify`: judge the outputs of another implementation, dumped
//! as safetensors ([`crate::dump`]), against the exact oracle.
//!
//! For every selected row, the oracle recomputes each candidate output
//! present (`log_probs`, `entropy`, `topk_log_probs`, `grad_logits`) from
//! the exact inputs, and the tolerance model ([`crate::tolerance`]) bounds
//! the error a correct implementation may make under the chosen summation
//! model. Each element's error is an upper bound on `|candidate - exact|`
//! over the oracle's enclosure
//! ([`Exact::error`](logprobe_reference::oracle::Exact::error)); it passes
//! when it is at most the bound. Rows run in parallel (rayon), one decoded
//! row of memory per thread.
//!
//! Verdicts per output and per file: `pass` (every element within its
//! bound), `FAIL` (some element beyond a finite bound, or a NaN / infinite
//! candidate where the exact value is finite), `no bound` (the model
//! certifies nothing, `n u >= 1`: never a pass). The report also gives, per
//! output, the tightest of `tree`, `lanes=8`, `sequential` that every
//! element satisfies, so the reader sees how far the candidate is from what
//! a better summation achieves.
//!
//! Files: `config` (what to check), `engine` (the judging),
//! `report` (what comes back), `table` (the text table), `expect`
//! (`--expect` and the exit status), `files` (a file, several, a
//! tensor-parallel set's files as one dump).

mod acc;
mod config;
mod engine;
mod expect;
pub(crate) mod files;
mod grad_screen;
mod linear_grads;
mod linear_logits;
mod reduced;
mod report;
mod row_setup;
mod table;
mod tiers;

// Shared with `compare`'s report (one convention for non-finite JSON and table figures).
pub(crate) use table::fmt_g;

pub use config::*;
pub use engine::*;
pub use expect::*;
pub use files::*;
pub use report::*;
pub use table::*;
