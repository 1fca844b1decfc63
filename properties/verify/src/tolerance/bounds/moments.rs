//! The log-softmax entropy sums (T12, T13) of every model from five
//! model-independent sums of the row: `(T12m)` in
//! `properties/TOLERANCE.md`.
//!
//! Per finite entry `j` of the entropy set, with `D_j = |d_j|^` ([`mag`]),
//! `w_j = (e^lw_j)^` (the shared walk's `ew`), `ell = (ln S_w)^`, each model
//! `m` bounds `lambda_j <= K |D_j| + B` ([`LambdaAffine`]) and `e^lambda_j -
//! 1` by the exact identity `e^(B + x) - 1 = (e^B - 1) + e^B (e^x - 1)` and
//! [`Hi::exp_m1_tiny`]'s polynomial for `e^x - 1`, `x = K D_j <= 2^-16`:
//!
//! ```text
//! e^lambda_j - 1 <= P(D_j) = q0 + q1 D_j + q2 D_j^2,
//!     q0 = (e^B - 1)^, q1 = (e^B)^ K, q2 = (e^B)^ C K^2   (C = 1/2 + 2^-18)
//! ```
//!
//! All of `P`'s coefficients are nonnegative once `B >= 0`, and so are
//! `D_j + ell` (`|lp_j|`'s bound) and `B + K D_j` (`lambda_j`'s), so each
//! model's sums over such *plain* entries are, as reals, polynomials in
//! `D_j` weighted by `w_j`, that is linear combinations with nonnegative
//! coefficients of the moments `M_i = sum_j w_j D_j^i` (`i <= 3`), of `SD =
//! sum_j D_j` and of their count `n`:
//!
//! ```text
//! s_em  = sum w P(D)             = q0 M0 + q1 M1 + q2 M2
//! s_dem = sum (D + ell) w P(D)   = q0 (M1 + ell M0) + q1 (M2 + ell M1) + q2 (M3 + ell M2)
//! s_lam = sum w (1 + P(D)) (B + K D)
//!       = (1 + q0) B M0 + ((1 + q0) K + q1 B) M1 + (q1 K + q2 B) M2 + q2 K M3
//! sdl   = sum (D + ell + K D + B) = (1 + K) SD + n (ell + B)
//! ```
//!
//! the same reals the entry-by-entry walk bounds term by term. The moments
//! are upward sums of upward products ([`Hi`]), so every combination,
//! evaluated upward, bounds its real from above. A plain entry never
//! flushes in the walk's test (`lw_j >= ln_min_normal` under every model,
//! `lambda >= 0`), so it adds nothing to `fl_d`, `fl_1`.
//!
//! Plain (for a model, [`PlainCut::of`]): finite `0 <= D_j <= d_max` (so
//! `K D_j <= 2^-16`, and `D_j <= 1e30`), `lw_j >= ln_min_normal`, `w_j`
//! finite, when the model meets the preconditions
//! ([`PlainCut::eligible`]; otherwise no entry is plain). The models of a
//! row share one walk per distinct cut (verify's share one: the same `K`
//! and flush threshold). Every other finite entry (an
//! *exception*) is walked entry by entry as before, four models a vector
//! ([`super::lanes::sums4`]) or one by one, and its terms added to the
//! models' sums. The moments are summed in four parts, entry `j` into part
//! `j % 4`, four entries a vector ([`super::lanes::moments4`], the same
//! bits) where the CPU has the lanes.

use logprobe_reference::oracle::RowStats;

use super::{lanes, mag, Hi, LambdaAffine, Lo, LsSums};
use crate::tolerance::upward::{ExpM1Base, TAYLOR_MAX, TINY_C};

/// Largest `D_j` of a plain entry whatever the models: `D^3 w` stays far
/// below `f64::MAX`.
const D_CAP: f64 = 1e30;

/// `1 - 2^-50`: `d_max = (2^-16 / K)(1 - 2^-50)` makes `K d_max <= 2^-16`
/// as reals (the quotient errs by at most `2^-53` relative, the product
/// by another).
const BELOW: f64 = 1.0 - 1.0 / 1_125_899_906_842_624.0;

