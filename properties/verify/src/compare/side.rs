//! One side of a comparison: a dump with logits (read by the verify
//! reader, [`crate::dump::Dump`]), or the log-probs a rollout engine
//! returns without logits ([`LogProbsDump`]: `tokens`, `log_probs`,
//! optional `row_mask`, shapes `[N]` or `[B, T]`).

use ndarray::Array1;

use super::CompareError;
use crate::dump::{decode_floats, decode_ids, st_float, Dump, DumpError};
use crate::shapes::RowShape;
use logprobe_reference::spec::{Dtype, Output, DEFAULT_IGNORE_INDEX};

/// Which side of `compare A B`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Side {
    /// The first dump (the trainer, as a rule): must hold logits.
    A,
    /// The second dump (the rollout engine): logits optional.
    B,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::A => "A",
            Side::B => "B",
        })
    }
}

/// The tensors a dump without logits may hold: all per-row (`[N]` or
/// `[B, T]`). Any other tensor needs the logits it is a function of.
pub const LOGITS_FREE_TENSORS: [&str; 3] = ["tokens", "log_probs", "row_mask"];

/// A side's candidate log-probs `[N]` (flattened), exact f64 values of
/// the stored ones, with the dtype they were dumped in.
#[derive(Clone, Debug, PartialEq)]
pub struct LogProbs {
    /// Dtype of the `log_probs` tensor.
    pub dtype: Dtype,
    /// The values, exactly.
    pub values: Array1<f64>,
}

/// A dump without logits: the log-probs of a rollout engine (vLLM and
/// SGLang return these, not the logits).
#[derive(Clone, Debug)]
pub struct LogProbsDump {
    /// `[N]` or `[B, T]`, from `tokens`.
    pub row_shape: RowShape,
    /// `tokens` (`[N]` flattened).
    pub tokens: Array1<i64>,
    /// Candidate `log_probs` (`[N]` flattened).
    pub log_probs: Option<LogProbs>,
    /// `row_mask` (`[N]` flattened).
    pub row_mask: Option<Vec<bool>>,
    /// `ignore_index` (metadata, default -100).
    pub ignore_index: i64,
}

impl LogProbsDump {
    /// Parses a safetensors file without `logits` (names checked against
    /// the name table, [`crate::names`]).
    ///
    /// # Errors
    /// The reader's header errors ([`DumpError::Malformed`], `Name`,
    /// `Duplicate`, ...); [`DumpError::MissingTensor`] without `tokens`;
    /// [`DumpError::BadShape`] / `BadDtype` for a tensor not of the row
    /// shape of `tokens` or of the wrong dtype, all as
    /// [`CompareError::Dump`] of side `side`; a tensor of the format that
    /// needs logits (`entropy`, `topk_ids`, ...) is
    /// [`CompareError::NeedsLogits`].
    pub fn parse(bytes: &[u8], side: Side) -> Result<Self, CompareError> {
        let h = crate::dump::Header::read(bytes)
            .map_err(|source| CompareError::Dump { side, source })?;
        Self::from_header(&h, side)
    }

