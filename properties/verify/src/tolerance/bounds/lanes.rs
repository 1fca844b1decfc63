//! Per-entry work in the four f64 lanes of one AVX2 vector: the
//! log-softmax entropy sums (T12, T13) of up to four models over a row's
//! exceptional entries ([`sums4`], lane `i` model `i`, the vector twin of
//! the entry-by-entry walk `super::entry_terms`), the row's moments
//! ([`moments4`], four entries a vector, the twin of `moments`'s scalar
//! walk) and the entropy set's sums ([`entropy4`], likewise). Every lane
//! runs the same IEEE operations in the same order as the scalar code,
//! each widened by the same step as [`crate::tolerance::upward`] (`x +
//! (|x| 4 eps + 2^-1074)`, no fused multiply-add), so the results are the
//! same bits either way (tests `four_lane_walks_equal_the_scalar_walks`,
//! `four_lane_moments_equal_the_scalar_moments`). What a lane cannot do
//! in a vector (libm `expm1` and `exp` outside the polynomials' ranges) it
//! does in scalar, as the scalar code does.

use logprobe_reference::oracle::{Interval, RowStats};

use super::moments::{MomentPart, PlainCut};
use super::{Consts, EntropyPart, Hi, LsSums, SetBounds};
use crate::tolerance::upward::ExpM1Base;

pub(crate) use logprobe_reference::simd::available;
#[cfg(test)]
pub(crate) use logprobe_reference::simd::scalar;

/// The [`LsSums`] of the models `cs` (1 to 4, each with its entropy set
/// bounds `ws`) over the entries `at` of `st.e`, `(j, i)`: column `j`
/// (finite), `ew[i]` its `e^lw` ([`super::EntropyShared::ew`]). `None` when
/// the CPU has no AVX2 ([`available`]) or there are more than four models.
pub(super) fn sums4(
    cs: &[&Consts],
    ws: &[SetBounds],
    st: &RowStats,
    ew: &[Hi],
    at: &[(usize, usize)],
) -> Option<Vec<LsSums>> {
    if cs.is_empty() || cs.len() > 4 || cs.len() != ws.len() || !available() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: AVX2 is present (checked above).
        Some(unsafe { x86::sums4(cs, ws, st, ew, at) })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (st, ew, at);
        None
    }
}

/// [`super::moments::moments`]'s four parts over the entries `j < 4
/// floor(V / 4)` of `st.e`, four entries a vector (entry `j` in lane `j %
/// 4`, the same bits as the scalar walk), added into `parts`, the
/// exceptions `(j, i)` pushed to `exc` in order; `(from, i)`: the first
/// entry left and its index in `ew`. `None` (nothing done) without AVX2.
pub(super) fn moments4(
    st: &RowStats,
    ew: &[Hi],
    cut: PlainCut,
    parts: &mut [MomentPart; 4],
    exc: &mut Vec<(usize, usize)>,
) -> Option<(usize, usize)> {
    if !available() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: AVX2 is present (checked above).
        Some(unsafe { x86::moments4(st, ew, cut, parts, exc) })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (st, ew, cut, parts, exc);
        None
    }
}

