//! The verify engine: one dump judged row by row (rows in parallel), each
//! row's elements walked once ([`crate::tolerance::walk_row`]) and judged
//! under the chosen model and the three reference models, accumulated per
//! output into the report.

use std::path::Path;

use rayon::prelude::*;

use ndarray::ArrayView1;

use logprobe_reference::oracle::{Exact, Fallback, Interval, RowStats};
use logprobe_reference::spec::{
    Columns, Dtype, Family, LossOptions, Output, PerOutput, RowStat, SpecError,
};

use crate::dump::{at_row, Dump, DumpError};
use crate::row_oracle::RowOracle;
use crate::tolerance;
use logprobe_reference::oracle::OracleForward;
use logprobe_reference::spec::Problem;
use ndarray::Array2;

use super::acc::{output_report, OutputAcc};
use super::grad_screen::{RowScreen, StatParts};
use super::linear_grads::{judge_linear_grads, LinearGradInputs, LinearGradRow};
use super::linear_logits::{logits_report, merge_logits};
use super::reduced::{judge_reduced_loss, reduced_loss, LossRow};
use super::row_setup::{
    entry_keys, forward_dtypes, linear_grad_row, row_context, row_inputs, verify_rows,
};
use super::tiers::{observe_tiers, GradStat, Tiers};
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
    // The dump's declarations narrow the configured model
    // ([`VerifyConfig::for_dump`]).
    let config = &config.for_dump(dump);
    let n = dump.n();
    let acc_dtype = config.accumulation.unwrap_or(dump.logits.accumulation());
    // Shapes, vocab_size and temperature: O(1), before any row.
    if n > 0 {
        dump.row(0)?.problem().validate_shapes()?;
    } else {
        // No row to decode: check the temperature on its own.
        dump.options
            .effective_temperature(dump.logits.accumulation())?;
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
    // Logits made from `hidden` cost O(V H) a row: those rows are
    // validated where they are verified (the first bad row in order is
    // reported all the same).
    let first_bad = rows
        .par_iter()
        .filter(|_| dump.logits.linear().is_none())
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
    let results = verify_rows(dump, &rows, acc_dtype, config, &progress);
    progress.finish();

    let mut totals: RowAcc = PerOutput::new();
    let mut fallback = Fallback::default();
    let mut loss_rows = Vec::new();
    let mut lin_rows = Vec::new();
    let mut lin_logits: Option<OutputAcc> = None;
    for res in results {
        let (acc, fb, loss_row, (lin, logits)) = res?;
        fallback += fb;
        loss_rows.extend(loss_row);
        lin_rows.extend(lin);
        lin_logits = merge_logits(lin_logits, logits, keep);
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

    let mut outputs = file_outputs(dump, totals, reduced, &rows);
    outputs.extend(logits_report(dump, lin_logits, keep));
    outputs.extend(judge_linear_grads(&LinearGradInputs {
        dump,
        rows: &lin_rows,
        all_rows: rows.len() == n,
        acc: acc_dtype,
        keep,
    }));
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
        logits_dtype: dump.logits.describe(),
        model: model_name(config),
        accumulation: acc_dtype.to_string(),
        statistical_c: config.statistical_c,
        outputs,
        topk_ids,
        ignored_tensors: dump.ignored_tensors.clone(),
        fallback: fallback.into(),
        tp_set: None,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The report of each candidate output from the rows' accumulators
/// `totals`: the worst elements' positions, and why nothing was checked
/// where nothing was (`rows` the rows checked, `reduced` a reduced loss's
/// options).
fn file_outputs(
    dump: &Dump<'_>,
    mut totals: RowAcc,
    reduced: Option<LossOptions>,
    rows: &[usize],
) -> Vec<OutputReport> {
    let n = dump.n();
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
                nothing_checked_reason(o, dump, rows)
            });
            if report.verdict == ReportVerdict::Pass {
                report.verdict = ReportVerdict::Unchecked;
            }
        }
        outputs.push(report);
    }
    outputs
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
    match output.family() {
        Family::LogSoftmax(RowStat::Entropy) => "no element".to_string(),
        // The token's statistics (its log-prob, its rank).
        Family::LogSoftmax(_) => format!(
            "every checked row's token is ignore_index ({})",
            dump.options.ignore_index
        ),
        Family::TopK => "K = 0: topk_ids has no column".to_string(),
        Family::TopkKl(_) => {
            "K = 0: topk_ids has no column, the top-k KL is over no teacher entry".to_string()
        }
        Family::Loss(_) | Family::Gradient | Family::Policy(_) => "no element".to_string(),
    }
}

