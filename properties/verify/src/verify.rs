//! `logprobe verify`: judge the outputs of another implementation, dumped
//! as safetensors ([`crate::dump`]), against the exact oracle.
//!
//! For every selected row, the oracle recomputes each candidate output
//! present (`log_probs`, `entropy`, `topk_log_probs`, `grad_logits`) from
//! the exact inputs, and the tolerance model ([`crate::tolerance`]) bounds
//! the error a correct implementation may make under the chosen summation
//! model. Each element's error is an upper bound on `|candidate - exact|`
//! over the oracle's enclosure ([`Exact::error`]); it passes when it is at
//! most the bound. Rows run in parallel (rayon), one decoded row of memory
//! per thread.
//!
//! Verdicts per output and per file: `pass` (every element within its
//! bound), `FAIL` (some element beyond a finite bound, or a NaN / infinite
//! candidate where the exact value is finite), `no bound` (the model
//! certifies nothing, `n u >= 1`: never a pass). The report also gives, per
//! output, the tightest of `tree`, `lanes=8`, `sequential` that every
//! element satisfies, so the reader sees how far the candidate is from what
//! a better summation achieves.

use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::Serialize;

use ndarray::ArrayView1;

use logprobe_reference::oracle::{Exact, Oracle};
use logprobe_reference::spec::{Columns, Dtype, Output, PerOutput, SpecError};

use crate::dump::{at_row, Dump, DumpError, DumpFile, RowInputs};
use crate::tolerance;
use logprobe_kernels::{CpuKernel, Kernel};

/// Which rows of each dump to check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum RowSelection {
    /// Every row.
    All,
    /// Rows `start..end` (clamped to `N`).
    Range {
        /// First row.
        start: usize,
        /// One past the last row.
        end: usize,
    },
    /// `k` rows spread evenly over `[0, N)`: rows `floor(i N / k)` for
    /// `i < k` (all rows when `k >= N`). Deterministic, so a rerun checks
    /// the same rows.
    Sample(usize),
}

impl std::str::FromStr for RowSelection {
    type Err = String;
    /// Parses `all`, `a..b`, `a..` or `sample:K`.
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let bad = || format!("bad --rows `{s}`: expected `a..b`, `a..` or `sample:K`");
        if s == "all" {
            return Ok(RowSelection::All);
        }
        if let Some(k) = s.strip_prefix("sample:") {
            return match k.parse() {
                Ok(0) => Err(format!("--rows `{s}` selects no row: K must be at least 1")),
                Ok(k) => Ok(RowSelection::Sample(k)),
                Err(_) => Err(bad()),
            };
        }
        let (a, b) = s.split_once("..").ok_or_else(bad)?;
        let start = if a.is_empty() {
            0
        } else {
            a.parse().map_err(|_| bad())?
        };
        let end = if b.is_empty() {
            usize::MAX
        } else {
            b.parse().map_err(|_| bad())?
        };
        if end < start {
            return Err(bad());
        }
        if end == start {
            return Err(format!("--rows `{s}` selects no row (empty range)"));
        }
        Ok(RowSelection::Range { start, end })
    }
}

impl std::fmt::Display for RowSelection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            RowSelection::All => f.write_str("all"),
            RowSelection::Range {
                start,
                end: usize::MAX,
            } => write!(f, "{start}.."),
            RowSelection::Range { start, end } => write!(f, "{start}..{end}"),
            RowSelection::Sample(k) => write!(f, "sample:{k}"),
        }
    }
}

impl RowSelection {
    /// The selected rows of a dump of `n` rows, ascending.
    pub fn rows(&self, n: usize) -> Vec<usize> {
        match *self {
            RowSelection::All => (0..n).collect(),
            RowSelection::Range { start, end } => (start.min(n)..end.min(n)).collect(),
            RowSelection::Sample(k) if k >= n => (0..n).collect(),
            // i n / k is strictly increasing in i for k < n: distinct rows.
            RowSelection::Sample(k) => (0..k)
                .map(|i| ((i as u128 * n as u128) / k as u128) as usize)
                .collect(),
        }
    }
}

/// Settings of a verification.
#[derive(Clone, Debug)]
pub struct VerifyConfig {
    /// Summation order of the bound (default [`tolerance::Order::DEFAULT`],
    /// `lanes=8`): a foreign-kernel preset.
    pub model: tolerance::Order,
    /// Accumulation dtype of the foreign kernel; `None` = the logits'
    /// accumulation dtype (f32 for f32/bf16/f16 logits, f64 for f64).
    pub accumulation: Option<Dtype>,
    /// Rows to check.
    pub rows: RowSelection,
    /// How many worst elements to report per output.
    pub worst: usize,
    /// Show progress on stderr: a bar on a terminal, otherwise a line every
    /// `progress_interval` ([`crate::progress`]).
    pub progress: bool,
    /// Time between two progress lines when stderr is not a terminal.
    pub progress_interval: std::time::Duration,
    /// The oracle's precision policy.
    pub oracle: Oracle,
    /// The statistical threshold's `c` (`None`: no SUSPECT tier); default
    /// [`tolerance::DEFAULT_C`]. Forward outputs only.
    pub statistical_c: Option<f64>,
}

impl Default for VerifyConfig {
    fn default() -> Self {
        VerifyConfig {
            model: tolerance::Order::DEFAULT,
            accumulation: None,
            rows: RowSelection::All,
            worst: 5,
            progress: false,
            progress_interval: crate::progress::ProgressMode::DEFAULT_INTERVAL,
            oracle: Oracle::default(),
            statistical_c: Some(tolerance::DEFAULT_C),
        }
    }
}

