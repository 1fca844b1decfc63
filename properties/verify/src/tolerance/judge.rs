//! Judging a candidate value against the oracle's exact result and a bound.

use logprobe_reference::oracle::{Exact, RowStats};
use logprobe_reference::spec::{Dtype, Output};

use super::model::{foreign_presets, tightest, Model, RowContext};
use super::walk::RowTargets;
use super::ErrorBound;

/// The verdict on one value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueVerdict {
    /// Error within the bound.
    Pass,
    /// Error beyond the bound.
    Fail,
    /// The model certifies nothing here ([`ErrorBound::None`]): reported as
    /// "no bound", never as a pass.
    NoBound,
}

impl std::fmt::Display for ValueVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ValueVerdict::Pass => "pass",
            ValueVerdict::Fail => "FAIL",
            ValueVerdict::NoBound => "no bound",
        })
    }
}

/// One candidate value judged against its exact value and bound.
#[derive(Clone, Debug, PartialEq)]
pub struct Judgement {
    /// `|candidate - exact|` at the far end of the oracle's enclosure
    /// ([`Exact::error`]), in the output's units (nats for log-probs and
    /// entropy); `inf` for NaN; 0 when the candidate equals an infinite
    /// correctly rounded value (a log-prob below f16's range).
    pub error_abs: f64,
    /// The same error in ulps of the candidate's dtype at the exact value
    /// ([`Exact::error_ulps`]).
    pub error_ulps: f64,
    /// The bound it was judged against.
    pub bound: ErrorBound,
    /// `error_abs / bound` (`None` without a bound; `inf` for a nonzero
    /// error against a zero bound).
    pub ratio: Option<f64>,
    /// `error_abs <= bound`; false when there is no bound.
    pub pass: bool,
}

impl Judgement {
    /// Pass, fail, or no bound.
    pub fn verdict(&self) -> ValueVerdict {
        match (&self.bound, self.pass) {
            (ErrorBound::None { .. }, _) => ValueVerdict::NoBound,
            (_, true) => ValueVerdict::Pass,
            (_, false) => ValueVerdict::Fail,
        }
    }
}

/// Judges `candidate` (a value of dtype `dtype`, as an exact f64) against
/// `exact` and `bound`: pass iff `error_abs <= bound`, the error measured
/// at the far end of the enclosure (under [`ErrorBound::Upward`] a
/// candidate below the enclosure, or not an integer, is an infinite error).
pub fn judge(exact: &Exact, candidate: f64, dtype: Dtype, bound: &ErrorBound) -> Judgement {
    // An exact value beyond `dtype`'s range is judged against its correct
    // rounding (an infinity) in `dtype`, whatever the oracle's target
    // (dump format: "Semantics at the edges"); e.g. a z_loss of 1e56 in f32.
    let same_infinity = candidate.is_infinite()
        && (candidate == exact.rounded
            || (dtype.round_f64(exact.enclosure.lo) == candidate
                && dtype.round_f64(exact.enclosure.hi) == candidate));
    // One-sided bounds (counts): a candidate below the exact value, or not
    // an integer, is wrong whatever the width (a count's bound never
    // allows an undercount).
    let below = matches!(bound, ErrorBound::Upward(_))
        && !(candidate >= exact.enclosure.lo && candidate.fract() == 0.0);
    let (error_abs, error_ulps) = if below {
        (f64::INFINITY, f64::INFINITY)
    } else if same_infinity {
        (0.0, 0.0)
    } else {
        (exact.error(candidate), exact.error_ulps(candidate, dtype))
    };
    let (ratio, pass) = ratio_pass(error_abs, bound);
    Judgement {
        error_abs,
        error_ulps,
        bound: bound.clone(),
        ratio,
        pass,
    }
}

/// `(error_abs / bound, error_abs <= bound)` of [`judge`] for an error
/// already measured (`None`, `false` without a bound; `inf` for a nonzero
/// error against a zero bound): one error judged against several bounds.
pub fn ratio_pass(error_abs: f64, bound: &ErrorBound) -> (Option<f64>, bool) {
    match bound {
        ErrorBound::Abs(b) | ErrorBound::Upward(b) => {
            let ratio = if *b > 0.0 {
                error_abs / b
            } else if error_abs == 0.0 {
                0.0
            } else {
                f64::INFINITY
            };
            (Some(ratio), error_abs <= *b)
        }
        ErrorBound::None { .. } => (None, false),
    }
}

/// The tightest of `verify`'s presets (`tree`, `lanes=8`, `sequential`,
/// accumulating in `accumulation`) within whose bound `candidate` lies for
/// column `col` of `output` in the row `stats` / `ctx` / `targets`; `None`
/// when it lies within none (or none certifies anything).
#[allow(clippy::too_many_arguments)]
pub fn tightest_model(
    stats: &RowStats,
    ctx: &RowContext,
    targets: &RowTargets,
    accumulation: Dtype,
    output: Output,
    col: usize,
    exact: &Exact,
    candidate: f64,
    dtype: Dtype,
) -> Option<Model> {
    let models = foreign_presets(accumulation);
    tightest(&models, |m| {
        let bound = m.row_bounds(stats, ctx).bound(output, col, targets, dtype);
        judge(exact, candidate, dtype, &bound).pass
    })
    .copied()
}