/// Which entries are plain (module docs).
#[derive(Clone, Copy, Debug)]
pub(super) struct PlainCut {
    /// Largest plain `D_j` (`-1`: none is plain).
    pub d_max: f64,
    /// Smallest plain `lw_j`.
    pub lw_min: f64,
}

impl PlainCut {
    /// Whether a model `(lambda, base, ln_min_normal)` meets the
    /// preconditions of the module docs: `K >= 0`, `0 <= B <= 1/2`, finite
    /// nonnegative `e^B - 1` and `e^B` (with `B <= 1/2` the entry-by-entry
    /// walk would take its polynomial branch there too). Others walk every
    /// entry one by one.
    pub(super) fn eligible(model: &(LambdaAffine, ExpM1Base, f64)) -> bool {
        let (aff, base, ln_min_normal) = model;
        #[cfg(test)]
        if NO_PLAIN.with(|s| s.get()) {
            return false;
        }
        (0.0..=f64::MAX).contains(&aff.k.0)
            && (0.0..=0.5).contains(&aff.b.0)
            && (0.0..=f64::MAX).contains(&base.em)
            && (0.0..=f64::MAX).contains(&base.e)
            && !ln_min_normal.is_nan()
    }

    /// The cut of one model `(lambda, base, ln_min_normal)` on a set with
    /// `ln S_w <= ell`: none plain unless `ell >= 0` and the model is
    /// [`PlainCut::eligible`]. A model's cut depends on nothing else, so
    /// its sums are the same bits whatever models it is built with.
    pub(super) fn of(model: &(LambdaAffine, ExpM1Base, f64), ell: f64) -> PlainCut {
        if !(0.0..=f64::MAX).contains(&ell) || !PlainCut::eligible(model) {
            return PlainCut {
                d_max: -1.0,
                lw_min: f64::INFINITY,
            };
        }
        let k = model.0.k.0;
        PlainCut {
            d_max: if k > 0.0 {
                D_CAP.min(TAYLOR_MAX / k * BELOW)
            } else {
                D_CAP
            },
            lw_min: model.2,
        }
    }

    /// The entries plain under both cuts (a cut for both models).
    #[cfg(test)]
    fn meet(self, o: PlainCut) -> PlainCut {
        PlainCut {
            d_max: self.d_max.min(o.d_max),
            lw_min: self.lw_min.max(o.lw_min),
        }
    }

    /// The same cut (bit for bit).
    pub(super) fn same(&self, o: &PlainCut) -> bool {
        self.d_max.to_bits() == o.d_max.to_bits() && self.lw_min.to_bits() == o.lw_min.to_bits()
    }

    /// Whether a finite entry with `D_j = d`, `lw_j = lw`, `w_j = w` is
    /// plain (NaN: not).
    #[inline(always)]
    pub(super) fn plain(&self, d: f64, lw: f64, w: f64) -> bool {
        (0.0..=self.d_max).contains(&d) && lw >= self.lw_min && (0.0..=f64::MAX).contains(&w)
    }
}

/// One part of [`Moments`]: the plain entries `j` with `j % 4` its index.
#[derive(Clone, Copy, Debug)]
pub(super) struct MomentPart {
    /// `M_0 .. M_3`.
    pub m: [Hi; 4],
    /// `SD`.
    pub sd: Hi,
    /// How many.
    pub n: u64,
}

impl MomentPart {
    pub(super) const ZERO: MomentPart = MomentPart {
        m: [Hi::ZERO; 4],
        sd: Hi::ZERO,
        n: 0,
    };
}

/// The moments of a row's plain entries (module docs), upper bounds.
#[derive(Clone, Copy, Debug)]
pub(super) struct Moments {
    m: [Hi; 4],
    sd: Hi,
    n: u64,
}

