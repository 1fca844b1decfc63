//! The verify engine: one dump judged row by row (rows in parallel), each
//! row's elements walked once ([`crate::tolerance::walk_row`]) and judged
//! under the chosen model and the three reference models, accumulated per
//! output into the report.

use std::path::{Path, PathBuf};

use rayon::prelude::*;

use ndarray::ArrayView1;

use logprobe_reference::oracle::{
    Exact, Fallback, Interval, LossSum, MpfrLossSum, Oracle, Rounder,
};
use logprobe_reference::spec::{
    Columns, Dtype, LossOptions, Output, PerOutput, Reduction, SpecError,
};

use crate::dump::{at_row, Dump, DumpError, DumpFile, RowInputs};
use crate::row_oracle::RowOracle;
use crate::tolerance;
use logprobe_kernels::{CpuKernel, Kernel};

use super::grad_screen::{RowScreen, Screened};
use super::*;

/// Whether verify screens gradient elements ([`super::grad_screen`]):
/// on unless [`set_grad_screen`] turned it off or the environment sets
/// `LOGPROBE_GRAD_SCREEN=0`. The report is the same bits either way (the
/// switch exists to show that, and to time both).
fn grad_screen_on() -> bool {
    GRAD_SCREEN.load(std::sync::atomic::Ordering::Relaxed)
        && std::env::var_os("LOGPROBE_GRAD_SCREEN").is_none_or(|v| v != "0")
}

