//! The row reduction every CPU kernel shares: per row, the max `m` of the
//! (masked) logits, `s = S - 1` (the sum of `exp((z_j - m) / T)` without one
//! argmax term, whose exp is exactly 1) and `B = sum_j e^{d_j} (-d_j)` for the
//! entropy, so that `ln S = ln_1p(s)` and `entropy = ln_1p(s) + B / (1 + s)`
//! (the oracle's `L + R`, DESIGN "The math"; the `ln S + B / S` form the
//! tolerance model analyses).
//!
//! # Order of operations (the declared summation model)
//!
//! The columns of a row are cut into blocks of [`BLOCK`] entries from the
//! row's first column. Per block (in L1): widen to the accumulation dtype,
//! block max `m_b`, then `d_j = (z_j - m_b) / T` (subtract, then scale:
//! [`crate::Shift::SubtractThenScale`]), `e_j = exp(d_j)`; term `j` goes to
//! lane `j % LANES` ([`LANES`] accumulators, each summing its terms in column
//! order), lanes merged by a pairwise tree (`log2 LANES` levels). Block
//! partials `(m, s, B)` are merged by a balanced pairwise tree over the
//! blocks (`ceil(log2 b)` levels), rescaling by one `exp((m_lo - m_hi) / T)`
//! per merge: `s = s_hi + (1 + s_lo) f`, `B = B_hi + f (B_lo + (1 + s_lo)(-delta))`,
//! all terms non-negative. The order depends on the column count alone:
//! never on row chunking, thread count or which rows run together, so every
//! kernel built on it is bit-invariant under chunking.
//!
//! No FMA is used and lane order is explicit, so the SSE2, AVX2 and AVX-512
//! builds of the block loop (chosen at run time, [`cpu_path`]) give the same
//! bits (the AVX-512 build's exps scale by `2^k` with `vscalefps`, which
//! rounds the same exact product once: [`crate::exp::exp_f32_nonpos_n_avx512`]).
//!
//! # Evaluation (speed without changing that order)
//!
//! Per block: (1) the max, read in place when the row is a contiguous slice
//! of the accumulation dtype (f32 / f64 without an input temperature; else
//! widened and masked into an L1 scratch), in 4 x `LANES` independent
//! lanes (the max is exact, so only a zero max needs the lane order, for
//! its sign); (2) the first argmax, one vector compare per chunk; (3) the
//! exp pass in steps of [`STEP_CHUNKS`] chunks whose exps are evaluated
//! operation by operation across the step (independent dependency chains
//! side by side), each lane then adding its terms in column order, while
//! the next block is prefetched. NaN and `+inf` need no pass of their own:
//! `+inf` is the max, and a NaN makes `s` NaN. Every value is the same
//! operation on the same operands as one chunk at a time (see the test
//! `every_cpu_path_gives_the_same_bits` and the golden digests).

// `!(x < inf)` and `!(m > -inf)` are meant: they are true for NaN.
#![allow(clippy::neg_cmp_op_on_partial_ord)]

use std::ops::{Add, Div, Mul, Neg, Sub};
use std::sync::OnceLock;

use half::{bf16, f16};
use ndarray::ArrayView1;

use logprobe_reference::spec::{Dtype, Element};

use crate::exp::{
    exp_f32, exp_f32_nonpos, exp_f32_nonpos_n, ln_1p_f32, EXP_F32_MAX_ULPS, LIBM_F64_MAX_ULPS,
    LN_1P_F32_MAX_ULPS,
};
use crate::kernel::{ceil_log2, Summation};

/// Entries per block (a widened block, 8 KiB in f32, stays in L1).
pub const BLOCK: usize = 2048;
/// Accumulators per block sum (summed in column order each).
pub const LANES: usize = 16;

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

/// Where a row's values come from: the caller's typed logits, or a widened
/// buffer (the chunked kernel's `[chunk, V]` workspace).
pub trait Source<A: Acc>: Sync {
    /// Writes the values of columns `start .. start + dst.len()` into `dst`.
    fn load(&self, start: usize, dst: &mut [A]);
    /// The value of column `j`.
    fn get(&self, j: usize) -> A;
    /// Columns `start .. start + n` in place, when the source holds them as
    /// a contiguous slice of the accumulation dtype (then the reduction
    /// reads them without a copy); `None` otherwise.
    #[inline(always)]
    fn contiguous(&self, start: usize, n: usize) -> Option<&[A]> {
        let _ = (start, n);
        None
    }
    /// Hints the CPU to bring columns `start .. start + n` (clamped to the
    /// row) into cache; no effect on any value.
    #[inline(always)]
    fn prefetch(&self, start: usize, n: usize) {
        let _ = (start, n);
    }
}