    /// As [`LogProbsDump::parse`], from a checked header (a file's or
    /// tensors' in memory).
    pub(crate) fn from_header(
        h: &crate::dump::Header<'_>,
        side: Side,
    ) -> Result<Self, CompareError> {
        let dump = |source| CompareError::Dump { side, source };
        for n in h.st.names() {
            if !LOGITS_FREE_TENSORS.contains(&n) {
                let tensor = crate::names::NAMES
                    .iter()
                    .find(|k| k.name == n)
                    .map_or("?", |k| k.name);
                return Err(CompareError::NeedsLogits { side, tensor });
            }
        }
        let get = |name: &str| h.st.tensor(name);
        let t = get("tokens").ok_or_else(|| {
            dump(DumpError::MissingTensor {
                tensor: "tokens",
                why: " (compare matches the rows of A and B by their tokens)",
            })
        })?;
        let row_shape = match *t.shape() {
            [n] => RowShape { batch: None, n },
            [b, tt] => RowShape {
                batch: Some((b, tt)),
                n: b.checked_mul(tt).ok_or_else(|| {
                    dump(DumpError::BadShape {
                        tensor: "tokens",
                        found: t.shape().to_vec(),
                        expected: "[N] or [B, T]".into(),
                    })
                })?,
            },
            _ => {
                return Err(dump(DumpError::BadShape {
                    tensor: "tokens",
                    found: t.shape().to_vec(),
                    expected: "[N] or [B, T] (without logits, tokens give the row shape)".into(),
                }))
            }
        };
        let tokens = Array1::from(decode_ids("tokens", t.dtype(), t.data()).map_err(dump)?);
        let log_probs = match get("log_probs") {
            None => None,
            Some(t) => {
                let dtype = st_float(t.dtype()).ok_or_else(|| {
                    dump(DumpError::BadDtype {
                        tensor: "log_probs",
                        found: format!("{:?}", t.dtype()),
                        expected: "F64, F32, BF16 or F16",
                    })
                })?;
                row_shape
                    .expect("log_probs", t.shape(), &[])
                    .map_err(dump)?;
                Some(LogProbs {
                    dtype,
                    values: Array1::from(decode_floats(dtype, t.data())),
                })
            }
        };
        let row_mask = match get("row_mask") {
            None => None,
            Some(t) => {
                row_shape.expect("row_mask", t.shape(), &[]).map_err(dump)?;
                Some(crate::shapes::decode_flags("row_mask", t.dtype(), t.data()).map_err(dump)?)
            }
        };
        let ignore_index = crate::keys::IGNORE_INDEX
            .get(&h.meta)
            .map_err(dump)?
            .unwrap_or(DEFAULT_IGNORE_INDEX);
        Ok(LogProbsDump {
            row_shape,
            tokens,
            log_probs,
            row_mask,
            ignore_index,
        })
    }
}

/// One side, parsed (two per comparison: the size difference is moot).
#[allow(clippy::large_enum_variant)]
pub enum SideDump<'a> {
    /// With logits: every check of `verify` applies.
    Logits(Dump<'a>),
    /// Without logits.
    LogProbsOnly(LogProbsDump),
}

impl SideDump<'_> {
    /// Rows `[N]` or `[B, T]`.
    pub fn row_shape(&self) -> RowShape {
        match self {
            SideDump::Logits(d) => d.row_shape,
            SideDump::LogProbsOnly(d) => d.row_shape,
        }
    }

    /// `tokens` (`[N]` flattened), when present.
    pub fn tokens(&self) -> Option<&Array1<i64>> {
        match self {
            SideDump::Logits(d) => d.tokens.as_ref(),
            SideDump::LogProbsOnly(d) => Some(&d.tokens),
        }
    }

    /// Candidate `log_probs`, when present (decoded: `[N]`).
    pub fn log_probs(&self) -> Option<LogProbs> {
        match self {
            SideDump::Logits(d) => d.candidates.get(Output::LogProbs).map(|m| LogProbs {
                dtype: m.dtype,
                values: m.to_array().column(0).to_owned(),
            }),
            SideDump::LogProbsOnly(d) => d.log_probs.clone(),
        }
    }

    /// `row_mask` (`[N]` flattened), when present.
    pub fn row_mask(&self) -> Option<&[bool]> {
        match self {
            SideDump::Logits(d) => d.row_mask.as_deref(),
            SideDump::LogProbsOnly(d) => d.row_mask.as_deref(),
        }
    }

    /// `ignore_index`.
    pub fn ignore_index(&self) -> i64 {
        match self {
            SideDump::Logits(d) => d.options.ignore_index,
            SideDump::LogProbsOnly(d) => d.ignore_index,
        }
    }

    /// The dump with logits, if this side has them.
    pub fn logits(&self) -> Option<&Dump<'_>> {
        match self {
            SideDump::Logits(d) => Some(d),
            SideDump::LogProbsOnly(_) => None,
        }
    }
}
