//! The exact oracle: MPFR (through `rug`) enclosures of logsumexp,
//! log-probs, entropy, top-k log-probs and their VJP, correctly rounded to
//! f64, f32, bf16 or f16.
//!
//! # The math (docs/design.md, "The math")
//!
//! Per row, with the real vocabulary `j < V` (padded columns ignored,
//! gradient exactly 0), temperature `T` rounded to the accumulation dtype
//! ([`crate::spec::Options::effective_temperature`]), logits `v_j` taken
//! exactly (`v = x`, or `v = z = round_input(x / T)`, correctly rounded once,
//! with `temperature_dtype = Input`; then the divisor below is 1):
//!
//! - `d_j = (v_j - v_max) / T <= 0` over allowed finite entries (`-inf`
//!   where masked or `-inf`), `v_max` their maximum, so the max term is
//!   `e^0 = 1` and `m'' = 0`;
//! - `s = sum_{j != argmax} e^{d_j}` (the sum without one argmax term),
//!   `S = 1 + s`, `lse = v_max / T + ln_1p(s)`;
//! - `log_prob = d_t - ln_1p(s)`, `topk_k = d_{id_k} - ln_1p(s)` (`-inf`
//!   for a masked or `-inf` id);
//! - entropy over `w` (unmasked logits by default, masked on request):
//!   `e_j = (w_j - max w) / T`, `S_w = 1 + s_w`, `R = sum q_j |e_j| =
//!   B / S_w` with `B = sum e^{e_j} |e_j|`, `entropy = ln_1p(s_w) + R`
//!   (both terms `>= 0`, no cancellation);
//! - VJP: `dx_j = ( g (1[j=t] - p_j) + sum_k G_k (1[j=id_k] - p_j) - h q_j
//!   (e_j + R) ) / T` with `1 - p_t = sum_{k != t} e^{d_k} / S` and
//!   `w_j - E_q[w] = e_j + R` (module `vjp`).
//!
//! # Enclosures (directed rounding)
//!
//! Every result is an interval `[lo, hi]` computed with MPFR's correctly
//! rounded operations in directed rounding modes (lower ends toward
//! `-inf`, upper ends toward `+inf`: MPFR manual, "Rounding Modes"; Fousse
//! et al., "MPFR: A multiple-precision binary floating-point library with
//! correct rounding", ACM TOMS 33(2), 2007). Per entry one MPFR `exp`: the
//! lower end is `exp(d)` rounded down, the upper end its `next_up` (the
//! value itself when MPFR's ternary says it is exact, as `exp(0) = 1`);
//! when `d` is an interval (a non-power-of-two `T`, or a difference that
//! needs more bits than the working precision) the upper end is widened by
//! `exp(delta) <= 1 + 2 delta` instead of a second exp. Each `e^{d_j}` is
//! reused for the entropy sums and the gradient. Sums accumulate in
//! `prec + 64` bits.
//!
//! Terms with `e^{d_j} < 2^-K`, `K = prec + ceil(log2 V) + 2` (tested
//! soundly in f64 before any MPFR work) are left out of the sums and their
//! total bound (`n 2^-K`, `n K 2^-K` for `B`) is added to the upper ends:
//! at an f32 offset of 1e30 the gaps of 1e22 would underflow MPFR's
//! exponent range.
//!
//! # Ziv's loop and rounding
//!
//! Each result is decided when both ends of its enclosure round to the same
//! value of the target dtype (A. Ziv, "Fast evaluation of elementary
//! mathematical functions with correctly rounded last bit", ACM TOMS 17(3),
//! 1991). Otherwise the row is redone at twice the precision, from
//! `max(start_precision, 2 p_target + 8 rounded up to 64)` (64 bits for
//! f32/bf16/f16 targets, 128 for f64) up to `max_precision`; exact results
//! (point enclosures: ties, `exp(0) = 1`, exact zeros) are decided at once.
//! At the cap results come back with `decided = false`. Rounding to a dtype
//! is [`round_to_dtype`] (module `round`): precision 53/24/8/11 with an
//! explicit minimum exponent (subnormals), overflow to `±inf`.
//!
//! Rows run in parallel (rayon), and long rows in fixed chunks of 8192
//! entries, so the enclosures do not depend on the thread count.
//!
//! # Tiers
//!
//! By default ([`Tier::Fast`]) each row first goes through the certified
//! f64 tier ([`fast`]: one CORE-MATH exp per entry, rigorous summation
//! bounds); every forward output whose f64 enclosure rounds to one value of
//! the target dtype is decided there, and only the others run the MPFR path
//! above, output by output; the row statistics come from the same pass.
//! [`Tier::FastVjp`] puts the VJP elements on the f64 tier too (its
//! enclosures are a few f64 ulps wide, which moves printed absolute errors
//! of almost exact gradients; see [`Tier`]). The values are the same
//! correctly rounded values either way; [`Tier::Mpfr`] forces the MPFR
//! path, and [`Fallback`] counts how many outputs and rows MPFR decided.

