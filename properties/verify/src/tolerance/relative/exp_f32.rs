//! `e^x` rounded to f32 for a block of arguments, the naive f32 passes'
//! per-entry term: bit for bit `Dtype::F32.round_f64(x.exp())` (libm's f64
//! `exp`, then round to nearest even), eight lanes at a time with AVX-512F
//! (fused multiply-adds), four with AVX2 (none), chosen at run time.
//!
//! A lane computes `y ~ e^x` as `2^k e^r`, `k = round(x / ln 2)`, `r = x - k
//! ln 2` (Cody-Waite: `ln 2`'s high part has 32 significant bits, so `k
//! ln2_hi` is exact), `e^r` by its Taylor polynomial to degree 13 (`|r| <=
//! 0.35`: truncation below `1e-17` relative), then scales by `2^k` exactly.
//! Its relative error is a few f64 ulps, far below `2^-32`, with or
//! without fused multiply-adds (each fused step rounds once where the
//! unfused one rounds twice; the bits of `y` may differ between the two
//! paths, its rounding to f32 does not, by the argument that follows). Rounding to
//! f32 changes only at the midpoints between f32 values: where `y` is
//! farther than `2^-32` relative from every midpoint, the exact `e^x`
//! (within a few ulps of `y`) and libm's value (within 1 ulp of it) lie on
//! the same side of every midpoint, so all three round to the same f32.
//! Lanes nearer a midpoint, and arguments outside `[-87, 80]` (results
//! near f32's subnormals or overflow, NaN), take libm's `exp` itself.

use logprobe_reference::spec::Dtype;

/// Entries a block holds (a stack buffer of the naive passes).
pub(super) const BLOCK: usize = 256;

/// `xs[i] <- Dtype::F32.round_f64(xs[i].exp())`, bit for bit, for every `i`.
pub(super) fn exp_f32_in_place(xs: &mut [f64]) {
    #[cfg(target_arch = "x86_64")]
    if logprobe_reference::simd::available() {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F is present (checked).
            unsafe { x86::exp_f32_in_place_avx512(xs) };
        } else {
            // SAFETY: AVX2 is present (checked).
            unsafe { x86::exp_f32_in_place(xs) };
        }
        return;
    }
    for x in xs {
        *x = scalar(*x);
    }
}

