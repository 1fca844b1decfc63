//! The statistical threshold beside the sound bound (TOLERANCE.md,
//! "Statistical threshold", `(S1)`-`(S3)`).
//!
//! The sound bound's accumulation terms `gamma_n` (the summation paths
//! `n_S = h + L + r`, `n_B`, `n_P` of (T3)) cover the worst rounding of
//! every addition on a path, all with the same sign. Probabilistic
//! rounding-error analysis (Higham & Mary, "A new approach to probabilistic
//! rounding error analysis", SIAM J. Sci. Comput. 41(5), 2019, Thm 2.4)
//! shows that with independent mean-zero errors they grow like
//! `lambda sqrt(n) u` with a stated probability. Round-to-nearest summation
//! of near-uniform rows breaks that independence (errors are correlated and
//! biased), so the constant `c` is calibrated on emulated correct
//! implementations (`properties/examples/calibrate_statistical.rs`), not
//! taken from the theorem. Every other term (the `exp` / `ln` errors, the
//! shift's `|d_t| u`, the division by `T`, the final roundings) stays as in
//! the sound bound, so the threshold is never below the deterministic part
//! and never above the sound bound.
//!
//! The cross-entropy `loss` has a tier too (S4): (T17) over these bounds
//! per row, and for a reduced loss its reduction's `gamma_D` replaced the
//! same way. The soft cross-entropy's and the top-k KLs' own sums are
//! replaced too (S5). Grad logits' threshold is the gradient bound (T14)
//! over these row bounds ([`StatisticalBounds::as_models`], (S6)); a fused
//! linear kernel's own logits have their matmul term replaced (S7); the
//! LM head's gradients have none yet.

use logprobe_reference::oracle::RowStats;
use logprobe_reference::spec::{Dtype, Output};

use super::bounds::RowBounds;
use super::model::{Model, RowContext};
use super::walk::RowTargets;
use super::ErrorBound;

/// The calibrated constant `c` of `c sqrt(n) u` for models with merges
/// (lanes, trees; TOLERANCE.md `(S3)`: the largest `c` a correct emulated
/// implementation in such an order needed was 4, taken twice).
pub const DEFAULT_C: f64 = 8.0;

/// Factor on `c` for a sequential model (one accumulator, `L = 0`): its
/// correlated rounding errors grow faster than `sqrt(n)` on near-uniform
/// and wide rows (calibration: `c` up to 24 needed at `V >= 128256`), so
/// its threshold uses `4 c` (32 by default).
pub const SEQUENTIAL_FACTOR: f64 = 4.0;

/// The statistical threshold of a [`Model`]: its sound bound with every
/// accumulation `gamma_n` replaced by `min(gamma_n, c sqrt(n) u)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Statistical {
    /// The sound model whose accumulation terms are replaced.
    pub model: Model,
    /// The constant `c` (dimensionless; [`DEFAULT_C`] calibrated).
    pub c: f64,
    /// (S2a) The floor of the row's vocabulary sums' accumulation terms:
    /// [`FLOOR_FACTOR`] times careful code's own relative error of the
    /// normaliser on this row (0: none).
    pub floor: f64,
    /// (S2b) The floor of the entropy family's sums: [`FLOOR_FACTOR`] times
    /// careful code's own relative error of the entropy on this row (0:
    /// none).
    pub floor_h: f64,
}

/// (S2a) How many times careful code's own error in `ln S` on a row the
/// threshold of the row's vocabulary sums allows: the relative rule's
/// [`super::RELATIVE_R`], the factor by which correct code was measured to
/// exceed careful code (an implementation with fewer partial sums than
/// careful code's blocks stagnates on more terms each; the entropy's and
/// the gradient's sums stagnate beside the normaliser's).
pub const FLOOR_FACTOR: f64 = super::RELATIVE_R;

impl Statistical {
    /// `model`'s statistical threshold with the calibrated [`DEFAULT_C`].
    pub fn new(model: Model) -> Statistical {
        Statistical {
            model,
            c: DEFAULT_C,
            floor: 0.0,
            floor_h: 0.0,
        }
    }

    /// (S2a) The same threshold with the row's vocabulary sums floored at
    /// [`FLOOR_FACTOR`] times `careful_ln_s_error`, careful code's own
    /// error in `ln S` on the row (nats; [`super::CarefulRow::ln_s_error`]).
    pub fn with_careful_error(self, careful_ln_s_error: f64) -> Statistical {
        let e = careful_ln_s_error;
        // A relative error of S from one of ln S, rounded up.
        let floor = if e.is_finite() && e > 0.0 {
            FLOOR_FACTOR * e.exp_m1() * (1.0 + 4.0 * f64::EPSILON)
        } else {
            0.0
        };
        Statistical { floor, ..self }
    }

    /// (S2b) The same threshold with the entropy family's sums floored at
    /// [`FLOOR_FACTOR`] times careful code's own relative error of the
    /// entropy, `careful_entropy_error / entropy` (nats over nats;
    /// [`super::CarefulRow::entropy_error`]).
    pub fn with_careful_entropy_error(
        self,
        careful_entropy_error: f64,
        entropy: f64,
    ) -> Statistical {
        let e = careful_entropy_error / entropy;
        let floor_h = if e.is_finite() && e > 0.0 {
            FLOOR_FACTOR * e * (1.0 + 4.0 * f64::EPSILON)
        } else {
            0.0
        };
        Statistical { floor_h, ..self }
    }

    /// The same threshold with another `c` (calibration).
    pub fn with_c(self, c: f64) -> Statistical {
        Statistical { c, ..self }
    }