/// Prefetch hints (`prefetcht0`) for the cache lines of `s` (x86_64; a
/// no-op elsewhere). No effect on any value.
#[inline(always)]
pub(crate) fn prefetch_lines<T>(s: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        let bytes = std::mem::size_of_val(s);
        let p = s.as_ptr() as *const i8;
        let mut off = 0;
        while off < bytes {
            // SAFETY: `p + off` lies inside `s`; a prefetch never faults
            // and reads nothing into the program's state.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.add(off));
            }
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = s;
}

/// `s[start .. start + n]` clamped to `s`.
#[inline(always)]
fn clamped<T>(s: &[T], start: usize, n: usize) -> &[T] {
    let a = start.min(s.len());
    &s[a..start.saturating_add(n).min(s.len())]
}

/// One row of typed logits `[V_total]`, widened on load; with
/// `TemperatureDtype::Input` each value becomes `round_input(x / T)`.
#[derive(Clone, Copy)]
pub struct TypedRow<'a, T> {
    /// The row.
    pub row: ArrayView1<'a, T>,
    /// `Some(T)` for `TemperatureDtype::Input`.
    pub input_temperature: Option<f64>,
}

impl<T: Input> TypedRow<'_, T> {
    #[inline(always)]
    fn conv(&self, x: T) -> T::Acc {
        match self.input_temperature {
            None => x.widen(),
            Some(t) => round_input::<T>(x, t).widen(),
        }
    }
}

/// `round_input(round_acc(x / T))`: the quotient rounded to the
/// accumulation dtype, then to `T`'s dtype, as PyTorch materialises it
/// ([`Dtype::scaled_input`], which defines it); the result is exact in `T`.
#[inline]
pub fn round_input<T: Input>(x: T, t: f64) -> T {
    T::from_f64(T::DTYPE.scaled_input(x.to_f64(), t))
}

impl<T: Input> Source<T::Acc> for TypedRow<'_, T> {
    #[inline(always)]
    fn load(&self, start: usize, dst: &mut [T::Acc]) {
        let n = dst.len();
        if let (Some(sl), None) = (self.row.as_slice(), self.input_temperature) {
            for (d, &x) in dst.iter_mut().zip(&sl[start..start + n]) {
                *d = x.widen();
            }
        } else {
            for (i, d) in dst.iter_mut().enumerate() {
                *d = self.conv(self.row[start + i]);
            }
        }
    }
    #[inline]
    fn get(&self, j: usize) -> T::Acc {
        self.conv(self.row[j])
    }
    #[inline(always)]
    fn contiguous(&self, start: usize, n: usize) -> Option<&[T::Acc]> {
        if self.input_temperature.is_some() {
            return None;
        }
        T::acc_slice(self.row.as_slice()?).map(|s| &s[start..start + n])
    }
    #[inline(always)]
    fn prefetch(&self, start: usize, n: usize) {
        if let Some(s) = self.row.as_slice() {
            prefetch_lines(clamped(s, start, n));
        }
    }
}

impl<A: Acc> Source<A> for [A] {
    #[inline(always)]
    fn load(&self, start: usize, dst: &mut [A]) {
        dst.copy_from_slice(&self[start..start + dst.len()]);
    }
    #[inline]
    fn get(&self, j: usize) -> A {
        self[j]
    }
    #[inline(always)]
    fn contiguous(&self, start: usize, n: usize) -> Option<&[A]> {
        Some(&self[start..start + n])
    }
    #[inline(always)]
    fn prefetch(&self, start: usize, n: usize) {
        prefetch_lines(clamped(self, start, n));
    }
}

/// `(z - m) / T` (or `z - m` when `scale` is `None`, i.e. `T == 1`): the
/// shifted logit, subtract then scale.
#[inline(always)]
pub fn shift<A: Acc>(z: A, m: A, scale: Option<A>) -> A {
    match scale {
        None => z - m,
        Some(t) => (z - m) / t,
    }
}

/// A partial reduction of some columns: max `m` (`-inf` = no finite allowed
/// entry: the empty partial), `s` = sum of `exp((z_j - m) / T)` without one
/// argmax term, `b = sum exp(d_j) (-d_j)` (0 unless asked for).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Partial<A> {
    /// Max of the (masked) values.
    pub m: A,
    /// `S - 1`.
    pub s: A,
    /// `sum e^{d_j} (-d_j)` relative to `m`.
    pub b: A,
}

