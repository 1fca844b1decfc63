//! Four plain VJP elements (F7') at a time in the four f64 lanes of one
//! AVX2 vector: the a-priori enclosure ([`super::grad`]'s
//! `element_point`), the decision (F8) in the target dtype
//! ([`super::decide`]) and the decided value's offset (`Exact::new`).
//! Lane `l` is element `j + l`, and every lane runs the same IEEE
//! operations in the same order as the scalar code (no fused multiply-add;
//! the directed sums by the same TwoSum and the same `next_up` /
//! `next_down` on the bits; bf16 / f16 rounding by the same bit step), so
//! each element's `Exact` is the same bits either way (unit tests
//! `four_lanes_equal_the_scalar_*`). What a lane cannot do in a vector
//! (bf16 / f16 rounding of a value below the dtype's normal range) it does
//! in scalar, by the scalar code.
//!
//! Why it pays: the scalar element's decision and offsets branch on the
//! sign of TwoSum's rounding error (about half the elements each way: a
//! mispredicted branch per element and end), and its dependent chain of
//! about 30 operations runs one element at a time.

use crate::interval::Interval;
use crate::spec::Dtype;

use super::grad::PointForm;

pub(super) use crate::simd::available;
#[cfg(test)]
pub(crate) use crate::simd::scalar;

/// Four plain elements' results, lane `l` for element `j + l`: the
/// enclosure `[lo, hi]` ((F7')), and, where `decided` (bit `l`), the
/// correctly rounded value and the offset `[olo, ohi]` of `Exact::new`
/// (meaningful where `finite`, bit `l`: the rounded value and both ends
/// finite; otherwise the offset is unknown).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Block {
    pub lo: [f64; 4],
    pub hi: [f64; 4],
    pub rounded: [f64; 4],
    pub olo: [f64; 4],
    pub ohi: [f64; 4],
    pub decided: u8,
    pub finite: u8,
}

impl Block {
    /// Lane `l`'s enclosure.
    #[inline(always)]
    pub fn enclosure(&self, l: usize) -> Interval {
        Interval {
            lo: self.lo[l],
            hi: self.hi[l],
        }
    }
}

