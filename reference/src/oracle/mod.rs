//! The exact oracle (MPFR through `rug`). API SKELETON: the oracle helper
//! fills in the bodies; signatures here are the contract other crates use.

use ndarray::Array2;

use crate::spec::{Cotangents, Dtype, Problem, SpecError};

/// An outward f64 enclosure `[lo, hi]` of an exact real (`lo <= x <= hi`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Interval {
    /// Lower end (rounded down).
    pub lo: f64,
    /// Upper end (rounded up).
    pub hi: f64,
}

/// One exact result: its enclosure (rounded outward to f64) and its value
/// correctly rounded to the target dtype.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Exact {
    /// Enclosure of the exact real.
    pub enclosure: Interval,
    /// The exact real correctly rounded (to nearest, ties to even) to the
    /// target dtype, as an exact f64. When `decided` is false: the rounding
    /// of the enclosure's midpoint.
    pub rounded: f64,
    /// Whether both ends of the enclosure round to `rounded`. False only at
    /// the precision cap.
    pub decided: bool,
}

impl Exact {
    /// Upper bound on `|candidate - exact|` (rounded up), over the whole
    /// enclosure (judges use the far end). `inf` for NaN candidates; 0 when
    /// candidate and exact are the same infinity.
    pub fn error(&self, candidate: f64) -> f64 {
        unimplemented!("oracle helper: {candidate}")
    }

    /// [`Exact::error`] in ulps of `dtype` at the exact value's magnitude.
    pub fn error_ulps(&self, candidate: f64, dtype: Dtype) -> f64 {
        unimplemented!("oracle helper: {candidate} {dtype}")
    }
}

/// Row statistics for the tolerance model (DESIGN: "The tolerance model"),
/// each an enclosure. `d`, `s`, `ln_s`, `d_t`, `p` are over the masked
/// shifted logits `d'_j = (z'_j - max z')`; `s_w`, `ln_s_w`, `r`, `m2`, `q`,
/// `e` over the entropy's logits `w` (unmasked or masked per options).
#[derive(Clone, Debug)]
pub struct RowStats {
    /// `d'_t` of the target (None without a target).
    pub d_t: Option<Interval>,
    /// `S = sum exp(d'_j)`.
    pub s: Interval,
    /// `ln S`.
    pub ln_s: Interval,
    /// `S_w = sum exp(e_j)`.
    pub s_w: Interval,
    /// `ln S_w`.
    pub ln_s_w: Interval,
    /// `R = sum q_j |e_j|` (nats).
    pub r: Interval,
    /// `M2 = sum q_j e_j^2`.
    pub m2: Interval,
    /// `p_j = softmax(z')_j`, `[V]` (0 where masked or `-inf`).
    pub p: Vec<Interval>,
    /// `q_j = softmax(w)_j`, `[V]`.
    pub q: Vec<Interval>,
    /// `e_j = w_j - max w` (<= 0; `-inf` allowed), `[V]`.
    pub e: Vec<Interval>,
    /// `d'_j = z'_j - max z'` (<= 0; `-inf` where masked), `[V]`.
    pub d: Vec<Interval>,
}

/// Exact forward results for a problem, in a target dtype.
#[derive(Clone, Debug)]
pub struct OracleForward {
    /// Target dtype of `rounded`.
    pub dtype: Dtype,
    /// `lse(z')` per row `[N]` (nats).
    pub lse: Vec<Exact>,
    /// Log-probs `[N]` (nats; `None` rows are `ignore_index`); `None` without tokens.
    pub log_probs: Option<Vec<Option<Exact>>>,
    /// Entropy `[N]` (nats); `None` when not requested.
    pub entropy: Option<Vec<Exact>>,
    /// Top-k log-probs `[N, K]` (nats; `-inf` for masked ids); `None` without ids.
    pub topk_log_probs: Option<Array2<Exact>>,
}

/// The MPFR oracle: precision policy of the Ziv loop.
#[derive(Clone, Copy, Debug)]
pub struct Oracle {
    /// First working precision in bits (64).
    pub start_precision: u32,
    /// Cap (4096): past it results come back undecided.
    pub max_precision: u32,
}

impl Default for Oracle {
    fn default() -> Self {
        Oracle { start_precision: 64, max_precision: 4096 }
    }
}

impl Oracle {
    /// Exact forward results of `problem`, correctly rounded to `target`.
    ///
    /// # Errors
    /// The spec's validation errors.
    pub fn forward(&self, problem: &Problem<'_>, target: Dtype) -> Result<OracleForward, SpecError> {
        unimplemented!("oracle helper {problem:?} {target}")
    }

    /// Exact VJP: grad logits `[N, V_total]` for `cotangents` (padded
    /// columns exactly 0), correctly rounded to `target`.
    ///
    /// # Errors
    /// The spec's validation errors.
    pub fn vjp(&self, problem: &Problem<'_>, cotangents: &Cotangents<'_>, target: Dtype) -> Result<Array2<Exact>, SpecError> {
        unimplemented!("oracle helper {problem:?} {cotangents:?} {target}")
    }

    /// Statistics of row `row` for the tolerance model.
    ///
    /// # Errors
    /// The spec's validation errors for that row.
    pub fn row_stats(&self, problem: &Problem<'_>, row: usize) -> Result<RowStats, SpecError> {
        unimplemented!("oracle helper {problem:?} {row}")
    }
}
