//! VJP enclosures of one row on the f64 tier (module docs of [`super`],
//! step (F7)): per element
//!
//! `dx_j T = A_j sigma_j / S - (C - A_j) E_j / S - h E^w_j (R - a^w_j) / S_w`
//!
//! with the exact coefficient sums `A_j = g 1[j=t] + sum_k G_k 1[j=id_k]`,
//! `C = g + sum_k G_k` (live ids only), `sigma_j = sum_{k != j} E_k` (`s` at
//! the argmax, `1 + s - E_j >= max(1, s)` elsewhere: no cancellation), the
//! same regrouping as the MPFR path (`crate::oracle` module `vjp`).

use super::pass::C1;
use super::{decide, lanes, FastRow, Mutant};
use crate::interval::{add_dn, add_up, mul_dn, mul_up, TINY, U};

/// `(1 + kappa)(1 + 2u)` rounded up: `E_j`'s shift widening factor.
pub(super) const CE: f64 = 1.0 + 2.0 * super::pass::KAPPA;
use crate::oracle::round::UNKNOWN_OFFSET;
use crate::oracle::row::TopId;
use crate::oracle::{Exact, Interval};
use crate::spec::Dtype;

/// One row's upstream cotangents for [`FastRow::vjp`]: `g` (log-prob; 0 on
/// `ignore_index` rows or without a log-prob cotangent), `h` (entropy),
/// `G_k` (top-k, `[K]`, in the order of the row's `topk_ids`). Units:
/// loss per nat.
#[derive(Clone, Copy, Debug, Default)]
pub struct RowCotangents<'c> {
    /// `g`.
    pub g: f64,
    /// `h`.
    pub h: f64,
    /// `G_k`, `[K]` (empty without top-k cotangents).
    pub topk: &'c [f64],
    /// The top-k KL's upstream cotangents `(g_f, g_r)` and options, when
    /// one is nonzero (what the MPFR path differentiates;
    /// [`crate::spec::Problem::kl_cotangents`]).
    pub kl: Option<(f64, f64, crate::spec::TopkKl)>,
    /// The KL's slopes `w_k` on the top-k log-probs, `[K]` in the order
    /// of `topk_ids`, enclosed on this tier ([`FastRow::kl_slopes`]);
    /// empty without `kl`. Each adds to `A_{id_k}` as a `G_k` does.
    pub kl_w: &'c [Interval],
    /// Whether the `kl_w` sum to exactly 0 (renormalised): then they add
    /// nothing to `C`, and `C - A_j` loses only `w_j`'s own part.
    pub kl_sum_zero: bool,
    /// The loss side's cotangents (`lse`, `z_loss`, the cross-entropy
    /// without label smoothing), when any is given (F10).
    pub loss_side: Option<&'c LossSide>,
    /// The policy terms' nonzero cotangents `(term, c)` of the row
    /// ([`crate::spec::Problem::policy_cotangents`]; empty without).
    pub policy: &'c [(crate::spec::PolicyTerm, f64)],
    /// (F10) Their log-prob cotangent `sum c k'(d)`, enclosed on this tier
    /// ([`FastRow::policy_weight`]): one more source at the target.
    pub policy_w: Option<Interval>,
}

impl FastRow<'_> {
    /// (F10) The policy terms' log-prob cotangent `sum c k'(d)` for the
    /// nonzero cotangents `terms`, enclosed from this tier's log-prob of the
    /// target (CORE-MATH `exp` / `expm1` one ulp outward, the clamps' sides
    /// as the MPFR path takes them); `None` without a target.
    pub fn policy_weight(&self, terms: &[(crate::spec::PolicyTerm, f64)]) -> Option<Interval> {
        let lp = self.log_prob()?;
        Some(crate::oracle::policy::vjp_cotangent_fast(
            &self.row.policy,
            terms,
            lp,
        ))
    }
}

