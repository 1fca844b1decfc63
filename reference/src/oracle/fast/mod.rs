//! The certified f64 tier of the oracle: one pass per row, one correctly
//! rounded f64 `exp` per entry, error-free sums and a-priori bounds
//! evaluated with upward rounding, giving f64 enclosures of everything the
//! MPFR path computes. An output whose enclosure rounds to one value of the
//! target dtype is decided here (that value is the correctly rounded one);
//! the others fall back, one by one, to the MPFR path and its Ziv loop.
//!
//! The public [`crate::oracle::Oracle`] uses this tier by default
//! ([`Tier::Fast`]); [`Tier::Mpfr`] forces the MPFR path. [`FastRow`] is
//! the prepared pass itself: one set of exps per row serves the forward
//! values, the row statistics ([`RowStats`]) and the VJP ([`FastVjp`]).
//!
//! # Derivation
//!
//! Notation: `u = 2^-53`, `eta = 2^-1075`, `RN` round to nearest even (Rust
//! never changes the rounding mode). For a real `y` and `y^ = RN(y)`:
//!
//! - (E0) `|y^ - y| <= u |y^|` when `|y| >= 2^-1022`, `<= eta` otherwise,
//!   so `|y^ - y| <= u |y^| + eta` and `y` lies in `[pred y^, succ y^]`
//!   (IEEE 754-2019 4.3.1; N. Higham, "Accuracy and Stability of Numerical
//!   Algorithms", 2nd ed., SIAM 2002, Thm 2.2 and 2.1.1 on gradual
//!   underflow). Sums are rounded in the exact direction with Knuth's
//!   TwoSum (exact with gradual underflow; TAOCP vol. 2, 4.2.2); products
//!   and quotients are moved one ulp outward.
//! - CORE-MATH's binary64 `exp` and `log1p` are correctly rounded (RN) for
//!   every input (A. Sibidanov, P. Zimmermann, S. Glondu, "The CORE-MATH
//!   Project", ARITH 2022; the `core-math` crate binds that C code).
//!
//! Per family (the masked logits `z'` for `p`, the entropy's `w` for `q`),
//! with max `v_max` at index `m` and `N` other members:
//!
//! - (F1) Shift. `a_j = (v_max - v_j) / ts >= 0`, `a^_j =
//!   RN(RN(v_max - v_j) / ts)`. TwoSum gives the subtraction's exact error
//!   (not always 0: f32 logits `1e30` apart from tiny ones, or from
//!   `100.5` and `1e-30`, need more than 53 bits). A quotient by a power of
//!   two is exact iff `a^ ts == RN(v_max - v_j)` (scaling by a power of two
//!   is exact); other divisors are taken as inexact. When inexact, `a^ =
//!   a (1+e1)(1+e2) + e3` (`|e1|, |e2| <= u`, `|e3| <= eta`; a subtraction
//!   landing in the subnormal range is exact, J. Hauser, ACM TOPLAS 18(2),
//!   1996), so `|a^ - a| <= Delta_j = c1 a^ + 2^-1074`, `c1 = 2u (1 + 4u)
//!   >= (2u + u^2) / (1 - u)^2`. The statistics `d_j`, `e_j` and the
//!   log-probs use the tighter enclosure: the subtraction rounded down and
//!   up exactly (TwoSum), each end divided and moved one ulp outward unless
//!   exact.
//! - (F2) Exp. `r_j = RN(exp(-a^_j))` (CORE-MATH). By (E0) `exp(-a^) in
//!   [pred r, succ r]` and `|r - exp(-a^)| <= u r + eta`. `r > 0` implies
//!   `exp(-a^) > eta`, so `a^ < 745.14` and `Delta_j <= kappa = 2^-42`;
//!   then `E_j = exp(-a_j) in exp(-a^) [1 - Delta, 1 + Delta (1 + kappa)]`.
//!   `r = 0` implies `a >= a^ - Delta >= 745.13`: `E_j < 2^-1074`,
//!   `E_j a_j < 2^-1064`, `E_j a_j^2 < 2^-1050` (the absolute underflow
//!   terms below; at `a = 1e30` MPFR's exponent range cannot hold `E_j`
//!   either).
//! - (F3) Sums. Nonnegative terms are added by TwoSum into `(H, LO)`
//!   (`H_i = RN(H_{i-1} + x_i)`, `LO += e_i` in plain f64), so `sum x = H +
//!   sum e_i` exactly, `|e_i| <= u H_i <= u H` (partial sums only grow), and
//!   the plain sum of the `e_i` is off by at most `gamma_{N-1} sum |e_i|`
//!   (Higham (4.4)): `|H + LO - sum x| <= eps = gamma_N N u H`, `gamma_n =
//!   n u / (1 - n u)` (the Sum2 analysis of T. Ogita, S. Rump, S. Oishi,
//!   "Accurate sum and dot product", SIAM J. Sci. Comput. 26(6), 2005,
//!   Prop. 4.5, without its last rounding). Plain sums of nonnegative
//!   terms are off by at most `gamma_{N-1}` relative.
//! - (F4) `s = S - 1 = sum_{j != m} E_j` is summed without the argmax term
//!   (exactly `e^0 = 1`), so a tiny `s` keeps its relative accuracy; forming
//!   `S` first and taking `S - 1` would lose it. With `R0 = H0 + LO0 + eps0
//!   >= sum r_j` and `X >= sum_{inexact, r > 0} r_j a^_j` (`X = (1 + u)
//!   X^ / (1 - gamma_N) + N 2^-1074` from the rounded products, (E0)):
//!   `s <= H0 + LO0 + eps0 + u R0 + (1 + kappa)(1 + u)(c1 X + 2^-1074 R0)
//!   + N 2^-1074` and `s >= H0 + LO0 - eps0 - u R0 - (c1 X + 2^-1074 R0) -
//!   N 2^-1074`, from `E_j <= (r_j (1 + u) + eta)(1 + Delta_j (1 +
//!   kappa))`, `E_j >= (r_j (1 - u) - eta)(1 - Delta_j)`, `sum r_j Delta_j
//!   <= c1 sum r_j a^_j + 2^-1074 sum r_j`. Then `S = 1 + s`, `ln S =
//!   ln_1p(s)` (CORE-MATH `log1p`, one ulp outward), `lse = v_max / ts +
//!   ln S`, `log_prob = -(a_t + ln S)`, `topk_k = -(a_{id_k} + ln S)`.
//! - (F5) `B = sum E_j a_j` (so `R = B / S_w`, `entropy = ln S_w + R`):
//!   with the rounded products `r_j a^_j in (1 +- u) P^_j +- eta`, the
//!   shift error `(a^ +- Delta)` and `amax = max a^_j` over inexact
//!   entries: `B <= (1 + u)^2 (H1 + LO1 + eps1) + (1 + u)(1 + kappa)(c1
//!   (amax + 1 + kappa) X + 748 2^-1074 R0) + N 2^-1064`, `B >= (1 - u)^2
//!   (H1 + LO1 - eps1) - (c1 (amax + 1) X + 747 2^-1074 R0) - N 2^-1064`.
//! - (F6) `T2 = sum E_j a_j^2` (so `M2 = T2 / S_w`), with `Q = (amax +
//!   kappa)^2 + 2 amax + kappa`: `T2 <= (1 + u)^3 (H2 + LO2 + eps2) + (1 +
//!   u)(1 + kappa) Q (c1 X + 2^-1074 R0) + N 2^-1050`, and the lower end
//!   with `(1 - u)^3`, `-Q (...)`, `-N 2^-1050`.
//! - (F7) Per entry: `E_j in [pred r_j, succ r_j] [1 - Delta_j, 1 +
//!   Delta_j (1 + kappa)]` (`[1, 1]` at the argmax, `[0, 2^-1074]` when
//!   `r_j = 0`), `p_j = E_j / S`, `q_j = E^w_j / S_w`, `d_j = -a_j`. VJP:
//!   `dx_j T = A_j sigma_j / S - (C - A_j) E_j / S - h E^w_j (R - a^w_j) /
//!   S_w` with `sigma_j = s` at the argmax and `1 + s - E_j >= max(1, s)`
//!   elsewhere (no cancellation), in interval arithmetic ([`FastVjp`]).
//! - (F8) Decision ([`decide`]). An output is decided when both ends of
//!   its enclosure round to the same bits in the target dtype and the
//!   enclosure does not contain 0 (an exact zero's sign is left to MPFR).
//!   Rounding is monotone, so that common value is the correctly rounded
//!   exact value: the one the MPFR path returns. For f64 targets this
//!   almost never happens (the enclosures are a few f64 ulps wide): those
//!   outputs fall back to MPFR.
//!
//! Every bound is a function of computed f64 values only, evaluated with
//! upward rounding. The property test `reference/tests/fast_tier.rs` checks
//! every enclosure against a 320-bit MPFR evaluation over offsets up to
//! `1e30`, subnormals, near-uniform rows at real `V`, one-hot rows, masks,
//! ties, `-inf` and temperatures, and kills planted mutants of the tier.
//!
//! # Planted mutants
//!
//! [`Mutant`] (hidden from the docs) switches off one widening of this tier
//! at run time: the exp result not widened, `d_j` not widened, `S - 1` used
//! in place of `s`. A run-time switch, not a `cfg`: the default
//! `cargo test` then tests the very code that ships (integration tests link
//! the library built without `cfg(test)`, and a custom `cfg` would rebuild
//! the dependency graph), and the switch is read outside the inner loop
//! (in the row-level bounds and the per-entry enclosure helpers), so it
//! costs nothing measurable.