mod cross_entropy;
pub mod fast;
mod kl;
pub mod linear;
mod log_softmax;
mod policy;
mod round;
mod row;
mod topk_kl;
mod vjp;

pub use crate::interval::{Interval, MpfrInterval};
pub use cross_entropy::{LossSum, MpfrLossSum, OracleLoss};
pub use fast::{Fallback, Tier};
pub use round::{round_to_dtype, Rounder};

use ndarray::Array2;

use rayon::prelude::*;

use crate::spec::{
    Dtype, EntropyLogits, Family, Output, PerOutput, Problem, RowStat, Shape, SpecError,
};

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
    /// Enclosure of `exact - rounded` (rounded outward; `[-inf, inf]` when
    /// `rounded` or an end is infinite). The f64 `enclosure` of a value
    /// judged in f64 is one f64 ulp wide unless the value is an f64; this
    /// offset keeps the MPFR path's precision, so [`Exact::error`] does not
    /// count that ulp as the candidate's error.
    pub offset: Interval,
}

/// Row statistics for the tolerance model (docs/design.md, "The tolerance model"),
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
    /// Every forward output the problem requests ([`Output::requested`]),
    /// `[N, width]` (nats): `log_probs [N, 1]` (an `ignore_index` row holds
    /// an exact 0 and is not judged, [`Output::judged`]), `entropy [N, 1]`,
    /// `topk_log_probs [N, K]` (`-inf` for masked ids).
    pub values: PerOutput<Array2<Exact>>,
    /// How many of these outputs (and rows) MPFR decided.
    pub fallback: Fallback,
}

/// The oracle: which tier computes, and the precision policy of the MPFR
/// path's Ziv loop.
///
/// ```
/// use logprobe_reference::oracle::{Oracle, Tier};
/// use logprobe_reference::spec::{Dtype, Logits, Output, Problem};
/// use ndarray::array;
/// let x = array![[1.0f32, 2.0, 3.0]];
/// let t = array![2i64];
/// let mut p = Problem::new(Logits::F32(x.view()));
/// p.tokens = Some(t.view());
/// let fast = Oracle::default().forward(&p, Dtype::F32).unwrap();
/// let mpfr = Oracle { tier: Tier::Mpfr, ..Oracle::default() }.forward(&p, Dtype::F32).unwrap();
/// let lp = |f: &logprobe_reference::oracle::OracleForward| f.values[Output::LogProbs][[0, 0]].rounded;
/// assert_eq!(lp(&fast), lp(&mpfr));
/// assert_eq!(fast.fallback.rows_mpfr, 0);
/// assert_eq!(mpfr.fallback.output_rate(), 1.0);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Oracle {
    /// First working precision in bits (64).
    pub start_precision: u32,
    /// Cap (4096): past it results come back undecided.
    pub max_precision: u32,
    /// The tier ([`Tier::Fast`]: f64 first, MPFR for undecided outputs).
    pub tier: Tier,
}