    /// The thresholds of one row (statistics from the oracle, or any
    /// enclosure of the exact row quantities).
    ///
    /// A model whose summation over this row has no merge level
    /// (sequential) uses `c * SEQUENTIAL_FACTOR`.
    pub fn row_bounds<'a>(&self, stats: &'a RowStats, ctx: &RowContext) -> StatisticalBounds<'a> {
        let n = stats.d.len().max(stats.e.len());
        StatisticalBounds(RowBounds::build(
            &self.model,
            stats,
            ctx,
            Some(super::bounds::StatTerms {
                c: self.row_c(n),
                floor: self.floor,
                floor_h: self.floor_h,
            }),
        ))
    }

    /// The `c` the threshold uses on a row of `n` entries: `c`, times
    /// [`SEQUENTIAL_FACTOR`] for a model without merge levels.
    pub(super) fn row_c(&self, n: usize) -> f64 {
        let sequential = self.model.algorithm(n).summation.merges == 0 && n > 1;
        if sequential {
            self.c * SEQUENTIAL_FACTOR
        } else {
            self.c
        }
    }
}

/// The statistical thresholds (nats) of one row's forward outputs: as
/// [`RowBounds::log_prob`], [`RowBounds::entropy`], [`RowBounds::topk`],
/// each `<=` the sound bound of the same model and `>=` its deterministic
/// part. [`ErrorBound::None`] exactly where the sound bound is none.
#[derive(Clone, Debug)]
pub struct StatisticalBounds<'a>(RowBounds<'a>);

impl<'a> StatisticalBounds<'a> {
    /// The thresholds from bounds built with `stat_c = Some(row_c(n))`.
    pub(super) fn from_bounds(rb: RowBounds<'a>) -> StatisticalBounds<'a> {
        StatisticalBounds(rb)
    }

    /// The threshold of the cell `(output, col)` (as [`RowBounds::bound`]),
    /// `None` for an output that is not [`Output::is_forward`] (grad
    /// logits take (T14) over [`StatisticalBounds::as_models`], (S6)).
    /// The cross-entropy `loss` per
    /// row is (T17) over these bounds (S4); a reduced loss's threshold is
    /// [`super::loss_statistical_bounds`].
    pub fn threshold(
        &self,
        (output, col): (Output, usize),
        targets: &RowTargets,
        out: Dtype,
    ) -> Option<ErrorBound> {
        output
            .is_forward()
            .then(|| self.0.bound(output, col, targets, out))
    }

    /// (S4) The row's statistical (T17) bound of its cross-entropy term,
    /// for a reduced loss's threshold ([`super::loss_statistical_bounds`]).
    ///
    /// # Errors
    /// [`super::NoBound`] as [`RowBounds::loss_row_of`].
    pub fn loss_row_of(
        &self,
        l: &super::LossTarget,
    ) -> Result<super::LossRowBound, super::NoBound> {
        self.0.loss_row_of(l)
    }

    /// The thresholds' row bounds as a one-model array: (S6) grad
    /// logits' threshold is the gradient bound (T14) over them
    /// ([`RowBounds::grad_row`], [`RowBounds::grad_many_with`]).
    pub fn as_models(&self) -> &[RowBounds<'a>; 1] {
        std::array::from_ref(&self.0)
    }

    /// Threshold on `|log_prob^ - log_prob|` for a candidate in `out`.
    pub fn log_prob(&self, out: Dtype) -> ErrorBound {
        self.0.log_prob(out)
    }
    /// Threshold on `|entropy^ - entropy|` for a candidate in `out`.
    pub fn entropy(&self, out: Dtype) -> ErrorBound {
        self.0.entropy(out)
    }
    /// Threshold on the top-k log-prob of vocabulary id `id`.
    pub fn topk(&self, id: usize, out: Dtype) -> ErrorBound {
        self.0.topk(id, out)
    }
}

/// One-sided upper confidence bound (Clopper & Pearson, Biometrika 1934)
/// of a probability from `k` events in `n` independent trials at
/// confidence `conf` (e.g. 0.95): the `p` with `P(X <= k; n, p) = 1 - conf`,
/// found by bisection on the binomial CDF (`1 - (1 - conf)^(1/n)` for
/// `k = 0`). Returns 1 for `n = 0` or `k >= n`.
pub fn clopper_pearson_upper(k: u64, n: u64, conf: f64) -> f64 {
    if n == 0 || k >= n {
        return 1.0;
    }
    let alpha = 1.0 - conf;
    if k == 0 {
        return 1.0 - alpha.powf(1.0 / n as f64);
    }
    let cdf = |p: f64| {
        // sum_{i<=k} C(n,i) p^i (1-p)^(n-i), terms in log space.
        let (lp, lq) = (p.ln(), (-p).ln_1p());
        let mut log_c = 0.0f64;
        let mut total = 0.0f64;
        for i in 0..=k {
            if i > 0 {
                log_c += ((n - i + 1) as f64).ln() - (i as f64).ln();
            }
            total += (log_c + i as f64 * lp + (n - i) as f64 * lq).exp();
        }
        total
    };
    let (mut lo, mut hi) = (k as f64 / n as f64, 1.0f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if cdf(mid) > alpha {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

/// The rate per dump of `rows` rows implied by a per-row rate `p`:
/// `1 - (1 - p)^rows` (rows independent; an upper bound of `p` gives an
/// upper bound of the rate).
pub fn per_dump_rate(p: f64, rows: u64) -> f64 {
    -((rows as f64) * (-p).ln_1p()).exp_m1()
}
