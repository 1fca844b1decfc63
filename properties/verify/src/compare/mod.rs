//! `logprobe compare A B`: where a trainer-vs-rollout log-prob mismatch
//! comes from. A and B are dumps of the same rows (the same `tokens` and
//! `row_mask`), each with its own `logits` and `log_probs`; B may lack
//! logits (rollout engines return log-probs only).
//!
//! # Per row (nats; each an enclosure)
//!
//! With `lp` a side's candidate log-prob and `exact(logits)` the oracle's
//! exact log-prob of that side's logits (its own temperature, mask and
//! dtype; [`Oracle::forward_row_of`]):
//!
//! - `kernel_error_a = lp_A - exact(logits_A)`, `kernel_error_b` likewise:
//!   what each side's log-prob kernel adds;
//! - `logits_effect = exact(logits_A) - exact(logits_B)`: the part due to
//!   the logits alone (matmuls, attention, bf16 storage, batch-dependent
//!   reductions);
//! - `observed = lp_A - lp_B`, which is exactly
//!   `kernel_error_a - kernel_error_b + logits_effect`;
//! - `kl = KL(softmax(z'_A) || softmax(z'_B))`, exact
//!   ([`Oracle::kl_row`]: an enclosure whose ends round to one f32), when
//!   both sides have logits;
//! - without B's logits, `b_minus_exact_a = lp_B - exact(logits_A)`
//!   (B's kernel error and logits effect together, inseparable without
//!   B's logits), so `observed = kernel_error_a - b_minus_exact_a`;
//! - whether the two candidate log-probs, and the two logits rows, are
//!   bitwise equal;
//! - when A has an `entropy` candidate, the same decomposition of the
//!   entropy (`entropy.kernel_error_a`, ... with `exact_entropy(logits)`).
//!
//! Every value is an [`Enclosure`] `[lo, hi]` with f64 ends rounded
//! outward: the oracle's enclosure of `exact(...)` (a few f64 ulps wide)
//! combined by [`Interval::sub`] (each end rounded in its direction), so
//! the exact real of each quantity lies inside, and the decomposition holds
//! on the enclosures in exact arithmetic (checked by a test).
//!
//! # Summary
//!
//! Over the compared rows (selected by `--rows`, kept by `row_mask`, token
//! not `ignore_index`): mean and max `|.|` of each quantity (at the
//! enclosures' midpoints), the bitwise-equal rows, the importance ratio
//! `exp(observed)` (its range and the fraction of rows outside the PPO
//! clip range `[1 - clip, 1 + clip]`), the Pearson correlation of the two
//! sides' log-probs and of their probabilities `exp(lp)` (verl's
//! `training/rollout_actor_probs_pearson_corr` is the latter), each side's
//! kernel verdict against its derived bound ([`crate::verify`], same
//! model and rows), and a one-line verdict with the shares
//! `share_X = mean |X| / (mean |kernel_error_a| + mean |kernel_error_b| +
//! mean |logits_effect|)`: "the mismatch is X% kernel numerics, Y%
//! logits". The shares split the magnitudes, not `observed` itself: per
//! row the terms may cancel.

mod render;
mod side;

use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::Serialize;

use logprobe_reference::oracle::{Exact, Interval, Oracle};
use logprobe_reference::spec::{Dtype, EntropyLogits, Output, SpecError};

pub use render::render_table;
pub use side::{LogProbs, LogProbsDump, Side, SideDump, LOGITS_FREE_TENSORS};

use crate::dump::{at_row, DumpError, DumpFile};
use crate::verify::{ReportVerdict as Verdict, RowSelection, VerifyConfig};

/// `schema_version` of the `compare --json` document ([`CompareReport`]).
pub const SCHEMA_VERSION: u32 = 1;

/// Bad input to a comparison (exit status 2). Every variant names the side
/// and, where one exists, the tensor and row.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// A side's dump is bad input on its own (the verify reader's error,
    /// naming tensor, row and column).
    #[error("{side}: {source}")]
    Dump {
        /// The side.
        side: Side,
        /// The reader's or the spec's error.
        source: DumpError,
    },
    /// A has no logits (A is the side every quantity is measured against).
    #[error("A has no `logits`: the first dump must hold logits (give the dump with logits first; B may lack them)")]
    ANeedsLogits,
    /// A side that compare needs `log_probs` from has none.
    #[error("{side} has no `log_probs`{why}")]
    MissingLogProbs {
        /// The side.
        side: Side,
        /// Why it is needed.
        why: &'static str,
    },
    /// B has neither logits nor log-probs: nothing to compare.
    #[error("B holds neither `logits` nor `log_probs`: nothing to compare")]
    NothingToCompare,
    /// A side without `tokens`.
    #[error("{side} has no `tokens`: compare matches the rows of A and B by their tokens")]
    MissingTokens {
        /// The side.
        side: Side,
    },
    /// A logits-free dump holding a tensor that is a function of logits.
    #[error("{side} has no `logits` but holds `{tensor}`, which needs them (a dump without logits holds only tokens, log_probs, row_mask)")]
    NeedsLogits {
        /// The side.
        side: Side,
        /// The tensor.
        tensor: &'static str,
    },
    /// The sides have different row shapes (`[N]` / `[B, T]`).
    #[error("A and B have different rows: A's tokens are {a}, B's are {b}")]
    RowShape {
        /// A's row dimensions, e.g. `[B, T] = [2, 12]`.
        a: String,
        /// B's.
        b: String,
    },
    /// The sides disagree on a row's token: not the same rows.
    #[error(
        "tokens differ at {at}: A has {a}, B has {b} (compare needs the same rows on both sides)"
    )]
    TokenMismatch {
        /// The row: `row 7` or `(b, t) = (0, 7)`.
        at: String,
        /// The flat row index.
        row: usize,
        /// A's token.
        a: i64,
        /// B's token.
        b: i64,
    },
    /// The sides disagree on `row_mask` at a row (an absent `row_mask`
    /// keeps every row).
    #[error("row_mask differs at {at}: A {a}, B {b} (an absent row_mask keeps every row)")]
    RowMaskMismatch {
        /// The row.
        at: String,
        /// The flat row index.
        row: usize,
        /// A's flag.
        a: bool,
        /// B's flag.
        b: bool,
    },
    /// Metadata that must agree does not (`ignore_index`).
    #[error("metadata `{key}` differs: A {a}, B {b}")]
    MetadataMismatch {
        /// The key.
        key: &'static str,
        /// A's value.
        a: String,
        /// B's value.
        b: String,
    },
    /// The sides' real vocabularies differ (KL and the logits effect
    /// compare distributions over one vocabulary).
    #[error("vocab_size differs: A {a}, B {b}")]
    VocabMismatch {
        /// A's real vocabulary size.
        a: usize,
        /// B's.
        b: usize,
    },
    /// A `--rows` selection that selects no row.
    #[error("--rows {selection} selects no row of the dumps' {rows} rows")]
    EmptySelection {
        /// The selection.
        selection: String,
        /// `N`.
        rows: usize,
    },
}