/// The scalar definition.
#[inline]
fn scalar(x: f64) -> f64 {
    Dtype::F32.round_f64(x.exp())
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use logprobe_reference::simd::x86::splat;

    /// `ln 2`'s high part (32 significant bits) and the rest (fdlibm's).
    const LN2_HI: f64 = 6.931_471_803_691_238e-1;
    const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
    /// `1 / k!`, `k = 2..=13`, for Horner from the top.
    const INV_FACT: [f64; 12] = [
        1.0 / 2.0,
        1.0 / 6.0,
        1.0 / 24.0,
        1.0 / 120.0,
        1.0 / 720.0,
        1.0 / 5_040.0,
        1.0 / 40_320.0,
        1.0 / 362_880.0,
        1.0 / 3_628_800.0,
        1.0 / 39_916_800.0,
        1.0 / 479_001_600.0,
        1.0 / 6_227_020_800.0,
    ];
    /// `1.5 * 2^52`: adding it leaves an integral f64's value in the low bits.
    const MAGIC: f64 = 6_755_399_441_055_744.0;
    /// f64 bits f32 rounding drops (29), the midpoint among them, and the
    /// margin around it that goes to libm (`2^21` f64 ulps: `2^-31` relative).
    const LOW_MASK: i64 = (1 << 29) - 1;
    const MID: i64 = 1 << 28;
    const MARGIN: i64 = 1 << 21;

    /// `e^x` per lane for `x` in `[-87, 80]`, within a few ulps.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn exp4(x: __m256d) -> __m256d {
        let k = _mm256_round_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_pd(x, splat(std::f64::consts::LOG2_E)),
        );
        let r = _mm256_sub_pd(
            _mm256_sub_pd(x, _mm256_mul_pd(k, splat(LN2_HI))),
            _mm256_mul_pd(k, splat(LN2_LO)),
        );
        let mut p = splat(INV_FACT[INV_FACT.len() - 1]);
        for &c in INV_FACT.iter().rev().skip(1) {
            p = _mm256_add_pd(_mm256_mul_pd(p, r), splat(c));
        }
        // 1 + r + r^2 p.
        let p = _mm256_add_pd(
            _mm256_add_pd(_mm256_mul_pd(_mm256_mul_pd(p, r), r), r),
            splat(1.0),
        );
        // 2^k from k's integer bits (|k| <= 126: a normal f64).
        let ki = _mm256_sub_epi64(
            _mm256_castpd_si256(_mm256_add_pd(k, splat(MAGIC))),
            _mm256_castpd_si256(splat(MAGIC)),
        );
        let two_k = _mm256_castsi256_pd(_mm256_slli_epi64::<52>(_mm256_add_epi64(
            ki,
            _mm256_set1_epi64x(1023),
        )));
        _mm256_mul_pd(p, two_k)
    }

    /// See [`super::exp_f32_in_place`].
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn exp_f32_in_place(xs: &mut [f64]) {
        let mut chunks = xs.chunks_exact_mut(4);
        for c in &mut chunks {
            let x = _mm256_loadu_pd(c.as_ptr());
            let in_range = _mm256_and_pd(
                _mm256_cmp_pd::<_CMP_GE_OQ>(x, splat(-87.0)),
                _mm256_cmp_pd::<_CMP_LE_OQ>(x, splat(80.0)),
            );
            // Out-of-range lanes compute e^0 (discarded).
            let y = exp4(_mm256_and_pd(x, in_range));
            // Near a midpoint: 0 <= low - (MID - MARGIN) < 2 MARGIN.
            let low = _mm256_and_si256(_mm256_castpd_si256(y), _mm256_set1_epi64x(LOW_MASK));
            let t = _mm256_sub_epi64(low, _mm256_set1_epi64x(MID - MARGIN));
            let near = _mm256_and_si256(
                _mm256_cmpgt_epi64(t, _mm256_set1_epi64x(-1)),
                _mm256_cmpgt_epi64(_mm256_set1_epi64x(2 * MARGIN), t),
            );
            let ok = _mm256_andnot_pd(_mm256_castsi256_pd(near), in_range);
            let f = _mm256_cvtps_pd(_mm256_cvtpd_ps(y));
            let mut out = [0.0; 4];
            _mm256_storeu_pd(out.as_mut_ptr(), f);
            let ok = _mm256_movemask_pd(ok);
            for (l, o) in out.iter_mut().enumerate() {
                if ok & (1 << l) == 0 {
                    *o = super::scalar(c[l]);
                }
            }
            c.copy_from_slice(&out);
        }
        for x in chunks.into_remainder() {
            *x = super::scalar(*x);
        }
    }

    /// `e^x` per lane for `x` in `[-87, 80]`, within a few ulps: [`exp4`]'s
    /// steps on eight lanes, with fused multiply-adds.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn exp8(x: __m512d) -> __m512d {
        let set1 = _mm512_set1_pd;
        // Round to nearest even, exceptions suppressed.
        let k = _mm512_roundscale_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_pd(x, set1(std::f64::consts::LOG2_E)),
        );
        // `k ln2_hi` is exact, so the first step is `x - k ln2_hi` rounded once.
        let r = _mm512_fnmadd_pd(k, set1(LN2_LO), _mm512_fnmadd_pd(k, set1(LN2_HI), x));
        let mut p = set1(INV_FACT[INV_FACT.len() - 1]);
        for &c in INV_FACT.iter().rev().skip(1) {
            p = _mm512_fmadd_pd(p, r, set1(c));
        }
        // 1 + r + r^2 p.
        let p = _mm512_add_pd(_mm512_fmadd_pd(_mm512_mul_pd(p, r), r, r), set1(1.0));
        let ki = _mm512_sub_epi64(
            _mm512_castpd_si512(_mm512_add_pd(k, set1(MAGIC))),
            _mm512_castpd_si512(set1(MAGIC)),
        );
        let two_k = _mm512_castsi512_pd(_mm512_slli_epi64::<52>(_mm512_add_epi64(
            ki,
            _mm512_set1_epi64(1023),
        )));
        _mm512_mul_pd(p, two_k)
    }

    /// See [`super::exp_f32_in_place`]: eight lanes, the rest by AVX2.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp_f32_in_place_avx512(xs: &mut [f64]) {
        let mut chunks = xs.chunks_exact_mut(8);
        for c in &mut chunks {
            let x = _mm512_loadu_pd(c.as_ptr());
            let in_range = _mm512_cmp_pd_mask::<_CMP_GE_OQ>(x, _mm512_set1_pd(-87.0))
                & _mm512_cmp_pd_mask::<_CMP_LE_OQ>(x, _mm512_set1_pd(80.0));
            // Out-of-range lanes compute e^0 (discarded).
            let y = exp8(_mm512_maskz_mov_pd(in_range, x));
            // Near a midpoint: 0 <= low - (MID - MARGIN) < 2 MARGIN
            // (unsigned: a negative difference wraps above 2 MARGIN).
            let low = _mm512_and_si512(_mm512_castpd_si512(y), _mm512_set1_epi64(LOW_MASK));
            let t = _mm512_sub_epi64(low, _mm512_set1_epi64(MID - MARGIN));
            let near = _mm512_cmplt_epu64_mask(t, _mm512_set1_epi64(2 * MARGIN));
            let ok = in_range & !near;
            let f = _mm512_cvtps_pd(_mm512_cvtpd_ps(y));
            if ok == 0xff {
                _mm512_storeu_pd(c.as_mut_ptr(), f);
                continue;
            }
            let mut out = [0.0; 8];
            _mm512_storeu_pd(out.as_mut_ptr(), f);
            for (l, o) in out.iter_mut().enumerate() {
                if ok & (1 << l) == 0 {
                    *o = super::scalar(c[l]);
                }
            }
            c.copy_from_slice(&out);
        }
        exp_f32_in_place(chunks.into_remainder());
    }

    #[cfg(test)]
    pub(super) fn exp8_of(x: [f64; 8]) -> [f64; 8] {
        let mut out = [0.0; 8];
        // SAFETY: only called where AVX-512F is present (the test checks).
        unsafe { _mm512_storeu_pd(out.as_mut_ptr(), exp8(_mm512_loadu_pd(x.as_ptr()))) };
        out
    }

    #[cfg(test)]
    pub(super) fn exp4_of(x: [f64; 4]) -> [f64; 4] {
        let mut out = [0.0; 4];
        // SAFETY: only called where AVX2 is present (the test checks).
        unsafe { _mm256_storeu_pd(out.as_mut_ptr(), exp4(_mm256_loadu_pd(x.as_ptr()))) };
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use logprobe_reference::splitmix::SplitMix64;

    fn args(n: usize) -> Vec<f64> {
        let mut g = SplitMix64::new(7);
        let mut xs: Vec<f64> = (0..n)
            .map(|i| {
                let u = (g.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                match i % 4 {
                    0 => -90.0 + 175.0 * u,
                    1 => -20.0 * u,
                    2 => -1e-3 * u,
                    _ => f64::from((g.next_u64() % 2000) as u32) * -0.0625,
                }
            })
            .collect();
        xs.extend([
            0.0,
            -0.0,
            -87.0,
            80.0,
            -87.01,
            80.01,
            f64::NEG_INFINITY,
            f64::INFINITY,
            f64::NAN,
            -745.2,
            1e-300,
            -1e-300,
        ]);
        xs
    }

    #[test]
    fn the_lanes_equal_libm_rounded_to_f32_bit_for_bit() {
        let xs = args(400_003);
        let check = |got: &[f64]| {
            for (&x, &g) in xs.iter().zip(got) {
                let want = scalar(x);
                assert!(g.to_bits() == want.to_bits(), "x {x:e}: {g:e} vs {want:e}");
            }
        };
        let mut got = xs.clone();
        exp_f32_in_place(&mut got);
        check(&got);
        // Each lane path on its own, where the CPU has it.
        #[cfg(target_arch = "x86_64")]
        if logprobe_reference::simd::available() {
            let mut got = xs.clone();
            // SAFETY: AVX2 is present (checked).
            unsafe { x86::exp_f32_in_place(&mut got) };
            check(&got);
            if std::arch::is_x86_feature_detected!("avx512f") {
                let mut got = xs.clone();
                // SAFETY: AVX-512F is present (checked).
                unsafe { x86::exp_f32_in_place_avx512(&mut got) };
                check(&got);
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_lane_exp_is_within_1e_14_of_libm() {
        if !logprobe_reference::simd::available() {
            return;
        }
        let avx512 = std::arch::is_x86_feature_detected!("avx512f");
        for c in args(200_000).chunks_exact(8) {
            let x: [f64; 8] = c.try_into().expect("eight");
            let mut ys: Vec<f64> = x
                .chunks_exact(4)
                .flat_map(|x| x86::exp4_of(x.try_into().expect("four")))
                .collect();
            if avx512 {
                ys.extend(x86::exp8_of(x));
            }
            for (&x, y) in x.iter().cycle().zip(ys) {
                if !(-87.0..=80.0).contains(&x) {
                    continue;
                }
                let l = x.exp();
                assert!(((y - l) / l).abs() < 1e-14, "x {x:e}: {y:e} vs {l:e}");
            }
        }
    }
}
