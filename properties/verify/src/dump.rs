//! The dump reader: one safetensors file holding the inputs of a log-prob /
//! entropy / top-k computation and the outputs another implementation
//! produced for them (format: `shared/cases/README.md`, restated in
//! `docs/dump-from-pytorch.md`).
//!
//! [`DumpFile::open`] memory-maps the file; [`DumpFile::parse`] checks the
//! header, every tensor's dtype and shape against `logits [N, V]`, the
//! metadata, and that there is something to verify, and returns a typed
//! [`Dump`]. Only `[N]`- and `[N, K]`-sized tensors are decoded eagerly;
//! `[N, V]` tensors (`logits`, `sampling_mask`, `grad_logits`) stay in the
//! mapping and are decoded one row at a time ([`Dump::row`]), so a dump of
//! 64K x 152K logits costs one row of memory per thread, and a header that
//! declares `N = 0` with a huge `V` allocates nothing `V`-sized.
//!
//! Every allocation is justified by the file: the safetensors header is
//! checked (offsets cover the file exactly, `prod(shape) * size(dtype)` equals
//! each tensor's byte length, with overflow checks) before anything is
//! decoded. Malformed, truncated or inconsistent files give a [`DumpError`]
//! naming the tensor (and row / column for value errors), never a panic.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use ndarray::{Array1, Array2};
use safetensors::{Dtype as StDtype, SafeTensors};

use logprobe_reference::spec::{
    Columns, Cotangents, Dtype, EntropyLogits, Logits, Options, Output, PerOutput, Problem,
    SpecError, TemperatureDtype, DEFAULT_IGNORE_INDEX,
};

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
}

/// The bytes of one dump: a read-only memory map of the file, or an owned
/// buffer (tests, generated dumps).
pub struct DumpFile {
    bytes: Bytes,
    path: Option<PathBuf>,
}

enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl DumpFile {
    /// Memory-maps `path` read-only.
    ///
    /// # Errors
    /// [`DumpError::Io`] when the file cannot be opened or mapped.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, DumpError> {
        let path = path.as_ref().to_path_buf();
        let io = |source| DumpError::Io {
            path: path.clone(),
            source,
        };
        if path.is_dir() {
            return Err(DumpError::IsDirectory { path });
        }
        let file = File::open(&path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        // A zero-length mapping is an error on some platforms: keep it owned.
        let bytes = if len == 0 {
            Bytes::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only; a file truncated or rewritten by
            // another process while we read it is outside this tool's
            // contract (as for every mmap-based safetensors reader).
            Bytes::Mapped(unsafe { memmap2::Mmap::map(&file) }.map_err(io)?)
        };
        Ok(DumpFile {
            bytes,
            path: Some(path),
        })
    }

    /// A dump held in memory (the bytes of a `.safetensors` file).
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        DumpFile {
            bytes: Bytes::Owned(bytes),
            path: None,
        }
    }

    /// The file's path, when it was opened from one.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The raw bytes.
    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }

    /// Parses and checks the dump (header, dtypes, shapes, metadata, that a
    /// candidate exists, that each candidate has the inputs it needs).
    /// Values (NaN logits, token ranges) are checked per row by
    /// [`Dump::problem_row`]'s callers through the spec's `validate_row`.
    ///
    /// # Errors
    /// Every [`DumpError`] variant but `Io` and `BadMaskValue`.
    pub fn parse(&self) -> Result<Dump<'_>, DumpError> {
        Dump::parse(self.bytes())
    }
}

/// A float tensor `[rows, cols]` left in the file, decoded row by row.
#[derive(Clone, Copy, Debug)]
pub struct FloatMatrix<'a> {
    /// Element dtype.
    pub dtype: Dtype,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    data: &'a [u8],
}

impl<'a> FloatMatrix<'a> {
    /// The whole tensor `[rows, cols]` as exact f64 values.
    pub fn to_array(&self) -> Array2<f64> {
        Array2::from_shape_vec((self.rows, self.cols), decode_floats(self.dtype, self.data))
            .expect("size checked by safetensors")
    }

