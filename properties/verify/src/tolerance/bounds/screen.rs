//! A cheap lower bound of every model's gradient bound (T14) of one
//! element, so that `verify` computes the exact bound only for the few
//! elements that could move a reported figure ((T14s) in
//! `properties/TOLERANCE.md`).
//!
//! # Why it is a lower bound
//!
//! [`RowBounds::grad_elem`] builds `E_j` from nonnegative terms with
//! upward operations (each result at least the exact operation on the
//! computed operands, [`Hi`]), so `E_j` is at least the same formula
//! evaluated exactly on the computed leaves, and at least any part of it.
//! For an element that is no indicator (`j` not the target, no id with a
//! nonzero `G_k`):
//!
//! ```text
//! E_j >= (1/T)^ ( G p^+ (arg_j + gamma_m)
//!                 + |h| q^+ (arg^w_j |c_j|^ + Delta H_g + gamma_m (|lp_j|^ + H^ + 2)) )
//! ```
//!
//! with `p^+ = e^(d_j - ln S)` and `q^+` the upward exps the bound itself
//! uses ([`GradShared`]), `arg_j`, `arg^w_j` the p- and h-terms' exponents
//! ([`RowBounds::prob_arg`], the same calls), `|c_j|^`, `|lp_j|^ = |e_j| +
//! ln S_w` and `H^ = ln S_w + R` computed as there, and `gamma_m`, `(1/T)^`,
//! `Delta H_g` the row's constants: `p_dev >= e^lw expm1(arg) >= p^+ arg`
//! for `arg <= 1` (`Hi::exp_m1` bounds `expm1 >= arg` from above; likewise
//! `q_dev >= q^+ arg^w`), `dc = lambda_j + Delta H_g >= Delta H_g`, and
//! `M_j >= G p^+ + |h| q^+ (|lp_j|^ + H^ + 2)`; every other term is dropped
//! (`>= 0`). [`Lo`] operations then evaluate the right side rounded down.
//!
//! # When it is used
//!
//! Only where `E_j` is a finite [`ErrorBound::Abs`] under every model: the
//! row has the statistics, set bounds, entropy error and `gamma_m` the
//! element needs, every magnitude is at most [`CAP`] and the exps' arguments
//! at most 1, so no operation of `E_j` overflows. Elsewhere [`GradScreen::lower`]
//! answers `None` and the caller computes `E_j`.

use super::lanes::{self, ArgLanes, ElementIn, ScreenLanes};
use super::{bits, mag, GradCotangents, GradRow, GradShared, Hi, Lo, RowBounds, SetBounds};

/// Magnitude cap of every quantity entering (T14) on a screened element:
/// products of five such factors stay far below `f64::MAX`.
const CAP: f64 = 1e30;

/// The row's part of the screen of `M` models ([`RowBounds::grad_screen`]).
#[derive(Clone, Debug)]
pub struct GradScreen<const M: usize> {
    g_sum: f64,
    h: f64,
    /// Per model: `gamma_m` without / with the h-term's two terms.
    gm: [[f64; 2]; M],
    /// Per model: `(1/T)^`.
    inv_t: [f64; M],
    /// Per model: `Delta H_g` (0 when `h = 0`).
    dh: [f64; M],
    /// Per model: `ln S_w + R` (upper; 0 when `h = 0`).
    h_hi: [f64; M],
    /// Per model: the first model with the same bounds ([`GradRow`]'s
    /// twins): its lower bound is that one's.
    twin: [usize; M],
    /// The same constants in vector lanes ([`lanes::lower4`]) when the CPU
    /// has them and `M <= 4`.
    lanes: Option<ScreenLanes>,
    /// Every model's two sets are the same bits (no sampling mask).
    pw_same: bool,
}

fn capped(x: f64) -> bool {
    (0.0..=CAP).contains(&x)
}