/// The moments over the finite entries of `st.e` that `cut` calls plain
/// (`ew`: their `e^lw`, the finite entries' in order), and, into `exc`
/// (cleared first), `(j, i)` of every other finite entry: its column and
/// its index in `ew`, ascending.
pub(super) fn moments(
    st: &RowStats,
    ew: &[Hi],
    cut: PlainCut,
    exc: &mut Vec<(usize, usize)>,
) -> Moments {
    exc.clear();
    let mut parts = [MomentPart::ZERO; 4];
    let (from, i) = lanes::moments4(st, ew, cut, &mut parts, exc).unwrap_or((0, 0));
    moment_parts(st, ew, cut, from, i, &mut parts, exc);
    let sum =
        |f: fn(&MomentPart) -> Hi| (f(&parts[0]) + f(&parts[1])) + (f(&parts[2]) + f(&parts[3]));
    Moments {
        m: [
            sum(|p| p.m[0]),
            sum(|p| p.m[1]),
            sum(|p| p.m[2]),
            sum(|p| p.m[3]),
        ],
        sd: sum(|p| p.sd),
        n: parts.iter().map(|p| p.n).sum(),
    }
}

/// The entries `j >= from` of [`moments`] into `parts` (`i`: the index in
/// `ew` of the first finite one); the scalar twin of
/// [`super::lanes::moments4`].
fn moment_parts(
    st: &RowStats,
    ew: &[Hi],
    cut: PlainCut,
    from: usize,
    mut i: usize,
    parts: &mut [MomentPart; 4],
    exc: &mut Vec<(usize, usize)>,
) {
    let ln_s_lo = Lo(st.ln_s_w.lo);
    for (j, e) in st.e.iter().enumerate().skip(from) {
        if e.hi == f64::NEG_INFINITY {
            continue;
        }
        let (w, at) = (ew[i], i);
        i += 1;
        let d = mag(e);
        let lw = Hi(e.hi) - ln_s_lo;
        if !cut.plain(d.0, lw.0, w.0) {
            exc.push((j, at));
            continue;
        }
        let p = &mut parts[j % 4];
        let t1 = w * d;
        let t2 = t1 * d;
        let t3 = t2 * d;
        for (m, t) in p.m.iter_mut().zip([w, t1, t2, t3]) {
            *m = *m + t;
        }
        p.sd = p.sd + d;
        p.n += 1;
    }
}

impl Moments {
    /// Whether no entry was plain.
    pub(super) fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// One model's [`LsSums`] over the plain entries (module docs): `aff`
    /// its `lambda`, `base` its [`LambdaAffine::base`], `ell = (ln S_w)^`;
    /// the walk's [`PlainCut`] must be the model's own
    /// ([`PlainCut::of`]) or stricter.
    pub(super) fn sums(&self, aff: &LambdaAffine, base: &ExpM1Base, ell: Hi) -> LsSums {
        let [m0, m1, m2, m3] = self.m;
        let (k, b) = (aff.k, aff.b);
        let (q0, e_b) = (Hi(base.em), Hi(base.e));
        let q1 = e_b * k;
        let q2 = e_b * Hi(TINY_C) * k * k;
        let one_q0 = Hi::ONE + q0;
        LsSums {
            s_dem: q0 * (m1 + ell * m0) + q1 * (m2 + ell * m1) + q2 * (m3 + ell * m2),
            s_em: q0 * m0 + q1 * m1 + q2 * m2,
            s_lam: one_q0 * b * m0
                + (one_q0 * k + q1 * b) * m1
                + (q1 * k + q2 * b) * m2
                + q2 * k * m3,
            fl_d: Hi::ZERO,
            fl_1: Hi::ZERO,
            sdl: (Hi::ONE + k) * self.sd + Hi(self.n as f64) * (ell + b),
        }
    }
}