/// One row's loss-side cotangents for [`FastRow::vjp`] (docs/fast-oracle.md,
/// (F10)): `lse`'s `a` and `z_loss`'s `b` add `(a + 2 coef b lse) p_j`, so
/// `C` loses that enclosure; the cross-entropy's row coefficient `ell = g w`
/// (`/ W` under `mean`) adds `ell (p_j - (1 - eps)[j = t] - eps [j in A] /
/// |A|)`: a source `-(1 - eps) ell` at the target (in `C`), `C` loses
/// `eps ell` more, and every allowed entry gains `-ell eps / (|A| T)`.
/// Units: loss per nat (`a`, `b`, `g`), weights and `W` unitless.
#[derive(Clone, Debug, Default)]
pub struct LossSide {
    /// `a`, the cotangent of `lse`.
    pub lse: f64,
    /// `b`, the cotangent of `z_loss`.
    pub z_loss: f64,
    /// The effective `z_loss_coef` (0 without one).
    pub z_loss_coef: f64,
    /// The cross-entropy's `(g, w)` of this row
    /// ([`crate::spec::Problem::loss_cotangent`]), when given; the row must
    /// have a target.
    pub loss: Option<(f64, f64)>,
    /// The `mean`'s divisor `W` as exact parts (their sum,
    /// [`crate::spec::MeanDivisor::parts`]); `None` under `none` / `sum`.
    pub divisor: Option<Vec<f64>>,
    /// The effective label smoothing `eps` in `[0, 1]` (as the oracle takes
    /// it: rounded to the accumulation dtype).
    pub eps: f64,
    /// `|A|`: the row's allowed entries of the real vocabulary.
    pub count: u64,
    /// `c`, the cotangent of `soft_cross_entropy` (0 without): `C` loses
    /// `c sum_j p_j` and every entry gains `-c p_j / T` (the teacher's
    /// `p_j`, the row's `teacher_probs`).
    pub soft: f64,
}

impl LossSide {
    /// `ell = g w / W` enclosed (exact product and quotient rounded
    /// outward; `W` summed outward from its parts): `None` without a loss
    /// term or when `W` is not positive.
    pub(crate) fn ell(&self) -> Option<Interval> {
        let (g, w) = self.loss?;
        let gw = Interval {
            lo: mul_dn(g, w).min(mul_up(g, w)),
            hi: mul_up(g, w).max(mul_dn(g, w)),
        };
        match &self.divisor {
            None => Some(gw),
            Some(parts) => {
                let (mut lo, mut hi) = (0.0f64, 0.0f64);
                for &x in parts {
                    lo = add_dn(lo, x);
                    hi = add_up(hi, x);
                }
                (lo > 0.0).then(|| gw.div_pos(Interval { lo, hi }))
            }
        }
    }

    /// `1 - eps`, enclosed.
    fn one_minus_eps(&self) -> Interval {
        Interval {
            lo: add_dn(1.0, -self.eps),
            hi: add_up(1.0, -self.eps),
        }
    }

    /// The uniform term `-ell eps / (|A| T)` of every allowed entry, when
    /// `eps > 0` and the row has a loss term.
    pub(crate) fn uniform(&self, ell: Interval, temperature: f64) -> Option<Interval> {
        if self.eps == 0.0 || self.count == 0 {
            return None;
        }
        let at = Interval {
            lo: mul_dn(self.count as f64, temperature),
            hi: mul_up(self.count as f64, temperature),
        };
        Some(ell.mul(Interval::point(self.eps)).div_pos(at).neg())
    }

    /// `kappa = a + 2 coef b lse` for the row's `lse` enclosure.
    pub(crate) fn kappa(&self, lse: Interval) -> Interval {
        let mut k = Interval::point(self.lse);
        if self.z_loss != 0.0 && self.z_loss_coef != 0.0 {
            let cb = Interval {
                lo: mul_dn(2.0 * self.z_loss_coef, self.z_loss),
                hi: mul_up(2.0 * self.z_loss_coef, self.z_loss),
            };
            k = k.add(cb.mul(lse));
        }
        k
    }
}