/// Settings of a comparison.
#[derive(Clone, Debug)]
pub struct CompareConfig {
    /// Rows to compare (before `row_mask` and `ignore_index`).
    pub rows: RowSelection,
    /// PPO clip range `eps` of the importance-ratio summary (`0.2`).
    pub clip: f64,
    /// Compute the exact KL per row when both sides have logits (the f64
    /// tier, MPFR where it does not decide: about the log-prob oracle's cost).
    pub kl: bool,
    /// Rows listed in the table, largest `|observed|` first.
    pub worst: usize,
    /// The bound of each side's kernel verdict: `verify`'s settings (model,
    /// accumulation, oracle); its `rows` are replaced by `rows` above.
    pub verify: VerifyConfig,
}

impl Default for CompareConfig {
    fn default() -> Self {
        CompareConfig {
            rows: RowSelection::All,
            clip: 0.2,
            kl: true,
            worst: 5,
            verify: VerifyConfig {
                worst: 1,
                ..VerifyConfig::default()
            },
        }
    }
}

/// An enclosure `[lo, hi]` of an exact real (nats), f64 ends rounded
/// outward, with its midpoint `value` (the figure tables and summaries use).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Enclosure {
    /// Midpoint of `[lo, hi]` (`lo` when the ends are equal or infinite).
    #[serde(serialize_with = "json_f64")]
    pub value: f64,
    /// Lower end.
    #[serde(serialize_with = "json_f64")]
    pub lo: f64,
    /// Upper end.
    #[serde(serialize_with = "json_f64")]
    pub hi: f64,
}

impl Enclosure {
    fn of(i: Interval) -> Self {
        let value = if i.lo == i.hi || !(i.lo.is_finite() && i.hi.is_finite()) {
            if i.lo.is_nan() {
                i.hi
            } else {
                i.lo
            }
        } else {
            i.lo / 2.0 + i.hi / 2.0
        };
        Enclosure {
            value,
            lo: i.lo,
            hi: i.hi,
        }
    }

    /// The enclosure as the oracle's [`Interval`].
    pub fn interval(&self) -> Interval {
        Interval {
            lo: self.lo,
            hi: self.hi,
        }
    }
}

/// One compared row.
#[derive(Clone, Debug, Serialize)]
pub struct CompareRow {
    /// Flat row index (`b * T + t` for `[B, T]` rows).
    pub row: usize,
    /// `(b, t)` for `[B, T]` rows.
    pub position: Option<(usize, usize)>,
    /// The token (the same on both sides).
    pub token: i64,
    /// A's candidate log-prob (exact f64 of the stored value).
    #[serde(serialize_with = "json_f64")]
    pub log_prob_a: f64,
    /// B's candidate log-prob (`null` when B has none).
    #[serde(serialize_with = "json_opt_f64")]
    pub log_prob_b: Option<f64>,
    /// `exact(logits_A)`: the oracle's enclosure.
    pub exact_a: Enclosure,
    /// `exact(logits_B)` (`null` without B's logits).
    pub exact_b: Option<Enclosure>,
    /// `lp_A - exact(logits_A)`.
    pub kernel_error_a: Enclosure,
    /// `lp_B - exact(logits_B)`.
    pub kernel_error_b: Option<Enclosure>,
    /// `exact(logits_A) - exact(logits_B)`.
    pub logits_effect: Option<Enclosure>,
    /// `lp_A - lp_B`.
    pub observed: Option<Enclosure>,
    /// `lp_B - exact(logits_A)` (only without B's logits).
    pub b_minus_exact_a: Option<Enclosure>,
    /// `KL(softmax(z'_A) || softmax(z'_B))` (both sides' logits, `kl` on).
    pub kl: Option<Enclosure>,
    /// The two candidate log-probs are the same bits in the same dtype.
    pub log_probs_bitwise_equal: Option<bool>,
    /// The two logits rows are the same bits in the same dtype (and the
    /// same temperature and mask).
    pub logits_bitwise_equal: Option<bool>,
    /// The same decomposition of the entropy, when A has an `entropy`
    /// candidate (B's from its own candidate, when it has one).
    pub entropy: Option<EntropyRow>,
}

