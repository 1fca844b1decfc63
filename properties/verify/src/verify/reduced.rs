//! A reduced loss (`sum` / `mean`): one element for the whole dump,
//! judged after the rows from each row's term and T17 row bound.

use logprobe_reference::oracle::{
    Exact, Fallback, Interval, LossSum, MpfrLossSum, Oracle, Rounder,
};
use logprobe_reference::spec::{Dtype, LossOptions, Output, Reduction};
use rayon::prelude::*;

use crate::dump::{at_row, Dump, DumpError};
use crate::tolerance;

use super::acc::OutputAcc;
use super::engine::{judge4, Models};
use super::*;

/// What one row contributes to a reduced loss (`sum` / `mean`), judged
/// after the rows ([`judge_reduced_loss`]).
#[derive(Clone, Debug)]
pub(super) struct LossRow {
    /// Enclosure of the row's term `w l` (nats; exactly 0 when not counted).
    pub(super) term: Interval,
    /// Token not `ignore_index`.
    pub(super) counted: bool,
    /// The row's `loss_weights` entry (1 without weights).
    pub(super) weight: f64,
    /// The row's T17 bound under `[chosen, tree, lanes=8, sequential]`.
    pub(super) bounds: [Result<tolerance::LossRowBound, tolerance::NoBound>; 4],
    /// (S4) Its statistical bound under the chosen model (`None` without
    /// the statistical tier).
    pub(super) stat: Option<Result<tolerance::LossRowBound, tolerance::NoBound>>,
    /// Careful code's term and floor (R5; `None` without the relative rule).
    pub(super) careful: Option<tolerance::CarefulLossRow>,
}

/// The loss options of a dump whose `loss` is reduced (`sum` / `mean`).
pub(super) fn reduced_loss(dump: &Dump<'_>) -> Option<LossOptions> {
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
pub(super) fn judge_reduced_loss(
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
    let models = Models::new(config, acc_dtype);
    let bounds: [tolerance::ErrorBound; 4] = std::array::from_fn(|i| {
        let per_row: Vec<_> = rows.iter().map(|l| l.bounds[i].clone()).collect();
        tolerance::loss_bounds(
            &per_row,
            &counted,
            weights.as_deref(),
            lo.reduction,
            models.all[i].loss_order.summation(rows.len()),
            sum.divisor.lo,
            acc_dtype,
            dtype,
        )
        .pop()
        .expect("one bound for a reduced loss")
    });
    // (S4) The statistical threshold under the chosen model.
    let threshold = match (
        config.statistical_c,
        rows.iter()
            .map(|l| l.stat.clone())
            .collect::<Option<Vec<_>>>(),
    ) {
        (Some(c), Some(per_row)) => tolerance::loss_statistical_bounds(
            &per_row,
            &counted,
            weights.as_deref(),
            lo.reduction,
            models.all[0].loss_order.summation(rows.len()),
            sum.divisor.lo,
            (acc_dtype, dtype),
            c,
        )
        .pop(),
        _ => None,
    };
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
        let (judged, pass, reference) = judge4(0, None, candidate, &exact, dtype, &bounds);
        if let Some(t) = &threshold {
            acc.observe_statistical(judged.error, pass, t);
        }
        // (R5) Careful code's reduced loss.
        let careful = rows
            .iter()
            .map(|l| l.careful.map(|c| c.against((l.term.lo, l.term.hi))))
            .collect::<Option<Vec<_>>>();
        let plan = |weights| tolerance::ReducedPlan {
            reduction: lo.reduction,
            leaf: models.all[0].loss_order.summation(rows.len()).leaf,
            weights,
            counted: &counted,
            acc: acc_dtype,
        };
        if let Some((values, floor)) = careful
            .and_then(|c| tolerance::careful_reduced_loss(&c, &plan(weights.as_deref()), dtype))
        {
            let mut rule = tolerance::RelativeRule::new();
            rule.observe(&exact, candidate, &values, floor, dtype);
            acc.relative = Some(rule);
        }
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
pub(super) fn mpfr_reduced_loss(
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