    /// Row `r` as exact f64 values (`[cols]`). Panics if `r >= rows`.
    pub fn row_f64(&self, r: usize) -> Vec<f64> {
        let w = self.dtype.size_bytes();
        let bytes = &self.data[r * self.cols * w..(r + 1) * self.cols * w];
        decode_floats(self.dtype, bytes)
    }

    /// Row `r` as logits `[1, cols]` of the same dtype. Panics if `r >= rows`.
    pub fn row_logits(&self, r: usize) -> RowLogits {
        let w = self.dtype.size_bytes();
        let b = &self.data[r * self.cols * w..(r + 1) * self.cols * w];
        fn arr<T>(v: Vec<T>) -> Array2<T> {
            let n = v.len();
            Array2::from_shape_vec((1, n), v).expect("one row")
        }
        match self.dtype {
            Dtype::F64 => RowLogits::F64(arr(b
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect())),
            Dtype::F32 => RowLogits::F32(arr(b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect())),
            Dtype::Bf16 => RowLogits::Bf16(arr(b
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes(c.try_into().unwrap()))
                .collect())),
            Dtype::F16 => RowLogits::F16(arr(b
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes(c.try_into().unwrap()))
                .collect())),
        }
    }
}

/// One row of logits `[1, V_total]`, owned, in its stored dtype.
#[derive(Clone, Debug)]
pub enum RowLogits {
    /// binary64.
    F64(Array2<f64>),
    /// binary32.
    F32(Array2<f32>),
    /// bfloat16.
    Bf16(Array2<bf16>),
    /// binary16.
    F16(Array2<f16>),
}

impl RowLogits {
    /// A view as the spec's [`Logits`].
    pub fn view(&self) -> Logits<'_> {
        match self {
            RowLogits::F64(a) => Logits::F64(a.view()),
            RowLogits::F32(a) => Logits::F32(a.view()),
            RowLogits::Bf16(a) => Logits::Bf16(a.view()),
            RowLogits::F16(a) => Logits::F16(a.view()),
        }
    }
}

/// A `sampling_mask [N, V]` left in the file (`bool` or `u8`, 1 = allowed).
#[derive(Clone, Copy, Debug)]
pub struct MaskMatrix<'a> {
    cols: usize,
    data: &'a [u8],
}

impl MaskMatrix<'_> {
    /// Row `r` as `[1, V]` bools (`bool` or `u8`: 1 = allowed, 0 = not).
    ///
    /// # Errors
    /// [`DumpError::BadMaskValue`] for a byte other than 0 or 1.
    pub fn row(&self, r: usize) -> Result<Array2<bool>, DumpError> {
        let bytes = &self.data[r * self.cols..(r + 1) * self.cols];
        let mut out = Vec::with_capacity(self.cols);
        for (col, &b) in bytes.iter().enumerate() {
            if b > 1 {
                return Err(DumpError::BadMaskValue {
                    row: r,
                    col,
                    value: b,
                });
            }
            out.push(b != 0);
        }
        Ok(Array2::from_shape_vec((1, self.cols), out).expect("row length equals cols"))
    }
}