mod grad;
pub(crate) mod ival;
mod pass;

pub use grad::{FastVjp, RowCotangents};

use super::row::{self, Row, TopId};
use super::{Exact, Interval, RowStats};
use crate::spec::{Dtype, EntropyLogits, Problem, SpecError};
use pass::{
    a_interval, a_tight, accumulate, exp_interval, family_bounds, Cache, Div, FamilyBounds, Sums,
};

/// Which tier of the oracle computes results.
///
/// The values are the same correctly rounded values on every tier; only the
/// enclosures differ (the f64 tier's are a few f64 ulps wide, MPFR's about
/// one). Judges measure a candidate's absolute error against the far end of
/// the enclosure, so figures printed to four digits of the error of a
/// gradient that is almost exact move with that width: this is why the
/// default keeps the VJP's enclosures on MPFR.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Tier {
    /// Forward values and row statistics on the certified f64 tier where it
    /// decides, MPFR (Ziv's loop) for each output it leaves undecided; the
    /// VJP on MPFR.
    #[default]
    Fast,
    /// As [`Tier::Fast`], and the VJP elements too (f64 enclosures).
    FastVjp,
    /// The MPFR path only (for the property tests and benchmarks).
    Mpfr,
    /// The f64 tier (VJP included) with one planted bug (test-only).
    #[doc(hidden)]
    FastMutant(Mutant),
}

