//! The f64-tier enclosure of one row's cross-entropy term `w l`
//! (docs/design.md, "The loss side"; [`crate::spec::CrossEntropy`]), from the same pass as the
//! log-probs: with `a_j = (v_max - v_j) / ts >= 0` (F1, the tight
//! enclosure) and `L = ln S` (F4), `-log p_j = a_j + L`, so
//! `l = (1 - eps)(a_t + L) + eps (L + sum_{j in A} a_j / |A|)` over the
//! allowed entries `A` of the real vocabulary. The sum of the `a_j` is
//! taken twice by TwoSum (F3), once over the lower ends and once over the
//! upper ends, each widened by its bound `gamma_n n u H`; every other
//! operation is one f64 operation moved one ulp outward (or exact), so the
//! result encloses the exact `w l`.

use super::pass::{a_tight, Dd};
use super::row::widen_abs;
use super::FastRow;
use crate::interval::Interval;
use crate::interval::{add_dn, add_up, div_dn, div_up, mul_dn, mul_up, TINY};
use crate::spec::TeacherForm;

/// The teacher's `p_j` of an entry holding `x`, enclosed: `x` itself
/// (probabilities), or `exp(x)` from core-math's correctly rounded `exp`,
/// one ulp each way (log-probabilities; `[0, 2^-1074]` when it rounds to 0).
pub(crate) fn teacher_p(form: TeacherForm, x: f64) -> Interval {
    match form {
        TeacherForm::Probs => Interval::point(x),
        TeacherForm::LogProbs if x == 0.0 => Interval::point(1.0),
        TeacherForm::LogProbs => match core_math::exp(x) {
            0.0 => Interval { lo: 0.0, hi: TINY },
            r => Interval {
                lo: r.next_down().max(0.0),
                hi: r.next_up(),
            },
        },
    }
}

impl FastRow<'_> {
    /// The enclosure of this row's loss term `w l` (nats; `w` the row's
    /// `loss_weights` entry) for label smoothing `eps` in `[0, 1]` as the
    /// computation takes it (rounded to the accumulation dtype): an exact 0
    /// on an `ignore_index` row or for `w = 0`, an exact `+inf` when
    /// `eps > 0` and an allowed logit of the real vocabulary is `-inf`.
    /// `None` when the row is not [`FastRow::applicable`] (the MPFR path
    /// then decides).
    pub fn loss_term(&self, eps: f64) -> Option<Interval> {
        let row = &self.row;
        let (Some(t), w) = (row.target, row.weight) else {
            return Some(Interval::point(0.0));
        };
        if w == 0.0 {
            return Some(Interval::point(0.0));
        }
        let v = row.v.len();
        // Under an exact softcap a `-inf` logit is the finite `x' = -c`.
        if eps > 0.0 && (0..v).any(|j| row.allowed(j) && !row.finite(j)) {
            return Some(Interval::point(f64::INFINITY));
        }
        if !self.applicable {
            return None;
        }
        let ln_s = self.p.bounds.ln_s;
        let nonneg = |i: Interval| Interval {
            lo: i.lo.max(0.0),
            hi: i.hi,
        };
        // (F9): each `-log p_j` moves by at most `k` under an exact softcap.
        let k = self.k_p();
        let vals = self.vals();
        let nll = nonneg(widen_abs(
            a_tight(self.p.vmax, vals[t], self.div, self.mutant).add(ln_s),
            k,
        ));
        let l = if eps == 0.0 {
            nll
        } else {
            let (mut lo, mut hi, mut n) = (Dd::default(), Dd::default(), 0u64);
            for j in (0..v).filter(|&j| row.in_p(j)) {
                let a = a_tight(self.p.vmax, vals[j], self.div, self.mutant);
                lo.add(a.lo);
                hi.add(a.hi);
                n += 1;
            }
            let sum = Interval {
                lo: lo.enclose(lo.err(n), 0.0).lo,
                hi: hi.enclose(0.0, hi.err(n)).hi,
            };
            let count = n.max(1) as f64;
            let mean_a = Interval {
                lo: div_dn(sum.lo, count).max(0.0),
                hi: div_up(sum.hi, count),
            };
            let smooth = nonneg(widen_abs(ln_s.add(mean_a), k));
            let one_minus = Interval {
                lo: add_dn(1.0, -eps).max(0.0),
                hi: add_up(1.0, -eps),
            };
            nonneg(
                one_minus
                    .mul_nonneg(nll)
                    .add(Interval::point(eps).mul_nonneg(smooth)),
            )
        };
        Some(if w == 1.0 {
            l
        } else {
            l.mul_nonneg(Interval::point(w))
        })
    }
}

impl FastRow<'_> {
    /// The enclosure of this row's soft-target cross-entropy `H(p, q) =
    /// (sum_j p_j) L + sum_j p_j a_j` (nats; `oracle/cross_entropy/soft.rs`):
    /// an exact `+inf` when the teacher puts mass on an entry whose
    /// log-prob is `-inf`. The products `p_j a_j` rounded outward, both
    /// sums by TwoSum (F3) each widened by its bound; under an exact
    /// softcap every `-log q_j` widened by `k` (F9), so `H` by `k sum p`.
    /// `None` when the row is not [`FastRow::applicable`].
    pub fn soft_cross_entropy(&self) -> Option<Interval> {
        let row = &self.row;
        if crate::oracle::cross_entropy::soft_infinite(row) {
            return Some(Interval::point(f64::INFINITY));
        }
        if !self.applicable {
            return None;
        }
        let vals = self.vals();
        let (mut lo, mut hi, mut mass_lo, mut mass_hi, mut n) = (
            Dd::default(),
            Dd::default(),
            Dd::default(),
            Dd::default(),
            0u64,
        );
        let form = row.teacher_form;
        for (j, &x) in row.teacher_probs.iter().enumerate() {
            if form.is_zero(x) {
                continue;
            }
            let p = teacher_p(form, x);
            let a = a_tight(self.p.vmax, vals[j], self.div, self.mutant);
            lo.add(mul_dn(p.lo, a.lo));
            hi.add(mul_up(p.hi, a.hi));
            mass_lo.add(p.lo);
            mass_hi.add(p.hi);
            n += 1;
        }
        let pa = Interval {
            lo: lo.enclose(lo.err(n), 0.0).lo,
            hi: hi.enclose(0.0, hi.err(n)).hi,
        };
        let mass = Interval {
            lo: mass_lo.enclose(mass_lo.err(n), 0.0).lo,
            hi: mass_hi.enclose(0.0, mass_hi.err(n)).hi,
        };
        let nonneg = |i: Interval| Interval {
            lo: i.lo.max(0.0),
            hi: i.hi,
        };
        let h = mass.mul_nonneg(nonneg(self.p.bounds.ln_s)).add(pa);
        let k = self.k_p();
        Some(nonneg(widen_abs(h, mul_up(k, mass.hi))))
    }
}