/// A coefficient sum as an enclosure (exact when representable: the sum
/// is rounded in each direction exactly).
fn sum_interval(terms: impl Iterator<Item = Interval>) -> Interval {
    let mut acc = Interval::ZERO;
    for t in terms {
        acc = acc.add(t);
    }
    acc
}

/// The VJP of one row on the f64 tier: row constants, then per-element
/// enclosures of grad logits `dx_j` (nats per logit unit, real vocabulary
/// `j < V`). Built by [`FastRow::vjp`].
#[derive(Debug)]
pub struct FastVjp<'r, 'a> {
    row: &'r FastRow<'a>,
    /// `(j, A_j, C - A_j)` of the target and live top-k ids with a nonzero
    /// cotangent, sorted by `j`.
    specials: Vec<(usize, Interval, Interval)>,
    /// `C / (S T)`.
    k1: Interval,
    c_nonzero: bool,
    /// `h / (S_w T)`.
    k2: Interval,
    h: f64,
    /// `R = B / S_w`.
    r: Interval,
    /// `S T`.
    st: Interval,
    temperature: f64,
    /// Whether any element has a term (otherwise all are exactly 0).
    any_term: bool,
    /// Constants of the a-priori element bound (F7'), when it applies.
    pub(super) pt: Option<PointForm>,
    /// (F10) The loss's uniform term `-ell eps / (|A| T)` on every allowed
    /// entry (label smoothing), when present.
    uniform: Option<Interval>,
    /// (F10) The soft cross-entropy's `-c / T`: entry `j` gains it times
    /// the teacher's `p_j`, when `c != 0`.
    soft: Option<Interval>,
}

/// Midpoints and radii of the row constants, for the a-priori bound of a
/// plain element (module docs, (F7')).
#[derive(Clone, Copy, Debug)]
pub(super) struct PointForm {
    pub(super) k1: f64,
    pub(super) dk1: f64,
    pub(super) k2: f64,
    pub(super) dk2: f64,
    pub(super) rho: f64,
    pub(super) dr: f64,
    /// Absolute slack for subnormal intermediates.
    pub(super) abs: f64,
    /// Whether the exp and the shift are widened (false only for mutants).
    pub(super) exp_w: bool,
    pub(super) shift_w: bool,
}

/// `(mid, rad)` of `iv`: `|x - mid| <= rad` for every `x` in `iv`.
fn mid_rad(iv: Interval) -> (f64, f64) {
    let mid = iv.lo / 2.0 + iv.hi / 2.0;
    (mid, add_up(iv.hi, -mid).max(add_up(mid, -iv.lo)))
}