/// A parsed, shape-checked dump. `N` rows, `V_total` columns of logits.
pub struct Dump<'a> {
    /// `logits [N, V_total]`.
    pub logits: FloatMatrix<'a>,
    /// `tokens [N]` as i64.
    pub tokens: Option<Array1<i64>>,
    /// `sampling_mask [N, V_total]`.
    pub sampling_mask: Option<MaskMatrix<'a>>,
    /// `topk_ids [N, K]` as i64.
    pub topk_ids: Option<Array2<i64>>,
    /// The candidate outputs, `[N, width]` each (`log_probs [N]` and
    /// `entropy [N]` as width 1, `topk_log_probs [N, K]`, `grad_logits
    /// [N, V_total]`), left in the file and decoded row by row, each with
    /// the dtype it was dumped in (ulps are counted in it).
    pub candidates: PerOutput<FloatMatrix<'a>>,
    /// The upstream cotangents (`grad_log_probs [N]`, `grad_entropy [N]`,
    /// `grad_topk_log_probs [N, K]`) as exact f64 `[N, width]`, keyed by the
    /// output they are the cotangent of.
    pub cotangents: PerOutput<Array2<f64>>,
    /// Options from the metadata. `entropy` is `Some` exactly when the
    /// entropy or its cotangent is in the dump.
    pub options: Options,
    /// Tensors in the file that the format does not define: always empty
    /// (an unknown name is bad input, [`crate::names`]).
    pub ignored_tensors: Vec<String>,
    /// Row dimensions: `[N]`, or `[B, T]` for `[B, T, V]` logits.
    pub row_shape: crate::shapes::RowShape,
    /// `row_mask` (`[N]` flattened): rows excluded (false) from every check.
    pub row_mask: Option<Vec<bool>>,
    /// Version-2 format options (`cotangent_reduction`, `topk_ids_source`, ...).
    pub format: crate::format::FormatOptions,
}

/// The tensor names the format defines.
pub const TENSOR_NAMES: [&str; 11] = [
    "logits",
    "tokens",
    "sampling_mask",
    "log_probs",
    "entropy",
    "topk_ids",
    "topk_log_probs",
    "grad_log_probs",
    "grad_entropy",
    "grad_topk_log_probs",
    "grad_logits",
];

/// One row of a dump as owned arrays; [`RowInputs::problem`] borrows them
/// as a one-row [`Problem`].
#[derive(Clone, Debug)]
pub struct RowInputs {
    /// The dump's row index.
    pub row: usize,
    /// Logits `[1, V_total]`.
    pub logits: RowLogits,
    /// Token `[1]`.
    pub tokens: Option<Array1<i64>>,
    /// Mask `[1, V_total]`.
    pub sampling_mask: Option<Array2<bool>>,
    /// Ids `[1, K]`.
    pub topk_ids: Option<Array2<i64>>,
    /// Options of the dump.
    pub options: Options,
    /// The row's cotangents `[1, width]`, keyed by their output.
    pub cotangents: PerOutput<Array2<f64>>,
}

impl RowInputs {
    /// The one-row problem.
    pub fn problem(&self) -> Problem<'_> {
        Problem {
            logits: self.logits.view(),
            tokens: self.tokens.as_ref().map(|t| t.view()),
            sampling_mask: self.sampling_mask.as_ref().map(|m| m.view()),
            topk_ids: self.topk_ids.as_ref().map(|m| m.view()),
            options: self.options,
        }
    }

    /// The one-row cotangents.
    pub fn cotangents(&self) -> Cotangents<'_> {
        Cotangents::from_outputs(&self.cotangents)
    }

    /// Validates the row's values with the spec (NaN / `+inf` logits,
    /// token, ids, finite cotangents), errors naming the dump's row.
    ///
    /// # Errors
    /// [`DumpError::Spec`].
    pub fn validate(&self) -> Result<(), DumpError> {
        let p = self.problem();
        let shape = p.validate_shapes().map_err(|e| at_row(e, self.row))?;
        p.validate_row(&shape, 0).map_err(|e| at_row(e, self.row))?;
        crate::temperature::check_row(
            &p.logits.row_f64(0),
            shape.vocab_size,
            &self.options,
            shape.temperature,
            shape.dtype,
            self.row,
        )?;
        if !self.cotangents.is_empty() {
            let c = self.cotangents();
            p.validate_cotangents(&shape, &c)
                .map_err(|e| at_row(e, self.row))?;
        }
        Ok(())
    }
}