impl Tier {
    /// `None` for the MPFR path, `Some(mutant)` for the f64 tier.
    pub(crate) fn fast(self) -> Option<Option<Mutant>> {
        match self {
            Tier::Fast | Tier::FastVjp => Some(None),
            Tier::Mpfr => None,
            Tier::FastMutant(m) => Some(Some(m)),
        }
    }

    /// As [`Tier::fast`], for the VJP.
    pub(crate) fn fast_vjp(self) -> Option<Option<Mutant>> {
        match self {
            Tier::Fast => None,
            t => t.fast(),
        }
    }
}

/// A planted bug of the f64 tier (test-only; see the module docs).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutant {
    /// `r_j` taken as the exact `exp(d_j)`.
    ExpNotWidened,
    /// `a^_j` taken as the exact shift.
    ShiftNotWidened,
    /// `s` taken as `fl(1 + s) - 1`.
    SMinusOne,
}

/// Fallback counters: how many outputs (and rows) were computed, and how
/// many of them the MPFR path had to decide. Summed over calls with `+=`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fallback {
    /// Outputs computed (forward values; grad elements; statistic rows).
    pub outputs: u64,
    /// Of those, decided by MPFR.
    pub outputs_mpfr: u64,
    /// Rows computed.
    pub rows: u64,
    /// Rows in which MPFR ran at all.
    pub rows_mpfr: u64,
}

impl Fallback {
    /// `outputs_mpfr / outputs` (0 when nothing was computed).
    pub fn output_rate(&self) -> f64 {
        ratio(self.outputs_mpfr, self.outputs)
    }