/// The four plain elements `j..j + 4` from their cached `a^`, `r` and
/// exactness (each slice at least 4 long; only the first 4 read), decided
/// in `target`. `None` when the CPU has no AVX2 ([`available`]).
#[inline]
pub(super) fn plain4(
    pt: &PointForm,
    a: &[f64],
    r: &[f64],
    exact: &[bool],
    with_q: bool,
    target: Dtype,
) -> Option<Block> {
    let (a, r, exact) = (a.get(..4)?, r.get(..4)?, exact.get(..4)?);
    #[cfg(target_arch = "x86_64")]
    {
        if !available() {
            return None;
        }
        let a: &[f64; 4] = a.try_into().ok()?;
        let r: &[f64; 4] = r.try_into().ok()?;
        let exact: [bool; 4] = exact.try_into().ok()?;
        // SAFETY: AVX2 is present (checked above).
        Some(unsafe { x86::plain4(pt, a, r, exact, with_q, target) })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (pt, a, r, exact, with_q, target);
        None
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::simd::x86::*;

    use super::super::decide::round_to;
    use super::super::grad::{PointForm, CE};
    use super::super::pass::C1;
    use super::Block;
    use crate::interval::{TINY, U};
    use crate::spec::Dtype;

    /// `f64::next_up` per lane, on the bits as the standard library does:
    /// NaN and `+inf` unchanged, `+-0` to the smallest subnormal, else one
    /// step up in magnitude (positive) or down (negative).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn next_up(x: __m256d) -> __m256d {
        let b = bits(x);
        let one = _mm256_set1_epi64x(1);
        let negative = _mm256_cmpgt_epi64(_mm256_setzero_si256(), b);
        let stepped = select(
            float(negative),
            float(_mm256_sub_epi64(b, one)),
            float(_mm256_add_epi64(b, one)),
        );
        let abs_b = _mm256_and_si256(b, _mm256_set1_epi64x(i64::MAX));
        let zero = _mm256_cmpeq_epi64(abs_b, _mm256_setzero_si256());
        let stepped = select(float(zero), float(one), stepped);
        let keep = _mm256_or_pd(
            _mm256_cmp_pd::<_CMP_UNORD_Q>(x, x),
            _mm256_cmp_pd::<_CMP_EQ_OQ>(x, splat(f64::INFINITY)),
        );
        select(keep, x, stepped)
    }

    /// `f64::next_down` per lane: `-next_up(-x)` (the same bits as the
    /// standard library's, case by case: NaN and `-inf` unchanged, `+-0`
    /// to `-2^-1074`, `+inf` to `MAX`).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn next_down(x: __m256d) -> __m256d {
        neg(next_up(neg(x)))
    }

    /// `(s, e)` of TwoSum (`crate::interval::two_sum`), per lane.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn two_sum(a: __m256d, b: __m256d) -> (__m256d, __m256d) {
        let s = add(a, b);
        let bb = sub(s, a);
        let e = add(sub(a, sub(s, bb)), sub(b, bb));
        (s, e)
    }

    /// Lanes where `x` is finite (not NaN, not infinite).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn finite(x: __m256d) -> __m256d {
        _mm256_cmp_pd::<_CMP_LT_OQ>(abs(x), splat(f64::INFINITY))
    }

    /// `add_dn(a, b)` (`crate::interval`), per lane.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn add_dn(a: __m256d, b: __m256d) -> __m256d {
        let (s, e) = two_sum(a, b);
        let overflow = _mm256_and_pd(
            _mm256_cmp_pd::<_CMP_EQ_OQ>(s, splat(f64::INFINITY)),
            _mm256_and_pd(finite(a), finite(b)),
        );
        let other = select(overflow, splat(f64::MAX), s);
        select(
            _mm256_cmp_pd::<_CMP_LT_OQ>(e, _mm256_setzero_pd()),
            next_down(s),
            other,
        )
    }

    /// `add_up(a, b)` (`crate::interval`), per lane.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn add_up(a: __m256d, b: __m256d) -> __m256d {
        let (s, e) = two_sum(a, b);
        let overflow = _mm256_and_pd(
            _mm256_cmp_pd::<_CMP_EQ_OQ>(s, splat(f64::NEG_INFINITY)),
            _mm256_and_pd(finite(a), finite(b)),
        );
        let other = select(overflow, splat(f64::MIN), s);
        select(
            _mm256_cmp_pd::<_CMP_GT_OQ>(e, _mm256_setzero_pd()),
            next_up(s),
            other,
        )
    }

    /// bf16 / f16 rounding of normal-range values (`Dtype::round_f64`'s
    /// bit step, its overflow to `+-inf` included); `scalar` holds the
    /// lanes this step does not apply to (0, not finite, or below the
    /// dtype's normal range: there `round_f64` returns `x` or scales).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn round_half(x: __m256d, d: Dtype) -> (__m256d, i32) {
        let drop = 53 - i64::from(d.precision());
        let b = bits(x);
        let one = _mm256_set1_epi64x(1);
        let count = _mm256_set1_epi64x(drop);
        let odd = _mm256_and_si256(_mm256_srlv_epi64(b, count), one);
        let half = _mm256_add_epi64(_mm256_set1_epi64x((1i64 << (drop - 1)) - 1), odd);
        let low = _mm256_set1_epi64x((1i64 << drop) - 1);
        let r = float(_mm256_andnot_si256(low, _mm256_add_epi64(b, half)));
        let over = _mm256_cmp_pd::<_CMP_GT_OQ>(abs(r), splat(d.max_finite()));
        // `r.signum() * inf`: r is not NaN here, so its sign bit on inf.
        let inf = _mm256_or_pd(_mm256_and_pd(r, splat(-0.0)), splat(f64::INFINITY));
        let r = select(over, inf, r);
        let normal =
            _mm256_cmp_pd::<_CMP_GE_OQ>(abs(x), splat(crate::spec::pow2(d.min_normal_exp())));
        // 0 and non-finite values are returned as they are.
        let as_is = _mm256_or_pd(
            _mm256_cmp_pd::<_CMP_EQ_OQ>(x, _mm256_setzero_pd()),
            _mm256_cmp_pd::<_CMP_NLT_UQ>(abs(x), splat(f64::INFINITY)),
        );
        let out = select(as_is, x, r);
        let scalar = !_mm256_movemask_pd(_mm256_or_pd(normal, as_is)) & 0b1111;
        (out, scalar)
    }

    /// `round_to(x, target)` (`super::super::decide`) per lane.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn round(x: __m256d, target: Dtype) -> __m256d {
        match target {
            Dtype::F64 => x,
            Dtype::F32 => _mm256_cvtps_pd(_mm256_cvtpd_ps(x)),
            d => {
                let (r, scalar) = round_half(x, d);
                if scalar == 0 {
                    return r;
                }
                let (xs, mut rs) = (lanes(x), lanes(r));
                for l in 0..4 {
                    if scalar & (1 << l) != 0 {
                        rs[l] = round_to(xs[l], d);
                    }
                }
                load(&rs)
            }
        }
    }

    /// Tests: [`round`], [`add_dn`], [`add_up`], [`next_up`],
    /// [`next_down`] of four lanes.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[cfg(test)]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn primitives4(x: &[f64; 4], y: &[f64; 4], target: Dtype) -> [[f64; 4]; 5] {
        let (x, y) = (load(x), load(y));
        [
            lanes(round(x, target)),
            lanes(add_dn(x, y)),
            lanes(add_up(x, y)),
            lanes(next_up(x)),
            lanes(next_down(x)),
        ]
    }

    /// See [`super::plain4`].
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn plain4(
        pt: &PointForm,
        a: &[f64; 4],
        r: &[f64; 4],
        exact: [bool; 4],
        with_q: bool,
        target: Dtype,
    ) -> Block {
        let (a, r) = (load(a), load(r));
        let zero = _mm256_setzero_pd();
        let ex = _mm256_cvtepu8_epi64(_mm_cvtsi32_si128(i32::from_le_bytes(exact.map(u8::from))));
        let exact = _mm256_cmpgt_epi64(ex, _mm256_setzero_si256());
        // (F7') element_point, the scalar code's operations in its order.
        let dl = if pt.shift_w {
            select(float(exact), zero, add(mul(splat(C1), a), splat(TINY)))
        } else {
            zero
        };
        let e_e = if pt.exp_w {
            add(
                mul(r, add(splat(2.0 * U), mul(dl, splat(CE)))),
                splat(2.0 * TINY),
            )
        } else {
            mul(mul(r, dl), splat(CE))
        };
        let (k1, dk1) = (splat(pt.k1), splat(pt.dk1));
        let y = mul(k1, r);
        let ey = add(
            add(add(mul(splat(U), abs(y)), splat(TINY)), mul(abs(k1), e_e)),
            mul(dk1, add(r, e_e)),
        );
        let (z, ez) = if with_q {
            let t = sub(splat(pt.rho), a);
            let et = add(add(mul(splat(U), abs(t)), splat(pt.dr)), dl);
            let m = mul(r, t);
            let em = add(
                add(add(mul(splat(U), abs(m)), splat(TINY)), mul(r, et)),
                mul(add(abs(t), et), e_e),
            );
            let (k2, dk2) = (splat(pt.k2), splat(pt.dk2));
            let z = mul(k2, m);
            let ez = add(
                add(add(mul(splat(U), abs(z)), splat(TINY)), mul(abs(k2), em)),
                mul(dk2, add(abs(m), em)),
            );
            (z, ez)
        } else {
            (zero, zero)
        };
        let v = neg(add(y, z));
        let av = abs(v);
        let err = add(
            mul(
                add(add(add(mul(splat(U), av), ey), ez), mul(splat(4.0 * U), av)),
                splat(1.0 + 64.0 * U),
            ),
            splat(pt.abs),
        );
        let (lo, hi) = (sub(v, err), add(v, err));
        // (F8) decide: ordered, not containing 0, both ends one value.
        let ordered = _mm256_cmp_pd::<_CMP_LE_OQ>(lo, hi);
        let straddles = _mm256_and_pd(
            _mm256_cmp_pd::<_CMP_LE_OQ>(lo, zero),
            _mm256_cmp_pd::<_CMP_GE_OQ>(hi, zero),
        );
        let (rl, rh) = (round(lo, target), round(hi, target));
        let same = float(_mm256_cmpeq_epi64(bits(rl), bits(rh)));
        let decided = _mm256_and_pd(_mm256_andnot_pd(straddles, ordered), same);
        // Exact::new: the offset `[add_dn(lo, -rl), add_up(hi, -rl)]`.
        let nrl = neg(rl);
        let (olo, ohi) = (add_dn(lo, nrl), add_up(hi, nrl));
        let fin = _mm256_and_pd(finite(rl), _mm256_and_pd(finite(lo), finite(hi)));
        Block {
            lo: lanes(lo),
            hi: lanes(hi),
            rounded: lanes(rl),
            olo: lanes(olo),
            ohi: lanes(ohi),
            decided: _mm256_movemask_pd(decided) as u8,
            finite: _mm256_movemask_pd(fin) as u8,
        }
    }
}

#[cfg(test)]
mod tests;
