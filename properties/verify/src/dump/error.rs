//! [`DumpError`]: every way a dump can be bad input, each naming the
//! tensor or metadata key (and row / column) at fault.

use std::path::PathBuf;

use logprobe_reference::spec::{Dtype, SpecError};

/// Bad input: a dump that cannot be verified. Every variant names the file's
/// tensor or metadata key at fault, and the row / column where one exists.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// The file could not be opened or mapped.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Not a well-formed safetensors file (bad header, truncated data,
    /// offsets that do not cover the file, sizes that overflow).
    #[error("not a valid safetensors file: {reason}")]
    Malformed {
        /// safetensors' description of the defect.
        reason: String,
    },
    /// A tensor the dump needs is absent.
    #[error("tensor `{tensor}` is missing{why}")]
    MissingTensor {
        /// The missing tensor.
        tensor: &'static str,
        /// Why it is needed (empty for `logits`).
        why: &'static str,
    },
    /// A tensor of a dtype the format does not allow for it.
    #[error("tensor `{tensor}` has dtype {found}, expected {expected}")]
    BadDtype {
        /// The tensor.
        tensor: &'static str,
        /// Its dtype, as safetensors names it.
        found: String,
        /// The dtypes allowed.
        expected: &'static str,
    },
    /// A tensor of the wrong shape (`N` and `V` come from `logits`, `K`
    /// from `topk_ids`).
    #[error("tensor `{tensor}` has shape {found:?}, expected {expected}")]
    BadShape {
        /// The tensor.
        tensor: &'static str,
        /// Its shape.
        found: Vec<usize>,
        /// The expected shape, e.g. `[N, V] = [8, 32000]`.
        expected: String,
    },
    /// A metadata value that does not parse or is out of range.
    #[error("metadata `{key}` = {value:?}: {reason}")]
    BadMetadata {
        /// The key.
        key: &'static str,
        /// The value as stored.
        value: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A `sampling_mask` byte that is neither 0 nor 1 (`bool` or `u8`).
    #[error("sampling_mask[{row}, {col}] is byte {value}, not 0 or 1")]
    BadMaskValue {
        /// Row index.
        row: usize,
        /// Column index.
        col: usize,
        /// The byte.
        value: u8,
    },
    /// An id (`tokens`, `topk_ids`) that does not fit an i64.
    #[error("{tensor}[{index}] = {value} does not fit an i64")]
    IdOverflow {
        /// The tensor.
        tensor: &'static str,
        /// Flat index.
        index: usize,
        /// The value.
        value: u64,
    },
    /// No candidate output (`log_probs`, `entropy`, `topk_log_probs`,
    /// `grad_logits`): nothing to verify.
    #[error(
        "no candidate to verify: the dump has none of log_probs, entropy, topk_log_probs, grad_logits (tensors: {tensors:?})"
    )]
    NoCandidate {
        /// The tensors the file holds.
        tensors: Vec<String>,
    },
    /// An unknown, version-2-only or not-yet-supported tensor name or
    /// metadata key ([`crate::names`]).
    #[error(transparent)]
    Name(#[from] crate::names::NameError),
    /// A tensor name or metadata key given twice in the header.
    #[error("{}", match .0 {
        crate::header::Repeated::Tensor(n) => format!("duplicate tensor `{n}` in the header"),
        crate::header::Repeated::MetaKey(k) => format!("duplicate metadata key `{k}` (repeated in __metadata__)"),
    })]
    Duplicate(crate::header::Repeated),
    /// Two tensors that are two forms of one input (`teacher_probs` and
    /// `teacher_log_probs`).
    #[error("tensors `{first}` and `{second}` are two forms of one input: give one")]
    TwoForms {
        /// The first.
        first: &'static str,
        /// The second.
        second: &'static str,
    },
    /// A NaN or infinite entry of a fused linear kernel's input
    /// (`hidden`, `lm_head_weight`, `lm_head_bias`).
    #[error("{tensor}{index:?} is {value}: the LM head's inputs must be finite")]
    NonFiniteInput {
        /// The tensor.
        tensor: &'static str,
        /// The entry's index (`[row, col]`, or `[col]` for the bias).
        index: Vec<usize>,
        /// The value.
        value: f64,
    },
    /// A logit `hidden[row] . lm_head_weight[col] (+ lm_head_bias[col])`
    /// beyond the largest finite value of `dtype`: f64 (the oracle's), or
    /// the accumulation dtype the kernel computes it in.
    #[error("the logit of hidden[{row}] and lm_head_weight[{col}] overflows {dtype}: the kernel cannot compute it")]
    LinearOverflow {
        /// The row of `hidden`.
        row: usize,
        /// The row of `lm_head_weight`.
        col: usize,
        /// The dtype it overflows.
        dtype: Dtype,
    },
    /// An output or option that cannot be judged from `hidden` and
    /// `lm_head_weight` (it depends on the kernel's logits to the bit).
    #[error("{what} cannot be checked from hidden and lm_head_weight (it depends on the kernel's logits to the bit, which a fused linear kernel does not give): dump logits instead")]
    LinearUnsupported {
        /// The output or option.
        what: &'static str,
    },
    /// A flag tensor (`row_mask`) byte other than 0 or 1.
    #[error("{tensor}[{index}] is byte {value}, not 0 or 1")]
    BadFlag {
        /// The tensor.
        tensor: &'static str,
        /// Flat index.
        index: usize,
        /// The byte.
        value: u8,
    },
    /// The path is a directory.
    #[error("{} is a directory, not a dump: give its files (e.g. {}/*.safetensors)", path.display(), path.display())]
    IsDirectory {
        /// The path.
        path: PathBuf,
    },
    /// A `--rows` selection that selects no row of the dump.
    #[error(
        "--rows {selection} selects no row of the dump's {rows} rows (nothing would be checked)"
    )]
    EmptySelection {
        /// The selection as given.
        selection: String,
        /// `N`.
        rows: usize,
    },
    /// A temperature the computation cannot use.
    #[error("metadata `temperature` = {value:?}: {reason}")]
    Temperature {
        /// The value as stored.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// `z = logits / temperature` overflows the dtype it is computed in.
    #[error("logits[{row}, {col}] / temperature = {logit:e} / {temperature:e} overflows {dtype}: z must be finite (temperature too small for these logits)")]
    ScaledOverflow {
        /// Row (flat).
        row: usize,
        /// Column.
        col: usize,
        /// The logit.
        logit: f64,
        /// The effective temperature.
        temperature: f64,
        /// The dtype z is materialised in.
        dtype: Dtype,
    },
    /// An error at row `(b, t)` of `[B, T, V]` logits.
    #[error("at (b, t) = ({b}, {t}): {source}")]
    AtPosition {
        /// Batch index.
        b: usize,
        /// Sequence index.
        t: usize,
        /// The error.
        source: Box<DumpError>,
    },
    /// Bad input as the problem's spec defines it (NaN / `+inf` logits,
    /// token out of range, masked or `-inf`, bad temperature, ...), with the
    /// row of the dump.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// A tensor-parallel set that cannot be assembled, or one rank's dump
    /// given alone ([`super::tp_set`]).
    #[error("tensor-parallel set: {0}")]
    TpSet(#[from] super::tp_set::TpSetError),
    /// A weights file that cannot be used ([`super::weights_file`]).
    #[error("LM head weights file: {0}")]
    WeightsFile(#[from] super::weights_file::WeightsFileError),
    /// The LM head's generator ([`super::weights_generator`]).
    #[error("generated LM head: {0}")]
    Generator(#[from] super::weights_generator::GeneratorError),
}
