//! Per-entry work of up to four models in the four f64 lanes of one AVX2
//! vector: the log-softmax entropy sums (T12, T13) of a row ([`sums4`],
//! the vector twin of [`super::logsoftmax_sums`]). Lane `i` is model `i`,
//! and every lane runs the same IEEE operations in the same order as the
//! scalar code, each widened by the same step as
//! [`crate::tolerance::upward`] (`x + (|x| 4 eps + 2^-1074)`, no fused
//! multiply-add), so each model's results are the same bits either way
//! (test `four_lane_walks_equal_the_scalar_walks`). What a lane cannot do
//! in a vector (libm `expm1` and `exp` outside the polynomials' ranges) it
//! does in scalar, as the scalar code does.

use logprobe_reference::oracle::RowStats;

use super::{Consts, Hi, LsSums, SetBounds};

pub(crate) use logprobe_reference::simd::available;
#[cfg(test)]
pub(crate) use logprobe_reference::simd::scalar;

/// The [`LsSums`] of the models `cs` (1 to 4, each with its entropy set
/// bounds `ws`) over every entry of `st.e` one by one (no groups), `ew`
/// the entries' `e^lw` ([`super::EntropyShared::ew`]). `None` when the
/// CPU has no AVX2 ([`available`]) or there are more than four models.
pub(super) fn sums4(
    cs: &[&Consts],
    ws: &[SetBounds],
    st: &RowStats,
    ew: &[Hi],
) -> Option<Vec<LsSums>> {
    if cs.is_empty() || cs.len() > 4 || cs.len() != ws.len() || !available() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: AVX2 is present (checked above).
        Some(unsafe { x86::sums4(cs, ws, st, ew) })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (st, ew);
        None
    }
}