    /// `rows_mpfr / rows` (0 when nothing was computed).
    pub fn row_rate(&self) -> f64 {
        ratio(self.rows_mpfr, self.rows)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

impl std::ops::AddAssign for Fallback {
    fn add_assign(&mut self, o: Fallback) {
        self.outputs += o.outputs;
        self.outputs_mpfr += o.outputs_mpfr;
        self.rows += o.rows;
        self.rows_mpfr += o.rows_mpfr;
    }
}

/// `x` rounded to nearest even in `dtype` (exact f64).
#[inline(always)]
fn round_to(x: f64, dtype: Dtype) -> f64 {
    match dtype {
        Dtype::F64 => x,
        Dtype::F32 => x as f32 as f64,
        d => d.round_f64(x),
    }
}

/// The decision (F8) of an enclosure in `target`: `Some` with the
/// correctly rounded value when both ends round to the same bits and the
/// enclosure does not contain 0; `None` otherwise (undecided here: the MPFR
/// path decides). Units: those of the value.
///
/// ```
/// use logprobe_reference::oracle::{fast::decide, Interval};
/// use logprobe_reference::spec::Dtype;
/// let e = decide(Interval { lo: 0.1, hi: 0.1 + 1e-12 }, Dtype::F32).unwrap();
/// assert_eq!(e.rounded, 0.1f32 as f64);
/// assert!(decide(Interval { lo: 1.0, hi: 1.0 + 1e-7 }, Dtype::F32).is_none());
/// ```
pub fn decide(enclosure: Interval, target: Dtype) -> Option<Exact> {
    let Interval { lo, hi } = enclosure;
    if !(lo <= hi) || (lo <= 0.0 && hi >= 0.0) {
        return None;
    }
    let rl = round_to(lo, target);
    (rl.to_bits() == round_to(hi, target).to_bits()).then(|| Exact::new(enclosure, rl, true))
}

/// [`decide`] for an exact value known to be `< 0` (`negative`) or `> 0`:
/// an end on the wrong side of 0 stands for a value of that sign next to
/// 0, which rounds to `-0` (`+0`) in every dtype.
fn decide_signed(enclosure: Interval, target: Dtype, negative: bool) -> Option<Exact> {
    let Interval { lo, hi } = enclosure;
    if !(lo <= hi) {
        return None;
    }
    let (rl, rh) = if negative {
        (
            round_to(lo, target),
            if hi >= 0.0 {
                -0.0
            } else {
                round_to(hi, target)
            },
        )
    } else {
        (
            if lo <= 0.0 { 0.0 } else { round_to(lo, target) },
            round_to(hi, target),
        )
    };
    (rl.to_bits() == rh.to_bits()).then(|| Exact::new(enclosure, rl, true))
}

/// What a [`FastRow`] computes.
#[derive(Clone, Copy, Debug, Default)]
pub struct FastOptions {
    /// The entropy's logits (`None`: no entropy family, so no entropy, `R`
    /// or `q`).
    pub entropy: Option<EntropyLogits>,
    /// Keep each entry's shift and exp (`16` bytes per entry and family)
    /// for the statistics, probabilities and VJP; without it those
    /// recompute the exp of each entry they read.
    pub per_entry: bool,
    /// Also accumulate `sum E_j a_j^2` for `M2`.
    pub m2: bool,
    /// A planted bug (test-only).
    #[doc(hidden)]
    pub mutant: Option<Mutant>,
}

/// One family's pass and bounds.
#[derive(Debug)]
struct Fam {
    vmax: f64,
    argmax: usize,
    sums: Sums,
    bounds: FamilyBounds,
    cache: Option<Cache>,
}

/// One row prepared on the f64 tier: the exact inputs, one exp per entry
/// and family, and the enclosures of the row sums (module docs, (F1)-(F6)).
/// Every accessor returns an f64 [`Interval`] containing the exact value;
/// units are nats for `d`, `e`, log-probs, entropy, `lse`, `ln S`, `R`, and
/// nats squared for `M2`.
///
/// ```
/// use logprobe_reference::oracle::fast::{FastOptions, FastRow};
/// use logprobe_reference::spec::{Dtype, EntropyLogits, Logits, Problem};
/// use ndarray::array;
/// let x = array![[2.0f32, 1.0, 0.5, -3.0]];
/// let t = array![1i64];
/// let mut p = Problem::new(Logits::F32(x.view()));
/// p.tokens = Some(t.view());
/// let opts = FastOptions { entropy: Some(EntropyLogits::Unmasked), ..Default::default() };
/// let row = FastRow::new(&p, 0, opts).unwrap();
/// let lp = row.log_prob().unwrap();
/// // log_softmax(x)[1] = 1 - lse(x)
/// let exact = 1.0 - (2f64.exp() + 1f64.exp() + 0.5f64.exp() + (-3f64).exp()).ln();
/// assert!(lp.lo <= exact + 1e-15 && exact - 1e-15 <= lp.hi);
/// let fwd = row.forward(Dtype::F32);
/// assert!(fwd.lse.is_some() && fwd.entropy.unwrap().is_some());
/// ```
#[derive(Debug)]
pub struct FastRow<'a> {
    row: Row<'a>,
    div: Div,
    mutant: Option<Mutant>,
    applicable: bool,
    p: Fam,
    /// The entropy family when it is not `p`'s (`q_is_p` false).
    q: Option<Fam>,
    q_is_p: bool,
    /// Whether `sum E_j a_j^2` was accumulated.
    m2: bool,
}

/// Forward values of one row decided on the f64 tier: `Some(exact)` when
/// decided, `None` when the MPFR path must decide it.
#[derive(Clone, Debug)]
pub struct FastForward {
    /// `lse(z')` (nats).
    pub lse: Option<Exact>,
    /// Log-prob of the target (nats); outer `None` without a target.
    pub log_prob: Option<Option<Exact>>,
    /// Entropy (nats); outer `None` without an entropy family.
    pub entropy: Option<Option<Exact>>,
    /// Top-k log-probs `[K]` (nats).
    pub topk: Vec<Option<Exact>>,
}

impl FastForward {
    /// Whether every output is decided.
    pub fn decided(&self) -> bool {
        self.lse.is_some()
            && self.log_prob.as_ref().is_none_or(|e| e.is_some())
            && self.entropy.as_ref().is_none_or(|e| e.is_some())
            && self.topk.iter().all(|e| e.is_some())
    }

