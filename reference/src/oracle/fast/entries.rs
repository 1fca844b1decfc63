//! The per-entry enclosures of a [`FastRow`] (module docs of [`super`],
//! (F1), (F2), (F7)): `d_j`, `e_j`, `exp(d'_j)`, `p_j`, `q_j`; the row
//! statistics for the tolerance model built from them ([`RowStats`]); the
//! entry point of the VJP.

use super::pass::{self, a_interval, a_tight, exp_interval};
use super::row::{nonneg, nonpos, widen_abs, widen_rel, Fam};
use super::{FastRow, FastVjp, RowCotangents};
use crate::oracle::{Interval, RowStats};

impl<'a> FastRow<'a> {
    /// `(a^_j, r_j, exact)` of member `j` of `fam` (cached or recomputed).
    #[inline(always)]
    fn entry(&self, fam: &Fam, j: usize) -> (f64, f64, bool) {
        match &fam.cache {
            Some(c) => (c.a[j], c.r[j], c.exact[j]),
            None => {
                let (a, exact) = pass::shift(fam.vmax, self.vals()[j], self.div);
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
        let e = exp_interval(r, a, exact, self.mutant);
        if j == self.p.argmax {
            return e;
        }
        widen_rel(e, self.k_p())
    }

    /// `(exp(e_j), |e_j|)` of a member `j` of the entropy family.
    #[inline(always)]
    pub(crate) fn exp_a_q(&self, j: usize) -> (Interval, Interval) {
        let fam = self.qfam().expect("entropy family");
        let (a, r, exact) = self.entry(fam, j);
        let (e, a) = (
            exp_interval(r, a, exact, self.mutant),
            a_interval(a, exact, self.mutant),
        );
        match self.k_of(fam) {
            0.0 => (e, a),
            _ if j == fam.argmax => (e, a),
            k => (widen_rel(e, k), nonneg(widen_abs(a, k))),
        }
    }

    /// `d'_j = z'_j - max z'` of column `j < V` (nats, `<= 0`; `-inf` where
    /// masked or `-inf`).
    pub fn d(&self, j: usize) -> Interval {
        if j < self.row.v.len() && self.row.in_p(j) {
            let d = a_tight(self.p.vmax, self.vals()[j], self.div, self.mutant).neg();
            match self.k_p() {
                0.0 => d,
                _ if j == self.p.argmax => d,
                k => nonpos(widen_abs(d, k)),
            }
        } else {
            Interval::point(f64::NEG_INFINITY)
        }
    }

    /// `e_j = w_j - max w` of column `j < V` (nats, `<= 0`; `-inf` outside
    /// the entropy family).
    pub fn e(&self, j: usize) -> Interval {
        match self.qfam() {
            Some(q) if j < self.row.v.len() && self.row.in_q(j) => {
                let e = a_tight(q.vmax, self.vals()[j], self.div, self.mutant).neg();
                match self.k_of(q) {
                    0.0 => e,
                    _ if j == q.argmax => e,
                    k => nonpos(widen_abs(e, k)),
                }
            }
            _ => Interval::point(f64::NEG_INFINITY),
        }
    }

    /// `p_j = softmax(z')_j` of column `j < V` (0 where masked or `-inf`).
    pub fn p(&self, j: usize) -> Interval {
        if j < self.row.v.len() && self.row.in_p(j) {
            self.exp_p(j).div_nonneg(self.sum())
        } else {
            Interval::ZERO
        }
    }

    /// `q_j = softmax(w)_j` of column `j < V` (0 outside the entropy family).
    pub fn q(&self, j: usize) -> Interval {
        match self.qfam() {
            Some(_) if j < self.row.v.len() && self.row.in_q(j) => self
                .exp_a_q(j)
                .0
                .div_nonneg(self.sum_w().expect("entropy family")),
            _ => Interval::ZERO,
        }
    }

    /// The row statistics for the tolerance model ([`RowStats`]), from this
    /// pass (no MPFR work). `s_w`, `ln_s_w`, `r`, `m2`, `q`, `e` are `[0, 0]`
    /// / `-inf` without an entropy family; `m2` is `[0, inf]` without
    /// [`FastOptions::m2`](crate::oracle::fast::FastOptions::m2).
    pub fn row_stats(&self) -> RowStats {
        let v = self.row.v.len();
        let mut stats = self.row_stats_shifts();
        stats.p = (0..v).map(|j| self.p(j)).collect();
        stats.q = (0..v).map(|j| self.q(j)).collect();
        stats
    }

    /// [`FastRow::row_stats`] without the probability vectors: `p` and `q`
    /// are left empty (`[]`), `d` and `e` are `[V]`. What the tolerance
    /// model reads (it never reads `p` or `q`), at a third of the cost.
    pub fn row_stats_shifts(&self) -> RowStats {
        self.row_stats_shifts_in(Vec::new(), Vec::new())
    }

    /// [`FastRow::row_stats_shifts`] into the buffers `d` and `e` (cleared
    /// first, their capacity reused: a caller judging row after row keeps
    /// two `[V]` buffers instead of allocating them per row). When the
    /// entropy family is `p`'s own, `e` is a copy of `d` (the same values).
    pub fn row_stats_shifts_in(&self, mut d: Vec<Interval>, mut e: Vec<Interval>) -> RowStats {
        let v = self.row.v.len();
        let zero = Interval::ZERO;
        d.clear();
        d.extend((0..v).map(|j| self.d(j)));
        e.clear();
        if self.q_is_p {
            e.extend_from_slice(&d);
        } else {
            e.extend((0..v).map(|j| self.e(j)));
        }
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
            e,
            d,
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