impl<'r, 'a> FastVjp<'r, 'a> {
    pub(crate) fn new(row: &'r FastRow<'a>, cot: &RowCotangents<'_>) -> Self {
        let pr = &row.row;
        // `(j, coefficient, is a KL slope)`.
        let mut coeffs: Vec<(usize, Interval, bool)> = Vec::new();
        if let (Some(t), true) = (pr.target, cot.g != 0.0) {
            coeffs.push((t, Interval::point(cot.g), false));
        }
        for (id, &gk) in pr.topk.iter().zip(cot.topk) {
            if let (TopId::Live(j), true) = (id, gk != 0.0) {
                coeffs.push((*j, Interval::point(gk), false));
            }
        }
        for (id, &wk) in pr.topk.iter().zip(cot.kl_w) {
            if let (TopId::Live(j), false) = (id, wk.lo == 0.0 && wk.hi == 0.0) {
                coeffs.push((*j, wk, true));
            }
        }
        // (F10) The policy terms' log-prob cotangent: a source at the target.
        if let (Some(t), Some(w)) = (pr.target, cot.policy_w) {
            coeffs.push((t, w, false));
        }
        // (F10) The loss side: `-ell` at the target (in `C`), and `kappa`,
        // which `C` loses.
        let (mut kappa, mut uniform) = (Interval::ZERO, None);
        if let Some(ls) = cot.loss_side {
            kappa = ls.kappa(row.lse());
            if let (Some(t), Some(_)) = (pr.target, ls.loss) {
                // An `ell` that cannot be enclosed (`W <= 0`) decides nothing.
                let ell = ls.ell().unwrap_or(Interval {
                    lo: f64::NEG_INFINITY,
                    hi: f64::INFINITY,
                });
                coeffs.push((t, ell.mul(ls.one_minus_eps()).neg(), false));
                if ls.eps != 0.0 {
                    kappa = kappa.add(ell.mul(Interval::point(ls.eps)));
                    uniform = ls.uniform(ell, pr.temperature);
                }
            }
        }
        // The soft cross-entropy: `C` loses `c sum_j p_j` (the teacher's).
        let soft = match cot.loss_side {
            Some(ls) if ls.soft != 0.0 && !pr.teacher_probs.is_empty() => {
                let (mut lo, mut hi) = (0.0f64, 0.0f64);
                for &x in &pr.teacher_probs {
                    let p = super::loss::teacher_p(pr.teacher_form, x);
                    lo = add_dn(lo, p.lo);
                    hi = add_up(hi, p.hi);
                }
                kappa = kappa.add(Interval::point(ls.soft).mul(Interval { lo, hi }));
                Some(Interval::point(-ls.soft).div_pos(Interval::point(pr.temperature)))
            }
            _ => None,
        };
        // A slope summing to 0 with the others is in no `C`.
        let in_c = |x: &&(usize, Interval, bool)| !(x.2 && cot.kl_sum_zero);
        let c = sum_interval(coeffs.iter().filter(in_c).map(|x| x.1)).sub(kappa);
        let mut ids: Vec<usize> = coeffs.iter().map(|x| x.0).collect();
        ids.sort_unstable();
        ids.dedup();
        let specials = ids
            .into_iter()
            .map(|j| {
                let a = sum_interval(coeffs.iter().filter(|x| x.0 == j).map(|x| x.1));
                // `C - A_j`: the others in `C`, less `j`'s own slopes not in `C`.
                let rest = sum_interval(
                    coeffs
                        .iter()
                        .filter(in_c)
                        .filter(|x| x.0 != j)
                        .map(|x| x.1)
                        .chain(
                            coeffs
                                .iter()
                                .filter(|x| x.0 == j && x.2 && cot.kl_sum_zero)
                                .map(|x| x.1.neg()),
                        )
                        .chain(std::iter::once(kappa.neg())),
                );
                (j, a, rest)
            })
            .collect::<Vec<_>>();
        let t = pr.temperature;
        let big_s = row.p.bounds.big_s;
        let st = Interval {
            lo: mul_dn(big_s.lo, t),
            hi: mul_up(big_s.hi, t),
        };
        let c_nonzero = !(c.lo == 0.0 && c.hi == 0.0);
        let k1 = c.div_pos(st);
        let (k2, r) = match row.qfam() {
            Some(q) if cot.h != 0.0 => {
                let sw = q.bounds.big_s;
                let swt = Interval {
                    lo: mul_dn(sw.lo, t),
                    hi: mul_up(sw.hi, t),
                };
                (
                    Interval::point(cot.h).div_pos(swt),
                    q.bounds.b.div_nonneg(sw),
                )
            }
            _ => (Interval::ZERO, Interval::ZERO),
        };
        let h = if row.qfam().is_some() { cot.h } else { 0.0 };
        let any_term =
            c_nonzero || h != 0.0 || !specials.is_empty() || uniform.is_some() || soft.is_some();
        let (k1m, dk1) = mid_rad(k1);
        let (k2m, dk2) = mid_rad(k2);
        let (rho, dr) = mid_rad(r);
        let kmax = 1f64.max(k1m.abs() + dk1).max(k2m.abs() + dk2);
        // With a uniform or soft term every element takes the interval form.
        let pt = (uniform.is_none()
            && soft.is_none()
            && kmax < 2f64.powi(500)
            && rho.abs() + dr < 2f64.powi(20)
            && (h == 0.0 || row.q_is_p))
            .then_some(PointForm {
                k1: k1m,
                dk1,
                k2: k2m,
                dk2,
                rho,
                dr,
                abs: 64.0 * TINY * 2f64.powi(11) * kmax,
                exp_w: row.mutant != Some(Mutant::ExpNotWidened),
                shift_w: row.mutant != Some(Mutant::ShiftNotWidened),
            });
        FastVjp {
            row,
            specials,
            k1,
            c_nonzero,
            k2,
            h,
            r,
            st,
            temperature: t,
            any_term,
            pt,
            uniform,
            soft,
        }
    }