/// Rewrites the row of an error from a one-row problem to the dump's row
/// `row` (the flat index of a cotangent becomes the row too).
pub fn at_row(e: SpecError, row: usize) -> SpecError {
    use SpecError::*;
    match e {
        NonFiniteLogit {
            tensor, col, value, ..
        } => NonFiniteLogit {
            tensor,
            row,
            col,
            value,
        },
        TokenOutOfRange {
            token, vocab_size, ..
        } => TokenOutOfRange {
            row,
            token,
            vocab_size,
        },
        TokenMasked { token, .. } => TokenMasked { row, token },
        TokenNegInf { token, .. } => TokenNegInf { row, token },
        TopkIdOutOfRange {
            k, id, vocab_size, ..
        } => TopkIdOutOfRange {
            row,
            k,
            id,
            vocab_size,
        },
        NoFiniteLogit { tensor, which, .. } => NoFiniteLogit { tensor, row, which },
        NonFiniteCotangent {
            tensor,
            index,
            value,
        } => {
            // `[1]` cotangents: index 0 is the row; `[1, K]`: index is k.
            let index = if tensor == "grad_topk_log_probs" {
                index
            } else {
                row
            };
            NonFiniteCotangent {
                tensor,
                index,
                value,
            }
        }
        other => other,
    }
}

/// Why the data section does not match the header (truncated or extended
/// file), naming the first tensor that reaches past the end. Reads only the
/// header (already checked to be valid JSON by safetensors).
fn describe_size_mismatch(bytes: &[u8]) -> String {
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("checked by safetensors")) as usize;
    let data_len = bytes.len() - 8 - n;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap_or_default();
    let mut ends: Vec<(u64, &str)> = header
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(name, info)| {
            Some((info.get("data_offsets")?.get(1)?.as_u64()?, name.as_str()))
        })
        .collect();
    ends.sort();
    let declared = ends.last().map_or(0, |e| e.0);
    match ends.iter().find(|(end, _)| *end > data_len as u64) {
        Some((end, name)) => format!(
            "truncated file: tensor `{name}` ends at data byte {end}, the file holds {data_len} data bytes (header declares {declared})"
        ),
        None => format!("the file holds {data_len} data bytes, the header declares {declared} (trailing bytes)"),
    }
}

fn malformed(e: safetensors::SafeTensorError) -> DumpError {
    DumpError::Malformed {
        reason: e.to_string(),
    }
}

fn st_float(d: StDtype) -> Option<Dtype> {
    match d {
        StDtype::F64 => Some(Dtype::F64),
        StDtype::F32 => Some(Dtype::F32),
        StDtype::BF16 => Some(Dtype::Bf16),
        StDtype::F16 => Some(Dtype::F16),
        _ => None,
    }
}

/// Decodes little-endian floats of `dtype` to exact f64 values.
fn decode_floats(dtype: Dtype, b: &[u8]) -> Vec<f64> {
    match dtype {
        Dtype::F64 => b
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        Dtype::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        Dtype::Bf16 => b
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes(c.try_into().unwrap()).to_f64())
            .collect(),
        Dtype::F16 => b
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes(c.try_into().unwrap()).to_f64())
            .collect(),
    }
}

fn decode_ids(tensor: &'static str, d: StDtype, b: &[u8]) -> Result<Vec<i64>, DumpError> {
    Ok(match d {
        StDtype::I64 => b
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        StDtype::I32 => b
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
            .collect(),
        StDtype::U32 => b
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as i64)
            .collect(),
        StDtype::I16 => b
            .chunks_exact(2)
            .map(|c| i16::from_le_bytes(c.try_into().unwrap()) as i64)
            .collect(),
        StDtype::U16 => b
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes(c.try_into().unwrap()) as i64)
            .collect(),
        StDtype::I8 => b.iter().map(|&c| c as i8 as i64).collect(),
        StDtype::U8 => b.iter().map(|&c| c as i64).collect(),
        StDtype::U64 => b
            .chunks_exact(8)
            .enumerate()
            .map(|(index, c)| {
                let value = u64::from_le_bytes(c.try_into().unwrap());
                i64::try_from(value).map_err(|_| DumpError::IdOverflow {
                    tensor,
                    index,
                    value,
                })
            })
            .collect::<Result<_, _>>()?,
        other => {
            return Err(DumpError::BadDtype {
                tensor,
                found: format!("{other:?}"),
                expected: "an integer dtype (I64, I32, I16, I8, U64, U32, U16, U8)",
            })
        }
    })
}