/// A verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum ReportVerdict {
    /// Every element within its bound.
    Pass,
    /// Every element within its sound bound, some beyond the statistical
    /// threshold ([`tolerance::Statistical`]): far less accurate than a
    /// correct implementation in any calibrated order. Exit 0, 1 with `--strict`.
    Suspect,
    /// The model certifies nothing (`n u >= 1`) and nothing is definitely
    /// wrong: not a pass.
    NoBound,
    /// Some element beyond its bound.
    Fail,
}

impl ReportVerdict {
    /// `pass`, `suspect`, `no bound` or `fail` (the `--expect` vocabulary).
    pub fn name(self) -> &'static str {
        match self {
            ReportVerdict::Pass => "pass",
            ReportVerdict::Suspect => "suspect",
            ReportVerdict::NoBound => "no bound",
            ReportVerdict::Fail => "fail",
        }
    }
}

impl std::fmt::Display for ReportVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReportVerdict::Pass => "pass",
            ReportVerdict::Suspect => "SUSPECT",
            ReportVerdict::NoBound => "no bound",
            ReportVerdict::Fail => "FAIL",
        })
    }
}

/// One judged element.
#[derive(Clone, Debug, Serialize)]
pub struct Judged {
    /// Row of the dump.
    pub row: usize,
    /// `(b, t)` of the row for `[B, T, V]` logits.
    pub position: Option<(usize, usize)>,
    /// Column: `k` for top-k, vocabulary index for `grad_logits`.
    pub col: Option<usize>,
    /// The candidate value (exact f64 of the stored value).
    #[serde(serialize_with = "json_f64")]
    pub candidate: f64,
    /// The exact value: midpoint of the oracle's enclosure, as f64.
    #[serde(serialize_with = "json_f64")]
    pub exact: f64,
    /// The exact value correctly rounded to the candidate's dtype.
    #[serde(serialize_with = "json_f64")]
    pub exact_rounded: f64,
    /// Upper bound on `|candidate - exact|` (nats, or nats per logit for
    /// gradients).
    #[serde(serialize_with = "json_f64")]
    pub error: f64,
    /// `error` in ulps of the candidate's dtype at the exact value.
    #[serde(serialize_with = "json_f64")]
    pub ulps: f64,
    /// The bound under the chosen model; `None` = no bound.
    #[serde(serialize_with = "json_opt_f64")]
    pub bound: Option<f64>,
    /// `error / bound` (`inf` when the bound is 0 and the error is not, or
    /// without a bound).
    #[serde(serialize_with = "json_f64")]
    pub ratio: f64,
}

/// The flash-attention rule's figure for one output (DESIGN: reported
/// alongside, not required; [`tolerance::FlashRule`]).
#[derive(Clone, Debug, Serialize)]
pub struct FlashRule {
    /// `max error / max(max naive same-dtype error, max half ulp)`.
    #[serde(serialize_with = "json_f64")]
    pub ratio: f64,
    /// Whether the rule holds (`ratio <= 2`).
    pub holds: bool,
}

/// The largest `error / bound` of an output under one reference model.
#[derive(Clone, Debug, Serialize)]
pub struct ModelRatio {
    /// `tree`, `lanes=8` or `sequential`.
    pub model: String,
    /// Largest ratio; `None` when the model certifies nothing for some element.
    #[serde(serialize_with = "json_opt_f64")]
    pub max_ratio: Option<f64>,
}

/// Serialises an f64 as a JSON number, or as the string `"inf"`, `"-inf"`
/// or `"NaN"` (JSON has no non-finite numbers).
fn json_f64<S: serde::Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    if x.is_finite() {
        s.serialize_f64(*x)
    } else if x.is_nan() {
        s.serialize_str("NaN")
    } else if *x > 0.0 {
        s.serialize_str("inf")
    } else {
        s.serialize_str("-inf")
    }
}

/// [`json_f64`] for an optional value (`null` when absent).
fn json_opt_f64<S: serde::Serializer>(x: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match x {
        Some(v) => json_f64(v, s),
        None => s.serialize_none(),
    }
}

/// The judgement of one output of one dump.
#[derive(Clone, Debug, Serialize)]
pub struct OutputReport {
    /// `log_probs`, `entropy`, `topk_log_probs` or `grad_logits`.
    pub output: &'static str,
    /// Dtype of the candidate tensor.
    pub dtype: String,
    /// Elements judged.
    pub count: usize,
    /// ReportVerdict under the chosen model.
    pub verdict: ReportVerdict,
    /// Largest error bound `|candidate - exact|`.
    #[serde(serialize_with = "json_f64")]
    pub max_abs_error: f64,
    /// Largest error in ulps of the candidate's dtype.
    #[serde(serialize_with = "json_f64")]
    pub max_ulps: f64,
    /// Largest `error / bound` (`null` when nothing has a bound).
    #[serde(serialize_with = "json_opt_f64")]
    pub max_ratio: Option<f64>,
    /// The tightest of `tree`, `lanes=8`, `sequential` under which every
    /// element is within bound; `None` when none is.
    pub tightest_model: Option<String>,
    /// Largest `error / bound` under each reference model, in
    /// [`tolerance::Order::REFERENCE`] order.
    pub reference_ratios: Vec<ModelRatio>,
    /// The flash-attention rule, when the tolerance module provides it.
    pub flash_rule: Option<FlashRule>,
    /// Why the chosen model certifies nothing (first element without a bound).
    pub no_bound_reason: Option<String>,
    /// Elements within the sound bound but beyond the statistical threshold.
    pub suspect_elements: usize,
    /// Largest `error / statistical threshold` (`null` without a tier:
    /// gradients, or `--statistical-c` off).
    #[serde(serialize_with = "json_opt_f64")]
    pub statistical_max_ratio: Option<f64>,
    /// Largest error our own correct f32 kernel (`Fused`) makes on the same
    /// rows, rounded to the same dtype (`null` for gradients).
    #[serde(serialize_with = "json_opt_f64")]
    pub fused_max_abs_error: Option<f64>,
    /// `max_abs_error / fused_max_abs_error`: how many times less accurate
    /// than a correct f32 kernel on these rows.
    #[serde(serialize_with = "json_opt_f64")]
    pub vs_fused: Option<f64>,
    /// The worst elements, worst first (by ratio, then by error).
    pub worst: Vec<Judged>,
    /// Why no element was checked (no row, every row ignored, `K = 0`);
    /// `None` when some element was. Such an output is valid but certifies
    /// nothing: the table says "unchecked".
    pub nothing_checked: Option<String>,
}