    /// `(outputs, undecided)`.
    pub fn counts(&self) -> (u64, u64) {
        let mut n = 1u64;
        let mut und = self.lse.is_none() as u64;
        for e in self.log_prob.iter().chain(self.entropy.iter()) {
            n += 1;
            und += e.is_none() as u64;
        }
        n += self.topk.len() as u64;
        und += self.topk.iter().filter(|e| e.is_none()).count() as u64;
        (n, und)
    }
}

impl<'a> FastRow<'a> {
    /// Prepares row `row` of `problem` on the f64 tier: validation, one
    /// exp per entry and family, the row sums' enclosures.
    ///
    /// # Errors
    /// The spec's validation errors for that row
    /// ([`Problem::validate_shapes`], [`Problem::validate_row`], and those
    /// of `round_input(x / T)` with `TemperatureDtype::Input`); a row index
    /// past `N` is [`SpecError::ShapeMismatch`] on tensor `row`.
    pub fn new(
        problem: &Problem<'a>,
        row: usize,
        options: FastOptions,
    ) -> Result<FastRow<'a>, SpecError> {
        let shape = problem.validate_shapes()?;
        super::check_row(&shape, row)?;
        problem.validate_row(&shape, row)?;
        let prepared = row::prepare(problem, &shape, row, options.entropy)?;
        Ok(FastRow::from_row(prepared, options))
    }

    pub(crate) fn from_row(row: Row<'a>, options: FastOptions) -> FastRow<'a> {
        let div = Div::new(row.ts);
        let v = &row.v[..];
        let mask_buf: Option<Vec<bool>>;
        let mask: Option<&[bool]> = match row.mask {
            None => None,
            Some(m) => match m.to_slice() {
                Some(s) => Some(&s[..v.len()]),
                None => {
                    mask_buf = Some(m.iter().take(v.len()).copied().collect());
                    mask_buf.as_deref()
                }
            },
        };
        let q_is_p = row.q.is_some() && (row.q_masked || row.mask.is_none());
        let want_b = q_is_p;
        let m2 = options.m2;
        let per = options.per_entry;
        let run = |vmax: f64, argmax: usize, masked: bool, b: bool| -> Fam {
            let mut cache = per.then(Cache::default);
            let c = cache.as_mut();
            let sums = match (masked.then_some(mask).flatten(), b, m2) {
                (None, false, _) => accumulate::<false, false>(v, |_| true, vmax, argmax, div, c),
                (None, true, false) => accumulate::<true, false>(v, |_| true, vmax, argmax, div, c),
                (None, true, true) => accumulate::<true, true>(v, |_| true, vmax, argmax, div, c),
                (Some(m), false, _) => {
                    accumulate::<false, false>(v, |j| m[j], vmax, argmax, div, c)
                }
                (Some(m), true, false) => {
                    accumulate::<true, false>(v, |j| m[j], vmax, argmax, div, c)
                }
                (Some(m), true, true) => {
                    accumulate::<true, true>(v, |j| m[j], vmax, argmax, div, c)
                }
            };
            Fam {
                vmax,
                argmax,
                bounds: family_bounds(&sums, options.mutant),
                sums,
                cache,
            }
        };
        let p = run(row.p.vmax, row.p.argmax, true, want_b);
        let q = match row.q {
            Some(qf) if !q_is_p => Some(run(qf.vmax, qf.argmax, row.q_masked, true)),
            _ => None,
        };
        let ok = |f: &Fam| {
            !f.sums.bad
                && f.sums.n < (1 << 32)
                && f.bounds.s.is_finite()
                && f.bounds.b.is_finite()
                && f.bounds.t2.is_finite()
        };
        let applicable = ok(&p) && q.as_ref().is_none_or(ok) && row.temperature.is_finite();
        FastRow {
            row,
            div,
            mutant: options.mutant,
            applicable,
            p,
            q,
            q_is_p,
            m2,
        }
    }

    pub(crate) fn prepared(&self) -> &Row<'a> {
        &self.row
    }