fn parse_meta<T: std::str::FromStr>(
    meta: &HashMap<String, String>,
    key: &'static str,
    reason: &'static str,
) -> Result<Option<T>, DumpError> {
    match meta.get(key) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<T>()
            .map(Some)
            .map_err(|_| DumpError::BadMetadata {
                key,
                value: v.clone(),
                reason,
            }),
    }
}

impl<'a> Dump<'a> {
    /// Parses `bytes` (a whole safetensors file). See [`DumpFile::parse`].
    ///
    /// # Errors
    /// See [`DumpFile::parse`].
    pub fn parse(bytes: &'a [u8]) -> Result<Self, DumpError> {
        Self::parse_with(bytes, true)
    }

    /// Parses a file of inputs only (a golden fixture): as [`Dump::parse`]
    /// without requiring a candidate; the entropy option is then
    /// `Some(entropy_logits)`.
    ///
    /// # Errors
    /// As [`Dump::parse`] but never [`DumpError::NoCandidate`].
    pub fn parse_inputs(bytes: &'a [u8]) -> Result<Self, DumpError> {
        Self::parse_with(bytes, false)
    }

    fn parse_with(bytes: &'a [u8], require_candidate: bool) -> Result<Self, DumpError> {
        // Checks offsets, sizes (with overflow checks) and that the data
        // covers the file exactly: nothing below reads out of bounds.
        let st = SafeTensors::deserialize(bytes).map_err(|e| match e {
            _ if crate::header::first_repeated(bytes).is_some() => {
                DumpError::Duplicate(crate::header::first_repeated(bytes).expect("just found"))
            }
            safetensors::SafeTensorError::MetadataIncompleteBuffer => DumpError::Malformed {
                reason: describe_size_mismatch(bytes),
            },
            safetensors::SafeTensorError::InvalidHeaderLength => DumpError::Malformed {
                reason: format!(
                    "truncated header: its length field declares {} bytes, the file holds {} after it",
                    u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes read by safetensors")),
                    bytes.len() - 8
                ),
            },
            other => malformed(other),
        })?;
        let (_, header) = SafeTensors::read_metadata(bytes).map_err(malformed)?;
        let meta = header.metadata().clone().unwrap_or_default();
        if let Some(r) = crate::header::first_repeated(bytes) {
            return Err(DumpError::Duplicate(r));
        }
        let format = crate::format::FormatOptions::parse(&meta)?;
        crate::names::check_names(
            st.names(),
            meta.keys().map(String::as_str),
            format.version,
            crate::names::NAMES,
        )?;
        let get = |name: &str| st.tensor(name).ok();

        let logits_t = get("logits").ok_or(DumpError::MissingTensor {
            tensor: "logits",
            why: "",
        })?;
        let ldtype = st_float(logits_t.dtype()).ok_or_else(|| DumpError::BadDtype {
            tensor: "logits",
            found: format!("{:?}", logits_t.dtype()),
            expected: "F64, F32, BF16 or F16",
        })?;
        let (rs, v) = crate::shapes::RowShape::of_logits(logits_t.shape())?;
        let n = rs.n;
        let logits = FloatMatrix {
            dtype: ldtype,
            rows: n,
            cols: v,
            data: logits_t.data(),
        };

        let tokens = match get("tokens") {
            None => None,
            Some(t) => {
                rs.expect("tokens", t.shape(), &[])?;
                Some(Array1::from(decode_ids("tokens", t.dtype(), t.data())?))
            }
        };

        let sampling_mask = match get("sampling_mask") {
            None => None,
            Some(t) => {
                match t.dtype() {
                    StDtype::BOOL | StDtype::U8 => {}
                    other => {
                        return Err(DumpError::BadDtype {
                            tensor: "sampling_mask",
                            found: format!("{other:?}"),
                            expected: "BOOL or U8",
                        })
                    }
                };
                rs.expect("sampling_mask", t.shape(), &[('V', v)])?;
                Some(MaskMatrix {
                    cols: v,
                    data: t.data(),
                })
            }
        };

        let topk_ids = match get("topk_ids") {
            None => None,
            Some(t) => {
                let k = rs.trailing("topk_ids", t.shape())?;
                let ids = decode_ids("topk_ids", t.dtype(), t.data())?;
                Some(Array2::from_shape_vec((n, k), ids).expect("size checked by safetensors"))
            }
        };
        let k = topk_ids.as_ref().map(|a| a.ncols());

        // A float tensor `[N, width]` (a per-row one stored `[N]`).
        // `(matrix, Some(width))` for a `[]` / `[1]` cotangent broadcast
        // under `cotangent_reduction=sum` (stored as one element).
        type Read<'a> = Option<(FloatMatrix<'a>, Option<usize>)>;
        let float = |name: &'static str,
                     columns: Columns,
                     cotangent: bool|
         -> Result<Read<'a>, DumpError> {
            let Some(t) = get(name) else { return Ok(None) };
            let dtype = st_float(t.dtype()).ok_or_else(|| DumpError::BadDtype {
                tensor: name,
                found: format!("{:?}", t.dtype()),
                expected: "F64, F32, BF16 or F16",
            })?;
            let summed = match columns {
                Columns::One if cotangent => {
                    rs.cotangent(name, t.shape(), &[], format.cotangent_sum)?
                }
                Columns::One => {
                    rs.expect(name, t.shape(), &[])?;
                    false
                }
                Columns::TopK => {
                    let Some(k) = k else {
                        return Err(DumpError::MissingTensor {
                            tensor: "topk_ids",
                            why: " (needed by top-k tensors)",
                        });
                    };
                    if cotangent {
                        rs.cotangent(name, t.shape(), &[('K', k)], format.cotangent_sum)?
                    } else {
                        rs.expect(name, t.shape(), &[('K', k)])?;
                        false
                    }
                }
                Columns::Vocabulary => {
                    rs.expect(name, t.shape(), &[('V', v)])?;
                    false
                }
            };
            let cols = match columns {
                Columns::One => 1,
                Columns::TopK => k.expect("checked above"),
                Columns::Vocabulary => v,
            };
            Ok(Some((
                FloatMatrix {
                    dtype,
                    rows: if summed { 1 } else { n },
                    cols: if summed { 1 } else { cols },
                    data: t.data(),
                },
                summed.then_some(cols),
            )))
        };
        let mut candidates = PerOutput::new();
        for o in Output::ALL {
            if let Some((m, _)) = float(o.name(), o.columns(), false)? {
                candidates.insert(o, m);
            }
        }
        let mut cotangents = PerOutput::new();
        for o in Output::ALL {
            if let Some(name) = o.cotangent_name() {
                if let Some((m, summed)) = float(name, o.columns(), true)? {
                    let a = match summed {
                        // One value, broadcast to every element.
                        Some(cols) => Array2::from_elem(
                            (n, cols),
                            m.to_array().first().copied().unwrap_or(0.0),
                        ),
                        None => m.to_array(),
                    };
                    cotangents.insert(o, a);
                }
            }
        }

        let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
        names.sort();
        if require_candidate && !(format.topk_kernel && topk_ids.is_some()) && candidates.is_empty()
        {
            return Err(DumpError::NoCandidate { tensors: names });
        }
        let ignored_tensors = Vec::new();
        let row_mask = match get("row_mask") {
            None => None,
            Some(t) => {
                rs.expect("row_mask", t.shape(), &[])?;
                Some(crate::shapes::decode_flags(
                    "row_mask",
                    t.dtype(),
                    t.data(),
                )?)
            }
        };
        if format.topk_kernel && topk_ids.is_none() {
            return Err(DumpError::MissingTensor {
                tensor: "topk_ids",
                why: " (needed by topk_ids_source=kernel)",
            });
        }

        // Inputs each candidate needs.
        let needs_tokens = |per: &PerOutput<_>| per.contains(Output::LogProbs);
        if (needs_tokens(&candidates) || cotangents.contains(Output::LogProbs)) && tokens.is_none()
        {
            let why = if needs_tokens(&candidates) {
                " (needed by log_probs)"
            } else {
                " (needed by grad_log_probs)"
            };
            return Err(DumpError::MissingTensor {
                tensor: "tokens",
                why,
            });
        }
        if candidates.contains(Output::GradLogits) && cotangents.is_empty() {
            return Err(DumpError::Spec(SpecError::NoCotangent {
                what:
                    "grad_logits given without grad_log_probs, grad_entropy or grad_topk_log_probs",
            }));
        }
        // Cotangents are judged only through grad_logits: without it they
        // are inert, but still read (and validated) so mistakes surface.

        let want_entropy = candidates.contains(Output::Entropy)
            || cotangents.contains(Output::Entropy)
            || !require_candidate;
        let options = parse_options(&meta, want_entropy, v, ldtype)?;
        Ok(Dump {
            logits,
            tokens,
            sampling_mask,
            topk_ids,
            candidates,
            cotangents,
            options,
            ignored_tensors,
            row_shape: rs,
            row_mask,
            format,
        })
    }

    /// Rows `N`.
    pub fn n(&self) -> usize {
        self.logits.rows
    }

    /// Columns of `logits`, padding included (`V_total`).
    pub fn v_total(&self) -> usize {
        self.logits.cols
    }

    /// Real vocabulary size (`vocab_size` metadata, default `V_total`).
    pub fn vocab_size(&self) -> usize {
        self.options.vocab_size.unwrap_or(self.logits.cols)
    }

    /// Row `row`'s inputs, decoded (O(V) memory). Panics if `row >= N`.
    ///
    /// # Errors
    /// [`DumpError::BadMaskValue`].
    pub fn row(&self, row: usize) -> Result<RowInputs, DumpError> {
        Ok(RowInputs {
            row,
            logits: self.logits.row_logits(row),
            tokens: self.tokens.as_ref().map(|a| Array1::from(vec![a[row]])),
            sampling_mask: self
                .sampling_mask
                .as_ref()
                .map(|m| m.row(row))
                .transpose()?,
            topk_ids: self
                .topk_ids
                .as_ref()
                .map(|a| a.row(row).to_owned().insert_axis(ndarray::Axis(0))),
            options: self.options,
            cotangents: self
                .cotangents
                .as_ref()
                .map(|_, a| a.row(row).to_owned().insert_axis(ndarray::Axis(0))),
        })
    }

    /// Whether row `row` has a log-prob to check (tokens present, token not
    /// `ignore_index`).
    pub fn has_target(&self, row: usize) -> bool {
        self.tokens
            .as_ref()
            .is_some_and(|t| t[row] != self.options.ignore_index)
    }
}