/// The judgement of one dump.
#[derive(Clone, Debug, Serialize)]
pub struct FileReport {
    /// The file.
    pub path: PathBuf,
    /// File stem (the key in `expected.json`).
    pub name: String,
    /// Overall verdict (the worst of the outputs').
    pub verdict: ReportVerdict,
    /// `N`.
    pub rows: usize,
    /// Rows checked (`--rows`).
    pub rows_checked: usize,
    /// Columns of logits (`V_total`).
    pub columns: usize,
    /// Real vocabulary size.
    pub vocab_size: usize,
    /// Dtype of the logits.
    pub logits_dtype: String,
    /// Summation model and accumulation dtype of the bound.
    pub model: String,
    /// Accumulation dtype of the bound.
    pub accumulation: String,
    /// The statistical threshold's `c` (`null`: no SUSPECT tier).
    #[serde(serialize_with = "json_opt_f64")]
    pub statistical_c: Option<f64>,
    /// Per output.
    pub outputs: Vec<OutputReport>,
    /// `topk_ids` judged as the kernel's top-k (`topk_ids_source=kernel`).
    pub topk_ids: Option<crate::topk_set::TopkSetReport>,
    /// Tensors the format does not define (not read).
    pub ignored_tensors: Vec<String>,
    /// Wall time in seconds.
    pub seconds: f64,
}

/// The result of verifying one file: a report, or the bad input found.
#[derive(Debug)]
pub enum FileOutcome {
    /// Verified.
    Report(FileReport),
    /// Bad input (exit status 2).
    BadInput {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        error: DumpError,
    },
}

/// Opens, parses and verifies `path`.
///
/// # Errors
/// [`DumpError`] for bad input: unreadable, malformed or truncated files,
/// missing or misshapen tensors, bad metadata, no candidate, and the spec's
/// value errors (NaN / `+inf` logits, tokens out of range, ...), naming
/// tensor, row and column.
pub fn verify_file(path: &Path, config: &VerifyConfig) -> Result<FileReport, DumpError> {
    let file = DumpFile::open(path)?;
    let dump = file.parse()?;
    verify_dump(&dump, path, config)
}

/// Accumulates judged elements of one output.
#[derive(Clone, Debug)]
struct OutputAcc {
    count: usize,
    max_abs: f64,
    max_ulps: f64,
    /// Largest ratio under the chosen model (finite bounds only).
    max_ratio: Option<f64>,
    any_no_bound: bool,
    any_fail: bool,
    /// Per reference model: largest ratio, and whether any element had no bound.
    reference: [(Option<f64>, bool); 3],
    flash: Option<tolerance::FlashRule>,
    /// Why the chosen model gave no bound (first occurrence).
    no_bound_reason: Option<String>,
    worst: Vec<Judged>,
    /// Statistical tier: suspect elements, largest error / threshold.
    suspect: usize,
    stat_ratio: Option<f64>,
    /// Largest error of our Fused f32 kernel on the same rows.
    fused_err: Option<f64>,
}

impl OutputAcc {
    fn new() -> Self {
        OutputAcc {
            count: 0,
            max_abs: 0.0,
            max_ulps: 0.0,
            max_ratio: None,
            any_no_bound: false,
            any_fail: false,
            reference: [(None, false); 3],
            flash: None,
            no_bound_reason: None,
            worst: Vec::new(),
            suspect: 0,
            stat_ratio: None,
            fused_err: None,
        }
    }

    /// Adds one element judged under the chosen model, with its
    /// `error / bound` under the reference models (`None` = no bound).
    fn push(&mut self, j: Judged, reference: [Option<f64>; 3], keep: usize) {
        self.count += 1;
        self.max_abs = max_nan(self.max_abs, j.error);
        self.max_ulps = max_nan(self.max_ulps, j.ulps);
        // A NaN or infinite candidate where the exact value is finite is
        // wrong under any model.
        let definitely_wrong = j.error.is_nan() || j.error == f64::INFINITY;
        match j.bound {
            Some(b) => {
                self.max_ratio = Some(max_nan(self.max_ratio.unwrap_or(0.0), j.ratio));
                // NaN errors fail too.
                if j.error.partial_cmp(&b) != Some(std::cmp::Ordering::Less) && j.error != b {
                    self.any_fail = true;
                }
            }
            None => {
                self.any_no_bound = true;
                if definitely_wrong {
                    self.any_fail = true;
                }
            }
        }
        for (acc, r) in self.reference.iter_mut().zip(reference) {
            match r {
                Some(r) => acc.0 = Some(max_nan(acc.0.unwrap_or(0.0), r)),
                None => acc.1 = true,
            }
        }
        if keep > 0 {
            self.worst.push(j);
            if self.worst.len() > 4 * keep {
                self.trim(keep);
            }
        }
    }