impl<A: Acc> Partial<A> {
    /// No entries (or none finite and allowed): `(-inf, 0, 0)`.
    pub const EMPTY: Partial<A> = Partial {
        m: A::NEG_INF,
        s: A::ZERO,
        b: A::ZERO,
    };

    /// Whether no finite allowed entry was seen.
    pub fn is_empty(&self) -> bool {
        !(self.m > A::NEG_INF)
    }

    /// Merges two partials (one rescaling exp): empty partials merge without
    /// NaN; on equal maxima `self` keeps the argmax role.
    #[inline]
    pub fn merge(self, other: Self, scale: Option<A>) -> Self {
        if other.is_empty() {
            return self;
        }
        if self.is_empty() {
            return other;
        }
        let (hi, lo) = if self.m >= other.m {
            (self, other)
        } else {
            (other, self)
        };
        let delta = shift(lo.m, hi.m, scale);
        let f = delta.exp();
        let s_lo = A::ONE + lo.s;
        let s = hi.s + s_lo * f;
        // f == 0 when delta underflows (or is -inf by overflow): lo adds nothing.
        let b = if f > A::ZERO {
            hi.b + f * (lo.b + s_lo * (-delta))
        } else {
            hi.b
        };
        Partial { m: hi.m, s, b }
    }
}

/// A reduction's result: the partial, and whether a NaN or `+inf` was loaded
/// (the caller then re-validates the row for the typed error).
#[derive(Clone, Copy, Debug)]
pub struct Reduction<A> {
    /// The merged partial.
    pub partial: Partial<A>,
    /// A NaN or `+inf` value was seen.
    pub bad: bool,
}

/// Which instruction set the block loop runs with: `"avx512"`, `"avx2"` or
/// `"sse2"` (x86_64), `"generic"` elsewhere. All give the same bits.
pub fn cpu_path() -> &'static str {
    match path() {
        Path::Avx512 => "avx512",
        Path::Avx2 => "avx2",
        Path::Baseline => {
            if cfg!(target_arch = "x86_64") {
                "sse2"
            } else {
                "generic"
            }
        }
    }
}

/// The block loops' instruction set, detected once ([`cpu_path`] names it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    Avx512,
    Avx2,
    Baseline,
}

/// This CPU's [`Path`], detected once.
pub(crate) fn path() -> Path {
    static PATH: OnceLock<Path> = OnceLock::new();
    *PATH.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw")
            {
                return Path::Avx512;
            }
            if std::is_x86_feature_detected!("avx2") {
                return Path::Avx2;
            }
        }
        Path::Baseline
    })
}

/// Block scratch: the widened values (`BLOCK` elements).
struct Scratch<A> {
    z: [A; BLOCK],
}

/// What one block reduction needs besides the scratch.
struct LeafArgs<'a, 'm, A: Acc, S: Source<A> + ?Sized> {
    src: &'a S,
    mask: Option<ArrayView1<'m, bool>>,
    start: usize,
    n: usize,
    /// End of the reduced columns: the next block (prefetched during this
    /// block's exp pass) is `start + n .. end`, at most `BLOCK` of it.
    end: usize,
    scale: Option<A>,
    want_b: bool,
}

/// Chunks of [`LANES`] whose exps one step of the exp pass computes side by
/// side: independent dependency chains the core overlaps (one chunk's exp is
/// a chain of ~25 dependent operations, ~60 cycles; 8 chains fill the
/// vector pipes of a Zen 5 core), then added lane by lane in column order,
/// so each lane's sum is the same as one chunk at a time.
pub const STEP_CHUNKS: usize = 8;
/// Entries per step of the exp pass.
pub(crate) const STEP: usize = STEP_CHUNKS * LANES;
/// Entries per step of the max pass (4 chunks: 4 independent max chains).
const MAX_STEP: usize = 4 * LANES;

/// A chunk of [`LANES`] values (the block's last chunk padded with `-inf`).
type Chunk<A> = [A; LANES];

/// A slice of exactly [`LANES`] values as a chunk.
#[inline(always)]
fn as_chunk<A>(x: &[A]) -> &Chunk<A> {
    x.try_into().expect("LANES values")
}

/// The 4 chunks of a max step.
#[inline(always)]
fn split4<A>(c: &[A; MAX_STEP]) -> (&Chunk<A>, &Chunk<A>, &Chunk<A>, &Chunk<A>) {
    let (c0, r) = c.split_at(LANES);
    let (c1, r) = r.split_at(LANES);
    let (c2, c3) = r.split_at(LANES);
    (as_chunk(c0), as_chunk(c1), as_chunk(c2), as_chunk(c3))
}

