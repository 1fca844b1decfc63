//! `logprobe compare A B`: where a trainer-vs-rollout log-prob mismatch
//! comes from. A and B are dumps of the same rows (the same `tokens` and
//! `row_mask`), each with its own `logits` and `log_probs`; B may lack
//! logits (rollout engines return log-probs only).
//!
//! # Per row (nats; each an enclosure)
//!
//! With `lp` a side's candidate log-prob and `exact(logits)` the oracle's
//! exact log-prob of that side's logits (its own temperature, mask and
//! dtype;
//! [`Oracle::forward_row_of`](logprobe_reference::oracle::Oracle::forward_row_of)):
//!
//! - `kernel_error_a = lp_A - exact(logits_A)`, `kernel_error_b` likewise:
//!   what each side's log-prob kernel adds;
//! - `logits_effect = exact(logits_A) - exact(logits_B)`: the part due to
//!   the logits alone (matmuls, attention, bf16 storage, batch-dependent
//!   reductions);
//! - `observed = lp_A - lp_B`, which is exactly
//!   `kernel_error_a - kernel_error_b + logits_effect`;
//! - `kl = KL(softmax(z'_A) || softmax(z'_B))`, exact
//!   ([`Oracle::kl_row`](logprobe_reference::oracle::Oracle::kl_row): an
//!   enclosure whose ends round to one f32), when both sides have logits;
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
//! combined by [`Interval::sub`](logprobe_reference::oracle::Interval::sub)
//! (each end rounded in its direction), so
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
mod report;
mod row;
mod side;
mod summary;

use std::path::Path;

use rayon::prelude::*;

use logprobe_reference::spec::{Dtype, Output};

pub use render::render_table;
pub use report::{
    CompareReport, CompareRow, Enclosure, EntropyRow, EntropySummary, KernelBound, Magnitude,
    NonFinite, RatioSummary, SideInfo, Summary,
};
pub use side::{LogProbs, LogProbsDump, Side, SideDump, LOGITS_FREE_TENSORS};

use crate::dump::{DumpError, DumpFile};
use crate::verify::{ReportVerdict as Verdict, RowSelection, VerifyConfig};
use row::compare_row;
use summary::summarize;

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

/// Reads one side (`side` names it in errors).
///
/// # Errors
/// [`CompareError::Dump`] (the verify reader's errors), and for a dump
/// without logits [`CompareError::ANeedsLogits`] (side A),
/// [`CompareError::NeedsLogits`], [`CompareError::NothingToCompare`].
pub fn parse_side(bytes: &[u8], side: Side) -> Result<SideDump<'_>, CompareError> {
    let h =
        crate::dump::Header::read(bytes).map_err(|source| CompareError::Dump { side, source })?;
    side_of_header(h, side)
}

/// One side from its checked header (a file's, or tensors' in memory).
fn side_of_header(h: crate::dump::Header<'_>, side: Side) -> Result<SideDump<'_>, CompareError> {
    let dump = |source| CompareError::Dump { side, source };
    if h.st.tensor("logits").is_some() {
        let d = match crate::dump::Dump::from_header(h.clone(), true) {
            Err(DumpError::NoCandidate { .. }) => crate::dump::Dump::from_header(h, false),
            other => other,
        }
        .map_err(dump)?;
        return Ok(SideDump::Logits(d));
    }
    if side == Side::A {
        return Err(CompareError::ANeedsLogits);
    }
    let d = LogProbsDump::from_header(&h, side)?;
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

/// One side of [`compare_tensors`]: named tensors (as
/// [`crate::tensors::TensorBytes`]) and metadata `(key, value)` pairs.
pub type TensorSide<'a> = (
    &'a [(&'a str, crate::tensors::TensorBytes<'a>)],
    &'a [(&'a str, &'a str)],
);

/// Compares two sides given as named tensors and metadata strings in
/// memory (the Python package's entry point), read in place as a dump
/// holding them (`format_version=2` added where a version-2 name is
/// present) and compared as
/// [`compare_files`] compares two files; `name_a`, `name_b` stand for the
/// paths in the report.
///
/// # Errors
/// [`CompareError`], as for files; a side's duplicate name or byte length
/// that does not match its shape is [`CompareError::Dump`] of that side.
pub fn compare_tensors(
    a: TensorSide<'_>,
    b: TensorSide<'_>,
    name_a: &str,
    name_b: &str,
    config: &CompareConfig,
) -> Result<CompareReport, CompareError> {
    let side = |side, (t, m)| {
        let h = crate::tensors::header_of(t, m)
            .map_err(|source| CompareError::Dump { side, source })?;
        side_of_header(h, side)
    };
    let (da, db) = (side(Side::A, a)?, side(Side::B, b)?);
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
            key: crate::keys::IGNORE_INDEX.name,
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

/// 0 only when something was compared and nothing is wrong: 1 when no row
/// was compared, a side's candidate log-prob is NaN or infinite, or some
/// side's kernel is beyond its bound, has no bound or was left unchecked.
fn exit_status(s: &Summary) -> u8 {
    let bad = s.rows == 0
        || !s.non_finite.is_empty()
        || s.kernel_bounds.iter().any(|k| {
            matches!(
                k.verdict,
                Verdict::Fail | Verdict::NoBound | Verdict::Unchecked
            )
        });
    u8::from(bad)
}

#[cfg(test)]
mod tests;
