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
//! E_j >= (1/T)^ ( G p^+ (arg_j + gamma_m + gamma_D)
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
//! `M_j >= G p^+ + |h| q^+ (|lp_j|^ + H^ + 2)`, `gamma_D` (T19b)'s
//! `gamma_{D_V}` when `h != 0` (else 0); every other term is dropped
//! (`>= 0`). [`Lo`] operations then evaluate the right side rounded down.
//!
//! The loss side (T19), the policy terms (T21) and the top-k KL (T25) join
//! `G` with their weights and `m` with their terms ([`row_weight`]); of the
//! errors they add beyond (T14) the bound keeps `P p^+` on every entry
//! (`delta_C`, `delta_w`, `sum_k delta_k`) and `sp p^+ + s0` on an entry
//! that gets the smoothing constant. Their indicators are not screened.
//!
//! # How it is evaluated
//!
//! `arg_j` is at least `max(a |d_j| + b_v, a_l |d_j| + b_l)` (T10's two
//! forms as the affine functions of `|d_j|` they are, [`RowBounds::prob_arg`]:
//! `alpha_j - ln(1 - theta_S) + 2u` and `lambda_j`, T9), likewise `arg^w_j`
//! in `|e_j|`. With `(1/T)^`, `G` and `|h|` folded in, the right side is,
//! per model and row, twelve coefficients ([`Affine`], computed with [`Lo`]
//! operations: lower bounds of the reals, clamped at 0) and per element
//!
//! ```text
//! L = p^+ max(pa1 |d| + pb1, pa2 |d| + pb2)
//!   + q^+ (max(ha1 |e| + hb1, ha2 |e| + hb2) |c|^ + hc + hg |e|)
//!   + s (sp p^+ + s0)
//! ```
//!
//! in plain f64 (round to nearest, no fused multiply-add). Every operand is
//! nonnegative and at most [`CAP`]^3, so each of its at most 24 operations
//! errs by at most `2^-53` relative plus `2^-1075` absolute (underflow), the
//! latter amplified by the later factors (`|c|^ <= CAP < 2^100`, `p^+, q^+
//! <= 2`) to at most `2^-968` in all: the result is at most `L (1 + 2^-48) +
//! 2^-968`, so `L (1 - 2^-44) - 2^-960` (rounded, then clamped at 0) is
//! below the real `L`, hence below `E_j`.
//!
//! # When it is used
//!
//! Only where `E_j` is a finite [`ErrorBound::Abs`] under every model: the
//! row has the statistics, set bounds, entropy error and `gamma_m` the
//! element needs, every magnitude is at most [`CAP`] and the exps' arguments
//! at most 1 (`|d_j|`, `|e_j|` at most the row's thresholds: the largest
//! magnitudes whose computed `arg` is at most 1 under every model, `arg`
//! being monotone in them), so no operation of `E_j` overflows. Elsewhere
//! [`GradScreen::lower`] answers `None` and the caller computes `E_j`.

use super::grad::ModelGrad;
use super::LossTerms;
use super::{
    mag, GradCotangents, GradRow, GradShared, GradSharedRow, Hi, Lo, RowBounds, SetBounds,
};
use logprobe_reference::oracle::Interval;

/// Magnitude cap of every quantity entering (T14) on a screened element:
/// products of five such factors stay far below `f64::MAX`.
const CAP: f64 = 1e30;

/// `1 - 2^-44`: the plain evaluation's relative widening (module docs).
const SHRINK: f64 = 1.0 - 1.0 / 17_592_186_044_416.0;
/// `2^-960`: its absolute widening (underflow).
const FLOOR: f64 = f64::from_bits((1023 - 960) << 52);

/// One model's coefficients of the screen for one `gamma_m` (module docs):
/// the p-term's two affine pieces in `|d_j|` (`(1/T) G` and `gamma_m`
/// folded in), the h-term's two pieces of `arg^w_j` in `|e_j|` (`(1/T)
/// |h|` folded in), its constant and its `|e_j|` coefficient. All
/// nonnegative lower bounds.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Affine {
    pa1: f64,
    pb1: f64,
    pa2: f64,
    pb2: f64,
    ha1: f64,
    hb1: f64,
    ha2: f64,
    hb2: f64,
    hc: f64,
    hg: f64,
    /// The loss side's smoothing errors (T19) on an entry that gets the
    /// smoothing constant: `sp p^+ + s0`.
    sp: f64,
    s0: f64,
}

