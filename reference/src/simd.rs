//! Four f64 lanes of one AVX2 vector: the switch and the lane primitives
//! shared by the oracle's f64 tier (`oracle::fast`, its plain VJP
//! elements) and verify's bounds (its per-model sums and gradient screen).
//!
//! Every primitive is the scalar IEEE operation per lane (no fused
//! multiply-add), so a lane gives the bits the scalar code gives; the
//! callers' tests compare the two paths bit for bit, with the lanes off on
//! the test's thread by [`scalar`]. No kernel uses this module.
//!
//! # Example
//! ```
//! use logprobe_reference::simd;
//! // Off on this thread inside `scalar`, whatever the CPU.
//! assert!(!simd::scalar(simd::available));
//! ```

use std::cell::Cell;

thread_local! {
    /// The lanes are off on this thread ([`scalar`]).
    static SCALAR: Cell<bool> = const { Cell::new(false) };
}

/// `f` with the lanes off on this thread: every caller of [`available`]
/// takes its scalar code (tests compare both paths). Restores the switch
/// after `f`, also when `f` panics.
pub fn scalar<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SCALAR.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SCALAR.with(|s| s.replace(true)));
    f()
}

/// Whether the lanes run on this thread: x86-64 with AVX2, and not inside
/// [`scalar`].
#[inline]
pub fn available() -> bool {
    if SCALAR.with(|s| s.get()) {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The lane primitives (x86-64; callable where AVX2 is enabled).
///
/// # Safety
///
/// Every function here is `#[target_feature(enable = "avx2")]`: call it only
/// from code compiled with AVX2 or after [`available`] returned `true`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::missing_safety_doc)] // the module's `# Safety` covers each function
pub mod x86 {
    use std::arch::x86_64::*;

    /// `x` in every lane.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn splat(x: f64) -> __m256d {
        _mm256_set1_pd(x)
    }

    /// `|x|` (the sign bit cleared, as `f64::abs`).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn abs(x: __m256d) -> __m256d {
        _mm256_andnot_pd(_mm256_set1_pd(-0.0), x)
    }

    /// `-x` (the sign bit flipped, as `Neg`).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn neg(x: __m256d) -> __m256d {
        _mm256_xor_pd(_mm256_set1_pd(-0.0), x)
    }

    /// `a + b`, rounded to nearest.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn add(a: __m256d, b: __m256d) -> __m256d {
        _mm256_add_pd(a, b)
    }

    /// `a - b`, rounded to nearest.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn sub(a: __m256d, b: __m256d) -> __m256d {
        _mm256_sub_pd(a, b)
    }

    /// `a * b`, rounded to nearest.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn mul(a: __m256d, b: __m256d) -> __m256d {
        _mm256_mul_pd(a, b)
    }

    /// `if m { x } else { y }` per lane (`m` all ones or all zeros).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn select(m: __m256d, x: __m256d, y: __m256d) -> __m256d {
        _mm256_blendv_pd(y, x, m)
    }

    /// `max(a, b)` per lane, NaN when either is (as the scalar `Hi::max`
    /// of verify's bounds, not `f64::max`).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn max_nan(a: __m256d, b: __m256d) -> __m256d {
        let nan = _mm256_cmp_pd::<_CMP_UNORD_Q>(a, b);
        _mm256_blendv_pd(_mm256_max_pd(a, b), _mm256_set1_pd(f64::NAN), nan)
    }

    /// The lanes' bits.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn bits(x: __m256d) -> __m256i {
        _mm256_castpd_si256(x)
    }

    /// The lanes whose bits `x` holds.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn float(x: __m256i) -> __m256d {
        _mm256_castsi256_pd(x)
    }

    /// The four lanes, lane 0 first.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn lanes(x: __m256d) -> [f64; 4] {
        let mut a = [0.0; 4];
        // SAFETY: `a` holds four f64 (unaligned store).
        unsafe { _mm256_storeu_pd(a.as_mut_ptr(), x) };
        a
    }

    /// `a` as lanes, `a[0]` in lane 0.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn load(a: &[f64; 4]) -> __m256d {
        // SAFETY: `a` holds four f64 (unaligned load).
        unsafe { _mm256_loadu_pd(a.as_ptr()) }
    }
}