    fn qfam(&self) -> Option<&Fam> {
        if self.q_is_p {
            Some(&self.p)
        } else {
            self.q.as_ref()
        }
    }

    /// Whether the f64 tier handles this row: `false` when a shift
    /// overflows f64 (f64 logits more than `1.8e308` apart) or a bound is
    /// not finite. Then nothing is decided here (every enclosure is still
    /// sound but may be infinite).
    pub fn applicable(&self) -> bool {
        self.applicable
    }

    /// Real vocabulary size `V`.
    pub fn vocab_size(&self) -> usize {
        self.row.v.len()
    }

    /// `s = S - 1 = sum_{j != argmax} exp(d'_j)` (dimensionless).
    pub fn s(&self) -> Interval {
        self.p.bounds.s
    }

    /// `S = sum_j exp(d'_j)` (dimensionless, `>= 1`).
    pub fn sum(&self) -> Interval {
        self.p.bounds.big_s
    }

    /// `ln S` (nats).
    pub fn ln_s(&self) -> Interval {
        self.p.bounds.ln_s
    }

    /// `s_w = S_w - 1` of the entropy's logits (`None` without entropy family).
    pub fn s_w(&self) -> Option<Interval> {
        self.qfam().map(|q| q.bounds.s)
    }

    /// `S_w` (`None` without entropy family).
    pub fn sum_w(&self) -> Option<Interval> {
        self.qfam().map(|q| q.bounds.big_s)
    }

    /// `ln S_w` (nats; `None` without entropy family).
    pub fn ln_s_w(&self) -> Option<Interval> {
        self.qfam().map(|q| q.bounds.ln_s)
    }

    /// `B = sum_j exp(e_j) |e_j|` (nats; `None` without entropy family).
    pub fn b(&self) -> Option<Interval> {
        self.qfam().map(|q| q.bounds.b)
    }

    /// `R = B / S_w = sum_j q_j |e_j|` (nats; `None` without entropy family).
    pub fn r(&self) -> Option<Interval> {
        self.qfam().map(|q| q.bounds.b.div_nonneg(q.bounds.big_s))
    }

    /// `M2 = sum_j q_j e_j^2` (nats squared; `None` without entropy family
    /// or without [`FastOptions::m2`]).
    pub fn m2(&self) -> Option<Interval> {
        if !self.m2 {
            return None;
        }
        self.qfam().map(|q| q.bounds.t2.div_nonneg(q.bounds.big_s))
    }

    /// `lse(z') = v_max / ts + ln S` (nats).
    pub fn lse(&self) -> Interval {
        let vmax = self.p.vmax;
        let m = match self.div {
            Div::One => Interval::point(vmax),
            Div::Pow2(t) | Div::Other(t) => {
                let q = vmax / t;
                if vmax == 0.0 || matches!(self.div, Div::Pow2(_)) && q * t == vmax {
                    Interval::point(q)
                } else {
                    Interval {
                        lo: q.next_down(),
                        hi: q.next_up(),
                    }
                }
            }
        };
        m.add(self.p.bounds.ln_s)
    }

    /// `-(a_c + ln S)` for a live column `c`, `-inf` for a `-inf` logit.
    fn log_prob_of(&self, c: usize) -> Interval {
        let x = self.row.v[c];
        if x == f64::NEG_INFINITY {
            return Interval::point(f64::NEG_INFINITY);
        }
        a_tight(self.p.vmax, x, self.div, self.mutant)
            .add(self.p.bounds.ln_s)
            .neg()
    }