/// Judges one element under the four models `[chosen, tree, lanes=8,
/// sequential]` ([`tolerance::judge`]): the chosen model's judgement and the
/// reference models' `error / bound` (`None` = no bound), and whether it
/// passes the chosen bound.
pub(super) fn judge4(
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
pub(super) fn verify_row(
    dump: &Dump<'_>,
    r: usize,
    acc_dtype: Dtype,
    config: &VerifyConfig,
    keep: usize,
    pre: Option<Result<logprobe_reference::oracle::linear::LinearRow, DumpError>>,
) -> Result<RowResult, DumpError> {
    let (inputs, lin_logits) = row_inputs(dump, r, acc_dtype, (keep, config.statistical_c), pre)?;
    let p = inputs.problem();
    let cot = inputs.cotangents();
    let spec = |e: SpecError| DumpError::Spec(at_row(e, r));
    let with_grad = dump.candidates.get(Output::GradLogits).is_some() || dump.linear_grads.any();
    let (mut oracle, mut stats) = RowOracle::new(&config.oracle, &p, with_grad).map_err(spec)?;
    let ctx = row_context(dump, &inputs, acc_dtype).map_err(spec)?;
    let models = Models::new(config, acc_dtype);
    let mut careful = careful_row(dump, &p, acc_dtype, config);
    let statistical = config
        .statistical_c
        .map(|c| statistical(models.all[0], c, careful.as_mut(), &stats, &p));
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
    let grad = dump
        .candidates
        .get(Output::GradLogits)
        .map(|g| oracle.vjp(&cot, g.dtype))
        .transpose()
        .map_err(spec)?;
    let exact = row_exact(dump, &p, &forwards, grad.as_ref());
    let rows = row_candidates(dump, &p, r);
    let candidates = rows
        .as_ref()
        .map(|_, (dtype, v)| (*dtype, ArrayView1::from(&v[..])));

    let grad_cot = targets.grad_cotangents();
    let grad_row = tolerance::RowBounds::grad_row(&rb, &grad_cot);
    let gstat = grad_stat(st.as_ref(), &grad_cot, &candidates, &p, targets.vocab_size);
    let mut screen = row_screen(
        (
            &rb,
            &grad_row,
            &grad_cot,
            gstat.as_ref().map(GradStat::parts),
        ),
        &exact,
        &candidates,
        Output::GradLogits.judged(&p, 0),
        targets.vocab_size,
        keep,
    );
    // (The screen holds what the sweep needs of `exact` and the candidates.)
    let screened = screen.as_mut().map(RowScreen::sweep);
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
            let grad_elem = e.output == Output::GradLogits && e.col < targets.vocab_size;
            let screened = grad_elem
                .then(|| screen.as_ref().and_then(|s| s.screened_error(e.col)))
                .flatten();
            if let Some(err) = screened {
                // Counted by the sweep above (within its sound bound); its
                // threshold where the statistical lane did not decide it.
                if let Some(g) = gstat.as_ref() {
                    let acc = out.get_or_insert_with(e.output, OutputAcc::new);
                    let at = (e.col, screen.as_ref());
                    g.observe(acc, at, (err, true), &grad_cot, e.dtype);
                }
                return Ok(());
            }
            let acc = out.get_or_insert_with(e.output, OutputAcc::new);
            let bounds = if grad_elem {
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
            // `masked_log_probs = finfo_min`: a masked id's clamped value is `-inf`.
            let candidate =
                dump.format
                    .masked_candidate(e.output, e.dtype, e.exact.rounded, e.candidate);
            let (judged, pass, reference) = judge4(r, col, candidate, e.exact, e.dtype, &bounds);
            let error = judged.error;
            acc.push(judged, reference, keep);
            let tiers = Tiers {
                st: st.as_ref(),
                grad: gstat.as_ref(),
                screen: screen.as_ref(),
                targets: &targets,
                cot: &grad_cot,
            };
            let judged = (candidate, error, pass);
            observe_tiers(acc, &e, judged, &bounds[0], &tiers, careful.as_mut());
            Ok(())
        },
    );
    let Ok(()) = walked;
    let lin = linear_grad_row(
        dump,
        &mut oracle,
        &cot,
        &rb,
        &grad_row,
        &grad_cot,
        r,
        acc_dtype,
    );
    drop((screen, gstat));
    let parts = (&rb, st.as_ref(), careful.as_mut());
    let loss_row = row_loss_term(dump, &p, &targets, &forwards, parts);
    let fallback = oracle.finish();
    // The row's statistics buffers go back to this worker's pool.
    drop((rb, st));
    crate::scratch::give(std::mem::take(&mut stats.d));
    crate::scratch::give(std::mem::take(&mut stats.e));
    Ok((out, fallback, loss_row, (lin.map_err(spec)?, lin_logits)))
}