/// Per lane, item `min(i, n - 1)`'s field `f` (the padding lanes repeat
/// the last item; their results are dropped).
fn per_model<T>(items: &[T], f: impl Fn(&T) -> f64) -> [f64; 4] {
    std::array::from_fn(|i| f(&items[i.min(items.len() - 1)]))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use logprobe_reference::simd::x86::{lanes, load, splat};

    use logprobe_reference::oracle::RowStats;

    use super::super::{lambda_base, Consts, Hi, Lo, LsSums, SetBounds};
    use super::per_model;
    use crate::tolerance::upward::ExpM1Base;
    use crate::tolerance::upward::{QUANTUM, SAFETY, TAYLOR_MAX};

    /// `1/6` rounded up (as [`Hi::exp_m1`]).
    const SIXTH_UP: f64 = 0.166_666_666_666_666_69;

    /// [`crate::tolerance::upward`]'s `up`, per lane.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn up(x: __m256d) -> __m256d {
        let abs = _mm256_andnot_pd(_mm256_set1_pd(-0.0), x);
        _mm256_add_pd(
            _mm256_add_pd(x, _mm256_mul_pd(abs, _mm256_set1_pd(SAFETY))),
            _mm256_set1_pd(QUANTUM),
        )
    }

    /// `Hi + Hi`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn add(a: __m256d, b: __m256d) -> __m256d {
        up(_mm256_add_pd(a, b))
    }

    /// `Hi * Hi`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn mul(a: __m256d, b: __m256d) -> __m256d {
        up(_mm256_mul_pd(a, b))
    }

    /// [`Hi::exp_m1`]'s polynomial, per lane (for `0 <= x <= 2^-16`).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn taylor(x: __m256d) -> __m256d {
        add(
            x,
            mul(
                mul(x, x),
                add(
                    splat(0.5),
                    mul(x, add(splat(SIXTH_UP), mul(x, splat(0.0625)))),
                ),
            ),
        )
    }

    /// The lanes with `0 <= x <= 2^-16` (the polynomial's range).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn in_taylor(x: __m256d) -> __m256d {
        _mm256_and_pd(
            _mm256_cmp_pd::<_CMP_GE_OQ>(x, _mm256_setzero_pd()),
            _mm256_cmp_pd::<_CMP_LE_OQ>(x, splat(TAYLOR_MAX)),
        )
    }

    /// See [`super::sums4`].
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn sums4(
        cs: &[&Consts],
        ws: &[SetBounds],
        st: &RowStats,
        ew: &[Hi],
    ) -> Vec<LsSums> {
        let n = cs.len();
        let a_lp = load(&per_model(cs, |c| c.a_lp.0));
        let b_lp = load(&per_model(cs, |c| c.b_lp.0));
        let u = load(&per_model(cs, |c| c.u.0));
        // `Hi::ONE + u`, as `Consts::lambda` evaluates it.
        let one_u = add(splat(1.0), u);
        let lmn = load(&per_model(cs, |c| c.ln_min_normal));
        let lse_err = load(&per_model(ws, |w| w.lse_err.0));
        let ln_s_hi = load(&per_model(ws, |w| w.ln_s.hi));
        // Each lane's base of lambda (`ExpM1Base`, as the scalar walk).
        let bases: Vec<ExpM1Base> = cs.iter().zip(ws).map(|(c, w)| lambda_base(c, w)).collect();
        let base_b = load(&per_model(&bases, |b| b.b));
        let base_em = load(&per_model(&bases, |b| b.em));
        let base_e = load(&per_model(&bases, |b| b.e));
        let zero = _mm256_setzero_pd();
        let (mut s_dem, mut s_em, mut s_lam, mut fl_d, mut fl_1, mut sdl) =
            (zero, zero, zero, zero, zero, zero);
        let ell = Hi(st.ln_s_w.hi);
        let mut i = 0usize;
        for e in &st.e {
            if e.hi == f64::NEG_INFINITY {
                continue;
            }
            let elw = ew[i];
            i += 1;
            // The model-independent terms, as the scalar walk computes them.
            let d_abs = Hi(-e.lo);
            let lw = Hi(e.hi) - Lo(st.ln_s_w.lo);
            let dl = d_abs + ell;
            let (d_abs_v, lw_v, dl_v, elw_v) =
                (splat(d_abs.0), splat(lw.0), splat(dl.0), splat(elw.0));
            // lambda_j (Consts::lambda).
            let lp_abs = add(d_abs_v, ln_s_hi);
            let pre = add(add(mul(a_lp, d_abs_v), b_lp), lse_err);
            let lam = add(mul(pre, one_u), mul(u, lp_abs));
            // expm1(lambda) as ExpM1Base::exp_m1: the polynomial of
            // Hi::exp_m1 where 0 <= lambda <= 2^-16; where 2^-16 < lambda
            // <= 1 and 0 <= delta = lambda - b <= 2^-16, the base's
            // (e^b - 1) + e^b (e^delta - 1); else per lane as the scalar walk.
            let in_poly = in_taylor(lam);
            let delta = up(_mm256_sub_pd(lam, base_b));
            let in_shift = _mm256_and_pd(
                _mm256_and_pd(
                    _mm256_cmp_pd::<_CMP_GT_OQ>(lam, splat(TAYLOR_MAX)),
                    _mm256_cmp_pd::<_CMP_LE_OQ>(lam, splat(1.0)),
                ),
                in_taylor(delta),
            );
            // One polynomial a lane: of delta where shifted, else of lambda.
            let t = taylor(_mm256_blendv_pd(lam, delta, in_shift));
            let em = _mm256_blendv_pd(t, add(base_em, mul(base_e, t)), in_shift);
            let lw_lam = add(lw_v, lam);
            let mut wl = mul(elw_v, em);
            let mut wel = mul(elw_v, add(splat(1.0), em));
            let off = !_mm256_movemask_pd(_mm256_or_pd(in_poly, in_shift)) & 0b1111;
            if off != 0 {
                // The lanes outside the polynomial's range, one by one
                // (rebuilt with `set`, not through memory: no stall on the sums).
                let (lam_a, lw_lam_a) = (lanes(lam), lanes(lw_lam));
                let (mut wl_a, mut wel_a) = (lanes(wl), lanes(wel));
                for l in 0..4 {
                    if off & (1 << l) == 0 {
                        continue;
                    }
                    let lam = Hi(lam_a[l]);
                    if lam.0 <= 1.0 {
                        let em = bases[l.min(n - 1)].exp_m1(lam);
                        wl_a[l] = (elw * em).0;
                        wel_a[l] = (elw * (Hi::ONE + em)).0;
                    } else {
                        let x = Hi(lw_lam_a[l]).exp();
                        wl_a[l] = x.0;
                        wel_a[l] = x.0;
                    }
                }
                wl = _mm256_set_pd(wl_a[3], wl_a[2], wl_a[1], wl_a[0]);
                wel = _mm256_set_pd(wel_a[3], wel_a[2], wel_a[1], wel_a[0]);
            }
            s_dem = add(s_dem, mul(dl_v, wl));
            s_em = add(s_em, wl);
            s_lam = add(s_lam, mul(wel, lam));
            sdl = add(add(sdl, dl_v), lam);
            let flush = _mm256_cmp_pd::<_CMP_LT_OQ>(lw_lam, lmn);
            if _mm256_movemask_pd(flush) != 0 {
                fl_d = _mm256_blendv_pd(fl_d, add(fl_d, mul(dl_v, wel)), flush);
                fl_1 = _mm256_blendv_pd(fl_1, add(fl_1, wel), flush);
            }
        }
        let (s_dem, s_em, s_lam, fl_d, fl_1, sdl) = (
            lanes(s_dem),
            lanes(s_em),
            lanes(s_lam),
            lanes(fl_d),
            lanes(fl_1),
            lanes(sdl),
        );
        (0..n)
            .map(|l| LsSums {
                s_dem: Hi(s_dem[l]),
                s_em: Hi(s_em[l]),
                s_lam: Hi(s_lam[l]),
                fl_d: Hi(fl_d[l]),
                fl_1: Hi(fl_1[l]),
                sdl: Hi(sdl[l]),
            })
            .collect()
    }
}