impl Default for Oracle {
    fn default() -> Self {
        Oracle {
            start_precision: 64,
            max_precision: 4096,
            tier: Tier::Fast,
        }
    }
}

/// `RowForward::precision` of rows decided on the f64 tier.
pub const FAST_PRECISION: u32 = 53;

/// Which results of a row the MPFR path must decide: `lse`, and per
/// requested forward output its columns `[width]`.
struct Want {
    lse: bool,
    values: PerOutput<Vec<bool>>,
}

impl Oracle {
    /// The precisions of the Ziv loop for `target`: from
    /// `max(start_precision, 2 p_target + 8 rounded up to a multiple of 64)`
    /// doubling up to `max_precision` (at least one step; bits).
    pub fn precisions(&self, target: Dtype) -> Vec<u32> {
        let want = (2 * target.precision() + 8).div_ceil(64) * 64;
        let cap = self.max_precision.max(MIN_PREC);
        let mut p = self.start_precision.max(want).max(MIN_PREC).min(cap);
        let mut out = vec![p];
        while p < cap {
            p = (p.saturating_mul(2)).min(cap);
            out.push(p);
        }
        out
    }

    /// Exact forward results of `problem`, correctly rounded to `target`:
    /// `lse [N]`, `log_probs [N]` (with tokens), `entropy [N]` (when
    /// `options.entropy` is `Some`), `topk_log_probs [N, K]` (with ids); all
    /// in nats. Rows run in parallel.
    ///
    /// # Errors
    /// The spec's validation errors ([`Problem::validate`]; the first bad
    /// row in row order), and with `TemperatureDtype::Input` the errors of
    /// `round_input(x / T)` overflowing ([`SpecError::NonFiniteLogit`] for
    /// `+inf`, [`SpecError::TokenNegInf`], [`SpecError::NoFiniteLogit`]).
    pub fn forward(
        &self,
        problem: &Problem<'_>,
        target: Dtype,
    ) -> Result<OracleForward, SpecError> {
        let shape = problem.validate()?;
        let rows: Vec<Result<(RowForward, Fallback), SpecError>> = (0..shape.n)
            .into_par_iter()
            .map(|r| self.forward_row(problem, &shape, r, target))
            .collect();
        let rows = first_error(rows)?;
        let mut fallback = Fallback::default();
        let mut lse = Vec::with_capacity(shape.n);
        let mut flat =
            PerOutput::for_requested(problem, |o| Vec::with_capacity(shape.n * o.width(&shape)));
        for (r, fb) in rows {
            fallback += fb;
            lse.push(r.lse);
            for (o, v) in r.values {
                if let Some(f) = flat.get_mut(o) {
                    f.extend(v);
                }
            }
        }
        Ok(OracleForward {
            dtype: target,
            lse,
            values: flat.map(|o, v| {
                Array2::from_shape_vec((shape.n, o.width(&shape)), v).expect("N * width results")
            }),
            fallback,
        })
    }

    /// Forward results of row `row` alone (see [`Oracle::forward`]).
    ///
    /// # Errors
    /// As [`Oracle::forward`], for that row; a row index past `N` is
    /// [`SpecError::ShapeMismatch`] on tensor `row`.
    pub fn forward_row_of(
        &self,
        problem: &Problem<'_>,
        row: usize,
        target: Dtype,
    ) -> Result<RowForward, SpecError> {
        let shape = problem.validate_shapes()?;
        check_row(&shape, row)?;
        problem.validate_row(&shape, row)?;
        self.forward_row(problem, &shape, row, target).map(|r| r.0)
    }