/// The row's statistical threshold (`c`, `model`): careful code (the
/// relative rule's reference, when computed) floors its vocabulary sums at
/// its own normaliser error (S2a) and, when the row has an entropy, the
/// entropy family's at its entropy error (S2b).
fn statistical(
    model: tolerance::Model,
    c: f64,
    careful: Option<&mut tolerance::CarefulRow>,
    stats: &RowStats,
    p: &Problem<'_>,
) -> tolerance::Statistical {
    let s = tolerance::Statistical::new(model).with_c(c);
    let Some(cr) = careful else {
        return s;
    };
    let s = s.with_careful_error(cr.ln_s_error(stats.ln_s));
    if p.options.entropy.is_some() && !stats.e.is_empty() {
        let h = stats.ln_s_w.add(stats.r);
        s.with_careful_entropy_error(cr.entropy_error(h), h.lo)
    } else {
        s
    }
}

/// The relative rule's careful code for row 0 of `p` (TOLERANCE.md
/// (R2)): on stored logits, and on a fused linear kernel's logits kept
/// in a 16-bit matmul dtype (the exact matmul rounded to it, twice with a
/// bias; f32 logits would need the GEMM's own error, so those rows have
/// no relative rule).
fn careful_row(
    dump: &Dump<'_>,
    p: &Problem<'_>,
    acc_dtype: Dtype,
    config: &VerifyConfig,
) -> Option<tolerance::CarefulRow> {
    let logits_in = match dump.logits.linear() {
        None => None,
        Some(l)
            if l.logits_dtype == crate::dump::LmHeadLogitsDtype::Input
                && matches!(l.dtype, Dtype::Bf16 | Dtype::F16) =>
        {
            Some((l.dtype, l.bias.as_deref()))
        }
        Some(_) => return None,
    };
    let plan = (config.form, config.model);
    Some(tolerance::CarefulRow::new(p, 0, acc_dtype, plan, logits_in))
}