/// Options from the `__metadata__` strings (defaults per the format).
fn parse_options(
    meta: &HashMap<String, String>,
    entropy: bool,
    v_total: usize,
    dtype: Dtype,
) -> Result<Options, DumpError> {
    let mut o = Options {
        ignore_index: DEFAULT_IGNORE_INDEX,
        ..Options::default()
    };
    if let Some(t) = parse_meta::<f64>(meta, "temperature", "not a number")? {
        if !(t.is_finite() && t > 0.0) {
            return Err(DumpError::BadMetadata {
                key: "temperature",
                value: meta["temperature"].clone(),
                reason: "must be finite and > 0",
            });
        }
        crate::temperature::check_value(&meta["temperature"], t, dtype)?;
        o.temperature = t;
    }
    if let Some(vs) = parse_meta::<usize>(meta, "vocab_size", "not a non-negative integer")? {
        if vs > v_total || (vs == 0 && v_total > 0) {
            return Err(DumpError::BadMetadata {
                key: "vocab_size",
                value: meta["vocab_size"].clone(),
                reason: "must be in [1, V] (V = columns of logits)",
            });
        }
        o.vocab_size = Some(vs);
    }
    if let Some(ii) = parse_meta::<i64>(meta, "ignore_index", "not an integer")? {
        o.ignore_index = ii;
    }
    let which = match meta.get("entropy_logits").map(|s| s.trim()) {
        None | Some("unmasked") => EntropyLogits::Unmasked,
        Some("masked") => EntropyLogits::Masked,
        Some(other) => {
            return Err(DumpError::BadMetadata {
                key: "entropy_logits",
                value: other.to_string(),
                reason: "expected `unmasked` or `masked`",
            })
        }
    };
    o.entropy = entropy.then_some(which);
    o.temperature_dtype = match meta.get("temperature_dtype").map(|s| s.trim()) {
        None | Some("accumulation") => TemperatureDtype::Accumulation,
        Some("input") => TemperatureDtype::Input,
        Some(other) => {
            return Err(DumpError::BadMetadata {
                key: "temperature_dtype",
                value: other.to_string(),
                reason: "expected `accumulation` or `input`",
            })
        }
    };
    Ok(o)
}

