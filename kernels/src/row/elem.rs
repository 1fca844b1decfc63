//! The accumulation dtype ([`Acc`]: f32 or f64, with its exp and `ln_1p`)
//! and the logits element types ([`Input`]: f64, f32, bf16, f16) with their
//! exact widening to it.

use std::ops::{Add, Div, Mul, Neg, Sub};

use half::{bf16, f16};

use logprobe_reference::spec::{Dtype, Element};

use crate::exp::{
    exp_f32, exp_f32_nonpos, exp_f32_nonpos_n, ln_1p_f32, EXP_F32_MAX_ULPS, LIBM_F64_MAX_ULPS,
    LN_1P_F32_MAX_ULPS,
};

/// The accumulation dtype: `f32` (for f32, bf16, f16 logits) or `f64`.
pub trait Acc:
    Copy
    + Send
    + Sync
    + PartialOrd
    + std::fmt::Debug
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + 'static
{
    /// Its dtype tag.
    const DTYPE: Dtype;
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// `-inf`.
    const NEG_INF: Self;
    /// `+inf`.
    const INF: Self;
    /// Max error of [`Acc::exp`] on `(-inf, 0]`, ulps of this dtype.
    const EXP_ULPS: f64;
    /// Max error of [`Acc::ln_1p`], ulps of this dtype.
    const LOG_ULPS: f64;
    /// `e^x` (vectorisable for f32: [`exp_f32`]).
    fn exp(self) -> Self;
    /// `e^x` for `x <= 0`, `-inf` or NaN: the same bits as [`Acc::exp`]
    /// there, without the overflow clamp ([`exp_f32_nonpos`]).
    #[inline(always)]
    fn exp_nonpos(self) -> Self {
        self.exp()
    }
    /// [`Acc::exp_nonpos`] of `N` values (f32: [`exp_f32_nonpos_n`], the
    /// values' dependency chains side by side).
    #[inline(always)]
    fn exp_nonpos_n<const N: usize>(x: &[Self; N]) -> [Self; N] {
        let mut o = *x;
        for v in &mut o {
            *v = v.exp_nonpos();
        }
        o
    }
    /// [`Acc::exp_nonpos_n`] for the AVX-512 block loops (f32:
    /// [`crate::exp::exp_f32_nonpos_n_avx512`]): the same bits.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[inline(always)]
    unsafe fn exp_nonpos_n_avx512<const N: usize>(x: &[Self; N]) -> [Self; N] {
        Self::exp_nonpos_n(x)
    }
    /// Max error of [`Acc::tanh`], ulps of this dtype at its result.
    const TANH_ULPS: f64 = 0.5;
    /// `tanh(x)`, correctly rounded to nearest (CORE-MATH's `cr_tanhf` /
    /// `cr_tanh`, proven: [`Acc::TANH_ULPS`] is 0.5), `tanh(-inf) = -1`.
    fn tanh(self) -> Self;
    /// `e^x - 1`, correctly rounded to nearest (CORE-MATH's `cr_expm1f` /
    /// `cr_expm1`, proven: 0.5 ulp at its result; the policy terms'
    /// `kl_k3` and its derivative, [`crate::policy`]).
    fn expm1(self) -> Self;
    /// `ln(1 + x)`.
    fn ln_1p(self) -> Self;
    /// The exactly equal f64.
    fn to_f64(self) -> f64;
    /// From an f64, rounded to nearest.
    fn from_f64(x: f64) -> Self;
}