    /// Log-prob of the target (nats; `None` without tokens or on
    /// `ignore_index` rows).
    pub fn log_prob(&self) -> Option<Interval> {
        self.row.target.map(|t| self.log_prob_of(t))
    }

    /// Top-k log-probs `[K]` (nats; `-inf` for masked or `-inf` ids).
    pub fn topk(&self) -> Vec<Interval> {
        self.row
            .topk
            .iter()
            .map(|id| match id {
                TopId::Masked => Interval::point(f64::NEG_INFINITY),
                TopId::Live(c) => self.log_prob_of(*c),
            })
            .collect()
    }

    /// Entropy `ln S_w + R` (nats; `None` without entropy family).
    pub fn entropy(&self) -> Option<Interval> {
        self.qfam()
            .map(|q| q.bounds.ln_s.add(q.bounds.b.div_nonneg(q.bounds.big_s)))
    }

    /// The forward values decided in `target` ([`decide`]); all `None`
    /// when the row is not [`FastRow::applicable`].
    ///
    /// An exact zero (a point enclosure `[0, 0]`: a family with one member)
    /// is decided with the sign MPFR's directed operations give it: `-0`
    /// for log-probs (`-(0 + ln_1p(0))`), `+0` for `lse` and entropy.
    ///
    /// Where the exact value's sign is known (log-probs `< 0` and entropy
    /// `> 0` once the family has a second member, since every `exp` is
    /// positive) an enclosure touching 0 is decided by that sign: e.g.
    /// `[0, 1e-76]` is the entropy of a row whose other terms underflow, and
    /// rounds to `+0` in every dtype.
    pub fn forward(&self, target: Dtype) -> FastForward {
        let ok = self.applicable;
        let n_p = self.p.sums.n;
        let n_q = self.qfam().map_or(0, |q| q.sums.n);
        let d = |zero: f64, strict: bool| {
            move |iv: Interval| {
                if !ok {
                    None
                } else if iv.lo == 0.0 && iv.hi == 0.0 {
                    Some(Exact::point(zero))
                } else if strict {
                    decide_signed(iv, target, zero.is_sign_negative())
                } else {
                    decide(iv, target)
                }
            }
        };
        FastForward {
            lse: d(0.0, false)(self.lse()),
            log_prob: self.log_prob().map(d(-0.0, n_p > 0)),
            entropy: self.entropy().map(d(0.0, n_q > 0)),
            topk: self.topk().into_iter().map(d(-0.0, n_p > 0)).collect(),
        }
    }

    /// `(a^_j, r_j, exact)` of member `j` of `fam` (cached or recomputed).
    #[inline(always)]
    fn entry(&self, fam: &Fam, j: usize) -> (f64, f64, bool) {
        match &fam.cache {
            Some(c) => (c.a[j], c.r[j], c.exact[j]),
            None => {
                let (a, exact) = pass::shift(fam.vmax, self.row.v[j], self.div);
                let r = if j == fam.argmax {
                    1.0
                } else {
                    core_math::exp(-a)
                };
                (a, r, exact)
            }
        }
    }

    /// `exp(d'_j)` of a member `j` of `p`'s family.
    #[inline(always)]
    pub(crate) fn exp_p(&self, j: usize) -> Interval {
        let (a, r, exact) = self.entry(&self.p, j);
        exp_interval(r, a, exact, self.mutant)
    }

    /// `(exp(e_j), |e_j|)` of a member `j` of the entropy family.
    #[inline(always)]
    pub(crate) fn exp_a_q(&self, j: usize) -> (Interval, Interval) {
        let fam = self.qfam().expect("entropy family");
        let (a, r, exact) = self.entry(fam, j);
        (
            exp_interval(r, a, exact, self.mutant),
            a_interval(a, exact, self.mutant),
        )
    }

    /// `d'_j = z'_j - max z'` of column `j < V` (nats, `<= 0`; `-inf` where
    /// masked or `-inf`).
    pub fn d(&self, j: usize) -> Interval {
        if j < self.row.v.len() && self.row.in_p(j) {
            a_tight(self.p.vmax, self.row.v[j], self.div, self.mutant).neg()
        } else {
            Interval::point(f64::NEG_INFINITY)
        }
    }