/// Whether any value is NaN or `+inf` (per-lane flags in the accumulation
/// dtype, so they stay in vector registers).
#[inline(always)]
fn any_bad<A: Acc>(z: &[A]) -> bool {
    let mut flag = [A::ZERO; LANES];
    let mut it = z.chunks_exact(LANES);
    for c in &mut it {
        for l in 0..LANES {
            flag[l] = if !(c[l] < A::INF) { A::ONE } else { flag[l] };
        }
    }
    it.remainder().iter().any(|&x| !(x < A::INF)) || flag.iter().any(|&f| f != A::ZERO)
}

/// The block max as the lane order defines it: per lane in column order
/// (`x > mx` keeps the first of equal values), then lanes `0 .. LANES` in
/// order. Its value is that of any max; it is only needed for the sign of
/// a zero max.
#[inline(always)]
fn ordered_max<A: Acc>(full: &[A], tail: &Chunk<A>) -> A {
    let mut mx = [A::NEG_INF; LANES];
    for c in full.chunks_exact(LANES).chain(std::iter::once(&tail[..])) {
        for l in 0..LANES {
            mx[l] = if c[l] > mx[l] { c[l] } else { mx[l] };
        }
    }
    let mut m = A::NEG_INF;
    for &v in &mx {
        m = if v > m { v } else { m };
    }
    m
}

/// Folds a chunk into per-lane maxima (`x > mx`: the first of equal values
/// stays; NaN is skipped), by value so they stay in vector registers.
#[inline(always)]
fn max_fold<A: Acc>(mut mx: Chunk<A>, c: &Chunk<A>) -> Chunk<A> {
    for l in 0..LANES {
        mx[l] = if c[l] > mx[l] { c[l] } else { mx[l] };
    }
    mx
}

/// Whether a value of the chunk equals `m` (one vector compare and an OR
/// of its lanes).
#[inline(always)]
fn any_eq<A: Acc>(c: &Chunk<A>, m: A) -> bool {
    let mut hit = [false; LANES];
    for l in 0..LANES {
        hit[l] = c[l] == m;
    }
    hit.iter().fold(false, |a, &b| a | b)
}

/// The exp pass over `W` entries from column `base` of the block: `e_j =
/// exp(d(z_j))`, `s` lanes add `e_j` (`+0` for the argmax), `b` lanes add
/// `e_j (-d_j)` (`+0` where `e_j = 0`); lane `j % LANES`, column order.
#[inline(always)]
fn exp_step<A: Acc, const W: usize, const B: bool, const X: bool>(
    c: &[A; W],
    base: usize,
    argmax: usize,
    d: impl Fn(A) -> A,
    sl: &mut [A; LANES],
    bl: &mut [A; LANES],
) {
    // The argmax term (exactly 1) stays out of s: it adds +0 (a no-op, as
    // every lane holds a sum >= +0). Only the step holding it compares
    // column indices.
    let k = argmax.wrapping_sub(base);
    if k < W {
        exp_step_inner::<A, W, B, true, X>(c, k, d, sl, bl)
    } else {
        exp_step_inner::<A, W, B, false, X>(c, k, d, sl, bl)
    }
}

#[inline(always)]
fn exp_step_inner<A: Acc, const W: usize, const B: bool, const SEL: bool, const X: bool>(
    c: &[A; W],
    k: usize,
    d: impl Fn(A) -> A,
    sl: &mut [A; LANES],
    bl: &mut [A; LANES],
) {
    let mut dv = [A::ZERO; W];
    for i in 0..W {
        dv[i] = d(c[i]);
    }
    let mut ex = if X {
        // SAFETY: `X` is set only in the AVX-512 build of the block loop,
        // which runs only where `path()` (or a test) detected AVX-512F.
        unsafe { A::exp_nonpos_n_avx512(&dv) }
    } else {
        A::exp_nonpos_n(&dv)
    };
    let mut t = [A::ZERO; W];
    if B {
        for i in 0..W {
            t[i] = if ex[i] > A::ZERO {
                ex[i] * (-dv[i])
            } else {
                A::ZERO
            };
        }
    }
    if SEL {
        for (i, e) in ex.iter_mut().enumerate() {
            *e = if i == k { A::ZERO } else { *e };
        }
    }
    for q in 0..W / LANES {
        for l in 0..LANES {
            sl[l] = sl[l] + ex[q * LANES + l];
            if B {
                bl[l] = bl[l] + t[q * LANES + l];
            }
        }
    }
}