static GRAD_SCREEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Turns the gradient screen on or off for this process (tests and
/// benchmarks compare both; the report does not depend on it).
#[doc(hidden)]
pub fn set_grad_screen(on: bool) {
    GRAD_SCREEN.store(on, std::sync::atomic::Ordering::Relaxed);
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
    /// Largest error of our fused f32 kernel ([`CpuKernel::fused`]) on the same rows.
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

    /// Adds a row's gradient elements screened by [`super::grad_screen`]
    /// (at least one; their count and error maxima as the judge measures
    /// them): each passes, and each of its ratios is at most that of a seed
    /// of the same row, which is pushed in full, so only the count and the
    /// error maxima can move (the ratio maxima become `Some` as that seed
    /// makes them). Maxima do not depend on the order of the elements.
    fn push_screened(&mut self, s: Screened) {
        self.count += s.count;
        self.max_abs = max_nan(self.max_abs, s.max_abs);
        self.max_ulps = max_nan(self.max_ulps, s.max_ulps);
        self.max_ratio = Some(self.max_ratio.unwrap_or(0.0));
        for acc in self.reference.iter_mut() {
            acc.0 = Some(acc.0.unwrap_or(0.0));
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
    let results: Vec<Result<RowResult, DumpError>> = rows
        .par_iter()
        .map(|&r| {
            let out = verify_row(dump, r, acc_dtype, config, keep);
            progress.inc();
            out
        })
        .collect();
    progress.finish();

    let mut totals: RowAcc = PerOutput::new();
    let mut fallback = Fallback::default();
    let mut loss_rows = Vec::new();
    for res in results {
        let (acc, fb, loss_row) = res?;
        fallback += fb;
        loss_rows.extend(loss_row);
        for (o, mut part) in acc {
            match totals.get_mut(o) {
                Some(t) => t.merge(part, keep),
                None => {
                    part.trim(keep);
                    totals.insert(o, part);
                }
            }
        }
    }

    // A reduced loss: one element for the whole dump, after the rows.
    let reduced = reduced_loss(dump);
    if let Some(lo) = reduced {
        if rows.len() == n {
            let (acc, fb) = judge_reduced_loss(dump, &loss_rows, lo, acc_dtype, config, keep)?;
            fallback += fb;
            totals.insert(Output::Loss, acc);
        }
    }

    let mut outputs = Vec::new();
    for (o, candidate) in dump.candidates.iter() {
        let acc = totals.take(o).unwrap_or_else(OutputAcc::new);
        let mut report = output_report(o.name(), candidate.dtype, acc);
        if o == Output::Loss {
            report.reduction = dump.options.loss.map(|l| l.reduction.name());
        }
        let whole = o == Output::Loss && reduced.is_some();
        for j in &mut report.worst {
            j.position = if whole {
                None
            } else {
                dump.row_shape.position(j.row)
            };
        }
        // A top-k KL over K = 0 teacher entries is 0 by definition: judged,
        // but nothing was checked.
        let no_teacher = matches!(o, Output::ForwardKl | Output::ReverseKl)
            && dump.topk_ids.as_ref().is_some_and(|t| t.ncols() == 0);
        if report.count == 0 || no_teacher {
            report.nothing_checked = Some(if whole {
                format!(
                    "a {} loss is over every row: the row selection / row_mask leave out {} of {} rows",
                    reduced.map_or("", |l| l.reduction.name()),
                    n - rows.len(),
                    n
                )
            } else {
                nothing_checked_reason(o, dump, &rows)
            });
            if report.verdict == ReportVerdict::Pass {
                report.verdict = ReportVerdict::Unchecked;
            }
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
        fallback: fallback.into(),
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
        Output::ForwardKl | Output::ReverseKl => {
            "K = 0: topk_ids has no column, the top-k KL is over no teacher entry".to_string()
        }
        Output::Entropy
        | Output::GradLogits
        | Output::Lse
        | Output::ZLoss
        | Output::Loss
        | Output::KlK1
        | Output::KlK2
        | Output::KlK3
        | Output::KlAbs
        | Output::Ratio => "no element".to_string(),
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
        reduction: None,
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
/// reference models' `error / bound` (`None` = no bound), and whether it
/// passes the chosen bound.
fn judge4(
    row: usize,
    col: Option<usize>,
    candidate: f64,
    exact: &Exact,
    dtype: Dtype,
    bounds: &[tolerance::ErrorBound; 4],
) -> (Judged, bool, [Option<f64>; 3]) {
    // The error is measured once; only the bound differs per model.
    let j = tolerance::judge(exact, candidate, dtype, &bounds[0]);
    let refs = [1, 2, 3].map(|i| tolerance::ratio_pass(j.error_abs, &bounds[i]).0);
    let e = exact.enclosure;
    let mid = if e.lo == e.hi {
        e.lo
    } else {
        e.lo / 2.0 + e.hi / 2.0
    };
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
    (judged, j.pass, refs)
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
) -> Result<RowResult, DumpError> {
    let inputs: RowInputs = dump.row(r)?;
    let p = inputs.problem();
    let cot = inputs.cotangents();
    let spec = |e: SpecError| DumpError::Spec(at_row(e, r));
    let with_grad = dump.candidates.get(Output::GradLogits).is_some();
    let (mut oracle, mut stats) = RowOracle::new(&config.oracle, &p, with_grad).map_err(spec)?;
    let ctx = tolerance::RowContext::from_problem(&p, 0).map_err(spec)?;
    let models = Models::new(config.model, acc_dtype);
    let statistical = config
        .statistical_c
        .map(|c| tolerance::Statistical::new(models.all[0]).with_c(c));
    let keys = entry_keys(&p, dump.vocab_size());
    let (rb, st) = tolerance::RowBounds::new_shared(
        &models.all,
        statistical.as_ref(),
        &stats,
        &ctx,
        keys.as_deref(),
    );
    let mut targets = tolerance::RowTargets::new(&p, 0, &cot);
    if let Some(l) = targets.loss.as_mut() {
        l.with_sums(&stats);
    }

    let forwards = forward_dtypes(dump)
        .into_iter()
        .map(|dtype| oracle.forward(dtype))
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
        .map(|g| oracle.vjp(&cot, g.dtype))
        .transpose()
        .map_err(spec)?;
    // A reduced output is judged once for the dump (after the rows), from
    // each row's term: not in the row's walk.
    let exact: PerOutput<ArrayView1<'_, Exact>> = dump
        .candidates
        .iter()
        .filter(|(o, _)| !o.reduced(&p))
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
    let rows: PerOutput<(Dtype, Vec<f64>)> = dump
        .candidates
        .iter()
        .filter(|(o, _)| !o.reduced(&p))
        .map(|(o, c)| (o, (c.dtype, c.row_f64(r))))
        .collect();
    let candidates = rows
        .as_ref()
        .map(|_, (dtype, v)| (*dtype, ArrayView1::from(&v[..])));

    let grad_cot = targets.grad_cotangents();
    let grad_row = tolerance::RowBounds::grad_row(&rb, &grad_cot);
    let mut screen = match (
        exact.get(Output::GradLogits),
        candidates.get(Output::GradLogits),
    ) {
        (Some(ex), Some((dtype, cand))) if grad_screen_on() && Output::GradLogits.judged(&p, 0) => {
            RowScreen::new(
                &rb,
                &grad_row,
                &grad_cot,
                ex.view(),
                cand.view(),
                *dtype,
                targets.vocab_size,
                keep,
            )
        }
        _ => None,
    };
    // (The screen holds what the sweep needs of `exact` and the candidates.)
    let screened = screen.as_mut().map(RowScreen::sweep);
    let mut naive = tolerance::NaiveRow::new(&p, 0);
    let mut out: RowAcc = PerOutput::new();
    if let Some(s) = screened.filter(|s| s.count > 0) {
        out.get_or_insert_with(Output::GradLogits, OutputAcc::new)
            .push_screened(s);
    }
    let walked: Result<(), std::convert::Infallible> = tolerance::walk_row(
        &exact,
        &candidates,
        |o| o.judged(&p, 0),
        |e| {
            if e.output == Output::GradLogits
                && e.col < targets.vocab_size
                && screen.as_ref().is_some_and(|s| s.is_screened(e.col))
            {
                // Counted by the sweep above.
                return Ok(());
            }
            let acc = out.get_or_insert_with(e.output, OutputAcc::new);
            let bounds = if e.output == Output::GradLogits && e.col < targets.vocab_size {
                tolerance::RowBounds::grad_many_with(&rb, &grad_row, e.col, &grad_cot, e.dtype)
            } else {
                rb.each_ref()
                    .map(|b| b.bound(e.output, e.col, &targets, e.dtype))
            };
            if let (tolerance::ErrorBound::None { reason }, None) =
                (&bounds[0], &acc.no_bound_reason)
            {
                acc.no_bound_reason = Some(reason.to_string());
            }
            let col = (e.output.columns() != Columns::One).then_some(e.col);
            let (judged, pass, reference) = judge4(r, col, e.candidate, e.exact, e.dtype, &bounds);
            let error = judged.error;
            acc.push(judged, reference, keep);
            // The statistical threshold (forward outputs only) and our
            // kernel's error on the same element.
            if let Some(t) = st
                .as_ref()
                .and_then(|s| s.threshold((e.output, e.col), &targets, e.dtype))
            {
                // Measured as in f64: for a finite candidate that is the
                // judgement's above (only an infinite candidate's error
                // depends on the dtype, `judge`'s out-of-range rule).
                let (error, pass) = if e.candidate.is_infinite() {
                    let j = tolerance::judge(e.exact, e.candidate, Dtype::F64, &bounds[0]);
                    (j.error_abs, j.pass)
                } else {
                    (error, pass)
                };
                acc.observe_statistical(error, pass, &t);
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
    drop(screen);
    // What this row adds to a reduced loss: its term's enclosure (from the
    // forward in the loss's dtype) and its T17 row bound per model.
    let loss_row = dump
        .candidates
        .get(Output::Loss)
        .filter(|_| Output::Loss.reduced(&p))
        .map(|c| {
            let l = targets.loss.as_ref().expect("a problem with a loss");
            let term = forwards
                .iter()
                .find(|f| f.dtype == c.dtype)
                .and_then(|f| f.values.get(Output::Loss))
                .map_or(
                    Interval {
                        lo: 0.0,
                        hi: f64::INFINITY,
                    },
                    |v| v[[0, 0]].enclosure,
                );
            LossRow {
                term,
                counted: l.counted,
                weight: l.weight,
                bounds: rb.each_ref().map(|b| b.loss_row_of(l)),
            }
        });
    let fallback = oracle.finish();
    // The row's statistics buffers go back to this worker's pool.
    drop((rb, st));
    crate::scratch::give(std::mem::take(&mut stats.d));
    crate::scratch::give(std::mem::take(&mut stats.e));
    Ok((out, fallback, loss_row))
}

/// One row's judgements, oracle counts, and its part of a reduced loss.
type RowResult = (RowAcc, Fallback, Option<LossRow>);

/// What one row contributes to a reduced loss (`sum` / `mean`), judged
/// after the rows ([`judge_reduced_loss`]).
#[derive(Clone, Debug)]
struct LossRow {
    /// Enclosure of the row's term `w l` (nats; exactly 0 when not counted).
    term: Interval,
    /// Token not `ignore_index`.
    counted: bool,
    /// The row's `loss_weights` entry (1 without weights).
    weight: f64,
    /// The row's T17 bound under `[chosen, tree, lanes=8, sequential]`.
    bounds: [Result<tolerance::LossRowBound, tolerance::NoBound>; 4],
}

/// The loss options of a dump whose `loss` is reduced (`sum` / `mean`).
fn reduced_loss(dump: &Dump<'_>) -> Option<LossOptions> {
    dump.options
        .loss
        .filter(|l| l.reduction != Reduction::None && dump.candidates.contains(Output::Loss))
}

/// Judges a reduced `loss` (one value for the dump) from every row's
/// [`LossRow`] (in row order, every row of the dump): the exact value is
/// the rows' terms reduced on the f64 tier ([`LossSum`]) when that decides
/// it in the candidate's dtype, else by MPFR row by row ([`mpfr_reduced_loss`]);
/// the bound is [`tolerance::loss_bounds`] over the rows' T17 bounds. The
/// declared NaN of an all-ignored `mean` (`mean_all_ignored = nan`) is its
/// own rule: only a NaN candidate is right (error 0 against bound 0), any
/// other value is wrong (error `inf`).
///
/// # Errors
/// The spec's errors of a row, on the MPFR path (validated already).
fn judge_reduced_loss(
    dump: &Dump<'_>,
    rows: &[LossRow],
    lo: LossOptions,
    acc_dtype: Dtype,
    config: &VerifyConfig,
    keep: usize,
) -> Result<(OutputAcc, Fallback), DumpError> {
    let c = &dump.candidates[Output::Loss];
    let (dtype, candidate) = (c.dtype, c.row_f64(0)[0]);
    let mut sum = LossSum::default();
    for l in rows {
        sum.add(l.term, l.counted, l.weight);
    }
    let mut fb = Fallback {
        outputs: 1,
        ..Fallback::default()
    };
    let exact = match sum.decide(lo.reduction, lo.mean_all_ignored, dtype) {
        Some(e) => e,
        None => {
            fb.outputs_mpfr = 1;
            mpfr_reduced_loss(dump, lo, dtype, &config.oracle)?
        }
    };
    let counted: Vec<bool> = rows.iter().map(|l| l.counted).collect();
    let weights: Option<Vec<f64>> = dump
        .loss_weights
        .is_some()
        .then(|| rows.iter().map(|l| l.weight).collect());
    let bounds: [tolerance::ErrorBound; 4] = std::array::from_fn(|i| {
        let per_row: Vec<_> = rows.iter().map(|l| l.bounds[i].clone()).collect();
        tolerance::loss_bounds(
            &per_row,
            &counted,
            weights.as_deref(),
            lo.reduction,
            sum.divisor.lo,
            acc_dtype,
            dtype,
        )
        .pop()
        .expect("one bound for a reduced loss")
    });
    let mut acc = OutputAcc::new();
    if let tolerance::ErrorBound::None { reason } = &bounds[0] {
        acc.no_bound_reason = Some(reason.to_string());
    }
    let (judged, reference) = if exact.rounded.is_nan() {
        // The declared NaN: right only as a NaN.
        let error = if candidate.is_nan() {
            0.0
        } else {
            f64::INFINITY
        };
        let judged = Judged {
            row: 0,
            position: None,
            col: None,
            candidate,
            exact: f64::NAN,
            exact_rounded: f64::NAN,
            error,
            ulps: error,
            bound: Some(0.0),
            ratio: error,
        };
        (judged, [Some(error); 3])
    } else {
        let (judged, _, reference) = judge4(0, None, candidate, &exact, dtype, &bounds);
        (judged, reference)
    };
    acc.push(judged, reference, keep);
    Ok((acc, fb))
}

/// The exact reduced loss of `dump` in `target` by MPFR, row by row: Ziv's
/// loop over the whole dump, each step every row's term at the step's
/// precision ([`Oracle::loss_term`], rows in parallel, one row's inputs in
/// memory at a time per worker) summed in row order ([`MpfrLossSum`]),
/// until the reduced value is decided (or the cap: undecided, judged by
/// its far end).
///
/// # Errors
/// The spec's errors of a row (validated already).
fn mpfr_reduced_loss(
    dump: &Dump<'_>,
    lo: LossOptions,
    target: Dtype,
    oracle: &Oracle,
) -> Result<Exact, DumpError> {
    let n = dump.n();
    let mut rounder = Rounder::new();
    let mut last = None;
    for prec in oracle.precisions(target) {
        let terms: Vec<Result<_, DumpError>> = (0..n)
            .into_par_iter()
            .map(|r| {
                let inputs = dump.row(r)?;
                oracle
                    .loss_term(&inputs.problem(), 0, prec)
                    .map_err(|e| DumpError::Spec(at_row(e, r)))
            })
            .collect();
        let mut m = MpfrLossSum::new(prec);
        for (r, t) in terms.into_iter().enumerate() {
            let w = dump.loss_weights.as_ref().map_or(1.0, |w| w[r]);
            m.add(&t?, dump.has_target(r), w);
        }
        let e = m.exact(lo.reduction, lo.mean_all_ignored, &mut rounder, target);
        if e.decided {
            return Ok(e);
        }
        last = Some(e);
    }
    Ok(last.expect("at least one precision"))
}

/// The grouping keys of row 0 of `p` for the bounds' per-entry sums
/// ([`tolerance::RowBounds::new_shared`]), `[V]`: a 16-bit logit's raw
/// bits and its sampling-mask bit; `None` for f32 and f64 logits (their
/// values are mostly distinct).
fn entry_keys(p: &logprobe_reference::spec::Problem<'_>, v: usize) -> Option<Vec<u32>> {
    use logprobe_reference::spec::Logits;
    let bits: Vec<u32> = match p.logits {
        Logits::Bf16(a) => a
            .row(0)
            .iter()
            .take(v)
            .map(|x| u32::from(x.to_bits()))
            .collect(),
        Logits::F16(a) => a
            .row(0)
            .iter()
            .take(v)
            .map(|x| u32::from(x.to_bits()))
            .collect(),
        _ => return None,
    };
    Some(match p.sampling_mask {
        Some(m) => bits
            .into_iter()
            .zip(m.row(0))
            .map(|(b, &ok)| b | (u32::from(ok) << 16))
            .collect(),
        None => bits,
    })
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