    /// One row: the f64 tier first (unless [`Tier::Mpfr`]), then MPFR for
    /// the outputs it left undecided.
    fn forward_row(
        &self,
        problem: &Problem<'_>,
        shape: &Shape,
        r: usize,
        target: Dtype,
    ) -> Result<(RowForward, Fallback), SpecError> {
        let row = row::prepare(problem, shape, r, problem.options.entropy)?;
        let Some(mutant) = self.tier.fast() else {
            let rf = self.forward_mpfr(problem, &row, target, None);
            let n = rf.outputs(problem, r);
            return Ok((
                rf,
                Fallback {
                    outputs: n,
                    outputs_mpfr: n,
                    rows: 1,
                    rows_mpfr: 1,
                },
            ));
        };
        let fast = fast::FastRow::from_row(
            row,
            fast::FastOptions {
                mutant,
                ..Default::default()
            },
        );
        Ok(self.complete_forward(problem, &fast, target, fast.forward(target)))
    }

    /// The forward values of a row prepared on the f64 tier: those `ff`
    /// ([`fast::FastRow::forward`] of `fast` in `target`) decided, and the
    /// MPFR path (Ziv's loop, reusing `fast`'s prepared row) for the
    /// others, with their [`Fallback`] counts. An output absent from `ff`
    /// (outer `None`: e.g. an entropy the caller does not need) is absent
    /// from the result; `problem` (whose row `fast` holds) says which
    /// outputs are requested. Units: nats. One row: `verify` calls it once
    /// per row and target dtype after one [`fast::FastRow::new`].
    pub fn complete_forward(
        &self,
        problem: &Problem<'_>,
        fast: &fast::FastRow<'_>,
        target: Dtype,
        ff: fast::FastForward,
    ) -> (RowForward, Fallback) {
        let (n, undecided) = ff.counts();
        let mut fb = Fallback {
            outputs: n,
            outputs_mpfr: undecided,
            rows: 1,
            rows_mpfr: 0,
        };
        let lse = ff.lse;
        let values = fast_values(problem, fast, ff, target);
        // The values derived here (z_loss, loss, the policy and top-k KL
        // terms) are outputs beyond `ff`'s counts, and may be undecided
        // where the f64 tier's own outputs are not.
        let (mut derived, mut derived_outputs) = (0, 0);
        for v in Output::FORWARD
            .into_iter()
            .filter(|o| !fast::FastForward::OUTPUTS.contains(o))
            .filter_map(|o| values.get(o))
        {
            derived_outputs += v.len() as u64;
            derived += v.iter().filter(|e| e.is_none()).count() as u64;
        }
        fb.outputs += derived_outputs;
        fb.outputs_mpfr += derived;
        if undecided + derived == 0 {
            let rf = RowForward {
                lse: lse.expect("decided"),
                values: values.map(|_, v| v.into_iter().map(|e| e.expect("decided")).collect()),
                precision: FAST_PRECISION,
            };
            return (rf, fb);
        }
        fb.rows_mpfr = 1;
        let want = Want {
            lse: lse.is_none(),
            values: values
                .as_ref()
                .map(|_, v| v.iter().map(Option::is_none).collect()),
        };
        let m = self.forward_mpfr(problem, fast.prepared(), target, Some(&want));
        let rf = RowForward {
            lse: lse.unwrap_or(m.lse),
            values: values.map(|o, v| {
                v.into_iter()
                    .zip(&m.values[o])
                    .map(|(f, m)| f.unwrap_or(*m))
                    .collect()
            }),
            precision: m.precision,
        };
        (rf, fb)
    }