    fn trim(&mut self, keep: usize) {
        self.worst.sort_by(|a, b| {
            worse(b)
                .partial_cmp(&worse(a))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        self.worst.truncate(keep);
    }

    fn merge(&mut self, other: OutputAcc, keep: usize) {
        self.count += other.count;
        self.max_abs = max_nan(self.max_abs, other.max_abs);
        self.max_ulps = max_nan(self.max_ulps, other.max_ulps);
        self.max_ratio = match (self.max_ratio, other.max_ratio) {
            (Some(a), Some(b)) => Some(max_nan(a, b)),
            (a, b) => a.or(b),
        };
        self.any_no_bound |= other.any_no_bound;
        self.any_fail |= other.any_fail;
        if self.no_bound_reason.is_none() {
            self.no_bound_reason = other.no_bound_reason;
        }
        for (a, b) in self.reference.iter_mut().zip(other.reference) {
            a.0 = match (a.0, b.0) {
                (Some(x), Some(y)) => Some(max_nan(x, y)),
                (x, y) => x.or(y),
            };
            a.1 |= b.1;
        }
        self.flash = match (self.flash, other.flash) {
            (Some(a), Some(b)) => Some(tolerance::FlashRule {
                candidate_error: max_nan(a.candidate_error, b.candidate_error),
                naive_error: max_nan(a.naive_error, b.naive_error),
                floor: a.floor.max(b.floor),
            }),
            (a, b) => a.or(b),
        };
        self.worst.extend(other.worst);
        self.trim(keep);
        self.suspect += other.suspect;
        self.stat_ratio = opt_max(self.stat_ratio, other.stat_ratio);
        self.fused_err = opt_max(self.fused_err, other.fused_err);
    }

    /// Records the statistical threshold of an element judged within its
    /// sound bound (`error`): suspect when beyond it.
    fn observe_statistical(
        &mut self,
        error: f64,
        sound_pass: bool,
        threshold: &tolerance::ErrorBound,
    ) {
        if let tolerance::ErrorBound::Abs(t) = threshold {
            let r = if *t > 0.0 {
                error / t
            } else if error == 0.0 {
                0.0
            } else {
                f64::INFINITY
            };
            self.stat_ratio = opt_max(self.stat_ratio, Some(r));
            if sound_pass && !(error <= *t) {
                self.suspect += 1;
            }
        }
    }

    fn verdict(&self) -> ReportVerdict {
        if self.any_fail {
            ReportVerdict::Fail
        } else if self.any_no_bound {
            ReportVerdict::NoBound
        } else if self.suspect > 0 {
            ReportVerdict::Suspect
        } else {
            ReportVerdict::Pass
        }
    }
}

/// Sort key of the worst elements: ratio under the chosen model, errors
/// of unbounded elements after every bounded one (by error).
fn worse(j: &Judged) -> (f64, f64) {
    let r = if j.ratio.is_nan() {
        f64::INFINITY
    } else {
        j.ratio
    };
    let e = if j.error.is_nan() {
        f64::INFINITY
    } else {
        j.error
    };
    (r, e)
}

fn opt_max(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(max_nan(x, y)),
        (x, y) => x.or(y),
    }
}

fn max_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// Per-row accumulators, one per judged output.
type RowAcc = PerOutput<OutputAcc>;

/// Verifies a parsed dump (see the module docs).
///
/// # Errors
/// The spec's value errors ([`DumpError::Spec`]) for the first bad selected
/// row, and [`DumpError::BadMaskValue`].
pub fn verify_dump(
    dump: &Dump<'_>,
    path: &Path,
    config: &VerifyConfig,
) -> Result<FileReport, DumpError> {
    let start = std::time::Instant::now();
    let n = dump.n();
    let logits_dtype = dump.logits.dtype;
    let acc_dtype = config.accumulation.unwrap_or(logits_dtype.accumulation());
    // Shapes, vocab_size and temperature: O(1), before any row.
    if n > 0 {
        dump.row(0)?.problem().validate_shapes()?;
    } else {
        // No row to decode: check the temperature on its own.
        dump.options
            .effective_temperature(logits_dtype.accumulation())?;
    }
    let rows = config.rows.rows(n);
    if rows.is_empty() && config.rows != RowSelection::All {
        return Err(DumpError::EmptySelection {
            selection: config.rows.to_string(),
            rows: n,
        });
    }
    let rows = crate::shapes::unmasked_rows(rows, dump.row_mask.as_deref());

    // Validate every selected row first (cheap, O(V) each), so bad input is
    // reported deterministically (first bad row) before any oracle work.
    let first_bad = rows
        .par_iter()
        .filter_map(|&r| {
            dump.row(r)
                .and_then(|inputs| inputs.validate())
                .err()
                .map(|e| (r, e))
        })
        .min_by_key(|(r, _)| *r);
    if let Some((r, e)) = first_bad {
        return Err(crate::shapes::at_position(e, dump.row_shape.position(r)));
    }

    let mode = if config.progress {
        crate::progress::ProgressMode::Auto {
            interval: config.progress_interval,
        }
    } else {
        crate::progress::ProgressMode::Off
    };
    let mut progress = crate::progress::Progress::start(mode, rows.len(), path);
    let keep = config.worst;
    let results: Vec<Result<RowAcc, DumpError>> = rows
        .par_iter()
        .map(|&r| {
            let out = verify_row(dump, r, acc_dtype, config, keep);
            progress.inc();
            out
        })
        .collect();
    progress.finish();

    let mut totals: RowAcc = PerOutput::new();
    for res in results {
        for (o, mut part) in res? {
            match totals.get_mut(o) {
                Some(t) => t.merge(part, keep),
                None => {
                    part.trim(keep);
                    totals.insert(o, part);
                }
            }
        }
    }

    let mut outputs = Vec::new();
    for (o, candidate) in dump.candidates.iter() {
        let acc = totals.take(o).unwrap_or_else(OutputAcc::new);
        let mut report = output_report(o.name(), candidate.dtype, acc);
        for j in &mut report.worst {
            j.position = dump.row_shape.position(j.row);
        }
        if report.count == 0 {
            report.nothing_checked = Some(nothing_checked_reason(o, dump, &rows));
        }
        outputs.push(report);
    }
    let topk_ids = dump
        .format
        .topk_kernel
        .then(|| crate::topk_set::check_dump(dump, &rows, config.worst))
        .transpose()?;
    let verdict = outputs
        .iter()
        .map(|o| o.verdict)
        .chain(topk_ids.as_ref().map(|t| t.verdict))
        .max()
        .unwrap_or(ReportVerdict::Pass);
    Ok(FileReport {
        path: path.to_path_buf(),
        name: path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
        verdict,
        rows: n,
        rows_checked: rows.len(),
        columns: dump.v_total(),
        vocab_size: dump.vocab_size(),
        logits_dtype: logits_dtype.to_string(),
        model: config.model.to_string(),
        accumulation: acc_dtype.to_string(),
        statistical_c: config.statistical_c,
        outputs,
        topk_ids,
        ignored_tensors: dump.ignored_tensors.clone(),
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Why no row was checked: `N = 0`, or `row_mask` excludes every selected row.
pub fn no_rows_reason(dump: &Dump<'_>) -> String {
    if dump.n() == 0 {
        "no rows (N = 0)".to_string()
    } else {
        "row_mask excludes every selected row".to_string()
    }
}

/// Why output `name` has no element checked over `rows`.
fn nothing_checked_reason(output: Output, dump: &Dump<'_>, rows: &[usize]) -> String {
    if rows.is_empty() {
        return no_rows_reason(dump);
    }
    match output {
        Output::LogProbs => format!(
            "every checked row's token is ignore_index ({})",
            dump.options.ignore_index
        ),
        Output::TopkLogProbs => "K = 0: topk_ids has no column".to_string(),
        _ => "no element".to_string(),
    }
}

fn output_report(name: &'static str, dtype: Dtype, acc: OutputAcc) -> OutputReport {
    let verdict = acc.verdict();
    let reference_ratios: Vec<ModelRatio> = tolerance::Order::REFERENCE
        .iter()
        .zip(acc.reference)
        .map(|(m, (r, no_bound))| ModelRatio {
            model: m.to_string(),
            max_ratio: if no_bound {
                None
            } else {
                Some(r.unwrap_or(0.0))
            },
        })
        .collect();
    let tightest_model = tolerance::Order::REFERENCE
        .iter()
        .zip(acc.reference)
        .find(|(_, (r, no_bound))| !no_bound && r.unwrap_or(0.0) <= 1.0)
        .map(|(m, _)| m.to_string());
    OutputReport {
        output: name,
        dtype: dtype.to_string(),
        count: acc.count,
        verdict,
        max_abs_error: acc.max_abs,
        max_ulps: acc.max_ulps,
        max_ratio: acc.max_ratio,
        tightest_model,
        reference_ratios,
        flash_rule: acc.flash.map(|f| FlashRule {
            ratio: f.ratio(),
            holds: f.holds(),
        }),
        no_bound_reason: acc.no_bound_reason,
        suspect_elements: acc.suspect,
        statistical_max_ratio: acc.stat_ratio,
        fused_max_abs_error: acc.fused_err,
        vs_fused: acc.fused_err.map(|f| {
            if f > 0.0 {
                acc.max_abs / f
            } else if acc.max_abs == 0.0 {
                1.0
            } else {
                f64::INFINITY
            }
        }),
        worst: acc.worst,
        nothing_checked: None,
    }
}

/// The candidate dtypes that need a forward call, deduplicated.
fn forward_dtypes(dump: &Dump<'_>) -> Vec<Dtype> {
    let mut v: Vec<Dtype> = dump
        .candidates
        .iter()
        .filter(|(o, _)| o.is_forward())
        .map(|(_, c)| c.dtype)
        .collect();
    v.sort();
    v.dedup();
    v
}

/// Judges one element under the four models `[chosen, tree, lanes=8,
/// sequential]` ([`tolerance::judge`]): the chosen model's judgement and the
/// reference models' `error / bound` (`None` = no bound).
fn judge4(
    row: usize,
    col: Option<usize>,
    candidate: f64,
    exact: &Exact,
    dtype: Dtype,
    bounds: &[tolerance::ErrorBound; 4],
) -> (Judged, [Option<f64>; 3]) {
    let js = bounds
        .each_ref()
        .map(|b| tolerance::judge(exact, candidate, dtype, b));
    let e = exact.enclosure;
    let mid = if e.lo == e.hi {
        e.lo
    } else {
        e.lo / 2.0 + e.hi / 2.0
    };
    let j = &js[0];
    let judged = Judged {
        row,
        position: None,
        col,
        candidate,
        exact: if mid.is_nan() { exact.rounded } else { mid },
        exact_rounded: exact.rounded,
        error: j.error_abs,
        ulps: j.error_ulps,
        bound: j.bound.value(),
        ratio: j.ratio.unwrap_or(f64::INFINITY),
    };
    (judged, [js[1].ratio, js[2].ratio, js[3].ratio])
}

/// Oracle, bounds and judgement for one row: the exact values of every
/// candidate output (forward once per candidate dtype, the VJP in the
/// gradient's dtype), then the row-judging walk ([`tolerance::walk_row`]),
/// each element under `[chosen, tree, lanes=8, sequential]`.
fn verify_row(
    dump: &Dump<'_>,
    r: usize,
    acc_dtype: Dtype,
    config: &VerifyConfig,
    keep: usize,
) -> Result<RowAcc, DumpError> {
    let inputs: RowInputs = dump.row(r)?;
    let p = inputs.problem();
    let cot = inputs.cotangents();
    let oracle = &config.oracle;
    let spec = |e: SpecError| DumpError::Spec(at_row(e, r));
    let stats = oracle.row_stats(&p, 0).map_err(spec)?;
    let ctx = tolerance::RowContext::from_problem(&p, 0).map_err(spec)?;
    let models = Models::new(config.model, acc_dtype);
    let rb = models.all.each_ref().map(|m| m.row_bounds(&stats, &ctx));
    let st = config
        .statistical_c
        .map(|c| tolerance::Statistical::new(models.all[0]).with_c(c))
        .map(|s| s.row_bounds(&stats, &ctx));
    let targets = tolerance::RowTargets::new(&p, 0, &cot);

    let forwards = forward_dtypes(dump)
        .into_iter()
        .map(|dtype| oracle.forward(&p, dtype))
        .collect::<Result<Vec<_>, _>>()
        .map_err(spec)?;
    // Our correct f32 kernel on the same row, per forward dtype.
    let ours: Vec<_> = forward_dtypes(dump)
        .into_iter()
        .filter_map(|dtype| {
            CpuKernel::fused()
                .forward(&p, dtype)
                .ok()
                .map(|f| (dtype, f))
        })
        .collect();
    let grad = dump
        .candidates
        .get(Output::GradLogits)
        .map(|g| oracle.vjp(&p, &cot, g.dtype))
        .transpose()
        .map_err(spec)?;
    let exact: PerOutput<ArrayView1<'_, Exact>> = dump
        .candidates
        .iter()
        .filter_map(|(o, c)| {
            let values = match &grad {
                Some(g) if o == Output::GradLogits => g,
                _ => forwards
                    .iter()
                    .find(|f| f.dtype == c.dtype)?
                    .values
                    .get(o)?,
            };
            Some((o, values.row(0)))
        })
        .collect();
    let rows = dump.candidates.as_ref().map(|_, c| (c.dtype, c.row_f64(r)));
    let candidates = rows
        .as_ref()
        .map(|_, (dtype, v)| (*dtype, ArrayView1::from(&v[..])));

    let mut naive = tolerance::NaiveRow::new(&p, 0);
    let mut out: RowAcc = PerOutput::new();
    let walked: Result<(), std::convert::Infallible> = tolerance::walk_row(
        &exact,
        &candidates,
        |o| o.judged(&p, 0),
        |e| {
            let acc = out.get_or_insert_with(e.output, OutputAcc::new);
            let bounds = rb
                .each_ref()
                .map(|b| b.bound(e.output, e.col, &targets, e.dtype));
            if let (tolerance::ErrorBound::None { reason }, None) =
                (&bounds[0], &acc.no_bound_reason)
            {
                acc.no_bound_reason = Some(reason.to_string());
            }
            let col = (e.output.columns() != Columns::One).then_some(e.col);
            let (judged, reference) = judge4(r, col, e.candidate, e.exact, e.dtype, &bounds);
            acc.push(judged, reference, keep);
            // The statistical threshold (forward outputs only) and our
            // kernel's error on the same element.
            if let Some(t) = st
                .as_ref()
                .and_then(|s| s.bound(e.output, e.col, &targets, e.dtype))
            {
                let j = tolerance::judge(e.exact, e.candidate, Dtype::F64, &bounds[0]);
                acc.observe_statistical(j.error_abs, j.pass, &t);
            }
            if e.output.is_forward() {
                let v = ours
                    .iter()
                    .find(|(d, _)| *d == e.dtype)
                    .and_then(|(_, f)| f.values.get(e.output))
                    .map(|a| a[[0, e.col]]);
                if let Some(v) = v {
                    acc.fused_err = opt_max(acc.fused_err, Some(e.exact.error(v)));
                }
            }
            if let Some(n) = naive.value(e.output, e.col, &targets, e.dtype) {
                acc.flash
                    .get_or_insert_with(tolerance::FlashRule::new)
                    .observe(e.exact, e.candidate, n, e.dtype);
            }
            Ok(())
        },
    );
    let Ok(()) = walked;
    Ok(out)
}

/// The chosen model and the three reference models (tree, lanes=8,
/// sequential), all accumulating in the same dtype.
struct Models {
    all: [tolerance::Model; 4],
}

impl Models {
    fn new(chosen: tolerance::Order, acc: Dtype) -> Self {
        let chosen = tolerance::Model::preset(chosen).with_accumulation(acc);
        let [a, b, c] = tolerance::foreign_presets(acc);
        Models {
            all: [chosen, a, b, c],
        }
    }
}

/// Formats a float for the table: 3 significant digits, `-` for none.
fn fmt_g(x: f64) -> String {
    if x.is_nan() {
        "NaN".into()
    } else if x.is_infinite() {
        if x > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        }
    } else if x == 0.0 {
        "0".into()
    } else if (1e-3..1e5).contains(&x.abs()) {
        let digits = (2 - x.abs().log10().floor() as i32).max(0) as usize;
        format!("{x:.digits$}")
    } else {
        format!("{x:.2e}")
    }
}

/// Formats a candidate / exact value with enough digits to tell them apart.
fn fmt_v(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.9e}")
    } else {
        format!("{x}")
    }
}

/// The human-readable table of one file's report: a header line with the
/// verdict, one line per output (verdict, max error absolute and in ulps,
/// error / bound, tightest model, flash-attention rule), and the worst
/// elements of each output with candidate and exact values.
pub fn render_table(report: &FileReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let all_unchecked = report.outputs.iter().all(|o| o.nothing_checked.is_some())
        && report
            .topk_ids
            .as_ref()
            .is_none_or(|t| t.nothing_checked.is_some());
    let _ = writeln!(
        s,
        "{}: {}{}  [{} x {} {} logits (vocab {}), rows checked {}/{}, model {} {} accumulation, {:.2} s]",
        report.path.display(),
        report.verdict,
        if all_unchecked { " (nothing checked)" } else { "" },
        report.rows,
        report.columns,
        report.logits_dtype,
        report.vocab_size,
        report.rows_checked,
        report.rows,
        report.model,
        report.accumulation,
        report.seconds,
    );
    let _ = writeln!(
        s,
        "  {:<15} {:>5} {:>8} {:>9} {:>10} {:>10} {:>10} {:>11} {:>6} {:>9} {:>10}",
        "output",
        "dtype",
        "elements",
        "verdict",
        "max |err|",
        "max ulps",
        "err/bound",
        "tightest",
        "flash",
        "err/stat",
        "vs f32"
    );
    for o in &report.outputs {
        let _ = writeln!(
            s,
            "  {:<15} {:>5} {:>8} {:>9} {:>10} {:>10} {:>10} {:>11} {:>6} {:>9} {:>10}",
            o.output,
            o.dtype,
            o.count,
            if o.nothing_checked.is_some() {
                "unchecked".to_string()
            } else {
                o.verdict.to_string()
            },
            fmt_g(o.max_abs_error),
            fmt_g(o.max_ulps),
            o.max_ratio.map_or("-".into(), fmt_g),
            o.tightest_model.as_deref().unwrap_or("none"),
            o.flash_rule.as_ref().map_or("-".into(), |f| fmt_g(f.ratio)),
            o.statistical_max_ratio.map_or("-".into(), fmt_g),
            o.vs_fused.map_or("-".into(), |r| format!("{}x", fmt_g(r))),
        );
    }
    // "37x less accurate than a correct f32 kernel on these rows".
    for o in &report.outputs {
        if let (Some(r), Some(f)) = (o.vs_fused, o.fused_max_abs_error) {
            if r > 2.0 {
                let _ = writeln!(
                    s,
                    "  {}: {}x less accurate than a correct f32 kernel on these rows (its max |err| {})",
                    o.output,
                    fmt_g(r),
                    fmt_g(f)
                );
            }
        }
        if o.suspect_elements > 0 {
            let _ = writeln!(
                s,
                "  {}: SUSPECT: {} of {} elements within the sound bound but beyond the statistical threshold (c = {})",
                o.output, o.suspect_elements, o.count, report.statistical_c.map_or("-".into(), fmt_g)
            );
        }
    }
    if let Some(t) = &report.topk_ids {
        let _ = writeln!(
            s,
            "  {:<15} {:>5} {:>8} {:>9}  ids as the kernel's top-{} of z'{}: {} of {} rows not a valid top-k set",
            "topk_ids",
            "-",
            t.rows_checked,
            if t.nothing_checked.is_some() {
                "unchecked".to_string()
            } else {
                t.verdict.to_string()
            },
            t.k,
            if t.sorted { ", descending" } else { "" },
            t.rows_failed,
            t.rows_checked,
        );
    }
    for o in &report.outputs {
        if let Some(why) = &o.nothing_checked {
            let _ = writeln!(s, "  {}: nothing checked: {why}", o.output);
        }
    }
    if let Some(t) = &report.topk_ids {
        if let Some(why) = &t.nothing_checked {
            let _ = writeln!(s, "  topk_ids: nothing checked: {why}");
        }
        for f in &t.failures {
            let at = match f.position {
                Some((b, tt)) => format!("(b, t) = ({b}, {tt})"),
                None => format!("row {}", f.row),
            };
            let _ = writeln!(s, "    topk_ids {at}: {}", f.message);
        }
    }
    for o in &report.outputs {
        if o.worst.is_empty() {
            continue;
        }
        let _ = writeln!(s, "  worst {}:", o.output);
        for j in &o.worst {
            let at = match (j.position, j.col) {
                (Some((b, t)), Some(c)) => format!("({b}, {t}), {c}"),
                (Some((b, t)), None) => format!("({b}, {t})"),
                (None, Some(c)) => format!("[{}, {}]", j.row, c),
                (None, None) => format!("[{}]", j.row),
            };
            let _ = writeln!(
                s,
                "    {:<14} candidate {:>16}  exact {:>16}  |err| {:>9}  ulps {:>8}  bound {:>9}  err/bound {:>8}",
                at,
                fmt_v(j.candidate),
                fmt_v(j.exact),
                fmt_g(j.error),
                fmt_g(j.ulps),
                j.bound.map_or("none".into(), fmt_g),
                if j.bound.is_some() { fmt_g(j.ratio) } else { "-".into() },
            );
        }
    }
    if !report.ignored_tensors.is_empty() {
        let _ = writeln!(
            s,
            "  ignored tensors (not in the format): {}",
            report.ignored_tensors.join(", ")
        );
    }
    s
}

/// One line of an `--expect` comparison.
#[derive(Clone, Debug, Serialize)]
pub struct ExpectRow {
    /// File stem.
    pub name: String,
    /// The expected verdict (`pass`, `fail`, `no bound`), `None` when the
    /// file is not listed.
    pub expected: Option<String>,
    /// The verdict found (`pass`, `fail`, `no bound`, `bad input`).
    pub found: String,
    /// Whether they agree.
    pub matches: bool,
}

/// Errors of an `--expect` file.
#[derive(Debug, thiserror::Error)]
pub enum ExpectError {
    /// Unreadable file.
    #[error("cannot read expectations {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Not `{"name": {"expect": "pass" | "fail" | "no bound"}, ...}`.
    #[error("bad expectations {path}: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// Expected verdicts by file stem, from JSON `{"name": {"expect": "pass" |
/// "fail" | "no bound", ...}, ...}` (other keys, such as `why`, are ignored).
#[derive(Clone, Debug, Default)]
pub struct Expectations(pub std::collections::BTreeMap<String, String>);

impl Expectations {
    /// Reads and checks an expectations file.
    ///
    /// # Errors
    /// [`ExpectError`].
    pub fn load(path: &Path) -> Result<Self, ExpectError> {
        let text = std::fs::read_to_string(path).map_err(|source| ExpectError::Io {
            path: path.into(),
            source,
        })?;
        Self::parse(&text).map_err(|reason| ExpectError::Format {
            path: path.into(),
            reason,
        })
    }

