//! [`FastRow`]: one row prepared on the f64 tier (the exp pass of each
//! family and its bounds, module docs of [`super`], (F1)-(F6)), its
//! row-level enclosures and the forward values decided from them (F8).

use super::decide::{decide, decide_signed};
use super::pass::{a_tight, accumulate, family_bounds, Cache, Div, FamilyBounds, Sums};
use super::Mutant;
use crate::interval::{add_dn, add_up, div_up, mul_dn, mul_up, TINY, U};
use crate::oracle::row::{self, Row, RowSoftcap, TopId};
use crate::oracle::{Exact, Interval};
use crate::spec::{Dtype, EntropyLogits, Output, Problem, SpecError};

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
    /// The caller has validated this row already
    /// ([`Problem::validate_row`], e.g. `verify`, which validates every
    /// selected row before any oracle work): [`FastRow::new`] skips that
    /// O(V) check (the shapes are still checked).
    pub row_validated: bool,
    /// A planted bug (test-only).
    #[doc(hidden)]
    pub mutant: Option<Mutant>,
}

/// One family's pass and bounds.
#[derive(Debug)]
pub(super) struct Fam {
    pub(super) vmax: f64,
    pub(super) argmax: usize,
    pub(super) sums: Sums,
    pub(super) bounds: FamilyBounds,
    pub(super) cache: Option<Cache>,
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
    pub(super) row: Row<'a>,
    pub(super) div: Div,
    pub(super) mutant: Option<Mutant>,
    pub(super) applicable: bool,
    pub(super) p: Fam,
    /// The entropy family when it is not `p`'s (`q_is_p` false).
    pub(super) q: Option<Fam>,
    pub(super) q_is_p: bool,
    /// Whether `sum E_j a_j^2` was accumulated.
    pub(super) m2: bool,
    /// Under an exact softcap, `y_j = RN(c RN(tanh(RN(x_j / c))))` `[V]`,
    /// the pass's inputs in place of the raw `row.v` (F9).
    pub(super) vy: Option<Vec<f64>>,
    /// `eta_z >= |z'_j - y_j / ts|` (F9; 0 without an exact softcap).
    pub(super) eta: f64,
    /// Whether the VJP runs on this tier (no softcap at all).
    pub(super) vjp_ok: bool,
}

/// The f64 softcap `y = RN(c RN(tanh(RN(x / c))))` (CORE-MATH `tanh`),
/// `-c` for `x = -inf` (exact); within [`softcap_err`] of `c tanh(x / c)`
/// (module docs of [`super`], (F9)).
#[inline(always)]
pub(crate) fn softcap_f64(x: f64, c: f64) -> f64 {
    if x == f64::NEG_INFINITY {
        -c
    } else {
        c * core_math::tanh(x / c)
    }
}

/// `e = 3 u c + c 2^-1074 + 2^-1074` rounded up: the bound on `|softcap_f64(x,
/// c) - c tanh(x / c)|` for every `x` (F9).
pub(crate) fn softcap_err(c: f64) -> f64 {
    add_up(add_up(mul_up(c, 3.0 * U), mul_up(c, TINY)), TINY)
}

/// `iv +- k`.
#[inline(always)]
pub(super) fn widen_abs(iv: Interval, k: f64) -> Interval {
    if k == 0.0 {
        return iv;
    }
    Interval {
        lo: add_dn(iv.lo, -k),
        hi: add_up(iv.hi, k),
    }
}

