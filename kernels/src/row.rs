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
//! bits.

// `!(x < inf)` and `!(m > -inf)` are meant: they are true for NaN.
#![allow(clippy::neg_cmp_op_on_partial_ord)]

use std::ops::{Add, Div, Mul, Neg, Sub};
use std::sync::OnceLock;

use half::{bf16, f16};
use ndarray::ArrayView1;

use logprobe_reference::spec::{Dtype, Element};

use crate::exp::{exp_f32, ln_1p_f32, EXP_F32_MAX_ULPS, LIBM_F64_MAX_ULPS, LN_1P_F32_MAX_ULPS};
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
}

impl Input for f32 {
    type Acc = f32;
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

/// `round_input(x / T)`: the quotient in f64 rounded once to `T`'s dtype.
/// For f32/bf16/f16 logits and an f32 temperature the f64 quotient is
/// itself correctly rounded and `53 >= 2p + 2`, so the double rounding is
/// innocuous (Figueroa, "When is double rounding innocuous?", 1995); for f64
/// it is the single IEEE division.
#[inline]
pub fn round_input<T: Input>(x: T, t: f64) -> T {
    T::from_f64(x.to_f64() / t)
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Avx512,
    Avx2,
    Baseline,
}

fn path() -> Path {
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
    scale: Option<A>,
    want_b: bool,
}

#[inline(always)]
fn leaf_body<A: Acc, S: Source<A> + ?Sized>(
    a: &LeafArgs<'_, '_, A, S>,
    sc: &mut Scratch<A>,
) -> Reduction<A> {
    let n = a.n;
    let n_pad = n.div_ceil(LANES) * LANES;
    let z = &mut sc.z[..n_pad];
    a.src.load(a.start, &mut z[..n]);
    for x in &mut z[n..] {
        *x = A::NEG_INF;
    }
    let mut badl = [false; LANES];
    let mut mx = [A::NEG_INF; LANES];
    if let Some(mask) = a.mask {
        // NaN / +inf check on the unmasked values (bad anywhere in the row is
        // an error), then the mask.
        for c in z.chunks_exact(LANES) {
            for l in 0..LANES {
                badl[l] |= !(c[l] < A::INF);
            }
        }
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
        for c in z.chunks_exact(LANES) {
            for l in 0..LANES {
                mx[l] = if c[l] > mx[l] { c[l] } else { mx[l] };
            }
        }
    } else {
        for c in z.chunks_exact(LANES) {
            for l in 0..LANES {
                badl[l] |= !(c[l] < A::INF);
                mx[l] = if c[l] > mx[l] { c[l] } else { mx[l] };
            }
        }
    }
    let bad = badl.iter().any(|&b| b);
    let mut m = A::NEG_INF;
    for &v in &mx {
        m = if v > m { v } else { m };
    }
    if !(m > A::NEG_INF) || bad {
        return Reduction {
            partial: Partial::EMPTY,
            bad,
        };
    }
    // First argmax: find its lane group with a vector compare, then the lane.
    let mut argmax = 0;
    for (ci, c) in z.chunks_exact(LANES).enumerate() {
        let mut hit = false;
        for &x in c {
            hit |= x == m;
        }
        if hit {
            argmax = ci * LANES + c.iter().position(|&x| x == m).unwrap_or(0);
            break;
        }
    }
    // One pass: exp, S (the argmax term, exactly 1, kept out of s) and B.
    let mut sl = [A::ZERO; LANES];
    let mut bl = [A::ZERO; LANES];
    macro_rules! exp_pass {
        ($d:expr, $want_b:expr) => {
            for (ci, cz) in z.chunks_exact(LANES).enumerate() {
                let base = ci * LANES;
                for l in 0..LANES {
                    let d = $d(cz[l]);
                    let ex = d.exp();
                    sl[l] = sl[l] + if base + l != argmax { ex } else { A::ZERO };
                    if $want_b {
                        let t = ex * (-d);
                        bl[l] = bl[l] + if ex > A::ZERO { t } else { A::ZERO };
                    }
                }
            }
        };
    }
    match (a.scale, a.want_b) {
        (None, false) => exp_pass!(|x: A| x - m, false),
        (None, true) => exp_pass!(|x: A| x - m, true),
        (Some(t), false) => exp_pass!(|x: A| (x - m) / t, false),
        (Some(t), true) => exp_pass!(|x: A| (x - m) / t, true),
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
    leaf_body(a, sc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx")]
unsafe fn leaf_avx2<A: Acc, S: Source<A> + ?Sized>(
    a: &LeafArgs<'_, '_, A, S>,
    sc: &mut Scratch<A>,
) -> Reduction<A> {
    leaf_body(a, sc)
}

fn leaf_baseline<A: Acc, S: Source<A> + ?Sized>(
    a: &LeafArgs<'_, '_, A, S>,
    sc: &mut Scratch<A>,
) -> Reduction<A> {
    leaf_body(a, sc)
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

    /// The SSE2, AVX2 and AVX-512 builds of the block loop give the same bits.
    #[test]
    fn every_cpu_path_gives_the_same_bits() {
        let mut state = 9u64;
        let z: Vec<f32> = (0..BLOCK - 5)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 60.0
            })
            .collect();
        for (scale, want_b) in [(None, true), (Some(0.7f32), true), (None, false)] {
            let a = LeafArgs {
                src: &z[..],
                mask: None,
                start: 0,
                n: z.len(),
                scale,
                want_b,
            };
            let mut sc = Scratch { z: [0.0; BLOCK] };
            let base = leaf_baseline(&a, &mut sc).partial;
            #[cfg(target_arch = "x86_64")]
            {
                let bits = |p: Partial<f32>| (p.m.to_bits(), p.s.to_bits(), p.b.to_bits());
                if std::is_x86_feature_detected!("avx2") {
                    // SAFETY: feature detected above.
                    let p = unsafe { leaf_avx2(&a, &mut sc) }.partial;
                    assert_eq!(bits(p), bits(base));
                }
                if std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512bw")
                {
                    // SAFETY: feature detected above.
                    let p = unsafe { leaf_avx512(&a, &mut sc) }.partial;
                    assert_eq!(bits(p), bits(base));
                }
            }
            assert!(base.s > 0.0 && base.m > 0.0);
        }
    }
}