    fn special(&self, j: usize) -> Option<&(usize, Interval, Interval)> {
        self.specials
            .binary_search_by_key(&j, |s| s.0)
            .ok()
            .map(|i| &self.specials[i])
    }

    /// Enclosure of `dx_j` (`j < V`): `None` when the element has no term
    /// (it is exactly 0: `p_j = q_j = 0` and not a target or live top-k id,
    /// or every cotangent is 0). Panics: none (an index past `V` gives
    /// `None`).
    pub fn element(&self, j: usize) -> Option<Interval> {
        if j >= self.row.row.v.len() || !self.any_term {
            return None;
        }
        self.element_at(j, self.special(j))
    }

    /// (F7') A plain element (not a target or top-k id, a member of `p`,
    /// and of `q = p` when `h != 0`): `v = -(fl(k1 r) + fl(k2 fl(r fl(rho -
    /// a^))))` with a first-order bound over midpoints and radii of the row
    /// constants, inflated for its own roundings.
    #[inline(always)]
    pub(super) fn element_point(
        pt: &PointForm,
        a: f64,
        r: f64,
        exact: bool,
        with_q: bool,
    ) -> Interval {
        let dl = if exact || !pt.shift_w {
            0.0
        } else {
            C1 * a + TINY
        };
        let e_e = if pt.exp_w {
            r * (2.0 * U + dl * CE) + 2.0 * TINY
        } else {
            r * dl * CE
        };
        let y = pt.k1 * r;
        let ey = U * y.abs() + TINY + pt.k1.abs() * e_e + pt.dk1 * (r + e_e);
        let (z, ez) = if with_q {
            let t = pt.rho - a;
            let et = U * t.abs() + pt.dr + dl;
            let m = r * t;
            let em = U * m.abs() + TINY + r * et + (t.abs() + et) * e_e;
            let z = pt.k2 * m;
            (
                z,
                U * z.abs() + TINY + pt.k2.abs() * em + pt.dk2 * (m.abs() + em),
            )
        } else {
            (0.0, 0.0)
        };
        let v = -(y + z);
        let err = (U * v.abs() + ey + ez + 4.0 * U * v.abs()) * (1.0 + 64.0 * U) + pt.abs;
        Interval {
            lo: v - err,
            hi: v + err,
        }
    }