/// The row's gradient screen ([`RowScreen::new`]) when grad logits are a
/// judged candidate and the screen is on (`judged`: the row has a
/// gradient to judge).
fn row_screen(
    (rb, grad_row, grad_cot, stat): (
        &[tolerance::RowBounds<'_>; 4],
        &tolerance::GradRow<4>,
        &tolerance::GradCotangents<'_>,
        Option<StatParts<'_, '_>>,
    ),
    exact: &PerOutput<ArrayView1<'_, Exact>>,
    candidates: &PerOutput<(Dtype, ArrayView1<'_, f64>)>,
    judged: bool,
    vocab_size: usize,
    keep: usize,
) -> Option<RowScreen<4>> {
    match (
        exact.get(Output::GradLogits),
        candidates.get(Output::GradLogits),
    ) {
        (Some(ex), Some((dtype, cand))) if grad_screen_on() && judged => RowScreen::new(
            rb,
            grad_row,
            grad_cot,
            ex.view(),
            cand.view(),
            *dtype,
            (vocab_size, keep),
            stat,
        ),
        _ => None,
    }
}

/// (S6) The statistical threshold of the row's grad logits, when they are
/// a judged candidate and the tier is on.
fn grad_stat<'s, 'a>(
    st: Option<&'s tolerance::StatisticalBounds<'a>>,
    cot: &tolerance::GradCotangents<'_>,
    candidates: &PerOutput<(Dtype, ArrayView1<'_, f64>)>,
    p: &Problem<'_>,
    vocab_size: usize,
) -> Option<GradStat<'s, 'a>> {
    candidates.get(Output::GradLogits)?;
    let judged = Output::GradLogits.judged(p, 0);
    st.filter(|_| judged)
        .map(|st| GradStat::new(st, cot, vocab_size))
}

/// The exact values of the row's outputs judged in the row's walk: the
/// VJP's (`grad`) for grad logits, the forward in the candidate's dtype
/// otherwise. A reduced output is judged once for the dump (after the
/// rows), from each row's term: not in the row's walk.
fn row_exact<'f>(
    dump: &Dump<'_>,
    p: &Problem<'_>,
    forwards: &'f [OracleForward],
    grad: Option<&'f Array2<Exact>>,
) -> PerOutput<ArrayView1<'f, Exact>> {
    dump.candidates
        .iter()
        .filter(|(o, _)| !o.reduced(p))
        .filter_map(|(o, c)| {
            let values = match grad {
                Some(g) if o == Output::GradLogits => g,
                _ => forwards
                    .iter()
                    .find(|f| f.dtype == c.dtype)?
                    .values
                    .get(o)?,
            };
            Some((o, values.row(0)))
        })
        .collect()
}

/// Row `r` of every candidate judged in the row's walk (not a reduced
/// one), as f64, with the candidate's dtype.
fn row_candidates(dump: &Dump<'_>, p: &Problem<'_>, r: usize) -> PerOutput<(Dtype, Vec<f64>)> {
    dump.candidates
        .iter()
        .filter(|(o, _)| !o.reduced(p))
        .map(|(o, c)| (o, (c.dtype, c.row_f64(r))))
        .collect()
}

/// What this row adds to a reduced loss: its term's enclosure (from the
/// forward in the loss's dtype), its T17 row bound per model, its
/// statistical bound and careful code's term (R5).
fn row_loss_term(
    dump: &Dump<'_>,
    p: &Problem<'_>,
    targets: &tolerance::RowTargets,
    forwards: &[OracleForward],
    (rb, st, careful): (
        &[tolerance::RowBounds<'_>; 4],
        Option<&tolerance::StatisticalBounds<'_>>,
        Option<&mut tolerance::CarefulRow>,
    ),
) -> Option<LossRow> {
    dump.candidates
        .get(Output::Loss)
        .filter(|_| Output::Loss.reduced(p))
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
                stat: st.map(|s| s.loss_row_of(l)),
                careful: careful.and_then(|c| c.loss_term(targets)),
            }
        })
}

/// One row's judgements, oracle counts, its part of a reduced loss, and
/// its gradient for the LM head's gradients.
pub(super) type RowResult = (
    RowAcc,
    Fallback,
    Option<LossRow>,
    (Option<LinearGradRow>, Option<OutputAcc>),
);

/// The model's name in reports: the summation order (`lanes=8`), then
/// ` form=NAME` and ` k3_form=NAME` for what `--form` / `--k3-form` declare
/// (the defaults, `any`, unnamed).
fn model_name(config: &VerifyConfig) -> String {
    let mut s = config.model.to_string();
    if config.form != logprobe_reference::spec::Shift::Any {
        s += &format!(" form={}", config.form.name());
    }
    if config.k3_form != tolerance::K3Form::Any {
        s += &format!(" k3_form={}", config.k3_form.name());
    }
    s
}

/// The chosen model and the three reference models (tree, lanes=8,
/// sequential), all accumulating in the same dtype.
pub(super) struct Models {
    pub(super) all: [tolerance::Model; 4],
}

impl Models {
    pub(super) fn new(config: &VerifyConfig, acc: Dtype) -> Self {
        let chosen = tolerance::Model::preset(config.model)
            .with_accumulation(acc)
            .with_shift(config.form);
        let [a, b, c] = tolerance::foreign_presets_with(acc, config.form);
        Models {
            all: [chosen, a, b, c].map(|m| m.with_k3_form(config.k3_form)),
        }
    }
}