    /// The MPFR path of one row: Ziv's loop until every output (or every
    /// output in `want`) is decided.
    fn forward_mpfr(
        &self,
        problem: &Problem<'_>,
        row: &row::Row<'_>,
        target: Dtype,
        want: Option<&Want>,
    ) -> RowForward {
        let mut rounder = Rounder::new();
        let precs = self.precisions(target);
        let mut out = None;
        for &prec in &precs {
            let sums = row::pass(row, prec, false, None);
            let vals = row::values(row, &sums, prec);
            let lse = rounder.exact(&vals.lse, target);
            let values = PerOutput::for_requested(problem, |o| match o.family() {
                // No log-prob bounds on an `ignore_index` row: defined as 0.
                Family::LogSoftmax(RowStat::LogProb) => vec![vals
                    .log_prob
                    .as_ref()
                    .map_or(Exact::point(0.0), |b| rounder.exact(b, target))],
                Family::LogSoftmax(RowStat::Entropy) => vals
                    .entropy
                    .iter()
                    .map(|b| rounder.exact(b, target))
                    .collect(),
                Family::LogSoftmax(stat) => log_softmax::row_stat(stat, row).into_iter().collect(),
                Family::TopK => vals.topk.iter().map(|b| rounder.exact(b, target)).collect(),
                Family::Gradient => Vec::new(),
                Family::Loss(term) => cross_entropy::row_values_mpfr(
                    term,
                    (problem, row),
                    (&vals, &sums, lse),
                    (prec, target),
                    &mut rounder,
                ),
                Family::TopkKl(dir) => {
                    let kl = problem.options.topk_kl.expect("requested");
                    let e = topk_kl::kl_mpfr(&vals.topk, &row.teacher, &kl, dir, prec);
                    vec![rounder.exact(&e, target)]
                }
                // No log-prob on an `ignore_index` row: its terms are 0.
                Family::Policy(term) => vec![vals
                    .log_prob
                    .as_ref()
                    .and_then(|lp| policy::term_mpfr(term, &row.policy, lp, prec))
                    .map_or(Exact::point(0.0), |b| rounder.exact(&b, target))],
            });
            let rf = RowForward {
                lse,
                values,
                precision: prec,
            };
            let done = match want {
                None => rf.decided(),
                Some(w) => {
                    (!w.lse || rf.lse.decided)
                        && w.values.iter().all(|(o, w)| {
                            rf.values
                                .get(o)
                                .is_none_or(|v| v.iter().zip(w).all(|(e, &w)| !w || e.decided))
                        })
                }
            };
            out = Some(rf);
            if done {
                break;
            }
        }
        out.expect("at least one precision")
    }

    /// The MPFR row statistics of the row prepared in `fast` at
    /// `start_precision` (for rows whose f64 statistics are not
    /// [`fast::FastRow::stats_decided`]; see [`Oracle::row_stats`]).
    pub fn row_stats_mpfr(&self, fast: &fast::FastRow<'_>) -> RowStats {
        row::stats(fast.prepared(), self.start_precision.max(MIN_PREC))
    }

    /// Statistics of row `row` for the tolerance model, at
    /// `start_precision` (f64 outward enclosures; see [`RowStats`]). The
    /// entropy's logits follow `options.entropy` (unmasked when `None`).
    ///
    /// # Errors
    /// The spec's validation errors for that row ([`Problem::validate_shapes`],
    /// [`Problem::validate_row`], the `Input`-temperature errors of
    /// [`Oracle::forward`]); a row index past `N` is
    /// [`SpecError::ShapeMismatch`] on tensor `row`.
    pub fn row_stats(&self, problem: &Problem<'_>, row: usize) -> Result<RowStats, SpecError> {
        self.row_stats_counted(problem, row).map(|r| r.0)
    }

    /// [`Oracle::row_stats`] with its [`Fallback`] counts (one output per
    /// row: the f64 tier's statistics stand when
    /// [`fast::FastRow::stats_decided`], otherwise MPFR computes them).
    ///
    /// # Errors
    /// As [`Oracle::row_stats`].
    pub fn row_stats_counted(
        &self,
        problem: &Problem<'_>,
        row: usize,
    ) -> Result<(RowStats, Fallback), SpecError> {
        let shape = problem.validate_shapes()?;
        check_row(&shape, row)?;
        problem.validate_row(&shape, row)?;
        let entropy = Some(problem.options.entropy.unwrap_or(EntropyLogits::Unmasked));
        let prepared = row::prepare(problem, &shape, row, entropy)?;
        let prec = self.start_precision.max(MIN_PREC);
        let mpfr = Fallback {
            outputs: 1,
            outputs_mpfr: 1,
            rows: 1,
            rows_mpfr: 1,
        };
        let Some(mutant) = self.tier.fast() else {
            return Ok((row::stats(&prepared, prec), mpfr));
        };
        let fast = fast::FastRow::from_row(
            prepared,
            fast::FastOptions {
                per_entry: true,
                m2: true,
                mutant,
                ..Default::default()
            },
        );
        if fast.stats_decided() {
            let fb = Fallback {
                outputs: 1,
                outputs_mpfr: 0,
                rows: 1,
                rows_mpfr: 0,
            };
            return Ok((fast.row_stats(), fb));
        }
        Ok((row::stats(fast.prepared(), prec), mpfr))
    }
}