/// The entropy's decomposition of one row (nats; enclosures as for the
/// log-probs): `observed = kernel_error_a - kernel_error_b + logits_effect`
/// with `kernel_error = H - exact_entropy(logits)`.
#[derive(Clone, Debug, Serialize)]
pub struct EntropyRow {
    /// A's candidate entropy.
    #[serde(serialize_with = "json_f64")]
    pub entropy_a: f64,
    /// B's candidate entropy (`null` when B has none).
    #[serde(serialize_with = "json_opt_f64")]
    pub entropy_b: Option<f64>,
    /// The exact entropy of A's logits.
    pub exact_a: Enclosure,
    /// The exact entropy of B's logits (`null` without them).
    pub exact_b: Option<Enclosure>,
    /// `H_A - exact(logits_A)`.
    pub kernel_error_a: Enclosure,
    /// `H_B - exact(logits_B)`.
    pub kernel_error_b: Option<Enclosure>,
    /// `exact(logits_A) - exact(logits_B)`.
    pub logits_effect: Option<Enclosure>,
    /// `H_A - H_B`.
    pub observed: Option<Enclosure>,
}

/// Mean and max `|x|` of a quantity over the compared rows (midpoints).
#[derive(Clone, Debug, Serialize)]
pub struct Magnitude {
    /// Rows with a value.
    pub rows: usize,
    /// `mean |x|`.
    #[serde(serialize_with = "json_f64")]
    pub mean_abs: f64,
    /// `max |x|`.
    #[serde(serialize_with = "json_f64")]
    pub max_abs: f64,
    /// The flat row of the max.
    pub max_row: Option<usize>,
    /// Its `(b, t)`.
    pub max_position: Option<(usize, usize)>,
}

/// The importance ratio `exp(observed) = exp(lp_A - lp_B)` (A the trainer,
/// B the behaviour policy, as PPO / GRPO take it).
#[derive(Clone, Debug, Serialize)]
pub struct RatioSummary {
    /// Smallest ratio.
    #[serde(serialize_with = "json_f64")]
    pub min: f64,
    /// Largest ratio.
    #[serde(serialize_with = "json_f64")]
    pub max: f64,
    /// The clip range's `eps` (`--clip`).
    pub clip: f64,
    /// Rows whose ratio is outside `[1 - eps, 1 + eps]`.
    pub outside_clip: usize,
    /// `outside_clip / rows`.
    #[serde(serialize_with = "json_f64")]
    pub outside_clip_fraction: f64,
}

/// One side's kernel against its derived bound: `verify`'s judgement of
/// one output of that side's dump, on the same rows.
#[derive(Clone, Debug, Serialize)]
pub struct KernelBound {
    /// `A` or `B`.
    pub side: Side,
    /// `log_probs` or `entropy`.
    pub output: &'static str,
    /// Dtype of the candidate.
    pub dtype: String,
    /// Verdict under the model.
    pub verdict: Verdict,
    /// Largest `error / bound` (`null`: no bound).
    #[serde(serialize_with = "json_opt_f64")]
    pub max_ratio: Option<f64>,
    /// The tightest of tree, lanes=8, sequential that the output meets.
    pub tightest_model: Option<String>,
}

/// The summary of a comparison.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Rows compared.
    pub rows: usize,
    /// `|lp_A - lp_B|` (`null` without B's log-probs).
    pub observed: Option<Magnitude>,
    /// `|kernel_error_a|`.
    pub kernel_error_a: Magnitude,
    /// `|kernel_error_b|` (`null` without B's logits or log-probs).
    pub kernel_error_b: Option<Magnitude>,
    /// `|logits_effect|` (`null` without B's logits).
    pub logits_effect: Option<Magnitude>,
    /// `|lp_B - exact(logits_A)|` (only without B's logits).
    pub b_minus_exact_a: Option<Magnitude>,
    /// `KL(A || B)`: mean and max.
    pub kl: Option<Magnitude>,
    /// Rows whose candidate log-probs are bitwise equal.
    pub bitwise_equal_rows: Option<usize>,
    /// Rows whose logits are bitwise equal (both sides' logits).
    pub logits_bitwise_equal_rows: Option<usize>,
    /// `exp(observed)`.
    pub importance_ratio: Option<RatioSummary>,
    /// Pearson correlation of `lp_A` and `lp_B` (`null` below 2 rows or at
    /// zero variance).
    #[serde(serialize_with = "json_opt_f64")]
    pub pearson_log_probs: Option<f64>,
    /// Pearson correlation of `exp(lp_A)` and `exp(lp_B)`: verl's
    /// `training/rollout_actor_probs_pearson_corr`.
    #[serde(serialize_with = "json_opt_f64")]
    pub pearson_probs: Option<f64>,
    /// Share of kernel numerics in the mismatch's magnitude (module docs):
    /// A's part.
    #[serde(serialize_with = "json_opt_f64")]
    pub share_kernel_a: Option<f64>,
    /// B's kernel part (`null` without B's logits).
    #[serde(serialize_with = "json_opt_f64")]
    pub share_kernel_b: Option<f64>,
    /// The logits' part (without B's logits: B's kernel and logits together).
    #[serde(serialize_with = "json_opt_f64")]
    pub share_logits: Option<f64>,
    /// Each side's kernel against its bound (sides with logits).
    pub kernel_bounds: Vec<KernelBound>,
    /// The entropy's magnitudes, when A has an entropy candidate.
    pub entropy: Option<EntropySummary>,
    /// The one-line verdict.
    pub verdict: String,
}

