//! The dump reader: one safetensors file holding the inputs of a log-prob /
//! entropy / top-k computation and the outputs another implementation
//! produced for them (format: `docs/dump-from-pytorch.md`).
//!
//! [`DumpFile::open`] reads the file (a FIFO or pipe as a bounded stream);
//! [`DumpFile::parse`] checks the header, every tensor's dtype and shape
//! against `logits [N, V]` (`V >= 1`, so `N` is bounded by the file's
//! bytes before anything `N`-sized is allocated), the metadata, and that
//! there is something to verify, and returns a typed [`Dump`]. Only `[N]`-
//! and `[N, K]`-sized tensors are decoded eagerly; `[N, V]` tensors
//! (`logits`, `sampling_mask`, `grad_logits`) stay in the file's bytes and
//! are decoded one row at a time ([`Dump::row`]), so a dump of 64K x 152K
//! logits costs its bytes plus one row of memory per thread, and a header
//! that declares `N = 0` with a huge `V` allocates nothing `V`-sized.
//!
//! Every allocation is justified by the file: the safetensors header is
//! checked (offsets cover the file exactly, `prod(shape) * size(dtype)` equals
//! each tensor's byte length, with overflow checks) before anything is
//! decoded. Malformed, truncated or inconsistent files give a [`DumpError`]
//! naming the tensor (and row / column for value errors), never a panic.
//!
//! Files: `error`, `file` (the bytes), `tensors` (row-by-row
//! decoding), `reader` (the [`Dump`] and its checks), `parts` (its tensor
//! groups), `options` (its metadata), `row` (one row's
//! inputs), `source` (the tensors by name, from a file or from memory),
//! `tp_set` (one tensor-parallel rank's dump per file, read as one),
//! `weights_file` (the LM head in a file of its own), `weights_generator`
//! (the LM head generated from a seed), `writer`.

mod error;
mod file;
mod linear;
mod options;
mod parts;
mod reader;
mod row;
mod source;
mod tensors;
pub mod tp_set;
pub mod weights_file;
pub mod weights_generator;
mod writer;

pub use error::*;
pub use file::*;
pub use linear::*;
pub use reader::*;
pub use row::*;
pub(crate) use source::{malformed, Header, Source};
pub use tensors::*;
pub use writer::*;