/// Forward results of one row in the target dtype.
#[derive(Clone, Debug)]
pub struct RowForward {
    /// `lse(z')` (nats).
    pub lse: Exact,
    /// The row's values `[width]` of every requested forward output (as
    /// in [`OracleForward::values`]; an `ignore_index` row's log-prob is an
    /// exact 0).
    pub values: PerOutput<Vec<Exact>>,
    /// The working precision (bits) of the last Ziv step
    /// ([`FAST_PRECISION`] when the f64 tier decided every output).
    pub precision: u32,
}

impl RowForward {
    /// Number of outputs of row `row` (lse and every judged value: an
    /// `ignore_index` row's log-prob is not counted, as on the f64 tier).
    fn outputs(&self, problem: &Problem<'_>, row: usize) -> u64 {
        1 + self
            .values
            .iter()
            .filter(|(o, _)| o.judged(problem, row))
            .map(|(_, v)| v.len() as u64)
            .sum::<u64>()
    }

    /// Whether every result is decided.
    pub fn decided(&self) -> bool {
        self.lse.decided && self.values.iter().all(|(_, v)| v.iter().all(|e| e.decided))
    }
}

/// The f64 tier's results of one row per requested forward output
/// (`None`: left undecided for MPFR); an `ignore_index` row's log-prob is
/// the exact 0 of [`RowForward::values`].
fn fast_values(
    problem: &Problem<'_>,
    fast: &fast::FastRow<'_>,
    ff: fast::FastForward,
    target: Dtype,
) -> PerOutput<Vec<Option<Exact>>> {
    let (mut log_prob, mut entropy, mut topk) =
        (Some(ff.log_prob), Some(ff.entropy), Some(ff.topk));
    let lse = ff.lse;
    PerOutput::for_requested(problem, |o| match o.family() {
        Family::LogSoftmax(RowStat::LogProb) => {
            vec![log_prob.take().flatten().unwrap_or(Some(Exact::point(0.0)))]
        }
        Family::LogSoftmax(RowStat::Entropy) => entropy.take().flatten().into_iter().collect(),
        Family::LogSoftmax(stat) => vec![log_softmax::row_stat(stat, fast.prepared())],
        Family::TopK => topk.take().unwrap_or_default(),
        Family::Gradient => Vec::new(),
        Family::Loss(term) => cross_entropy::row_values_fast(term, problem, fast, lse, target),
        Family::TopkKl(dir) => vec![topk_kl::decide_fast(problem, fast, dir, target)],
        Family::Policy(term) => vec![match fast.log_prob() {
            // No log-prob on an `ignore_index` row: its terms are 0.
            None => Some(Exact::point(0.0)),
            Some(_) if !fast.applicable() => None,
            Some(lp) => policy::term_fast(term, &fast.prepared().policy, lp)
                .and_then(|iv| policy::decide_term(term, iv, target)),
        }],
    })
}

/// Smallest working precision: every f64 input must be exact.
const MIN_PREC: u32 = 64;

fn check_row(shape: &Shape, row: usize) -> Result<(), SpecError> {
    if row >= shape.n {
        return Err(SpecError::ShapeMismatch {
            tensor: "row",
            expected: vec![shape.n],
            found: vec![row],
        });
    }
    Ok(())
}

fn first_error<T>(rows: Vec<Result<T, SpecError>>) -> Result<Vec<T>, SpecError> {
    rows.into_iter().collect()
}