/// Mean and max `|.|` of the entropy's decomposition (nats).
#[derive(Clone, Debug, Serialize)]
pub struct EntropySummary {
    /// `|H_A - H_B|` (`null` without B's entropy).
    pub observed: Option<Magnitude>,
    /// `|H_A - exact(logits_A)|`.
    pub kernel_error_a: Option<Magnitude>,
    /// `|H_B - exact(logits_B)|`.
    pub kernel_error_b: Option<Magnitude>,
    /// `|exact(logits_A) - exact(logits_B)|`.
    pub logits_effect: Option<Magnitude>,
}

/// Facts of one side for the report's header.
#[derive(Clone, Debug, Serialize)]
pub struct SideInfo {
    /// The file.
    pub path: PathBuf,
    /// Dtype of the logits (`null`: no logits).
    pub logits_dtype: Option<String>,
    /// Dtype of the candidate log-probs (`null`: none).
    pub log_probs_dtype: Option<String>,
    /// Real vocabulary size (`null`: no logits).
    pub vocab_size: Option<usize>,
}

/// The report of `compare A B`.
#[derive(Clone, Debug, Serialize)]
pub struct CompareReport {
    /// Version of this document's layout ([`SCHEMA_VERSION`]).
    pub schema_version: u32,
    /// A.
    pub a: SideInfo,
    /// B.
    pub b: SideInfo,
    /// Rows of each dump (`N`).
    pub rows_total: usize,
    /// `(B, T)` for `[B, T]` rows.
    pub batch: Option<(usize, usize)>,
    /// Rows `row_mask` excludes (among the selected).
    pub rows_masked: usize,
    /// Rows whose token is `ignore_index` (among the selected, kept ones).
    pub rows_ignored: usize,
    /// The summary.
    pub summary: Summary,
    /// Every compared row, in row order.
    pub rows: Vec<CompareRow>,
    /// Exit status: 0 compared and every kernel within its bound, 1 a
    /// kernel beyond its bound (or "no bound").
    pub exit_status: u8,
    /// Wall time in seconds.
    pub seconds: f64,
    /// Rows the table lists ([`CompareConfig::worst`]; not in the JSON).
    #[serde(skip)]
    pub worst_rows: usize,
}

/// Reads one side (`side` names it in errors).
///
/// # Errors
/// [`CompareError::Dump`] (the verify reader's errors), and for a dump
/// without logits [`CompareError::ANeedsLogits`] (side A),
/// [`CompareError::NeedsLogits`], [`CompareError::NothingToCompare`].
pub fn parse_side(bytes: &[u8], side: Side) -> Result<SideDump<'_>, CompareError> {
    let dump = |source| CompareError::Dump { side, source };
    let has_logits = safetensors::SafeTensors::deserialize(bytes)
        .map(|st| st.names().contains(&"logits"))
        // Malformed: the reader says why.
        .unwrap_or(true);
    if has_logits {
        let d = match crate::dump::Dump::parse(bytes) {
            Err(DumpError::NoCandidate { .. }) => crate::dump::Dump::parse_inputs(bytes),
            other => other,
        }
        .map_err(dump)?;
        return Ok(SideDump::Logits(d));
    }
    if side == Side::A {
        return Err(CompareError::ANeedsLogits);
    }
    let d = LogProbsDump::parse(bytes, side)?;
    if d.log_probs.is_none() {
        return Err(CompareError::NothingToCompare);
    }
    Ok(SideDump::LogProbsOnly(d))
}

/// Opens, parses and compares the dumps at `a` and `b`.
///
/// # Errors
/// [`CompareError`] for bad input (either file, or the pair).
pub fn compare_files(
    a: &Path,
    b: &Path,
    config: &CompareConfig,
) -> Result<CompareReport, CompareError> {
    let fa = DumpFile::open(a).map_err(|source| CompareError::Dump {
        side: Side::A,
        source,
    })?;
    let fb = DumpFile::open(b).map_err(|source| CompareError::Dump {
        side: Side::B,
        source,
    })?;
    let da = parse_side(fa.bytes(), Side::A)?;
    let db = parse_side(fb.bytes(), Side::B)?;
    compare_dumps(&da, &db, a, b, config)
}