#[cfg(test)]
thread_local! {
    /// No entry is plain on this thread ([`without_moments`]).
    static NO_PLAIN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `f` with every entry an exception on this thread: the entry-by-entry
/// walk alone, for tests comparing the two ways.
#[cfg(test)]
pub(crate) fn without_moments<R>(f: impl FnOnce() -> R) -> R {
    NO_PLAIN.with(|s| s.set(true));
    let r = f();
    NO_PLAIN.with(|s| s.set(false));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use logprobe_reference::oracle::Interval;
    use logprobe_reference::splitmix::SplitMix64;
    use rug::Float;

    const PREC: u32 = 512;

    fn big(x: f64) -> Float {
        Float::with_val(PREC, x)
    }

    /// A row's entropy-set statistics: shifts `e_j = [-D_j, -D_j + tiny]`
    /// of several magnitudes, some `-inf`, some NaN, and `ln S_w`.
    fn stats(g: &mut SplitMix64, v: usize, spread: f64) -> RowStats {
        let e: Vec<Interval> = (0..v)
            .map(|j| {
                let d = match j % 53 {
                    0 => 0.0,
                    7 => f64::NEG_INFINITY,
                    11 if spread > 100.0 => f64::NAN,
                    13 => 1e35,
                    _ => spread * g.uniform(),
                };
                if d == f64::NEG_INFINITY {
                    return Interval { lo: d, hi: d };
                }
                Interval {
                    lo: -d,
                    hi: -d + d * 1e-16,
                }
            })
            .collect();
        let l = 2.0 + spread.ln().max(0.0);
        RowStats {
            d_t: None,
            s: Interval { lo: 1.0, hi: 1.0 },
            ln_s: Interval {
                lo: l,
                hi: l + 1e-15,
            },
            s_w: Interval { lo: 1.0, hi: 1.0 },
            ln_s_w: Interval {
                lo: l,
                hi: l + 1e-15,
            },
            r: Interval { lo: 0.0, hi: 0.0 },
            m2: Interval { lo: 0.0, hi: 0.0 },
            p: Vec::new(),
            q: Vec::new(),
            e: e.clone(),
            d: e,
        }
    }

    fn ew(st: &RowStats) -> Vec<Hi> {
        st.e.iter()
            .filter(|e| e.hi != f64::NEG_INFINITY)
            .map(|e| (Hi(e.hi) - Lo(st.ln_s_w.lo)).exp())
            .collect()
    }

    fn models() -> Vec<(LambdaAffine, ExpM1Base, f64)> {
        [(3e-7, 2e-5), (1e-7, 1e-3), (2.5e-6, 9e-3), (0.0, 0.0)]
            .into_iter()
            .zip([-87.3, -87.3, -9.7, -708.0])
            .map(|((k, b), lmn)| {
                let aff = LambdaAffine { k: Hi(k), b: Hi(b) };
                (aff, aff.base(), lmn)
            })
            .collect()
    }

    /// A cut for every model of `ms` (their own cuts met).
    fn common(ms: &[(LambdaAffine, ExpM1Base, f64)], ell: f64) -> PlainCut {
        ms.iter()
            .map(|m| PlainCut::of(m, ell))
            .reduce(PlainCut::meet)
            .expect("a model")
    }

    /// The moments are the same bits with and without the lanes, the
    /// exceptions the same list; every plain entry meets the cut's
    /// promises exactly (`K D <= 2^-16` under every model, no flush).
    #[test]
    fn four_lane_moments_equal_the_scalar_moments() {
        let mut g = SplitMix64::new(3);
        let ms = models();
        for (v, spread) in [(1001, 30.0), (4096, 300.0), (7, 5.0), (3, 1.0)] {
            let st = stats(&mut g, v, spread);
            let w = ew(&st);
            let ell = st.ln_s_w.hi;
            let cut = common(&ms, ell);
            let (mut ev, mut es) = (Vec::new(), Vec::new());
            let mv = moments(&st, &w, cut, &mut ev);
            let msc = lanes::scalar(|| moments(&st, &w, cut, &mut es));
            assert_eq!(format!("{mv:?}"), format!("{msc:?}"), "v {v}");
            assert_eq!(ev, es, "v {v}");
            let n_fin = st.e.iter().filter(|e| e.hi != f64::NEG_INFINITY).count();
            assert_eq!(mv.n as usize + ev.len(), n_fin);
            for (j, e) in st.e.iter().enumerate() {
                if e.hi == f64::NEG_INFINITY || ev.iter().any(|x| x.0 == j) {
                    continue;
                }
                let d = big(-e.lo);
                for (aff, _, lmn) in &ms {
                    assert!(big(aff.k.0) * &d <= big(TAYLOR_MAX), "j {j}");
                    let lam = aff.at(Hi(-e.lo));
                    assert!(((Hi(e.hi) - Lo(st.ln_s_w.lo)) + lam).0 >= *lmn, "j {j}");
                }
            }
        }
    }

    /// Each model's sums from the moments bound from above the exact real
    /// sums, entry by entry in 512-bit arithmetic, of the module docs'
    /// polynomials over the plain entries, and within `1e-10` of them.
    #[test]
    fn moment_sums_bound_the_exact_polynomial_sums() {
        let mut g = SplitMix64::new(9);
        let ms = models();
        for (v, spread) in [(3001, 30.0), (2000, 300.0), (64, 0.5)] {
            let st = stats(&mut g, v, spread);
            let w = ew(&st);
            let ell = Hi(st.ln_s_w.hi);
            let cut = common(&ms, ell.0);
            let mut exc = Vec::new();
            let mo = moments(&st, &w, cut, &mut exc);
            assert!(mo.n > 0);
            for (aff, base, _) in &ms {
                let s = mo.sums(aff, base, ell);
                let (k, b) = (big(aff.k.0), big(aff.b.0));
                let c = big(TINY_C);
                let (q0, eb) = (big(base.em), big(base.e));
                let zero = || big(0.0);
                let (mut s_em, mut s_dem, mut s_lam, mut sdl) = (zero(), zero(), zero(), zero());
                let mut i = 0;
                for (j, e) in st.e.iter().enumerate() {
                    if e.hi == f64::NEG_INFINITY {
                        continue;
                    }
                    i += 1;
                    if exc.iter().any(|x| x.0 == j) {
                        continue;
                    }
                    let (d, wj) = (big(-e.lo), big(w[i - 1].0));
                    let kd = k.clone() * &d;
                    let p = q0.clone() + eb.clone() * (kd.clone() + c.clone() * kd.clone() * &kd);
                    let lam = b.clone() + &kd;
                    let dl = d.clone() + big(ell.0);
                    s_em += wj.clone() * &p;
                    s_dem += dl.clone() * &wj * &p;
                    s_lam += wj * (big(1.0) + &p) * &lam;
                    sdl += dl + lam;
                }
                for (name, got, exact) in [
                    ("s_em", s.s_em, s_em),
                    ("s_dem", s.s_dem, s_dem),
                    ("s_lam", s.s_lam, s_lam),
                    ("sdl", s.sdl, sdl),
                ] {
                    let got = big(got.0);
                    assert!(got >= exact, "{name} v {v}: {got} < {exact}");
                    let tight = exact.clone() * big(1.0 + 1e-10) + big(1e-300);
                    assert!(got <= tight, "{name} v {v}: {got} vs {exact}");
                }
                assert_eq!((s.fl_d.0, s.fl_1.0), (0.0, 0.0));
            }
        }
    }

    /// No plain entry when a precondition fails (a negative or large `B`,
    /// a negative `ell`, a NaN or negative `K`).
    #[test]
    fn no_plain_entries_outside_the_preconditions() {
        for m in models() {
            assert!(PlainCut::of(&m, 3.0).d_max > 0.0);
            assert!(PlainCut::of(&m, -1.0).d_max < 0.0);
        }
        for (k, b) in [(1e-7, -1e-9), (1e-7, 0.75), (f64::NAN, 1e-3), (-1e-7, 1e-3)] {
            let aff = LambdaAffine { k: Hi(k), b: Hi(b) };
            assert!(
                PlainCut::of(&(aff, aff.base(), -87.0), 3.0).d_max < 0.0,
                "k {k} b {b}"
            );
        }
    }
}