impl<'a> RowBounds<'a> {
    /// The screen of the gradient bounds of `all` (one row's models on the
    /// same statistics, constants `row` from [`RowBounds::grad_row`]) for
    /// the cotangents `cot`; `None` when some row constant it needs is
    /// missing or out of range (then no element is screened).
    pub fn grad_screen<const M: usize>(
        all: &[RowBounds<'_>; M],
        row: &GradRow<M>,
        cot: &GradCotangents<'_>,
    ) -> Option<GradScreen<M>> {
        // The loss side's terms (T19) and the policy terms' (T21) are not
        // in the screen: every element takes the full bound.
        if cot.loss.is_some() || cot.policy.is_some() || cot.kl.is_some() {
            return None;
        }
        let first = all.first()?;
        let g_sum = row.cot.g_sum.0;
        let h = cot.h.abs();
        if !(capped(g_sum) && capped(h)) {
            return None;
        }
        let mut gm = [[0.0; 2]; M];
        let mut inv_t = [0.0; M];
        let mut dh = [0.0; M];
        let mut h_hi = [0.0; M];
        for (i, rb) in all.iter().enumerate() {
            let mg = &row.models[i];
            let c = &rb.c;
            let st = rb.stats;
            if !std::ptr::eq(st, first.stats) {
                return None;
            }
            // (T14)'s sets and row constants, all present and in range.
            let p = rb.p.as_ref().ok()?;
            if !capped(p.ln_s.lo.abs()) || !capped(p.ln_s.hi.abs()) {
                return None;
            }
            if h > 0.0 {
                let w = rb.w.as_ref().ok()?;
                let d = rb.entropy_grad.as_ref().ok()?.0;
                let r_abs = st.r.lo.abs().max(st.r.hi.abs());
                if !(capped(d) && capped(r_abs) && capped(w.ln_s.hi.abs()) && capped(mg.h_hi.0)) {
                    return None;
                }
                dh[i] = d;
                h_hi[i] = mg.h_hi.0;
            }
            for (k, n_extra) in [0usize, 2].into_iter().enumerate() {
                let g = mg.gm.get(n_extra)?.as_ref().ok()?.0;
                let f = *mg.floor.get(n_extra)?;
                if !((0.0..=1.0).contains(&g) && (0.0..=1.0).contains(&f.0)) {
                    return None;
                }
                gm[i][k] = g;
            }
            let small = |x: Hi| (0.0..=1.0).contains(&x.0);
            if !(capped(mg.inv_t.0)
                && small(c.u)
                && small(c.eps_exp)
                && small(c.eta_sub)
                && c.cap_df.is_none_or(small))
            {
                return None;
            }
            inv_t[i] = mg.inv_t.0;
        }
        let pw_same = row.models.iter().all(|mg| mg.pw_same);
        let lanes = (M <= 4 && lanes::available()).then(|| {
            let cs: Vec<_> = all.iter().map(|rb| &rb.c).collect();
            let sets = |w: bool| -> Option<Vec<&SetBounds>> {
                all.iter()
                    .map(|rb| if w { &rb.w } else { &rb.p }.as_ref().ok())
                    .collect()
            };
            let p = ArgLanes::new(&cs, &sets(false)?);
            // Without an h-term the w lanes are never read.
            let w = match sets(true) {
                Some(w) => ArgLanes::new(&cs, &w),
                None if h == 0.0 => p,
                None => return None,
            };
            let lane = |a: &[f64; M]| std::array::from_fn(|l| a[l.min(M - 1)]);
            Some(ScreenLanes {
                n: M,
                p,
                w,
                gm: [0, 1].map(|k| std::array::from_fn(|l| gm[l.min(M - 1)][k])),
                inv_t: lane(&inv_t),
                dh: lane(&dh),
                h_hi: lane(&h_hi),
            })
        });
        Some(GradScreen {
            g_sum,
            h,
            gm,
            inv_t,
            dh,
            h_hi,
            twin: row.twin,
            lanes: lanes.flatten(),
            pw_same,
        })
    }
}

impl<const M: usize> GradScreen<M> {
    /// Lower bounds of the `M` bounds [`RowBounds::grad_many_with`] gives
    /// element `j < V` (same `all`, row constants and `cot` as
    /// [`RowBounds::grad_screen`]), each a finite [`super::ErrorBound::Abs`]
    /// there; `None` when `j` is an indicator or out of the screen's range.
    pub fn lower(
        &self,
        all: &[RowBounds<'_>; M],
        j: usize,
        cot: &GradCotangents<'_>,
    ) -> Option<[f64; M]> {
        if cot.token == Some(j) && cot.g != 0.0 {
            return None;
        }
        if cot.topk.iter().any(|&(id, gk)| id == j && gk != 0.0) {
            return None;
        }
        let first = all.first()?;
        let st = first.stats;
        let (dj, ej) = (st.d.get(j)?, st.e.get(j)?);
        let sh = GradShared::new(st, j, cot);
        let p_term = self.g_sum > 0.0 && dj.hi > f64::NEG_INFINITY;
        let h_term = self.h > 0.0 && ej.hi > f64::NEG_INFINITY;
        if p_term && !(capped(mag(dj).0) && capped(dj.hi.abs()) && sh.ep.0 <= 2.0) {
            return None;
        }
        if h_term && !(capped(mag(ej).0) && capped(ej.hi.abs()) && sh.eq.0 <= 2.0) {
            return None;
        }
        if let Some(l) = &self.lanes {
            let x = ElementIn {
                g_sum: self.g_sum,
                h: self.h,
                d: (dj.lo, dj.hi),
                e: (ej.lo, ej.hi),
                ep: sh.ep.0,
                eq: sh.eq.0,
                r: (st.r.lo, st.r.hi),
                p_term,
                h_term,
                same: self.pw_same
                    && bits(dj.lo, ej.lo)
                    && bits(dj.hi, ej.hi)
                    && bits(sh.ep.0, sh.eq.0),
            };
            let v = lanes::lower4(l, &x)?;
            return Some(std::array::from_fn(|i| v[i]));
        }
        let k = usize::from(h_term);
        let mut out = [0.0; M];
        for (i, rb) in all.iter().enumerate() {
            let t = self.twin[i];
            if t < i {
                out[i] = out[t];
                continue;
            }
            let mut arg_p = None;
            if p_term {
                let set = rb.p.as_ref().ok()?;
                let (_, arg, _) = rb.prob_arg(set, dj);
                if !(arg.0 <= 1.0) {
                    return None;
                }
                arg_p = Some(arg.0);
            }
            let gm = Lo(self.gm[i][k]);
            let t_h = if h_term {
                // The h-term reuses the p-term's exponent when the sets and
                // the entry are the same bits; else its own must be <= 1 too.
                let w = rb.w.as_ref().ok()?;
                let same = rb.p.as_ref().ok()?.same_bits(w)
                    && bits(dj.lo, ej.lo)
                    && bits(dj.hi, ej.hi)
                    && bits(sh.ep.0, sh.eq.0);
                let arg_w = match arg_p {
                    Some(arg) if same => arg,
                    _ => {
                        let (_, arg, _) = rb.prob_arg(w, ej);
                        if !(arg.0 <= 1.0) {
                            return None;
                        }
                        arg.0
                    }
                };
                // |c_j| and |lp_j| + ln S_w as `grad_elem` computes them.
                let c_hi = Hi(ej.hi) + Hi(st.r.hi);
                let c_lo = Lo(ej.lo) + Lo(st.r.lo);
                let c_abs = c_hi.max(c_lo.neg()).0;
                let lpw_abs = (mag(ej) + Hi(w.ln_s.hi)).0;
                let mags = Lo(lpw_abs) + Lo(self.h_hi[i]) + Lo(2.0);
                Lo(self.h) * Lo(sh.eq.0) * (Lo(arg_w) * Lo(c_abs) + Lo(self.dh[i]) + gm * mags)
            } else {
                Lo(0.0)
            };
            let t_p = match arg_p {
                Some(arg) => Lo(self.g_sum) * Lo(sh.ep.0) * (Lo(arg) + gm),
                None => Lo(0.0),
            };
            out[i] = ((t_p + t_h) * Lo(self.inv_t[i])).0.max(0.0);
        }
        Some(out)
    }
}
