//! The SUSPECT tiers of a row's judged elements: the statistical
//! threshold (TOLERANCE.md (S1)-(S6)) and the relative rule's careful code
//! (R1)-(R5), observed beside the sound bound's judgement.
//!
//! Grad logits' threshold (S6) is the gradient bound (T14) over the
//! chosen model's statistical row bounds. The gradient screen decides most
//! elements in its statistical lane ([`RowScreen::stat_screened`]); the
//! others' thresholds are computed here, so the report is the same as if
//! every element's threshold had been.

use logprobe_reference::spec::{Dtype, Output};

use crate::tolerance::{self, GradCotangents, GradRow, RowBounds, StatisticalBounds};

use super::acc::OutputAcc;
use super::grad_screen::{RowScreen, StatParts};

/// (S6) One row's statistical threshold of grad logits.
pub(super) struct GradStat<'s, 'a> {
    one: &'s [RowBounds<'a>; 1],
    row: GradRow<1>,
    /// The elements `j < v` it covers (the row's real vocabulary).
    v: usize,
}

impl<'s, 'a> GradStat<'s, 'a> {
    /// The threshold of a row whose grad logits are judged, `st` its
    /// statistical bounds, `v` the real vocabulary.
    pub(super) fn new(
        st: &'s StatisticalBounds<'a>,
        cot: &GradCotangents<'_>,
        v: usize,
    ) -> GradStat<'s, 'a> {
        let one = st.as_models();
        GradStat {
            one,
            row: RowBounds::grad_row(one, cot),
            v,
        }
    }

    /// The bounds and row constants the gradient screen's statistical
    /// lane reads ([`RowScreen::new`]).
    pub(super) fn parts(&self) -> StatParts<'_, 'a> {
        (self.one, &self.row)
    }

    /// Observes element `j` (its `error` and sound `pass` as judged) into
    /// `acc` unless the screen's statistical lane decided it.
    pub(super) fn observe(
        &self,
        acc: &mut OutputAcc,
        (j, screen): (usize, Option<&RowScreen<4>>),
        (error, pass): (f64, bool),
        cot: &GradCotangents<'_>,
        dtype: Dtype,
    ) {
        if j >= self.v || screen.is_some_and(|s| s.stat_screened(j)) {
            return;
        }
        let [t] = RowBounds::grad_many_with(self.one, &self.row, j, cot, dtype);
        acc.observe_statistical(error, pass, &t);
    }
}

/// What [`observe_tiers`] reads of the row besides the element.
pub(super) struct Tiers<'t, 's, 'a, 'c> {
    pub(super) st: Option<&'t StatisticalBounds<'a>>,
    pub(super) grad: Option<&'t GradStat<'s, 'a>>,
    pub(super) screen: Option<&'t RowScreen<4>>,
    pub(super) targets: &'t tolerance::RowTargets,
    pub(super) cot: &'t GradCotangents<'c>,
}

/// The statistical threshold and the relative rule on one judged element
/// (`candidate` as judged, its `error` and sound `pass`, `bound` the
/// chosen model's): forward outputs by their row thresholds, grad logits
/// by [`GradStat`], careful code's values where the rule covers the
/// output.
pub(super) fn observe_tiers(
    acc: &mut OutputAcc,
    e: &tolerance::Element<'_>,
    (candidate, error, pass): (f64, f64, bool),
    bound: &tolerance::ErrorBound,
    tiers: &Tiers<'_, '_, '_, '_>,
    careful: Option<&mut tolerance::CarefulRow>,
) {
    if e.output == Output::GradLogits {
        if let Some(g) = tiers.grad {
            g.observe(
                acc,
                (e.col, tiers.screen),
                (error, pass),
                tiers.cot,
                e.dtype,
            );
        }
    } else if let Some(t) = tiers
        .st
        .and_then(|s| s.threshold((e.output, e.col), tiers.targets, e.dtype))
    {
        // Measured as in f64: for a finite candidate that is the
        // judgement's (only an infinite candidate's error depends on the
        // dtype, `judge`'s out-of-range rule).
        let (error, pass) = if candidate.is_infinite() {
            let j = tolerance::judge(e.exact, candidate, Dtype::F64, bound);
            (j.error_abs, j.pass)
        } else {
            (error, pass)
        };
        acc.observe_statistical(error, pass, &t);
    }
    if let Some(c) = careful {
        if let Some(v) = c.values(e.output, e.col, tiers.targets, e.dtype) {
            let floor = c.floor(e.output, tiers.targets);
            acc.relative
                .get_or_insert_with(tolerance::RelativeRule::new)
                .observe(e.exact, candidate, &v, floor, e.dtype);
        }
    }
}