    /// `e_j = w_j - max w` of column `j < V` (nats, `<= 0`; `-inf` outside
    /// the entropy family).
    pub fn e(&self, j: usize) -> Interval {
        match self.qfam() {
            Some(q) if j < self.row.v.len() && self.row.in_q(j) => {
                a_tight(q.vmax, self.row.v[j], self.div, self.mutant).neg()
            }
            _ => Interval::point(f64::NEG_INFINITY),
        }
    }

    /// `p_j = softmax(z')_j` of column `j < V` (0 where masked or `-inf`).
    pub fn p(&self, j: usize) -> Interval {
        if j < self.row.v.len() && self.row.in_p(j) {
            self.exp_p(j).div_nonneg(self.p.bounds.big_s)
        } else {
            Interval::ZERO
        }
    }

    /// `q_j = softmax(w)_j` of column `j < V` (0 outside the entropy family).
    pub fn q(&self, j: usize) -> Interval {
        match self.qfam() {
            Some(q) if j < self.row.v.len() && self.row.in_q(j) => {
                self.exp_a_q(j).0.div_nonneg(q.bounds.big_s)
            }
            _ => Interval::ZERO,
        }
    }

    /// The row statistics for the tolerance model ([`RowStats`]), from this
    /// pass (no MPFR work). `s_w`, `ln_s_w`, `r`, `m2`, `q`, `e` are `[0, 0]`
    /// / `-inf` without an entropy family; `m2` is `[0, inf]` without
    /// [`FastOptions::m2`].
    pub fn row_stats(&self) -> RowStats {
        let v = self.row.v.len();
        let zero = Interval::ZERO;
        RowStats {
            d_t: self.row.target.map(|t| self.d(t)),
            s: self.sum(),
            ln_s: self.ln_s(),
            s_w: self.sum_w().unwrap_or(zero),
            ln_s_w: self.ln_s_w().unwrap_or(zero),
            r: self.r().unwrap_or(zero),
            m2: self.m2().unwrap_or(Interval {
                lo: 0.0,
                hi: f64::INFINITY,
            }),
            p: (0..v).map(|j| self.p(j)).collect(),
            q: (0..v).map(|j| self.q(j)).collect(),
            e: (0..v).map(|j| self.e(j)).collect(),
            d: (0..v).map(|j| self.d(j)).collect(),
        }
    }

    /// [`FastRow::row_stats`] without the probability vectors: `p` and `q`
    /// are left empty (`[]`), `d` and `e` are `[V]`. What the tolerance
    /// model reads (it never reads `p` or `q`), at a third of the cost.
    pub fn row_stats_shifts(&self) -> RowStats {
        let v = self.row.v.len();
        let zero = Interval::ZERO;
        RowStats {
            d_t: self.row.target.map(|t| self.d(t)),
            s: self.sum(),
            ln_s: self.ln_s(),
            s_w: self.sum_w().unwrap_or(zero),
            ln_s_w: self.ln_s_w().unwrap_or(zero),
            r: self.r().unwrap_or(zero),
            m2: self.m2().unwrap_or(Interval {
                lo: 0.0,
                hi: f64::INFINITY,
            }),
            p: Vec::new(),
            q: Vec::new(),
            e: (0..v).map(|j| self.e(j)).collect(),
            d: (0..v).map(|j| self.d(j)).collect(),
        }
    }

    /// Whether the row-level statistics are tight enough to stand for the
    /// MPFR ones (relative width at most `2^-30` plus `2^-1000` absolute):
    /// the tolerance bounds computed from them then agree with MPFR's to
    /// about nine digits.
    pub fn stats_decided(&self) -> bool {
        let tight = |iv: Interval| {
            iv.is_finite()
                && iv.hi - iv.lo <= iv.hi.abs().max(iv.lo.abs()) * 2f64.powi(-30) + 1e-300
        };
        self.applicable
            && tight(self.sum())
            && tight(self.ln_s())
            && self.sum_w().is_none_or(tight)
            && self.ln_s_w().is_none_or(tight)
            && self.r().is_none_or(tight)
            && self.m2().is_none_or(tight)
    }

    /// The VJP terms of this row for `cotangents` ([`FastVjp`]).
    pub fn vjp<'r>(&'r self, cotangents: &RowCotangents<'_>) -> FastVjp<'r, 'a> {
        FastVjp::new(self, cotangents)
    }
}