/// `iv` (nonnegative) times `[e^-k, e^k]`, enclosed by `[1 - k, 1 + k +
/// k^2]` (`0 <= k <= 1`).
#[inline(always)]
pub(super) fn widen_rel(iv: Interval, k: f64) -> Interval {
    if k == 0.0 {
        return iv;
    }
    Interval {
        lo: mul_dn(iv.lo, add_dn(1.0, -k)).max(0.0),
        hi: mul_up(iv.hi, add_up(add_up(1.0, k), mul_up(k, k))),
    }
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
    /// The outputs this struct holds, those [`FastForward::counts`] counts;
    /// a forward's others (`z_loss`, `loss`, the policy and top-k KL terms)
    /// are derived from them and exact inputs.
    pub const OUTPUTS: [Output; 4] = [
        Output::LogProbs,
        Output::Entropy,
        Output::TopkLogProbs,
        Output::Lse,
    ];

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
        crate::oracle::check_row(&shape, row)?;
        if !options.row_validated {
            problem.validate_row(&shape, row)?;
        }
        let prepared = row::prepare(problem, &shape, row, options.entropy)?;
        Ok(FastRow::from_row(prepared, options))
    }

    pub(crate) fn from_row(row: Row<'a>, options: FastOptions) -> FastRow<'a> {
        let div = Div::new(row.ts);
        let cap = row.cap();
        let vy: Option<Vec<f64>> = cap.map(|c| row.v.iter().map(|&x| softcap_f64(x, c)).collect());
        let eta = match cap {
            Some(c) if options.mutant != Some(Mutant::TanhNotWidened) => {
                div_up(softcap_err(c), row.ts)
            }
            _ => 0.0,
        };
        let v = vy.as_deref().unwrap_or(&row.v[..]);
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
        // Under an exact softcap the family's max is `y` at its argmax (F9).
        let top = |vmax: f64, argmax: usize| vy.as_ref().map_or(vmax, |y| y[argmax]);
        let p = run(top(row.p.vmax, row.p.argmax), row.p.argmax, true, want_b);
        let q = match row.q {
            Some(qf) if !q_is_p => {
                Some(run(top(qf.vmax, qf.argmax), qf.argmax, row.q_masked, true))
            }
            _ => None,
        };
        let ok = |f: &Fam| {
            !f.sums.bad
                && f.sums.n < (1 << 32)
                && f.bounds.s.is_finite()
                && f.bounds.b.is_finite()
                && f.bounds.t2.is_finite()
        };
        // An exact softcap's widening needs `k = 2 eta_z <= 1/4` (F9).
        let applicable = ok(&p)
            && q.as_ref().is_none_or(ok)
            && row.temperature.is_finite()
            && mul_up(4.0, eta) <= 0.5;
        let vjp_ok = applicable && row.softcap == RowSoftcap::None;
        FastRow {
            row,
            div,
            mutant: options.mutant,
            applicable,
            p,
            q,
            q_is_p,
            m2,
            vy,
            eta,
            vjp_ok,
        }
    }

    /// The pass's inputs `[V]`: `y_j` under an exact softcap, else the
    /// row's exact `v_j`.
    #[inline(always)]
    pub(super) fn vals(&self) -> &[f64] {
        self.vy.as_deref().unwrap_or(&self.row.v[..])
    }

    /// The softcap's widening `k = 2 eta_z` of shifts in `fam` (F9): 0
    /// without an exact softcap or when `fam` has one member.
    #[inline(always)]
    pub(super) fn k_of(&self, fam: &Fam) -> f64 {
        if self.eta == 0.0 || fam.sums.n == 0 {
            0.0
        } else {
            mul_up(2.0, self.eta)
        }
    }

    /// `k` of `p`'s family.
    #[inline(always)]
    pub(super) fn k_p(&self) -> f64 {
        self.k_of(&self.p)
    }

    /// `R = sum q_j |e_j|` of the entropy family, widened for an exact
    /// softcap (F9).
    fn r_of(&self, q: &Fam) -> Interval {
        let r = q.bounds.b.div_nonneg(q.bounds.big_s);
        let k = self.k_of(q);
        if k == 0.0 {
            return r;
        }
        widen_rel(
            Interval {
                lo: add_dn(r.lo, -k).max(0.0),
                hi: add_up(r.hi, k),
            },
            k,
        )
    }

    /// Whether the VJP ([`FastRow::vjp`]) may run on this tier: the row is
    /// [`FastRow::applicable`] and has no softcap (the softcap's factor
    /// `dx'/dx` is taken on MPFR).
    pub fn vjp_applicable(&self) -> bool {
        self.vjp_ok
    }

    pub(crate) fn prepared(&self) -> &Row<'a> {
        &self.row
    }

    pub(super) fn qfam(&self) -> Option<&Fam> {
        if self.q_is_p {
            Some(&self.p)
        } else {
            self.q.as_ref()
        }
    }

    /// Whether the f64 tier handles this row: `false` when a shift
    /// overflows f64 (f64 logits more than `1.8e308` apart), a bound is
    /// not finite, or an exact softcap's `4 e / T > 1/2` ((F9): `c / T`
    /// above about `1.5e14`). Then nothing is decided here (every enclosure
    /// is still sound but may be infinite).
    pub fn applicable(&self) -> bool {
        self.applicable
    }

    /// Real vocabulary size `V`.
    pub fn vocab_size(&self) -> usize {
        self.row.v.len()
    }

    /// `s = S - 1 = sum_{j != argmax} exp(d'_j)` (dimensionless).
    pub fn s(&self) -> Interval {
        widen_rel(self.p.bounds.s, self.k_p())
    }

    /// `S = sum_j exp(d'_j)` (dimensionless, `>= 1`).
    pub fn sum(&self) -> Interval {
        one_plus(self.s())
    }

    /// `ln S` (nats).
    pub fn ln_s(&self) -> Interval {
        nonneg(widen_abs(self.p.bounds.ln_s, self.k_p()))
    }

    /// `s_w = S_w - 1` of the entropy's logits (`None` without entropy family).
    pub fn s_w(&self) -> Option<Interval> {
        self.qfam().map(|q| widen_rel(q.bounds.s, self.k_of(q)))
    }

    /// `S_w` (`None` without entropy family).
    pub fn sum_w(&self) -> Option<Interval> {
        self.s_w().map(one_plus)
    }

    /// `ln S_w` (nats; `None` without entropy family).
    pub fn ln_s_w(&self) -> Option<Interval> {
        self.qfam()
            .map(|q| nonneg(widen_abs(q.bounds.ln_s, self.k_of(q))))
    }

    /// `B = sum_j exp(e_j) |e_j|` (nats; `None` without entropy family).
    pub fn b(&self) -> Option<Interval> {
        let q = self.qfam()?;
        if self.k_of(q) == 0.0 {
            return Some(q.bounds.b);
        }
        Some(self.r_of(q).mul_nonneg(self.sum_w()?))
    }

    /// `R = B / S_w = sum_j q_j |e_j|` (nats; `None` without entropy family).
    pub fn r(&self) -> Option<Interval> {
        self.qfam().map(|q| self.r_of(q))
    }

    /// `M2 = sum_j q_j e_j^2` (nats squared; `None` without entropy family
    /// or without [`FastOptions::m2`]).
    pub fn m2(&self) -> Option<Interval> {
        if !self.m2 {
            return None;
        }
        self.qfam().map(|q| {
            let m2 = q.bounds.t2.div_nonneg(q.bounds.big_s);
            let k = self.k_of(q);
            if k == 0.0 {
                return m2;
            }
            // (F9): [e^-k (M2 - 2 k R)^+, e^k (M2 + 2 k R + k^2)].
            let r = q.bounds.b.div_nonneg(q.bounds.big_s);
            let kr = mul_up(mul_up(2.0, k), r.hi);
            widen_rel(
                Interval {
                    lo: add_dn(m2.lo, -kr).max(0.0),
                    hi: add_up(add_up(m2.hi, kr), mul_up(k, k)),
                },
                k,
            )
        })
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
        // (F9): lse moves by at most eta_z.
        widen_abs(m.add(self.p.bounds.ln_s), self.eta)
    }

    /// `-(a_c + ln S)` for a live column `c`, `-inf` for a `-inf` logit.
    fn log_prob_of(&self, c: usize) -> Interval {
        let x = self.vals()[c];
        if x == f64::NEG_INFINITY {
            return Interval::point(f64::NEG_INFINITY);
        }
        let lp = a_tight(self.p.vmax, x, self.div, self.mutant)
            .add(self.p.bounds.ln_s)
            .neg();
        match self.k_p() {
            0.0 => lp,
            k => nonpos(widen_abs(lp, k)),
        }
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

    /// The top-k KL's slopes `w [K]` on this row's top-k log-probs for
    /// the upstream cotangents `(g_f, g_r)` (of `forward_kl`,
    /// `reverse_kl`), enclosed on this tier from [`FastRow::topk`], and
    /// whether they sum to exactly 0 (renormalised): the
    /// [`super::RowCotangents::kl_w`] and `kl_sum_zero` of a VJP. `None`
    /// where an enclosure is not finite: the row's VJP is MPFR's.
    pub fn kl_slopes(
        &self,
        gf: f64,
        gr: f64,
        kl: &crate::spec::TopkKl,
    ) -> Option<(Vec<Interval>, bool)> {
        crate::oracle::topk_kl::kl_slopes_fast(&self.topk(), &self.row.teacher, kl, (gf, gr))
    }

    /// Entropy `ln S_w + R` (nats; `None` without entropy family).
    pub fn entropy(&self) -> Option<Interval> {
        let q = self.qfam()?;
        if self.k_of(q) == 0.0 {
            return Some(q.bounds.ln_s.add(q.bounds.b.div_nonneg(q.bounds.big_s)));
        }
        Some(self.ln_s_w()?.add(self.r_of(q)))
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
}

/// `1 + s` rounded outward.
fn one_plus(s: Interval) -> Interval {
    Interval {
        lo: add_dn(1.0, s.lo),
        hi: add_up(1.0, s.hi),
    }
}

/// `iv` with its lower end kept `>= 0` (a nonnegative quantity).
pub(super) fn nonneg(iv: Interval) -> Interval {
    Interval {
        lo: iv.lo.max(0.0),
        hi: iv.hi,
    }
}

/// `iv` with its upper end kept `<= 0` (a nonpositive quantity).
pub(super) fn nonpos(iv: Interval) -> Interval {
    Interval {
        lo: iv.lo,
        hi: iv.hi.min(0.0),
    }
}