/// An owned tensor for writing dumps ([`serialize_dump`]): dtype, shape and
/// little-endian bytes.
#[derive(Clone, Debug)]
pub struct DumpTensor {
    /// safetensors dtype.
    pub dtype: StDtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Little-endian bytes, `prod(shape) * size(dtype)` of them.
    pub data: Vec<u8>,
}

impl DumpTensor {
    /// A float tensor of `dtype` from exact f64 values (each rounded to
    /// `dtype` correctly; exact when the value is representable).
    pub fn floats(dtype: Dtype, shape: &[usize], values: &[f64]) -> Self {
        let mut data = Vec::with_capacity(values.len() * dtype.size_bytes());
        for &x in values {
            match dtype {
                Dtype::F64 => data.extend(x.to_le_bytes()),
                Dtype::F32 => data.extend((x as f32).to_le_bytes()),
                Dtype::Bf16 => data
                    .extend(<bf16 as logprobe_reference::spec::Element>::from_f64(x).to_le_bytes()),
                Dtype::F16 => data
                    .extend(<f16 as logprobe_reference::spec::Element>::from_f64(x).to_le_bytes()),
            }
        }
        let dtype = match dtype {
            Dtype::F64 => StDtype::F64,
            Dtype::F32 => StDtype::F32,
            Dtype::Bf16 => StDtype::BF16,
            Dtype::F16 => StDtype::F16,
        };
        DumpTensor {
            dtype,
            shape: shape.to_vec(),
            data,
        }
    }