/// The exp pass over a block: `full` (a multiple of [`LANES`] long) in
/// steps of [`STEP`], then its last chunks one by one, then the padded tail.
/// `prefetch(k)` is called before the step at offset `k` (a cache hint for
/// the next block: no effect on values).
#[inline(always)]
fn exp_pass<A: Acc, const B: bool, const X: bool>(
    full: &[A],
    tail: Option<&Chunk<A>>,
    argmax: usize,
    d: impl Fn(A) -> A + Copy,
    prefetch: impl Fn(usize),
) -> ([A; LANES], [A; LANES]) {
    let mut sl = [A::ZERO; LANES];
    let mut bl = [A::ZERO; LANES];
    let mut steps = full.chunks_exact(STEP);
    for (si, c) in (&mut steps).enumerate() {
        let c: &[A; STEP] = c.try_into().expect("chunks_exact(STEP)");
        prefetch(si * STEP);
        exp_step::<A, STEP, B, X>(c, si * STEP, argmax, d, &mut sl, &mut bl);
    }
    let done = full.len() - steps.remainder().len();
    for (ci, c) in steps.remainder().chunks_exact(LANES).enumerate() {
        let c: &Chunk<A> = c.try_into().expect("chunks_exact(LANES)");
        exp_step::<A, LANES, B, X>(c, done + ci * LANES, argmax, d, &mut sl, &mut bl);
    }
    if let Some(tc) = tail {
        exp_step::<A, LANES, B, X>(tc, full.len(), argmax, d, &mut sl, &mut bl);
    }
    (sl, bl)
}

#[inline(always)]
fn leaf_body<A: Acc, S: Source<A> + ?Sized, const X: bool>(
    a: &LeafArgs<'_, '_, A, S>,
    sc: &mut Scratch<A>,
) -> Reduction<A> {
    let n = a.n;
    // The block's values: read in place when the source is a contiguous
    // slice of the accumulation dtype and no mask applies, else widened
    // (and masked) into the scratch. NaN / +inf anywhere in the row is an
    // error, masked or not: checked before the mask.
    let mut bad = false;
    let z: &[A] = match (a.mask, a.src.contiguous(a.start, n)) {
        (None, Some(z)) => z,
        (mask, _) => {
            let z = &mut sc.z[..n];
            a.src.load(a.start, z);
            if let Some(mask) = mask {
                bad = any_bad(z);
                let mask = mask.slice(ndarray::s![a.start..a.start + n]);
                match mask.as_slice() {
                    Some(ms) => {
                        for (x, &k) in z.iter_mut().zip(ms) {
                            *x = if k { *x } else { A::NEG_INF };
                        }
                    }
                    None => {
                        for (x, &k) in z.iter_mut().zip(mask.iter()) {
                            *x = if k { *x } else { A::NEG_INF };
                        }
                    }
                }
            }
            z
        }
    };
    // Full chunks, and the last partial chunk padded with -inf (adds +0).
    let nf = n - n % LANES;
    let full = &z[..nf];
    let mut tail = [A::NEG_INF; LANES];
    tail[..n - nf].copy_from_slice(&z[nf..]);
    let tail_chunk = (n > nf).then_some(&tail);

    // Max (with the NaN / +inf check) in STEP lanes: the max is exact, so
    // any grouping gives its value; only a zero max needs the lane order
    // for its sign (then `ordered_max`).
    let (mut m0, mut m1, mut m2, mut m3) = (
        [A::NEG_INF; LANES],
        [A::NEG_INF; LANES],
        [A::NEG_INF; LANES],
        [A::NEG_INF; LANES],
    );
    let mut steps = full.chunks_exact(MAX_STEP);
    for c in &mut steps {
        let c: &[A; MAX_STEP] = c.try_into().expect("chunks_exact(MAX_STEP)");
        let (c0, c1, c2, c3) = split4(c);
        m0 = max_fold(m0, c0);
        m1 = max_fold(m1, c1);
        m2 = max_fold(m2, c2);
        m3 = max_fold(m3, c3);
    }
    // Opaque to the optimiser: the lane reduction below must not reshape the
    // loop's vectors (LLVM's SLP pass otherwise permutes lanes every step).
    let (m0, m1, m2, m3) = std::hint::black_box((m0, m1, m2, m3));
    let mut mm = max_fold(max_fold(m0, &m1), &max_fold(m2, &m3));
    for c in steps.remainder().chunks_exact(LANES) {
        mm = max_fold(mm, as_chunk(c));
    }
    mm = max_fold(mm, &tail);
    let mut m = A::NEG_INF;
    for &v in &mm {
        m = if v > m { v } else { m };
    }
    // NaN / +inf without a separate check: +inf is the max; with a finite
    // max a NaN turns s into NaN (below); with none, look for a NaN.
    bad |= m == A::INF || (!(m > A::NEG_INF) && any_bad(z));
    if !(m > A::NEG_INF) || bad {
        return Reduction {
            partial: Partial::EMPTY,
            bad,
        };
    }
    if m == A::ZERO {
        m = ordered_max(full, &tail);
    }
    // First argmax (its exp is exactly 1 and stays out of s): the first
    // chunk holding m (one vector compare per chunk), then its first lane.
    let argmax = full
        .chunks_exact(LANES)
        .chain(std::iter::once(&tail[..]))
        .position(|c| any_eq(as_chunk(c), m))
        .and_then(|ci| {
            let c = if ci * LANES < nf {
                &full[ci * LANES..][..LANES]
            } else {
                &tail[..]
            };
            c.iter().position(|&x| x == m).map(|l| ci * LANES + l)
        })
        .unwrap_or(0);
    // One pass: exp, S (without the argmax term) and B.
    // While the exps run, bring the next block into cache: the hardware
    // prefetchers idle during this compute-bound pass.
    let next = a.start + n;
    let pf = |k: usize| {
        if next + k < a.end {
            a.src.prefetch(next + k, STEP.min(a.end - next - k));
        }
    };
    let (sl, bl) = match (a.scale, a.want_b) {
        (None, false) => exp_pass::<A, false, X>(full, tail_chunk, argmax, |x: A| x - m, pf),
        (None, true) => exp_pass::<A, true, X>(full, tail_chunk, argmax, |x: A| x - m, pf),
        (Some(t), false) => {
            exp_pass::<A, false, X>(full, tail_chunk, argmax, |x: A| (x - m) / t, pf)
        }
        (Some(t), true) => exp_pass::<A, true, X>(full, tail_chunk, argmax, |x: A| (x - m) / t, pf),
    };
    let (s, b) = (lane_tree(sl), lane_tree(bl));
    // Every e_j is in [0, 1] and every t_j finite unless a z_j is NaN (d_j
    // NaN, e_j NaN; never the argmax): s is NaN (`!(s >= 0)`) exactly when
    // the block holds one.
    if !(s >= A::ZERO) {
        return Reduction {
            partial: Partial::EMPTY,
            bad: true,
        };
    }
    Reduction {
        partial: Partial { m, s, b },
        bad,
    }
}