/// [`super::entropy_all`]'s four parts over the shifts `es` `[V]` (of a
/// set with `ln S >= ln_s_lo`), entries `j < 4 floor(V / 4)`, four
/// entries a vector (entry `j` in lane `j % 4`, the same bits as
/// [`super::entropy_parts`]), added into `parts`; `(from,
/// i)`: the first entry left and its index in `ew`. `None` (nothing
/// done) without AVX2.
pub(super) fn entropy4(
    c: &Consts,
    es: &[Interval],
    ln_s_lo: f64,
    ew: &[Hi],
    base: &ExpM1Base,
    parts: &mut [EntropyPart; 4],
) -> Option<(usize, usize)> {
    if !available() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: AVX2 is present (checked above).
        Some(unsafe { x86::entropy4(c, es, ln_s_lo, ew, base, parts) })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (c, es, ln_s_lo, ew, base, parts);
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

    use logprobe_reference::oracle::{Interval, RowStats};

    use super::super::moments::{MomentPart, PlainCut};
    use super::super::{Consts, EntropyPart, Hi, LambdaAffine, Lo, LsSums, SetBounds};
    use super::per_model;
    use crate::tolerance::upward::ExpM1Base;
    use crate::tolerance::upward::{QUANTUM, SAFETY, TAYLOR_MAX, TINY_C};

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

    /// [`Hi::exp_m1_tiny`], per lane (for `0 <= x <= 2^-16`).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn tiny(x: __m256d) -> __m256d {
        add(x, mul(mul(x, x), splat(TINY_C)))
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
        at: &[(usize, usize)],
    ) -> Vec<LsSums> {
        let n = cs.len();
        // Each lane's lambda, `k |d| + b`, and its base (as the scalar walk).
        let affs: Vec<LambdaAffine> = cs
            .iter()
            .zip(ws)
            .map(|(c, w)| LambdaAffine::new(c, w))
            .collect();
        let bases: Vec<ExpM1Base> = affs.iter().map(LambdaAffine::base).collect();
        let lam_k = load(&per_model(&affs, |a| a.k.0));
        let lam_b = load(&per_model(&affs, |a| a.b.0));
        let lmn = load(&per_model(cs, |c| c.ln_min_normal));
        let base_b = load(&per_model(&bases, |b| b.b));
        let base_em = load(&per_model(&bases, |b| b.em));
        let base_e = load(&per_model(&bases, |b| b.e));
        let zero = _mm256_setzero_pd();
        let (mut s_dem, mut s_em, mut s_lam, mut fl_d, mut fl_1, mut sdl) =
            (zero, zero, zero, zero, zero, zero);
        let ell = Hi(st.ln_s_w.hi);
        for &(j, i) in at {
            let e = &st.e[j];
            let elw = ew[i];
            // The model-independent terms, as the scalar walk computes them.
            let d_abs = Hi(-e.lo);
            let lw = Hi(e.hi) - Lo(st.ln_s_w.lo);
            let dl = d_abs + ell;
            let (d_abs_v, lw_v, dl_v, elw_v) =
                (splat(d_abs.0), splat(lw.0), splat(dl.0), splat(elw.0));
            // lambda_j (LambdaAffine::at).
            let lam = add(mul(lam_k, d_abs_v), lam_b);
            // expm1(lambda) as ExpM1Base::exp_m1 where a polynomial
            // applies; else per lane as the scalar walk.
            let (em, ok) = exp_m1_base(lam, base_b, base_em, base_e);
            let lw_lam = add(lw_v, lam);
            let mut wl = mul(elw_v, em);
            let mut wel = mul(elw_v, add(splat(1.0), em));
            let off = !_mm256_movemask_pd(ok) & 0b1111;
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
            sdl = add(sdl, add(dl_v, lam));
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

    /// `expm1(x)` as [`ExpM1Base::exp_m1`] where its two polynomial
    /// branches apply (the tiny polynomial where `0 <= x <= 2^-16`; where
    /// `2^-16 < x <= 1` and `0 <= delta = x - b <= 2^-16`, the base's
    /// `(e^b - 1) + e^b (e^delta - 1)`, one polynomial a lane), and the mask of
    /// those lanes (the others are left to the scalar code).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn exp_m1_base(x: __m256d, b: __m256d, em: __m256d, e: __m256d) -> (__m256d, __m256d) {
        let in_poly = in_taylor(x);
        let delta = up(_mm256_sub_pd(x, b));
        let in_shift = _mm256_and_pd(
            _mm256_and_pd(
                _mm256_cmp_pd::<_CMP_GT_OQ>(x, splat(TAYLOR_MAX)),
                _mm256_cmp_pd::<_CMP_LE_OQ>(x, splat(1.0)),
            ),
            in_taylor(delta),
        );
        let t = tiny(_mm256_blendv_pd(x, delta, in_shift));
        let v = _mm256_blendv_pd(t, add(em, mul(e, t)), in_shift);
        (v, _mm256_or_pd(in_poly, in_shift))
    }

    /// `acc + x` in the lanes of `m`, `acc` elsewhere.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn add_in(acc: __m256d, x: __m256d, m: __m256d) -> __m256d {
        _mm256_blendv_pd(acc, add(acc, x), m)
    }

    /// Entries `j .. j + 4` of `es`: their `lo` and `hi` lanes, which are
    /// finite (`hi > -inf`, as bits), the finite lanes' `e^lw` (the next
    /// items of `ew` from `*i`, which advances past them; 0 elsewhere) and
    /// their indices in `ew`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn block4(
        es: &[Interval],
        ew: &[Hi],
        j: usize,
        i: &mut usize,
    ) -> (__m256d, __m256d, i32, __m256d, [usize; 4]) {
        let e = &es[j..j + 4];
        let lo = _mm256_set_pd(e[3].lo, e[2].lo, e[1].lo, e[0].lo);
        let hi = _mm256_set_pd(e[3].hi, e[2].hi, e[1].hi, e[0].hi);
        let fin_bits =
            _mm256_movemask_pd(_mm256_cmp_pd::<_CMP_NEQ_UQ>(hi, splat(f64::NEG_INFINITY)));
        let mut at = [0usize; 4];
        let w = if fin_bits == 0b1111 {
            let w = &ew[*i..*i + 4];
            at = [*i, *i + 1, *i + 2, *i + 3];
            *i += 4;
            _mm256_set_pd(w[3].0, w[2].0, w[1].0, w[0].0)
        } else {
            let mut w = [0.0; 4];
            for (l, w) in w.iter_mut().enumerate() {
                if fin_bits & (1 << l) != 0 {
                    *w = ew[*i].0;
                    at[l] = *i;
                    *i += 1;
                }
            }
            load(&w)
        };
        (lo, hi, fin_bits, w, at)
    }

    /// See [`super::moments4`].
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn moments4(
        st: &RowStats,
        ew: &[Hi],
        cut: PlainCut,
        parts: &mut [MomentPart; 4],
        exc: &mut Vec<(usize, usize)>,
    ) -> (usize, usize) {
        let es = &st.e;
        let get = |f: &dyn Fn(&MomentPart) -> Hi| load(&std::array::from_fn(|l| f(&parts[l]).0));
        let mut m = [
            get(&|p| p.m[0]),
            get(&|p| p.m[1]),
            get(&|p| p.m[2]),
            get(&|p| p.m[3]),
        ];
        let mut sd = get(&|p| p.sd);
        let mut n = [0u64; 4];
        let ln_s_lo = splat(st.ln_s_w.lo);
        let (zero, d_max, lw_min, big) = (
            _mm256_setzero_pd(),
            splat(cut.d_max),
            splat(cut.lw_min),
            splat(f64::MAX),
        );
        let n4 = es.len() / 4 * 4;
        let mut i = 0usize;
        for j in (0..n4).step_by(4) {
            let (lo, hi, fin_bits, w, at) = block4(es, ew, j, &mut i);
            if fin_bits == 0 {
                continue;
            }
            let d = _mm256_xor_pd(lo, splat(-0.0));
            let lw = up(_mm256_sub_pd(hi, ln_s_lo));
            // PlainCut::plain, per lane (NaN compares false).
            let plain = _mm256_and_pd(
                _mm256_and_pd(
                    _mm256_cmp_pd::<_CMP_GE_OQ>(d, zero),
                    _mm256_cmp_pd::<_CMP_LE_OQ>(d, d_max),
                ),
                _mm256_and_pd(
                    _mm256_cmp_pd::<_CMP_GE_OQ>(lw, lw_min),
                    _mm256_and_pd(
                        _mm256_cmp_pd::<_CMP_GE_OQ>(w, zero),
                        _mm256_cmp_pd::<_CMP_LE_OQ>(w, big),
                    ),
                ),
            );
            let plain_bits = _mm256_movemask_pd(plain) & fin_bits;
            if plain_bits != fin_bits {
                for (l, &at) in at.iter().enumerate() {
                    if fin_bits & !plain_bits & (1 << l) != 0 {
                        exc.push((j + l, at));
                    }
                }
            }
            if plain_bits == 0 {
                continue;
            }
            let plain = _mm256_castsi256_pd(_mm256_cmpeq_epi64(
                _mm256_and_si256(
                    _mm256_set1_epi64x(i64::from(plain_bits)),
                    _mm256_setr_epi64x(1, 2, 4, 8),
                ),
                _mm256_setr_epi64x(1, 2, 4, 8),
            ));
            let t1 = mul(w, d);
            let t2 = mul(t1, d);
            let t3 = mul(t2, d);
            m[0] = add_in(m[0], w, plain);
            m[1] = add_in(m[1], t1, plain);
            m[2] = add_in(m[2], t2, plain);
            m[3] = add_in(m[3], t3, plain);
            sd = add_in(sd, d, plain);
            for (l, n) in n.iter_mut().enumerate() {
                *n += u64::from(plain_bits & (1 << l) != 0);
            }
        }
        let (m, sd) = (m.map(|x| lanes(x)), lanes(sd));
        for (l, p) in parts.iter_mut().enumerate() {
            p.m = std::array::from_fn(|k| Hi(m[k][l]));
            p.sd = Hi(sd[l]);
            p.n += n[l];
        }
        (n4, i)
    }

    /// See [`super::entropy4`].
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn entropy4(
        c: &Consts,
        es: &[Interval],
        ln_s_lo: f64,
        ew: &[Hi],
        base: &ExpM1Base,
        parts: &mut [EntropyPart; 4],
    ) -> (usize, usize) {
        let (a, b, lmn) = (splat(c.a.0), splat(c.b.0), splat(c.ln_min_normal));
        let (base_b, base_em, base_e) = (splat(base.b), splat(base.em), splat(base.e));
        let get = |f: fn(&EntropyPart) -> Hi| load(&std::array::from_fn(|l| f(&parts[l]).0));
        let (mut e1, mut fl, mut e2, mut fl2, mut sd) = (
            get(|p| p.e1),
            get(|p| p.fl),
            get(|p| p.e2),
            get(|p| p.fl2),
            get(|p| p.sd),
        );
        let neg_inf = splat(f64::NEG_INFINITY);
        let n4 = es.len() / 4 * 4;
        let mut i = 0usize;
        for j in (0..n4).step_by(4) {
            let (lo, hi, fin_bits, elw, _) = block4(es, ew, j, &mut i);
            if fin_bits == 0 {
                continue;
            }
            let fin = _mm256_cmp_pd::<_CMP_NEQ_UQ>(hi, neg_inf);
            let d = _mm256_xor_pd(lo, splat(-0.0));
            let lw = up(_mm256_sub_pd(hi, splat(ln_s_lo)));
            let alpha = add(mul(a, d), b);
            let (em, ok) = exp_m1_base(alpha, base_b, base_em, base_e);
            let mut wm = mul(elw, em);
            let off = !_mm256_movemask_pd(ok) & fin_bits;
            if off != 0 {
                // Outside the polynomials: one by one, as the scalar code.
                let (alpha_a, lw_a, elw_a) = (lanes(alpha), lanes(lw), lanes(elw));
                let mut wm_a = lanes(wm);
                for l in 0..4 {
                    if off & (1 << l) == 0 {
                        continue;
                    }
                    let alpha = Hi(alpha_a[l]);
                    wm_a[l] = if alpha.0 <= 1.0 {
                        (Hi(elw_a[l]) * base.exp_m1(alpha)).0
                    } else {
                        (Hi(lw_a[l]) + alpha).exp().0
                    };
                }
                wm = load(&wm_a);
            }
            e1 = add_in(e1, wm, fin);
            e2 = add_in(e2, mul(d, wm), fin);
            sd = add_in(sd, d, fin);
            let flush = _mm256_and_pd(_mm256_cmp_pd::<_CMP_LT_OQ>(add(hi, alpha), lmn), fin);
            if _mm256_movemask_pd(flush) != 0 {
                let (alpha_a, lw_a) = (lanes(alpha), lanes(lw));
                let we: [f64; 4] = std::array::from_fn(|l| (Hi(lw_a[l]) + Hi(alpha_a[l])).exp().0);
                let we = load(&we);
                fl = add_in(fl, we, flush);
                fl2 = add_in(fl2, mul(d, we), flush);
            }
        }
        let (e1, fl, e2, fl2, sd) = (lanes(e1), lanes(fl), lanes(e2), lanes(fl2), lanes(sd));
        for (l, p) in parts.iter_mut().enumerate() {
            *p = EntropyPart {
                e1: Hi(e1[l]),
                fl: Hi(fl[l]),
                e2: Hi(e2[l]),
                fl2: Hi(fl2[l]),
                sd: Hi(sd[l]),
            };
        }
        (n4, i)
    }
}