    /// Parses the JSON text; the error is a description.
    ///
    /// # Errors
    /// A message naming the entry at fault.
    pub fn parse(text: &str) -> Result<Self, String> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let obj = value.as_object().ok_or("top level is not an object")?;
        let mut out = std::collections::BTreeMap::new();
        for (name, entry) in obj {
            let expect = entry
                .get("expect")
                .and_then(|e| e.as_str())
                .ok_or_else(|| format!("entry `{name}` has no string `expect`"))?;
            match expect {
                "pass" | "suspect" | "fail" | "no bound" => {
                    out.insert(name.clone(), expect.to_string());
                }
                other => {
                    return Err(format!(
                        "entry `{name}`: expect = {other:?}, not pass, suspect, fail or no bound"
                    ))
                }
            }
        }
        Ok(Expectations(out))
    }

    /// Compares outcomes with the expectations, in the outcomes' order.
    pub fn compare(&self, outcomes: &[FileOutcome]) -> Vec<ExpectRow> {
        outcomes
            .iter()
            .map(|o| {
                let (name, found) = match o {
                    FileOutcome::Report(r) => (r.name.clone(), r.verdict.name().to_string()),
                    FileOutcome::BadInput { path, .. } => (stem(path), "bad input".to_string()),
                };
                let expected = self.0.get(&name).cloned();
                let matches = expected.as_deref() == Some(found.as_str());
                ExpectRow {
                    name,
                    expected,
                    found,
                    matches,
                }
            })
            .collect()
    }
}

fn stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The `--expect` comparison as text.
pub fn render_expect(rows: &[ExpectRow]) -> String {
    use std::fmt::Write;
    let mut s = String::from("expected verdicts:\n");
    for r in rows {
        let _ = writeln!(
            s,
            "  {:<36} expected {:<9} found {:<9} {}",
            r.name,
            r.expected.as_deref().unwrap_or("(unlisted)"),
            r.found,
            if r.matches { "ok" } else { "MISMATCH" }
        );
    }
    let bad = rows.iter().filter(|r| !r.matches).count();
    let _ = writeln!(s, "{} of {} as expected", rows.len() - bad, rows.len());
    s
}

/// The exit status of `logprobe verify`: 2 when any file is bad input;
/// otherwise, with expectations, 0 when every verdict matches and 1 when
/// one does not; without, 0 when every file passes and 1 when any fails
/// or has no bound.
pub fn exit_status(outcomes: &[FileOutcome], expect: Option<&[ExpectRow]>) -> u8 {
    exit_status_strict(outcomes, expect, false)
}

/// [`exit_status`], where without expectations a `suspect` verdict passes
/// (exit 0) unless `strict` (exit 1).
pub fn exit_status_strict(
    outcomes: &[FileOutcome],
    expect: Option<&[ExpectRow]>,
    strict: bool,
) -> u8 {
    if outcomes
        .iter()
        .any(|o| matches!(o, FileOutcome::BadInput { .. }))
    {
        return 2;
    }
    match expect {
        Some(rows) => u8::from(!rows.iter().all(|r| r.matches)),
        None => u8::from(!outcomes.iter().all(|o| {
            matches!(o, FileOutcome::Report(r) if r.verdict == ReportVerdict::Pass
                    || (!strict && r.verdict == ReportVerdict::Suspect))
        })),
    }
}

/// Verifies each file in turn (rows in parallel within a file); bad input
/// in one file does not stop the others.
pub fn verify_files(paths: &[PathBuf], config: &VerifyConfig) -> Vec<FileOutcome> {
    paths
        .iter()
        .map(|p| match verify_file(p, config) {
            Ok(r) => FileOutcome::Report(r),
            Err(error) => FileOutcome::BadInput {
                path: p.clone(),
                error,
            },
        })
        .collect()
}