/// Pairwise tree over the lanes: `(l, l + half)` pairs, `log2 LANES` levels.
#[inline(always)]
fn lane_tree<A: Acc>(mut v: [A; LANES]) -> A {
    let mut half = LANES / 2;
    while half > 0 {
        for l in 0..half {
            v[l] = v[l] + v[l + half];
        }
        half /= 2;
    }
    v[0]
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,avx")]
unsafe fn leaf_avx512<A: Acc, S: Source<A> + ?Sized>(
    a: &LeafArgs<'_, '_, A, S>,
    sc: &mut Scratch<A>,
) -> Reduction<A> {
    leaf_body::<A, S, true>(a, sc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx")]
unsafe fn leaf_avx2<A: Acc, S: Source<A> + ?Sized>(
    a: &LeafArgs<'_, '_, A, S>,
    sc: &mut Scratch<A>,
) -> Reduction<A> {
    leaf_body::<A, S, false>(a, sc)
}

fn leaf_baseline<A: Acc, S: Source<A> + ?Sized>(
    a: &LeafArgs<'_, '_, A, S>,
    sc: &mut Scratch<A>,
) -> Reduction<A> {
    leaf_body::<A, S, false>(a, sc)
}

fn leaf<A: Acc, S: Source<A> + ?Sized>(
    a: &LeafArgs<'_, '_, A, S>,
    sc: &mut Scratch<A>,
) -> Reduction<A> {
    match path() {
        // SAFETY: the features were detected at run time by `path()`.
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 => unsafe { leaf_avx512(a, sc) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe { leaf_avx2(a, sc) },
        _ => leaf_baseline(a, sc),
    }
}

/// Reduces columns `cols` of a row (blocks from `cols.start`, balanced
/// pairwise tree over the blocks). `mask` is the whole row's sampling mask
/// (indexed by column), `scale` the temperature (`None` for `T == 1`).
/// Stack scratch `BLOCK` elements; no heap allocation.
pub fn reduce<A: Acc, S: Source<A> + ?Sized>(
    src: &S,
    cols: std::ops::Range<usize>,
    mask: Option<ArrayView1<'_, bool>>,
    scale: Option<A>,
    want_b: bool,
) -> Reduction<A> {
    let len = cols.end.saturating_sub(cols.start);
    if len == 0 {
        return Reduction {
            partial: Partial::EMPTY,
            bad: false,
        };
    }
    let mut sc = Scratch {
        z: [A::ZERO; BLOCK],
    };
    let nblocks = len.div_ceil(BLOCK);
    let mut bad = false;
    let p = tree(
        0,
        nblocks,
        &mut |blk| {
            let start = cols.start + blk * BLOCK;
            let n = BLOCK.min(cols.end - start);
            let r = leaf(
                &LeafArgs {
                    src,
                    mask,
                    start,
                    n,
                    end: cols.end,
                    scale,
                    want_b,
                },
                &mut sc,
            );
            bad |= r.bad;
            r.partial
        },
        scale,
    );
    Reduction { partial: p, bad }
}

/// Balanced pairwise tree over leaves `lo .. hi` (split `ceil(n/2)`, `floor(n/2)`):
/// depth `ceil(log2 (hi - lo))`.
fn tree<A: Acc>(
    lo: usize,
    hi: usize,
    leaf: &mut dyn FnMut(usize) -> Partial<A>,
    scale: Option<A>,
) -> Partial<A> {
    if hi - lo == 1 {
        return leaf(lo);
    }
    let mid = lo + (hi - lo).div_ceil(2);
    let l = tree(lo, mid, leaf, scale);
    let r = tree(mid, hi, leaf, scale);
    l.merge(r, scale)
}

/// The summation model of [`reduce`] over `len` columns: leaf depth
/// `ceil(min(len, BLOCK) / LANES)`, merges `log2 LANES + ceil(log2 blocks)`.
pub fn summation(len: usize) -> Summation {
    let blocks = len.div_ceil(BLOCK).max(1);
    Summation {
        leaf: len.min(BLOCK).div_ceil(LANES).max(1),
        merges: ceil_log2(LANES) + ceil_log2(blocks),
    }
}

/// Rescaling exps along any merge path of [`reduce`] over `len` columns:
/// one per block-merge level, `ceil(log2 blocks)`.
pub fn rescaling_exps(len: usize) -> usize {
    ceil_log2(len.div_ceil(BLOCK).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The block reduction one chunk at a time, exactly as the module docs
    /// order it (the straightforward form the fast evaluation must match).
    fn chunk_at_a_time(
        z: &[f32],
        mask: Option<&[bool]>,
        scale: Option<f32>,
        want_b: bool,
    ) -> Reduction<f32> {
        let n_pad = z.len().div_ceil(LANES) * LANES;
        let mut v = vec![f32::NEG_INFINITY; n_pad];
        v[..z.len()].copy_from_slice(z);
        let bad = v.iter().any(|&x| !(x < f32::INFINITY));
        if let Some(mk) = mask {
            for (x, &k) in v.iter_mut().zip(mk) {
                *x = if k { *x } else { f32::NEG_INFINITY };
            }
        }
        let mut mx = [f32::NEG_INFINITY; LANES];
        for c in v.chunks_exact(LANES) {
            for l in 0..LANES {
                mx[l] = if c[l] > mx[l] { c[l] } else { mx[l] };
            }
        }
        let mut m = f32::NEG_INFINITY;
        for &x in &mx {
            m = if x > m { x } else { m };
        }
        if !(m > f32::NEG_INFINITY) || bad {
            return Reduction {
                partial: Partial::EMPTY,
                bad,
            };
        }
        let argmax = v.iter().position(|&x| x == m).unwrap();
        let (mut sl, mut bl) = ([0f32; LANES], [0f32; LANES]);
        for (j, &x) in v.iter().enumerate() {
            let l = j % LANES;
            let d = shift(x, m, scale);
            let e = crate::exp::exp_f32(d);
            sl[l] += if j != argmax { e } else { 0.0 };
            if want_b {
                let t = e * (-d);
                bl[l] += if e > 0.0 { t } else { 0.0 };
            }
        }
        Reduction {
            partial: Partial {
                m,
                s: lane_tree(sl),
                b: lane_tree(bl),
            },
            bad,
        }
    }

    fn bits(r: Reduction<f32>) -> (u32, u32, u32, bool) {
        let p = r.partial;
        (p.m.to_bits(), p.s.to_bits(), p.b.to_bits(), r.bad)
    }

    /// A block, its mask, temperature and whether `B` is wanted.
    type Block = (Vec<f32>, Option<Vec<bool>>, Option<f32>, bool);

    /// Blocks that stress the evaluation: ragged lengths, ties at the max,
    /// a zero max with both signs, `-inf`, NaN and `+inf`, masks, temperatures.
    fn blocks() -> Vec<Block> {
        let mut state = 9u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 40) as f32 / (1u64 << 24) as f32
        };
        let mut out = Vec::new();
        for (k, &n) in [
            1usize,
            5,
            16,
            17,
            63,
            64,
            127,
            128,
            129,
            300,
            BLOCK - 5,
            BLOCK,
        ]
        .iter()
        .enumerate()
        {
            let mut z: Vec<f32> = (0..n).map(|_| (next() - 0.5) * 60.0).collect();
            let mut zero = z.clone();
            for (i, x) in zero.iter_mut().enumerate() {
                // Max exactly 0, first as -0 then +0 (the sign comes from the lane order).
                *x = if i % 7 == 3 {
                    if i % 2 == 0 {
                        0.0
                    } else {
                        -0.0
                    }
                } else {
                    -(x.abs())
                };
            }
            let mut inf = z.clone();
            for (i, x) in inf.iter_mut().enumerate() {
                if i % 3 == 1 {
                    *x = f32::NEG_INFINITY;
                }
            }
            let mask: Vec<bool> = (0..n).map(|_| next() < 0.6).collect();
            let tie = z.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let last = z.len() - 1;
            z[last] = tie; // the max twice: the first one is the argmax
            out.push((z.clone(), None, None, true));
            out.push((z.clone(), None, Some(0.7), true));
            out.push((z.clone(), None, Some(1e-30), true));
            out.push((z.clone(), None, None, false));
            out.push((z.clone(), Some(mask.clone()), Some(1.3), true));
            out.push((zero, None, None, true));
            out.push((inf.clone(), None, None, true));
            out.push((vec![f32::NEG_INFINITY; n], None, None, true));
            let mut nan = z.clone();
            nan[(k * 37) % n] = f32::NAN;
            out.push((nan.clone(), None, None, true));
            out.push((nan.clone(), None, None, false));
            let mut masked_nan = nan;
            masked_nan[0] = f32::NAN;
            let mut mk = mask.clone();
            mk[0] = false;
            out.push((masked_nan, Some(mk), None, true));
            let mut pinf = inf;
            pinf[n / 2] = f32::INFINITY;
            out.push((pinf, None, None, true));
            let mut all_inf_nan = vec![f32::NEG_INFINITY; n];
            all_inf_nan[n - 1] = f32::NAN;
            out.push((all_inf_nan, None, None, true));
        }
        out
    }

    /// The fast block loop gives the bits of the chunk-at-a-time order, on
    /// every CPU path (SSE2, AVX2, AVX-512) this machine has.
    #[test]
    fn every_cpu_path_gives_the_same_bits() {
        let mut sc = Scratch { z: [0.0; BLOCK] };
        for (z, mask, scale, want_b) in blocks() {
            let mask_view = mask.as_ref().map(|m| ArrayView1::from(&m[..]));
            let a = LeafArgs {
                src: &z[..],
                mask: mask_view,
                start: 0,
                n: z.len(),
                end: z.len(),
                scale,
                want_b,
            };
            let want = bits(chunk_at_a_time(&z, mask.as_deref(), scale, want_b));
            let what = format!(
                "n = {}, mask = {}, scale = {scale:?}",
                z.len(),
                mask.is_some()
            );
            assert_eq!(bits(leaf_baseline(&a, &mut sc)), want, "baseline, {what}");
            #[cfg(target_arch = "x86_64")]
            {
                if std::is_x86_feature_detected!("avx2") {
                    // SAFETY: feature detected above.
                    assert_eq!(
                        bits(unsafe { leaf_avx2(&a, &mut sc) }),
                        want,
                        "avx2, {what}"
                    );
                }
                if std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512bw")
                {
                    // SAFETY: feature detected above.
                    assert_eq!(
                        bits(unsafe { leaf_avx512(&a, &mut sc) }),
                        want,
                        "avx512, {what}"
                    );
                }
            }
        }
    }
}