/// The row's part of the screen of `M` models ([`RowBounds::grad_screen`]).
#[derive(Clone, Debug)]
pub struct GradScreen<const M: usize> {
    /// The largest model's `G` (sources beyond the log-prob included).
    g_sum: f64,
    h: f64,
    /// The row's indicator columns, ascending: the target (with a nonzero
    /// `g`, a loss side or policy terms), the top-k ids with `G_k != 0`,
    /// the KL's ids. Never screened.
    indicators: Vec<usize>,
    /// Per model: the coefficients without / with the h-term's two terms
    /// (`gamma_m`'s two indices).
    coef: [[Affine; 2]; M],
    /// Per model: the first model with the same bounds ([`GradRow`]'s
    /// twins): its lower bound is that one's.
    twin: [usize; M],
    /// Largest `|d_j|` (`|e_j|`) whose p-term (h-term) exponent is at
    /// most 1 under every model (`-1`: none).
    d_max: f64,
    e_max: f64,
    /// `coef` field by field, four models a vector (`M == 4`, for
    /// [`GradScreen::lower4`]): `[k][field][model]`, fields in
    /// [`Affine`]'s order.
    coef4: [[[f64; 4]; 12]; 2],
    /// `twin` as the 32-bit lane indices that gather lane `twin[i]`'s
    /// 64 bits into lane `i` (`M == 4`).
    twin4: [i32; 8],
    /// The row's part of every element's [`GradShared`].
    shared: GradSharedRow,
}

/// One element's leaves of its lower bound (module docs): `p^+`, `q^+`
/// (0 for a term that does not apply), `|d_j|`, `|e_j|` (likewise),
/// `|c_j|^` and which coefficients apply (1 with the h-term).
#[derive(Clone, Copy, Debug)]
pub struct Leaves {
    ep: f64,
    eq: f64,
    d: f64,
    e: f64,
    c: f64,
    k: usize,
    /// 1 where the entry gets the loss side's smoothing constant, else 0.
    s: f64,
}

fn capped(x: f64) -> bool {
    (0.0..=CAP).contains(&x)
}

/// A lower bound's f64, clamped at 0 (the real it bounds is nonnegative).
fn nonneg(x: Lo) -> Lo {
    Lo(x.0.max(0.0))
}

/// `a + b` rounded down, `a` itself when `b` is 0 (the same bits as
/// before a term that is absent).
fn plus(a: Lo, b: Lo) -> Lo {
    if b.0 == 0.0 {
        a
    } else {
        nonneg(a + b)
    }
}

/// The largest `x` in `[0, CAP]` with `ok(x)`, for `ok` true up to a
/// point and false beyond (monotone); `-1` when `ok(0)` fails.
fn largest(ok: impl Fn(f64) -> bool) -> f64 {
    if !ok(0.0) {
        return -1.0;
    }
    if ok(CAP) {
        return CAP;
    }
    // Nonnegative f64s are ordered as their bits.
    let (mut lo, mut hi) = (0u64, CAP.to_bits());
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if ok(f64::from_bits(mid)) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    f64::from_bits(lo)
}

impl Affine {
    /// The coefficients in field order (that of [`GradScreen::lower4`]'s
    /// vectors).
    fn fields(&self) -> [f64; 12] {
        [
            self.pa1, self.pb1, self.pa2, self.pb2, self.ha1, self.hb1, self.ha2, self.hb2,
            self.hc, self.hg, self.sp, self.s0,
        ]
    }
}

/// `coef` field by field, four models a vector, and the twins' lane
/// indices ([`GradScreen`]'s `coef4`, `twin4`; zeros unless `M == 4`).
#[allow(clippy::type_complexity)]
fn lanes4<const M: usize>(
    coef: &[[Affine; 2]; M],
    twin: &[usize; M],
) -> Option<([[[f64; 4]; 12]; 2], [i32; 8])> {
    let mut coef4 = [[[0.0; 4]; 12]; 2];
    let mut twin4 = [0i32; 8];
    if M == 4 {
        for (i, per_k) in coef.iter().enumerate() {
            for (k, a) in per_k.iter().enumerate() {
                for (f, x) in a.fields().into_iter().enumerate() {
                    coef4[k][f][i] = x;
                }
            }
            let t = i32::try_from(twin[i].min(i)).ok()?;
            twin4[2 * i] = 2 * t;
            twin4[2 * i + 1] = 2 * t + 1;
        }
    }
    Some((coef4, twin4))
}