    /// An `I64` tensor.
    pub fn i64s(shape: &[usize], values: &[i64]) -> Self {
        DumpTensor {
            dtype: StDtype::I64,
            shape: shape.to_vec(),
            data: values.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    /// A `BOOL` tensor.
    pub fn bools(shape: &[usize], values: &[bool]) -> Self {
        DumpTensor {
            dtype: StDtype::BOOL,
            shape: shape.to_vec(),
            data: values.iter().map(|&b| b as u8).collect(),
        }
    }
}

impl safetensors::View for &DumpTensor {
    fn dtype(&self) -> StDtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        (&self.data).into()
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Serializes named tensors and metadata into the bytes of a dump (the
/// safetensors layout `safetensors.torch.save_file` writes).
///
/// # Errors
/// [`DumpError::Malformed`] when a tensor's byte length does not match its
/// shape and dtype.
pub fn serialize_dump(
    tensors: &[(&str, DumpTensor)],
    metadata: &[(&str, &str)],
) -> Result<Vec<u8>, DumpError> {
    let meta: HashMap<String, String> = metadata
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for (name, t) in tensors {
        let elems = t.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if elems.and_then(|e| e.checked_mul(t.dtype.bitsize() / 8)) != Some(t.data.len()) {
            return Err(DumpError::Malformed {
                reason: format!(
                    "tensor `{name}`: {} bytes do not match shape {:?} of {:?}",
                    t.data.len(),
                    t.shape,
                    t.dtype
                ),
            });
        }
    }
    safetensors::serialize(tensors.iter().map(|(k, t)| (*k, t)), Some(meta)).map_err(malformed)
}