    #[inline]
    fn element_with(
        &self,
        j: usize,
        special: Option<&(usize, Interval, Interval)>,
    ) -> Option<Interval> {
        let fr = self.row;
        let pr = &fr.row;
        let in_p = pr.in_p(j);
        let in_q = self.h != 0.0 && pr.in_q(j);
        let mut any = false;
        let mut dx = Interval::ZERO;
        if let Some(&(_, a, rest)) = special {
            any = true;
            if in_p {
                let e = fr.exp_p(j);
                let s = fr.p.bounds.s;
                let sigma = if j == fr.p.argmax {
                    s
                } else {
                    Interval {
                        lo: add_dn(add_dn(1.0, s.lo), -e.hi),
                        hi: add_up(add_up(1.0, s.hi), -e.lo),
                    }
                };
                let y = a.mul(sigma).sub(rest.mul(e));
                dx = y.div_pos(self.st);
            } else {
                dx = a.div_pos(Interval::point(self.temperature));
            }
        } else if in_p && self.c_nonzero {
            any = true;
            dx = self.k1.mul_by_nonneg(fr.exp_p(j)).neg();
        }
        if in_q {
            any = true;
            let (ew, aw) = fr.exp_a_q(j);
            let c = self.r.sub(aw);
            let m = c.mul_by_nonneg(ew);
            let tq = if self.h > 0.0 {
                m.mul_by_nonneg(self.k2)
            } else {
                m.mul_by_nonneg(self.k2.neg()).neg()
            };
            dx = dx.sub(tq);
        }
        any.then_some(dx)
    }

    /// Element `j` decided in `target` ([`decide`]); elements without a
    /// term are the exact point 0 (decided). `None`: undecided (the MPFR
    /// path must decide it).
    pub fn decide(&self, j: usize, target: Dtype) -> Option<Exact> {
        match self.element(j) {
            None => Some(Exact::point(0.0)),
            Some(iv) => decide(iv, target),
        }
    }

    /// Every element of the row `[V]`, decided in `target` where the f64
    /// tier can (`None` where it cannot). One walk over the row.
    pub fn decide_row(&self, target: Dtype) -> Vec<Option<Exact>> {
        let mut out = Vec::new();
        let mut pending = Vec::new();
        self.decide_into(target, &mut out, &mut pending);
        let mut res: Vec<Option<Exact>> = out.into_iter().map(Some).collect();
        for j in pending {
            res[j] = None;
        }
        res
    }

    /// [`FastVjp::decide_row`] into `out` (`[V]`, cleared first; undecided
    /// elements hold `Exact::point(0.0)`) and `pending` (the indices of the
    /// undecided elements, ascending, cleared first).
    pub fn decide_into(&self, target: Dtype, out: &mut Vec<Exact>, pending: &mut Vec<usize>) {
        out.clear();
        out.resize(self.row.row.v.len(), Exact::point(0.0));
        self.decide_slice(target, out, pending);
    }

    /// [`FastVjp::decide_into`] into a slice `out` of length `V` (every
    /// entry written: decided elements, exact zeros, and `Exact::point(0.0)`
    /// for the undecided ones listed in `pending`, cleared first). Panics:
    /// none (a slice of another length is filled up to the shorter one).
    ///
    /// Plain elements ((F7')) go four at a time through the vector lanes
    /// (`lanes.rs`) where the CPU has AVX2: the same bits as one at a time.
    pub fn decide_slice(&self, target: Dtype, out: &mut [Exact], pending: &mut Vec<usize>) {
        pending.clear();
        let v = self.row.row.v.len().min(out.len());
        let out = &mut out[..v];
        let zero = Exact::point(0.0);
        if !self.any_term {
            out.fill(zero);
            return;
        }
        let mut next = 0usize;
        let mut j = 0usize;
        let with_q = self.h != 0.0;
        if let (Some(pt), Some(c), true) = (
            &self.pt,
            &self.row.p.cache,
            (self.c_nonzero || with_q) && lanes::available(),
        ) {
            let row = &self.row.row;
            while j + 4 <= v {
                if self.specials.get(next).is_some_and(|s| s.0 < j + 4) {
                    for o in &mut out[j..j + 4] {
                        *o = self.decide_one(j, &mut next, target, pending);
                        j += 1;
                    }
                    continue;
                }
                let Some(b) =
                    lanes::plain4(pt, &c.a[j..], &c.r[j..], &c.exact[j..], with_q, target)
                else {
                    break;
                };
                for (l, o) in out[j..j + 4].iter_mut().enumerate() {
                    let k = j + l;
                    *o = if !row.in_p(k) {
                        zero
                    } else if b.decided & (1 << l) != 0 {
                        Exact {
                            enclosure: b.enclosure(l),
                            rounded: b.rounded[l],
                            decided: true,
                            offset: if b.finite & (1 << l) != 0 {
                                Interval {
                                    lo: b.olo[l],
                                    hi: b.ohi[l],
                                }
                            } else {
                                UNKNOWN_OFFSET
                            },
                        }
                    } else {
                        pending.push(k);
                        zero
                    };
                }
                j += 4;
            }
        }
        for o in &mut out[j..] {
            *o = self.decide_one(j, &mut next, target, pending);
            j += 1;
        }
    }