impl Acc for f32 {
    const DTYPE: Dtype = Dtype::F32;
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INF: Self = f32::NEG_INFINITY;
    const INF: Self = f32::INFINITY;
    const EXP_ULPS: f64 = EXP_F32_MAX_ULPS;
    const LOG_ULPS: f64 = LN_1P_F32_MAX_ULPS;
    #[inline(always)]
    fn exp(self) -> Self {
        exp_f32(self)
    }
    #[inline(always)]
    fn exp_nonpos(self) -> Self {
        exp_f32_nonpos(self)
    }
    #[inline(always)]
    fn exp_nonpos_n<const N: usize>(x: &[f32; N]) -> [f32; N] {
        exp_f32_nonpos_n(x)
    }
    #[inline(always)]
    unsafe fn exp_nonpos_n_avx512<const N: usize>(x: &[f32; N]) -> [f32; N] {
        // SAFETY: the caller guarantees AVX-512F.
        #[cfg(target_arch = "x86_64")]
        return unsafe { crate::exp::exp_f32_nonpos_n_avx512(x) };
        #[cfg(not(target_arch = "x86_64"))]
        exp_f32_nonpos_n(x)
    }
    #[inline]
    fn tanh(self) -> Self {
        core_math::tanhf(self)
    }
    #[inline]
    fn expm1(self) -> Self {
        core_math::expm1f(self)
    }
    #[inline]
    fn ln_1p(self) -> Self {
        ln_1p_f32(self)
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn from_f64(x: f64) -> Self {
        x as f32
    }
}

impl Acc for f64 {
    const DTYPE: Dtype = Dtype::F64;
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INF: Self = f64::NEG_INFINITY;
    const INF: Self = f64::INFINITY;
    const EXP_ULPS: f64 = LIBM_F64_MAX_ULPS;
    const LOG_ULPS: f64 = LIBM_F64_MAX_ULPS;
    #[inline(always)]
    fn exp(self) -> Self {
        f64::exp(self)
    }
    #[inline]
    fn tanh(self) -> Self {
        core_math::tanh(self)
    }
    #[inline]
    fn expm1(self) -> Self {
        core_math::expm1(self)
    }
    #[inline]
    fn ln_1p(self) -> Self {
        f64::ln_1p(self)
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn from_f64(x: f64) -> Self {
        x
    }
}

/// A logits element type with its accumulation dtype and exact widening.
pub trait Input: Element {
    /// f32 for f32/bf16/f16, f64 for f64.
    type Acc: Acc;
    /// Exact widening (bf16 by a 16-bit shift, f16 through `half`).
    fn widen(self) -> Self::Acc;
    /// Rounds an accumulation value to this dtype (for the in-place backward).
    fn narrow(a: Self::Acc) -> Self;
    /// [`Input::widen`] of each of `src` into `dst` (same length): exact,
    /// so any evaluation gives the same bits; bf16's is vectorised for this
    /// CPU ([`widen_bf16`]).
    #[inline(always)]
    fn widen_slice(src: &[Self], dst: &mut [Self::Acc]) {
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = x.widen();
        }
    }
    /// The slice itself when this dtype is its accumulation dtype (f32,
    /// f64): widening is the identity and needs no copy.
    #[inline(always)]
    fn acc_slice(s: &[Self]) -> Option<&[Self::Acc]> {
        let _ = s;
        None
    }
}

impl Input for f32 {
    type Acc = f32;
    #[inline(always)]
    fn acc_slice(s: &[f32]) -> Option<&[f32]> {
        Some(s)
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    #[inline(always)]
    fn narrow(a: f32) -> Self {
        a
    }
}

impl Input for f64 {
    type Acc = f64;
    #[inline(always)]
    fn acc_slice(s: &[f64]) -> Option<&[f64]> {
        Some(s)
    }
    #[inline(always)]
    fn widen(self) -> f64 {
        self
    }
    #[inline(always)]
    fn narrow(a: f64) -> Self {
        a
    }
}

impl Input for bf16 {
    type Acc = f32;
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
    #[inline(always)]
    fn narrow(a: f32) -> Self {
        bf16::from_f32(a)
    }
    #[inline(always)]
    fn widen_slice(src: &[bf16], dst: &mut [f32]) {
        widen_bf16(src, dst)
    }
}

#[inline(always)]
fn widen_bf16_body(src: &[bf16], dst: &mut [f32]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = x.widen();
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,avx")]
unsafe fn widen_bf16_avx512(src: &[bf16], dst: &mut [f32]) {
    widen_bf16_body(src, dst)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx")]
unsafe fn widen_bf16_avx2(src: &[bf16], dst: &mut [f32]) {
    widen_bf16_body(src, dst)
}

/// bf16 values widened to f32 (a 16-bit shift, exact), vectorised for
/// this CPU: a zero extension and a shift per 16 values under AVX-512 (the
/// baseline build would take 8 at a time). Called by the write pass, whose
/// loop is not built per instruction set, and by the stats pass.
pub(crate) fn widen_bf16(src: &[bf16], dst: &mut [f32]) {
    match super::path() {
        // SAFETY: the features were detected at run time by `path()`.
        #[cfg(target_arch = "x86_64")]
        super::Path::Avx512 => unsafe { widen_bf16_avx512(src, dst) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        super::Path::Avx2 => unsafe { widen_bf16_avx2(src, dst) },
        _ => widen_bf16_body(src, dst),
    }
}

impl Input for f16 {
    type Acc = f32;
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn narrow(a: f32) -> Self {
        f16::from_f32(a)
    }
}