/// Compares two sides given as named tensors and metadata strings in
/// memory (the Python package's entry point): each side is laid out as the
/// bytes of a dump ([`crate::tensors::to_dump_bytes`]: `format_version=2`
/// added where a version-2 name is present) and compared as
/// [`compare_files`] compares two files; `name_a`, `name_b` stand for the
/// paths in the report.
///
/// # Errors
/// [`CompareError`], as for files; a side's duplicate name or byte length
/// that does not match its shape is [`CompareError::Dump`] of that side.
pub fn compare_tensors(
    a: (&[(&str, crate::tensors::TensorBytes<'_>)], &[(&str, &str)]),
    b: (&[(&str, crate::tensors::TensorBytes<'_>)], &[(&str, &str)]),
    name_a: &str,
    name_b: &str,
    config: &CompareConfig,
) -> Result<CompareReport, CompareError> {
    let bytes = |side, (t, m)| {
        crate::tensors::to_dump_bytes(t, m).map_err(|source| CompareError::Dump { side, source })
    };
    let (ba, bb) = (bytes(Side::A, a)?, bytes(Side::B, b)?);
    let da = parse_side(&ba, Side::A)?;
    let db = parse_side(&bb, Side::B)?;
    compare_dumps(&da, &db, Path::new(name_a), Path::new(name_b), config)
}

fn row_name(shape: crate::shapes::RowShape, r: usize) -> String {
    match shape.position(r) {
        Some((b, t)) => format!("(b, t) = ({b}, {t})"),
        None => format!("row {r}"),
    }
}

fn dims_text(shape: crate::shapes::RowShape) -> String {
    match shape.batch {
        Some((b, t)) => format!("[B, T] = [{b}, {t}]"),
        None => format!("[N] = [{}]", shape.n),
    }
}

/// Compares two parsed dumps (see the module docs). `path_a`, `path_b`
/// name them in the report.
///
/// # Errors
/// [`CompareError`]: the pair's mismatches (rows, tokens, `row_mask`,
/// `ignore_index`, `vocab_size`), a missing `log_probs` on A, and each
/// side's value errors for the compared rows (NaN logits, tokens out of
/// range, ...) as [`CompareError::Dump`] naming the row.
pub fn compare_dumps(
    a: &SideDump<'_>,
    b: &SideDump<'_>,
    path_a: &Path,
    path_b: &Path,
    config: &CompareConfig,
) -> Result<CompareReport, CompareError> {
    let start = std::time::Instant::now();
    let da = a.logits().ok_or(CompareError::ANeedsLogits)?;
    let lp_a = a.log_probs().ok_or(CompareError::MissingLogProbs {
        side: Side::A,
        why: " (every quantity is measured from A's log-probs)",
    })?;
    let db = b.logits();
    let lp_b = b.log_probs();
    if db.is_none() && lp_b.is_none() {
        return Err(CompareError::NothingToCompare);
    }
    let shape = a.row_shape();
    if shape != b.row_shape() {
        return Err(CompareError::RowShape {
            a: dims_text(shape),
            b: dims_text(b.row_shape()),
        });
    }
    let ta = a
        .tokens()
        .ok_or(CompareError::MissingTokens { side: Side::A })?;
    let tb = b
        .tokens()
        .ok_or(CompareError::MissingTokens { side: Side::B })?;
    if let Some(r) = (0..shape.n).find(|&r| ta[r] != tb[r]) {
        return Err(CompareError::TokenMismatch {
            at: row_name(shape, r),
            row: r,
            a: ta[r],
            b: tb[r],
        });
    }
    let mask = |s: &SideDump<'_>, r: usize| s.row_mask().is_none_or(|m| m[r]);
    if let Some(r) = (0..shape.n).find(|&r| mask(a, r) != mask(b, r)) {
        return Err(CompareError::RowMaskMismatch {
            at: row_name(shape, r),
            row: r,
            a: mask(a, r),
            b: mask(b, r),
        });
    }
    if a.ignore_index() != b.ignore_index() {
        return Err(CompareError::MetadataMismatch {
            key: "ignore_index",
            a: a.ignore_index().to_string(),
            b: b.ignore_index().to_string(),
        });
    }
    if let Some(db) = db {
        if da.vocab_size() != db.vocab_size() {
            return Err(CompareError::VocabMismatch {
                a: da.vocab_size(),
                b: db.vocab_size(),
            });
        }
    }

    let selected = config.rows.rows(shape.n);
    if selected.is_empty() && config.rows != RowSelection::All {
        return Err(CompareError::EmptySelection {
            selection: config.rows.to_string(),
            rows: shape.n,
        });
    }
    let kept: Vec<usize> = selected.iter().copied().filter(|&r| mask(a, r)).collect();
    let ignore = a.ignore_index();
    let rows: Vec<usize> = kept.iter().copied().filter(|&r| ta[r] != ignore).collect();

    // Each side's values on the compared rows, first bad row first.
    for (side, d) in [(Side::A, Some(da)), (Side::B, db)] {
        let Some(d) = d else { continue };
        let first_bad = rows
            .par_iter()
            .filter_map(|&r| d.row(r).and_then(|i| i.validate()).err().map(|e| (r, e)))
            .min_by_key(|(r, _)| *r);
        if let Some((r, e)) = first_bad {
            return Err(CompareError::Dump {
                side,
                source: crate::shapes::at_position(e, shape.position(r)),
            });
        }
    }

    let oracle = config.verify.oracle;
    let computed: Vec<Result<CompareRow, CompareError>> = rows
        .par_iter()
        .map(|&r| compare_row(da, db, &lp_a, lp_b.as_ref(), r, shape, &oracle, config.kl))
        .collect();
    let rows_out: Vec<CompareRow> = computed.into_iter().collect::<Result<_, _>>()?;

    // Each side's kernel against its bound, with verify on the same rows.
    let mut kernel_bounds = Vec::new();
    let vcfg = VerifyConfig {
        rows: config.rows,
        progress: false,
        ..config.verify.clone()
    };
    for (side, d, path) in [(Side::A, Some(da), path_a), (Side::B, db, path_b)] {
        let Some(d) = d else { continue };
        if !d.candidates.contains(Output::LogProbs) && !d.candidates.contains(Output::Entropy) {
            continue;
        }
        let report = crate::verify::verify_dump(d, path, &vcfg)
            .map_err(|source| CompareError::Dump { side, source })?;
        for o in report.outputs {
            if o.output == "log_probs" || o.output == "entropy" {
                kernel_bounds.push(KernelBound {
                    side,
                    output: o.output,
                    dtype: o.dtype,
                    verdict: o.verdict,
                    max_ratio: o.max_ratio,
                    tightest_model: o.tightest_model,
                });
            }
        }
    }

    let summary = summarize(&rows_out, config.clip, kernel_bounds, shape);
    let exit_status = exit_status(&summary);
    let info = |path: &Path, d: Option<&crate::dump::Dump<'_>>, lp: Option<Dtype>| SideInfo {
        path: path.to_path_buf(),
        logits_dtype: d.map(|d| d.logits.dtype.to_string()),
        log_probs_dtype: lp.map(|t| t.to_string()),
        vocab_size: d.map(|d| d.vocab_size()),
    };
    Ok(CompareReport {
        schema_version: SCHEMA_VERSION,
        a: info(path_a, Some(da), Some(lp_a.dtype)),
        b: info(path_b, db, lp_b.as_ref().map(|c| c.dtype)),
        rows_total: shape.n,
        batch: shape.batch,
        rows_masked: selected.len() - kept.len(),
        rows_ignored: kept.len() - rows.len(),
        summary,
        rows: rows_out,
        exit_status,
        seconds: start.elapsed().as_secs_f64(),
        worst_rows: config.worst,
    })
}

/// 1 when some side's kernel is beyond its bound or has no bound, else 0.
fn exit_status(s: &Summary) -> u8 {
    let bad = s
        .kernel_bounds
        .iter()
        .any(|k| matches!(k.verdict, Verdict::Fail | Verdict::NoBound));
    u8::from(bad)
}

/// The oracle's exact log-prob of row `r` of `d` (enclosure), and its
/// exact entropy over `entropy`'s logits when `entropy` is `Some`, in the
/// candidate's dtype `dtype` (the enclosures do not depend on it; the dtype
/// only decides when the oracle stops refining).
fn exact_row(
    d: &crate::dump::Dump<'_>,
    r: usize,
    dtype: Dtype,
    entropy: Option<EntropyLogits>,
    oracle: &Oracle,
) -> Result<(Exact, Option<Exact>, crate::dump::RowInputs), DumpError> {
    let mut inputs = d.row(r)?;
    inputs.options.entropy = entropy;
    let f = oracle
        .forward_row_of(&inputs.problem(), 0, dtype)
        .map_err(|e: SpecError| DumpError::Spec(at_row(e, r)))?;
    let first = |o: Output| f.values.get(o).and_then(|v| v.first().copied());
    let e = first(Output::LogProbs).expect("a compared row has a target");
    Ok((e, first(Output::Entropy), inputs))
}

/// The decomposition of one quantity of one row (module docs): candidates
/// `ca`, `cb`, exact enclosures `ia`, `ib`; `same_logits` makes the logits
/// effect the exact 0 (one real, so no width).
fn decompose(
    ca: f64,
    cb: Option<f64>,
    ia: Interval,
    ib: Option<Interval>,
    same_logits: bool,
) -> [Option<Enclosure>; 5] {
    let (enc, point) = (Enclosure::of, Interval::point);
    [
        Some(enc(point(ca).sub(ia))),
        cb.zip(ib).map(|(cb, ib)| enc(point(cb).sub(ib))),
        ib.map(|ib| {
            enc(if same_logits {
                Interval::point(0.0)
            } else {
                ia.sub(ib)
            })
        }),
        cb.map(|cb| enc(point(ca).sub(point(cb)))),
        match (cb, ib) {
            (Some(cb), None) => Some(enc(point(cb).sub(ia))),
            _ => None,
        },
    ]
}

#[allow(clippy::too_many_arguments)]
fn compare_row(
    da: &crate::dump::Dump<'_>,
    db: Option<&crate::dump::Dump<'_>>,
    lp_a: &LogProbs,
    lp_b: Option<&LogProbs>,
    r: usize,
    shape: crate::shapes::RowShape,
    oracle: &Oracle,
    want_kl: bool,
) -> Result<CompareRow, CompareError> {
    let side_err = |side| {
        move |e: DumpError| CompareError::Dump {
            side,
            source: crate::shapes::at_position(e, shape.position(r)),
        }
    };
    let la = lp_a.values[r];
    // The entropy is decomposed when A has an entropy candidate.
    let ent_a = da.candidates.get(Output::Entropy);
    let want_entropy = ent_a.map(|_| da.options.entropy.unwrap_or(EntropyLogits::Unmasked));
    let (ea, eh_a, in_a) =
        exact_row(da, r, lp_a.dtype, want_entropy, oracle).map_err(side_err(Side::A))?;
    let ia = ea.enclosure;
    let lb = lp_b.map(|c| c.values[r]);
    let b_exact = match db {
        Some(db) => {
            let dtype = lp_b.map_or(lp_a.dtype, |c| c.dtype);
            let ent = want_entropy.map(|w| db.options.entropy.unwrap_or(w));
            Some(exact_row(db, r, dtype, ent, oracle).map_err(side_err(Side::B))?)
        }
        None => None,
    };
    let logits_bitwise_equal = b_exact.as_ref().map(|(_, _, in_b)| {
        let (pa, pb) = (in_a.problem(), in_b.problem());
        pa.logits.dtype() == pb.logits.dtype()
            && pa.options.temperature.to_bits() == pb.options.temperature.to_bits()
            && pa.options.temperature_dtype == pb.options.temperature_dtype
            && pa.options.vocab_size == pb.options.vocab_size
            && in_a.sampling_mask == in_b.sampling_mask
            && bits_equal(&pa.logits.row_f64(0), &pb.logits.row_f64(0))
    });
    // The same logits (and options): the same exact value, one enclosure,
    // so the logits effect is exactly 0 (two enclosures of one real would
    // leave a few ulps of width in their difference).
    let ib = match logits_bitwise_equal {
        Some(true) => Some(ia),
        _ => b_exact.as_ref().map(|(e, _, _)| e.enclosure),
    };
    let kl = match (&b_exact, want_kl) {
        (Some((_, _, in_b)), true) => Some(
            oracle
                .kl_row(&in_a.problem(), 0, &in_b.problem(), 0, Dtype::F32)
                .map_err(|e| side_err(Side::B)(DumpError::Spec(at_row(e, r))))?,
        ),
        _ => None,
    };
    let log_probs_bitwise_equal =
        lp_b.map(|c| c.dtype == lp_a.dtype && c.values[r].to_bits() == la.to_bits());
    let enc = Enclosure::of;
    let same = logits_bitwise_equal == Some(true);
    let [kernel_error_a, kernel_error_b, logits_effect, observed, b_minus_exact_a] =
        decompose(la, lb, ia, ib, same);
    let entropy = match (ent_a, eh_a) {
        (Some(m), Some(eh_a)) => {
            let ha = m.row_f64(r)[0];
            let hb = db
                .and_then(|d| d.candidates.get(Output::Entropy))
                .map(|m| m.row_f64(r)[0]);
            let ih_a = eh_a.enclosure;
            let ih_b = match (same, &b_exact) {
                (true, _) => Some(ih_a),
                (false, Some((_, eh, _))) => eh.map(|e| e.enclosure),
                _ => None,
            };
            // A logits-free B holds no entropy: no b_minus_exact_a here.
            let [kernel_error_a, kernel_error_b, logits_effect, observed, _] =
                decompose(ha, hb, ih_a, ih_b, same);
            Some(EntropyRow {
                entropy_a: ha,
                entropy_b: hb,
                exact_a: enc(ih_a),
                exact_b: ih_b.map(enc),
                kernel_error_a: kernel_error_a.expect("always"),
                kernel_error_b,
                logits_effect,
                observed,
            })
        }
        _ => None,
    };
    Ok(CompareRow {
        row: r,
        position: shape.position(r),
        token: da.tokens.as_ref().expect("checked")[r],
        log_prob_a: la,
        log_prob_b: lb,
        exact_a: enc(ia),
        exact_b: ib.map(enc),
        kernel_error_a: kernel_error_a.expect("always"),
        kernel_error_b,
        logits_effect,
        observed,
        b_minus_exact_a,
        kl: kl.map(|k| enc(k.enclosure)),
        log_probs_bitwise_equal,
        logits_bitwise_equal,
        entropy,
    })
}

fn bits_equal(x: &[f64], y: &[f64]) -> bool {
    x.len() == y.len() && x.iter().zip(y).all(|(a, b)| a.to_bits() == b.to_bits())
}

fn magnitude<'r>(
    rows: &'r [CompareRow],
    f: impl Fn(&'r CompareRow) -> Option<&'r Enclosure>,
    shape: crate::shapes::RowShape,
) -> Option<Magnitude> {
    let vals: Vec<(usize, f64)> = rows
        .iter()
        .filter_map(|r| f(r).map(|e| (r.row, e.value.abs())))
        .collect();
    if vals.is_empty() && !rows.is_empty() {
        return None;
    }
    let n = vals.len();
    let sum: f64 = vals.iter().map(|v| v.1).sum();
    let max = vals
        .iter()
        .copied()
        .reduce(|a, b| if b.1 > a.1 || b.1.is_nan() { b } else { a });
    Some(Magnitude {
        rows: n,
        mean_abs: if n == 0 { 0.0 } else { sum / n as f64 },
        max_abs: max.map_or(0.0, |m| m.1),
        max_row: max.map(|m| m.0),
        max_position: max.and_then(|m| shape.position(m.0)),
    })
}

/// Pearson's r of paired values (`None` below 2 pairs, at zero variance,
/// or with a non-finite value).
fn pearson(pairs: &[(f64, f64)]) -> Option<f64> {
    let n = pairs.len();
    if n < 2 || pairs.iter().any(|(x, y)| !x.is_finite() || !y.is_finite()) {
        return None;
    }
    let mx = pairs.iter().map(|p| p.0).sum::<f64>() / n as f64;
    let my = pairs.iter().map(|p| p.1).sum::<f64>() / n as f64;
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for &(x, y) in pairs {
        let (dx, dy) = (x - mx, y - my);
        sxy += dx * dy;
        sxx += dx * dx;
        syy += dy * dy;
    }
    (sxx > 0.0 && syy > 0.0).then(|| sxy / (sxx.sqrt() * syy.sqrt()))
}

fn summarize(
    rows: &[CompareRow],
    clip: f64,
    kernel_bounds: Vec<KernelBound>,
    shape: crate::shapes::RowShape,
) -> Summary {
    let observed = magnitude(rows, |r| r.observed.as_ref(), shape);
    let ke_a = magnitude(rows, |r| Some(&r.kernel_error_a), shape).expect("every row has one");
    let ke_b = magnitude(rows, |r| r.kernel_error_b.as_ref(), shape);
    let le = magnitude(rows, |r| r.logits_effect.as_ref(), shape);
    let bma = magnitude(rows, |r| r.b_minus_exact_a.as_ref(), shape);
    let kl = magnitude(rows, |r| r.kl.as_ref(), shape);
    let bitwise_equal_rows = rows
        .iter()
        .map(|r| r.log_probs_bitwise_equal)
        .try_fold(0usize, |n, e| e.map(|e| n + e as usize));
    let logits_bitwise_equal_rows = rows
        .iter()
        .map(|r| r.logits_bitwise_equal)
        .try_fold(0usize, |n, e| e.map(|e| n + e as usize));
    let ratios: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.observed.map(|o| o.value.exp()))
        .collect();
    let importance_ratio = (observed.is_some() && !ratios.is_empty()).then(|| {
        let outside = ratios
            .iter()
            .filter(|&&q| !(1.0 - clip..=1.0 + clip).contains(&q))
            .count();
        RatioSummary {
            min: ratios.iter().copied().fold(f64::INFINITY, f64::min),
            max: ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            clip,
            outside_clip: outside,
            outside_clip_fraction: outside as f64 / ratios.len() as f64,
        }
    });
    let pairs: Vec<(f64, f64)> = rows
        .iter()
        .filter_map(|r| r.log_prob_b.map(|b| (r.log_prob_a, b)))
        .collect();
    let pearson_log_probs = pearson(&pairs);
    let probs: Vec<(f64, f64)> = pairs.iter().map(|&(a, b)| (a.exp(), b.exp())).collect();
    let pearson_probs = pearson(&probs);

    // Shares of the magnitude (module docs).
    let m_a = ke_a.mean_abs;
    let (share_kernel_a, share_kernel_b, share_logits) = match (&ke_b, &le, &bma) {
        (Some(kb), Some(l), _) => {
            let total = m_a + kb.mean_abs + l.mean_abs;
            if total > 0.0 {
                (
                    Some(m_a / total),
                    Some(kb.mean_abs / total),
                    Some(l.mean_abs / total),
                )
            } else {
                (None, None, None)
            }
        }
        (None, Some(l), _) => {
            let total = m_a + l.mean_abs;
            if total > 0.0 {
                (Some(m_a / total), None, Some(l.mean_abs / total))
            } else {
                (None, None, None)
            }
        }
        (_, None, Some(x)) => {
            let total = m_a + x.mean_abs;
            if total > 0.0 {
                (Some(m_a / total), None, Some(x.mean_abs / total))
            } else {
                (None, None, None)
            }
        }
        _ => (None, None, None),
    };
    let mut s = Summary {
        rows: rows.len(),
        observed,
        kernel_error_a: ke_a,
        kernel_error_b: ke_b,
        logits_effect: le,
        b_minus_exact_a: bma,
        kl,
        bitwise_equal_rows,
        logits_bitwise_equal_rows,
        importance_ratio,
        pearson_log_probs,
        pearson_probs,
        share_kernel_a,
        share_kernel_b,
        share_logits,
        kernel_bounds,
        entropy: rows.first().and_then(|r| r.entropy.as_ref()).map(|_| {
            let e = |f: fn(&EntropyRow) -> Option<&Enclosure>| {
                magnitude(rows, move |r| r.entropy.as_ref().and_then(f), shape)
            };
            EntropySummary {
                observed: e(|h| h.observed.as_ref()),
                kernel_error_a: e(|h| Some(&h.kernel_error_a)),
                kernel_error_b: e(|h| h.kernel_error_b.as_ref()),
                logits_effect: e(|h| h.logits_effect.as_ref()),
            }
        }),
        verdict: String::new(),
    };
    s.verdict = verdict_line(&s);
    s
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// "the mismatch is X% kernel numerics (A a%, B b%), Y% logits; ...".
fn verdict_line(s: &Summary) -> String {
    if s.rows == 0 {
        return "no row compared".into();
    }
    let out_of_bound: Vec<String> = s
        .kernel_bounds
        .iter()
        .filter(|k| matches!(k.verdict, Verdict::Fail | Verdict::NoBound))
        .map(|k| {
            let why = match (k.verdict, k.max_ratio) {
                (Verdict::NoBound, _) => "no bound".to_string(),
                (_, Some(r)) => format!("err/bound {}", crate::verify::fmt_g(r)),
                _ => "beyond its bound".to_string(),
            };
            format!(
                "{}'s {} kernel is out of its bound ({why})",
                k.side, k.output
            )
        })
        .collect();
    let suspect: Vec<String> = s
        .kernel_bounds
        .iter()
        .filter(|k| k.verdict == Verdict::Suspect)
        .map(|k| {
            format!(
                "{}'s {} kernel is within its bound but SUSPECT (beyond the statistical threshold)",
                k.side, k.output
            )
        })
        .collect();
    let within: Vec<String> = s
        .kernel_bounds
        .iter()
        .filter(|k| k.output == "log_probs" && k.verdict == Verdict::Pass)
        .map(|k| k.side.to_string())
        .collect();
    let mut notes = out_of_bound;
    match within.len() {
        0 => {}
        1 => notes.push(format!(
            "{}'s log_probs kernel is within its bound",
            within[0]
        )),
        _ => notes.push("both log_probs kernels are within their bounds".into()),
    }
    notes.extend(suspect);
    let bounds = if notes.is_empty() {
        String::new()
    } else {
        format!("; {}", notes.join("; "))
    };
    if s.bitwise_equal_rows == Some(s.rows) {
        let logits = match s.logits_bitwise_equal_rows {
            Some(n) if n == s.rows => " and the logits",
            _ => "",
        };
        return format!(
            "no mismatch: the log-probs{logits} of A and B are bitwise equal on all {} rows{bounds}",
            s.rows
        );
    }
    match (s.share_kernel_a, s.share_kernel_b, s.share_logits) {
        (Some(a), Some(b), Some(l)) => format!(
            "the mismatch is {} kernel numerics (A {}, B {}), {} logits{bounds}",
            pct(a + b),
            pct(a),
            pct(b),
            pct(l)
        ),
        (Some(a), None, Some(l)) if s.b_minus_exact_a.is_some() => format!(
            "the mismatch is {} A's kernel numerics, {} B's logits and kernel together (B has no logits to separate them){bounds}",
            pct(a),
            pct(l)
        ),
        (Some(a), None, Some(l)) => format!(
            "the difference of exact log-probs is {} of the magnitude, A's kernel error {} (B has no log_probs){bounds}",
            pct(l),
            pct(a)
        ),
        _ => format!("the exact log-probs of A and B agree and neither kernel errs{bounds}"),
    }
}

use crate::verify::{json_f64, json_opt_f64};

#[cfg(test)]
mod tests;