/// The row's indicator columns, ascending ([`GradScreen`]'s
/// `indicators`).
fn indicators(cot: &GradCotangents<'_>) -> Vec<usize> {
    let mut ids: Vec<usize> = cot
        .topk
        .iter()
        .filter(|&&(_, gk)| gk != 0.0)
        .map(|&(id, _)| id)
        .chain(cot.kl.iter().flat_map(|k| k.ids.iter().copied()))
        .collect();
    if let Some(t) = cot.token {
        if cot.g != 0.0 || cot.loss.is_some() || cot.policy.is_some() {
            ids.push(t);
        }
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// One model's row part of the sources beyond (T14)'s log-prob, entropy
/// and top-k ([`row_weight`]).
struct RowWeight {
    /// `G` with the loss side's two weights (T19), the policy terms'
    /// (T21) and the top-k KL's (T25).
    g: Hi,
    /// The terms they add on a non-indicator element (`m`'s part).
    n: usize,
    /// A lower bound of the coefficient of `p_j` (at its upper end) in what
    /// they add beyond (T14) at a non-indicator element, before `/T`.
    p_extra: Lo,
    /// Lower bounds of the coefficient of `p_j` and of the constant they
    /// add on an entry that gets the smoothing constant, before `/T`.
    sp: Lo,
    s0: Lo,
}

/// One model's [`RowWeight`]: `G` as [`RowBounds::grad_sources`] sums it
/// (the same operations, the same bits) and lower bounds of the errors
/// the terms add ([`LossTerms::lower_parts`]: `delta_C p_j` and the
/// smoothing constant's; `delta_w p_j` (T21); `p_j sum_k delta_k` (T25));
/// `None` when a term has no bound or is out of range (then no element is
/// screened: its `E_j` could be infinite). What else they add (the
/// indicators' terms, the smoothing roundings under a sampling mask) is
/// nonnegative and left out of the lower bound.
///
/// [`LossTerms::lower_parts`]: super::LossTerms::lower_parts
fn row_weight(cot: &GradCotangents<'_>, mg: &ModelGrad, g: Hi) -> Option<RowWeight> {
    let mut w = RowWeight {
        g,
        n: 0,
        p_extra: Lo(0.0),
        sp: Lo(0.0),
        s0: Lo(0.0),
    };
    if let Some(l) = &cot.loss {
        let lt = mg.loss.as_ref()?.as_ref().ok()?;
        if !lt.within(CAP) {
            return None;
        }
        w.g = w.g + lt.t_weight + lt.p_weight;
        w.n += 2 + usize::from(l.soft != 0.0);
    }
    if let Some(pt) = &mg.policy {
        let pt = pt.as_ref().ok()?;
        if !pt.within(CAP) {
            return None;
        }
        w.g = w.g + pt.weight;
        w.n += 1;
        w.p_extra = w.p_extra + Lo(pt.delta.0);
    }
    if let Some(kt) = &mg.kl {
        let kt = kt.as_ref().ok()?;
        if !(capped(kt.weight.0) && capped(kt.delta.0)) {
            return None;
        }
        w.g = w.g + kt.weight;
        w.n += kt.per_id.len();
        w.p_extra = w.p_extra + Lo(kt.delta.0);
    }
    // The loss side's errors read the element's whole `G` (T19).
    if let (Some(l), Some(Ok(lt))) = (&cot.loss, &mg.loss) {
        let parts = lt.lower_parts(l, w.g);
        w.p_extra = w.p_extra + parts.p;
        (w.sp, w.s0) = (parts.smooth_p, parts.smooth);
    }
    if ![w.p_extra, w.sp, w.s0].iter().all(|x| capped(x.0)) {
        return None;
    }
    Some(w)
}

/// The soft cross-entropy's indicator `|c| p_j` (T28) is finite on every
/// element: `|c|` capped and every teacher probability in `[0, CAP]`
/// (log-probabilities at most 60 or `-inf`); true without one.
fn soft_teacher_capped(cot: &GradCotangents<'_>) -> bool {
    let Some(l) = cot.loss.as_ref().filter(|l| l.soft != 0.0) else {
        return true;
    };
    let Some(t) = l.teacher.as_ref() else {
        return true;
    };
    capped(l.soft)
        && if l.soft_log_probs {
            t.iter().all(|&a| a <= 60.0)
        } else {
            t.iter().all(|&p| capped(p))
        }
}

/// The two affine pieces `(slope, intercept)` below a set's `arg` ((T10):
/// `alpha + nl_theta + 2u`, `lambda`), lower bounds of the reals.
fn arg_pieces(rb: &RowBounds<'_>, set: &SetBounds) -> [(Lo, Lo); 2] {
    let c = &rb.c;
    let one_u = Hi::ONE + c.u;
    let via = nonneg(Lo(c.b.0) + Lo(set.nl_theta.0) + Lo((Hi(2.0) * c.u).0));
    let lam_a = nonneg(Lo(c.a_lp.0) * Lo(one_u.0) + Lo(c.u.0));
    let lam_b = nonneg(
        nonneg(Lo(c.b_lp.0) + Lo(set.lse_err.0)) * Lo(one_u.0) + Lo(c.u.0) * Lo(set.ln_s.hi),
    );
    [(Lo(c.a.0), via), (lam_a, lam_b)]
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
        let first = all.first()?;
        let h = cot.h.abs();
        if !(capped(row.cot.g_sum.0) && capped(h) && soft_teacher_capped(cot)) {
            return None;
        }
        let mut coef = [[Affine::default(); 2]; M];
        let (mut d_max, mut e_max) = (CAP, CAP);
        let mut g_max = 0.0f64;
        for (i, rb) in all.iter().enumerate() {
            let mg = &row.models[i];
            // This model's `G` with the loss side, policy and KL weights,
            // and the terms they add on every element.
            let RowWeight {
                g: g_sum,
                n: n_row,
                p_extra,
                sp,
                s0,
            } = row_weight(cot, mg, row.cot.g_sum)?;
            let g_sum = g_sum.0;
            if !capped(g_sum) {
                return None;
            }
            g_max = g_max.max(g_sum);
            let c = &rb.c;
            let st = rb.stats;
            if !std::ptr::eq(st, first.stats) {
                return None;
            }
            // (T14)'s sets and row constants, all present and in range;
            // the affine pieces' leaves nonnegative.
            let p = rb.p.as_ref().ok()?;
            if !capped(p.ln_s.lo.abs()) || !capped(p.ln_s.hi) {
                return None;
            }
            let (mut dh, mut h_hi, mut w_ln_s) = (0.0, 0.0, 0.0);
            let mut w_pieces = [(Lo(0.0), Lo(0.0)); 2];
            if h > 0.0 {
                let w = rb.w.as_ref().ok()?;
                let d = rb.entropy_grad.as_ref().ok()?.0;
                let r_abs = st.r.lo.abs().max(st.r.hi.abs());
                if !(capped(d) && capped(r_abs) && capped(w.ln_s.hi) && capped(mg.h_hi.0)) {
                    return None;
                }
                dh = d;
                h_hi = mg.h_hi.0;
                w_ln_s = w.ln_s.hi;
                w_pieces = arg_pieces(rb, w);
                e_max = e_max.min(largest(|x| {
                    let e = Interval { lo: -x, hi: -x };
                    rb.prob_arg(w, &e).1 .0 <= 1.0
                }));
            }
            if g_sum > 0.0 {
                d_max = d_max.min(largest(|x| {
                    let d = Interval { lo: -x, hi: -x };
                    rb.prob_arg(p, &d).1 .0 <= 1.0
                }));
            }
            let small = |x: Hi| (0.0..=1.0).contains(&x.0);
            if !(capped(mg.inv_t.0)
                && small(c.u)
                && small(c.eps_exp)
                && small(c.eta_sub)
                && c.cap_df.is_none_or(small)
                && [c.a, c.b, c.a_lp, c.b_lp, p.nl_theta, p.lse_err]
                    .iter()
                    .all(|x| capped(x.0)))
            {
                return None;
            }
            let inv_t = Lo(mg.inv_t.0);
            let g_t = nonneg(inv_t * Lo(g_sum));
            let h_t = nonneg(inv_t * Lo(h));
            let p_pieces = arg_pieces(rb, p);
            // Without a p-term in `E_j` (no source reads `p_j`), none here.
            let p_live = g_sum > 0.0 || mg.policy.is_some() || mg.kl.is_some();
            let (p_extra, sp) = if p_live {
                (p_extra, sp)
            } else {
                (Lo(0.0), Lo(0.0))
            };
            let p_extra_t = nonneg(inv_t * nonneg(p_extra));
            // (T19b) `gamma_{D_V} G p^+` beside the p-term's `gamma_m`.
            let dense = if h > 0.0 {
                Lo(mg.dense.as_ref().ok()?.0)
            } else {
                Lo(0.0)
            };
            let (sp_t, s0_t) = (nonneg(inv_t * nonneg(sp)), nonneg(inv_t * nonneg(s0)));
            for (k, n_extra) in [0usize, 2].into_iter().enumerate() {
                // The element's `gamma_m` (`m = base + n_row + n_extra`).
                let at = n_row + n_extra;
                let g = match mg.gm.get(at) {
                    Some(g) => g.as_ref().ok()?.0,
                    // As `grad_elem` computes it there.
                    None => super::gamma(mg.base + at, c.u.0).ok()?.0,
                };
                let f = *mg.floor.get(n_extra)?;
                if !((0.0..=1.0).contains(&g) && (0.0..=1.0).contains(&f.0)) {
                    return None;
                }
                let gm = Lo(g);
                let [(a1, b1), (a2, b2)] = p_pieces;
                let [(wa1, wb1), (wa2, wb2)] = w_pieces;
                // `gamma_m (ln S_w + H + 2)`: the `|lp_j| + H + 2` factor's
                // constant part.
                let mags0 = Lo(w_ln_s) + Lo(h_hi) + Lo(2.0);
                let a = Affine {
                    pa1: nonneg(g_t * a1).0,
                    pb1: nonneg(nonneg(g_t * plus(nonneg(b1 + gm), dense)) + p_extra_t).0,
                    pa2: nonneg(g_t * a2).0,
                    pb2: nonneg(nonneg(g_t * plus(nonneg(b2 + gm), dense)) + p_extra_t).0,
                    ha1: nonneg(h_t * wa1).0,
                    hb1: nonneg(h_t * wb1).0,
                    ha2: nonneg(h_t * wa2).0,
                    hb2: nonneg(h_t * wb2).0,
                    hc: nonneg(h_t * nonneg(Lo(dh) + nonneg(gm * nonneg(mags0)))).0,
                    hg: nonneg(h_t * gm).0,
                    sp: sp_t.0,
                    s0: s0_t.0,
                };
                if !a.fields().iter().all(|&x| x <= CAP * CAP * CAP) {
                    return None;
                }
                coef[i][k] = a;
            }
        }
        let (coef4, twin4) = lanes4(&coef, &row.twin)?;
        Some(GradScreen {
            g_sum: g_max,
            h,
            indicators: indicators(cot),
            coef,
            twin: row.twin,
            d_max,
            e_max,
            coef4,
            twin4,
            shared: GradSharedRow::new(first.stats, cot),
        })
    }
}

impl GradScreen<1> {
    /// Whether this screen's lower bound ([`GradScreen::lower_of`]) holds
    /// on every element's [`Leaves`] from `other` (a screen of other
    /// models on the same statistics and cotangents, e.g. the statistical
    /// threshold's beside the sound bounds'): the same indicators and
    /// terms, and its exps' ranges at least `other`'s, so that wherever
    /// `other` gives leaves, this model's bound is a finite
    /// [`super::ErrorBound::Abs`] at least its lower bound there.
    pub fn admits<const M: usize>(&self, other: &GradScreen<M>) -> bool {
        self.indicators == other.indicators
            && (self.g_sum > 0.0) == (other.g_sum > 0.0)
            && self.h.to_bits() == other.h.to_bits()
            && self.d_max >= other.d_max
            && self.e_max >= other.e_max
    }
}

impl<const M: usize> GradScreen<M> {
    /// Lower bounds of the `M` bounds [`RowBounds::grad_many_with`] gives
    /// element `j < V` (same `all`, row constants and `cot` as
    /// [`RowBounds::grad_screen`]), each a finite [`super::ErrorBound::Abs`]
    /// there; `None` when `j` is an indicator or out of the screen's range.
    #[inline(always)]
    pub fn lower(
        &self,
        all: &[RowBounds<'_>; M],
        j: usize,
        cot: &GradCotangents<'_>,
    ) -> Option<[f64; M]> {
        self.leaves(all, j, cot).map(|l| self.lower_of(&l))
    }

    /// Element `j`'s [`Leaves`] (`None` where [`GradScreen::lower`] is).
    #[inline(always)]
    pub fn leaves(
        &self,
        all: &[RowBounds<'_>; M],
        j: usize,
        cot: &GradCotangents<'_>,
    ) -> Option<Leaves> {
        if self.indicators.binary_search(&j).is_ok() {
            return None;
        }
        let first = all.first()?;
        let st = first.stats;
        let (dj, ej) = (st.d.get(j)?, st.e.get(j)?);
        let ep = first.ep.as_deref().map(|v| &v[..]);
        let sh = GradShared::with_row(st, j, cot, ep, &self.shared);
        let p_term = self.g_sum > 0.0 && dj.hi > f64::NEG_INFINITY;
        let h_term = self.h > 0.0 && ej.hi > f64::NEG_INFINITY;
        // A term that does not apply reads 0 (`-inf` entries: no NaN).
        let d = if p_term { mag(dj).0 } else { 0.0 };
        let e = if h_term { mag(ej).0 } else { 0.0 };
        if p_term && !(capped(d) && d <= self.d_max && capped(dj.hi.abs()) && sh.ep.0 <= 2.0) {
            return None;
        }
        if h_term && !(capped(e) && e <= self.e_max && capped(ej.hi.abs()) && sh.eq.0 <= 2.0) {
            return None;
        }
        let (ep, eq) = (
            if p_term { sh.ep.0 } else { 0.0 },
            if h_term { sh.eq.0 } else { 0.0 },
        );
        // |c_j| as `grad_elem` computes it.
        let c = if h_term {
            let c_hi = Hi(ej.hi) + Hi(st.r.hi);
            let c_lo = Lo(ej.lo) + Lo(st.r.lo);
            let c = c_hi.max(c_lo.neg()).0;
            if !capped(c) {
                return None;
            }
            c
        } else {
            0.0
        };
        Some(Leaves {
            ep,
            eq,
            d,
            e,
            c,
            k: usize::from(h_term),
            s: match &cot.loss {
                Some(l) if LossTerms::allowed(l, j) => 1.0,
                _ => 0.0,
            },
        })
    }

    /// The `M` lower bounds of an element from its [`Leaves`].
    #[inline(always)]
    pub fn lower_of(&self, l: &Leaves) -> [f64; M] {
        let Leaves {
            ep,
            eq,
            d,
            e,
            c,
            k,
            s,
        } = *l;
        let mut out = [0.0; M];
        for i in 0..M {
            let t = self.twin[i];
            if t < i {
                out[i] = out[t];
                continue;
            }
            let a = &self.coef[i][k];
            let tp = ep * (a.pa1 * d + a.pb1).max(a.pa2 * d + a.pb2);
            let th = eq * ((a.ha1 * e + a.hb1).max(a.ha2 * e + a.hb2) * c + a.hc + a.hg * e);
            let ts = (a.sp * ep + a.s0) * s;
            out[i] = ((tp + th + ts) * SHRINK - FLOOR).max(0.0);
        }
        out
    }

    /// [`GradScreen::lower_of`] for four models, one per lane, the same
    /// bits: every operand is finite and nonnegative (module docs), where
    /// `_mm256_max_pd` is `f64::max`, and no operation is fused.
    ///
    /// # Safety
    /// `M == 4` and the CPU has AVX2.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    pub unsafe fn lower4(&self, l: &Leaves) -> std::arch::x86_64::__m256d {
        use logprobe_reference::simd::x86::{add, load, mul, splat, sub};
        use std::arch::x86_64::*;
        let c4 = &self.coef4[l.k.min(1)];
        let [pa1, pb1, pa2, pb2, ha1, hb1, ha2, hb2, hc, hg, sp, s0] =
            c4.each_ref().map(|a| load(a));
        let (d, e) = (splat(l.d), splat(l.e));
        let tp = mul(
            splat(l.ep),
            _mm256_max_pd(add(mul(pa1, d), pb1), add(mul(pa2, d), pb2)),
        );
        let hw = _mm256_max_pd(add(mul(ha1, e), hb1), add(mul(ha2, e), hb2));
        let th = mul(splat(l.eq), add(add(mul(hw, splat(l.c)), hc), mul(hg, e)));
        let ts = mul(add(mul(sp, splat(l.ep)), s0), splat(l.s));
        let out = _mm256_max_pd(
            sub(mul(add(add(tp, th), ts), splat(SHRINK)), splat(FLOOR)),
            _mm256_setzero_pd(),
        );
        // Twins take their first model's lane.
        let idx = _mm256_loadu_si256(self.twin4.as_ptr().cast());
        _mm256_castsi256_pd(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(out), idx))
    }
}
