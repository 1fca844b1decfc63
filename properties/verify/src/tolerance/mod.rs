//! The tolerance model: sound error bounds of log-probs, entropy, top-k
//! log-probs (nats, per row) and grad logits (per element), from a kernel's
//! declared numerical algorithm and the oracle's exact row statistics; the
//! judging of candidates against them; the presets `verify` uses for
//! foreign kernels; and the relative rule against careful code.
//!
//! The derivation, step by step with its sources (Higham, *Accuracy and
//! Stability of Numerical Algorithms*, 2nd ed., SIAM 2002, ch. 2-4), is
//! `properties/TOLERANCE.md`; equation tags `(T1)`... refer to it.
//!
//! # Formula (summary)
//!
//! With `u` the accumulation dtype's unit roundoff, `gamma_n = n u / (1 - n u)`,
//! summation leaf `h`, merge levels `L`, rescaling exps `r`,
//! `eps_exp = exp_ulps * 2u`, and the oracle's exact `d_j`, `p_j`, `ln S`, `R`:
//!
//! - shift error `|d^_j - d_j| <= alpha_j = a |d_j| + b` (`a = u` for
//!   subtract-then-scale with `T` a power of two, `(1+u)(1+gamma_2) - 1`
//!   otherwise, `b = 0`; scale-then-subtract and raw: `a = u + (1+u) gamma_2`,
//!   `b = 2 (1+u) gamma_2 |z_max|` when `T` is not a power of two);
//! - `theta_S = (K_S - 1) + K_S sum_j p_j expm1(alpha_j) + floor`, with
//!   `K_S = (1 + eps_exp)^(1+r) (1 + gamma_{h+L+r})`;
//! - `delta_ell = -ln(1 - theta_S) + log_ulps ulp_acc(ln S - ln(1 - theta_S))`;
//! - log-prob: `A = alpha_t + delta_ell`; entropy: `delta_ell + E_R`
//!   (fused) or the log-softmax form's `Delta H_P` (T12), or their max;
//! - final: `A + 1/2 ulp_acc(|v| + A) [+ 1/2 ulp_out(|v| + A + 1/2 ulp_acc)]`.
//!
//! A model with `n u >= 1` or `theta_S >= 1` certifies nothing:
//! [`ErrorBound::None`], reported as "no bound".
//!
//! # Example
//! ```no_run
//! use logprobe_verify::tolerance::{judge, Model, RowContext};
//! # fn demo(stats: &logprobe_reference::oracle::RowStats, exact: &logprobe_reference::oracle::Exact) {
//! let ctx = RowContext { temperature: 1.0, z_max_abs: 0.0, softcap: None, linear: None };
//! let bound = Model::lanes(8).row_bounds(stats, &ctx).log_prob(logprobe_reference::spec::Dtype::F32);
//! let j = judge(exact, -3.25, logprobe_reference::spec::Dtype::F32, &bound);
//! println!("{} error/bound = {:?}", j.verdict(), j.ratio);
//! # }
//! ```

mod bounds;
mod judge;
mod loss_grad;
mod model;
mod relative;
mod statistical;
mod upward;
mod walk;

#[cfg(test)]
mod tests;

pub use bounds::{
    loss_bounds, loss_statistical_bounds, DetachedBounds, GradCotangents, GradRow, GradScreen,
    KlTarget, LossRowBound, LossSums, PolicyGradCotangents, RowBounds,
};
pub use judge::{judge, ratio_pass, tightest_model, Judgement, ValueVerdict};
pub use loss_grad::LossGradCotangents;
pub use model::{
    foreign_presets, foreign_presets_with, tightest, EntropyForm, K3Form, LinearContext, Model,
    Order, RowContext, SoftcapContext,
};
pub use relative::{
    careful_reduced_loss, naive_entropy, naive_entropy_of, naive_log_softmax, CarefulLossRow,
    CarefulRow, ReducedPlan, RelativeRule, RELATIVE_R,
};
pub use statistical::{
    clopper_pearson_upper, per_dump_rate, Statistical, StatisticalBounds, DEFAULT_C,
    SEQUENTIAL_FACTOR,
};
pub use walk::{walk_row, Element, LossGradRow, LossTarget, PolicyTarget, RowTargets};

/// Why a model certifies nothing for a value.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum NoBound {
    /// `gamma_n` is undefined: `n u >= 1` (e.g. bf16 accumulation, `u = 2^-8`,
    /// over 256 or more terms in order).
    #[error("no bound: gamma_{n} undefined ({n} * u = {} >= 1)", *n as f64 * u)]
    GammaUndefined {
        /// Roundings on the longest path.
        n: usize,
        /// Unit roundoff of the accumulation dtype.
        u: f64,
    },
    /// The normaliser's relative error bound reaches 1: its logarithm is unbounded.
    #[error("no bound: relative error of the normaliser theta_S = {theta} >= 1")]
    SumUnbounded {
        /// The bound `theta_S`.
        theta: f64,
    },
    /// A bound came out infinite or NaN (non-finite statistics or magnitudes).
    #[error("no bound: {what} is not finite")]
    NonFinite {
        /// Which quantity.
        what: &'static str,
    },
    /// The statistics lack what this output needs.
    #[error("no bound: missing {what}")]
    MissingStatistic {
        /// Which statistic.
        what: &'static str,
    },
}

/// An error bound for one value (how far a correct kernel's result may
/// be from the exact one), or the reason there is none. Not to be confused
/// with the oracle's `MpfrInterval` (an MPFR interval around an exact real).
#[derive(Clone, Debug, PartialEq)]
pub enum ErrorBound {
    /// Absolute bound on `|candidate - exact|`, in the output's units
    /// (nats for log-probs and entropy), rounded up.
    Abs(f64),
    /// One-sided, for counts: the candidate, an integer, may exceed the
    /// exact value by at most this much and never fall below it
    /// ([`Output::is_count`](logprobe_reference::spec::Output::is_count)'s
    /// outputs). [`judge`] measures a candidate
    /// below the exact value, or not an integer, as an infinite error,
    /// wrong under every model.
    Upward(f64),
    /// The model certifies nothing: report "no bound", never a pass.
    None {
        /// Why.
        reason: NoBound,
    },
}

impl ErrorBound {
    /// The bound's value, if there is one.
    pub fn value(&self) -> Option<f64> {
        match self {
            ErrorBound::Abs(b) | ErrorBound::Upward(b) => Some(*b),
            ErrorBound::None { .. } => None,
        }
    }
}

impl std::fmt::Display for ErrorBound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ErrorBound::Abs(b) => write!(f, "{b:.3e}"),
            ErrorBound::Upward(b) => write!(f, "+{b:.3e}"),
            ErrorBound::None { reason } => write!(f, "{reason}"),
        }
    }
}