    /// Element `j` of [`FastVjp::decide_slice`] one at a time (`next`:
    /// the first special not below `j`, advanced past `j`).
    #[inline(always)]
    fn decide_one(
        &self,
        j: usize,
        next: &mut usize,
        target: Dtype,
        pending: &mut Vec<usize>,
    ) -> Exact {
        let sp = match self.specials.get(*next) {
            Some(s) if s.0 == j => {
                *next += 1;
                Some(s)
            }
            _ => None,
        };
        match self.element_at(j, sp).map(|iv| decide(iv, target)) {
            None => Exact::point(0.0),
            Some(Some(e)) => e,
            Some(None) => {
                pending.push(j);
                Exact::point(0.0)
            }
        }
    }

    /// The enclosure of element `j`: the a-priori form (F7') for plain
    /// elements where it applies, interval arithmetic otherwise.
    #[inline(always)]
    fn element_at(&self, j: usize, sp: Option<&(usize, Interval, Interval)>) -> Option<Interval> {
        let mut base = self.element_base(j, sp);
        if let Some(u) = self.uniform.filter(|_| self.row.row.allowed(j)) {
            base = Some(base.unwrap_or(Interval::ZERO).add(u));
        }
        let (form, x) = (self.row.row.teacher_form, self.row.row.teacher_probs.get(j));
        match (self.soft, x) {
            (Some(k), Some(&x)) if !form.is_zero(x) => {
                let p = super::loss::teacher_p(form, x);
                Some(base.unwrap_or(Interval::ZERO).add(k.mul_by_nonneg(p)))
            }
            _ => base,
        }
    }

    /// [`FastVjp::element_at`] without the uniform term.
    #[inline(always)]
    fn element_base(&self, j: usize, sp: Option<&(usize, Interval, Interval)>) -> Option<Interval> {
        let fr = self.row;
        match (sp, &self.pt, &fr.p.cache) {
            (None, Some(pt), Some(c)) => {
                // q's members are p's (or h = 0): no term outside p.
                let with_q = self.h != 0.0;
                if !fr.row.in_p(j) || (!self.c_nonzero && !with_q) {
                    return None;
                }
                Some(Self::element_point(pt, c.a[j], c.r[j], c.exact[j], with_q))
            }
            _ => self.element_with(j, sp),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mul_by_a_nonnegative_interval_encloses() {
        let e = Interval { lo: 0.5, hi: 2.0 };
        for x in [
            Interval { lo: -3.0, hi: -1.0 },
            Interval { lo: -1.0, hi: 4.0 },
            Interval { lo: 1.0, hi: 4.0 },
        ] {
            let m = x.mul_by_nonneg(e);
            let prods = [x.lo * e.lo, x.lo * e.hi, x.hi * e.lo, x.hi * e.hi];
            let lo = prods.iter().cloned().fold(f64::INFINITY, f64::min);
            let hi = prods.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            assert!(m.lo <= lo && m.hi >= hi && m.lo > lo - 1e-12 && m.hi < hi + 1e-12);
        }
    }
}
