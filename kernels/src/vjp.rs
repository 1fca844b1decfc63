//! Backward (VJP) of log-probs, entropy and top-k log-probs for the CPU
//! kernels: per row a stats pass ([`crate::stats::row_stats`], the
//! forward's reduction), then one write pass, vectorised block by block
//! (`crate::grad_block`), while the row is still in cache (fused staging;
//! in place, every row's stats come first so that bad input leaves the
//! logits unchanged). The gradient is written as f64 holding values of the
//! requested dtype ([`backward`]) or in the element type itself
//! ([`backward_into`]: f64, f32, bf16 or f16), each value rounded once.
//!
//! # Formula (docs/design.md, "The math"; the oracle's docs)
//!
//! For upstream `g` (log-prob), `h` (entropy), `G_k` (top-k), with the
//! sources `(t, g)` and `(id_k, G_k)` (an `ignore_index` row has `g = 0`; a
//! masked or `-inf` id is a constant and its `G_k` is dropped):
//! `dx_j = ( c_j (1 - p_j) - o_j p_j - h q_j (e_j + R) ) / T`, where `c_j` is
//! the sum of the source weights at column `j` and `o_j` that of the others
//! (for a column that is no source: `-(sum of all weights) p_j`).
//! `p_j = exp((z_j - m) / T - ln S)` (0 where masked), `q_j = exp(e_j - ln S_w)`,
//! `e_j = (w_j - m_w) / T`, `R = B_w / S_w`. Cancellation-free:
//! `1 - p_j = s / (1 + s)` when `z_j` is the max (`s` excludes one argmax
//! term), else `p_j <= 1/2` and `1 - p_j` is computed directly; the entropy
//! term is 0 where `q_j = 0` (no `0 * inf`). Every element is computed in
//! the accumulation dtype and rounded once to the output dtype; zeros are
//! `+0`. Padded columns get 0. Cotangents are rounded to the accumulation
//! dtype first. With `TemperatureDtype::Input` the gradient is taken with
//! respect to `x` with `dz/dx = 1/T` (the shift uses `T = 1`, the final
//! division `T`), as the oracle takes it.

use ndarray::{Array2, ArrayView1, ArrayView2, ArrayViewMut1, ArrayViewMut2};
use rayon::prelude::*;

use logprobe_reference::spec::{
    Cotangents, Dtype, Logits, LogitsMut, Options, Output, Problem, ProblemMut, Reduction, Shape,
    SpecError,
};

use crate::cpu::Staging;
use crate::grad_block::{grad_block, BlockConsts, BlockOut, EntropyTerm};
use crate::gradient::GradElement;
use crate::row::{shift, Acc, Input, Softcap, Source, TypedRow, BLOCK};
use crate::stats::{
    ids_suspect, mask_row, pairwise_sum, row_error, row_stats, shard_ranges, typed_row, CallParams,
    LossGrad, RowStats,
};

/// The cotangents of one row, in the accumulation dtype.
#[derive(Clone, Debug)]
pub struct RowCot<A> {
    /// Sources `(column, weight)`: the target first (its log-prob
    /// cotangent, then the loss's `-(1 - eps) ell`), then top-k ids in order.
    pub sources: Vec<(usize, A)>,
    /// Entropy cotangent `h` (None = absent or zero: no entropy term).
    pub h: Option<A>,
    /// The loss side (`None`: no `lse`, `z_loss` or `loss` cotangent).
    pub loss: Option<LossSide<A>>,
    /// The policy terms' cotangents (`None`: none nonzero on this row):
    /// one more source at the target, of weight `sum c k'(lp^)` from the
    /// row's own log-prob ([`crate::policy`]), added in [`grad_row`].
    pub policy: Option<crate::policy::PolicySide<A>>,
    /// The top-k KL's cotangents (`None`: none nonzero on this row): one
    /// more source at each id, of weight [`crate::stats::topk_kl_slopes`]
    /// from the row's own log-probs at the ids, added in [`grad_row`].
    pub kl: Option<KlSide<A>>,
}

/// One row's top-k KL cotangents and inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct KlSide<A> {
    /// The ids `[K]` (validated: live, distinct, `< V`).
    pub ids: Vec<usize>,
    /// The teacher's log-probs `a_k [K]`, exact.
    pub teacher: Vec<f64>,
    /// The student's log-probs renormalised over the ids.
    pub renormalized: bool,
    /// `g_f`, `g_r` in `A`.
    pub gf: A,
    /// `g_r`.
    pub gr: A,
}

impl<A: Acc> KlSide<A> {
    /// Row `row`'s side (`None` without a nonzero KL cotangent).
    pub fn of(problem: &Problem<'_>, cot: &Cotangents<'_>, row: usize) -> Option<Self> {
        let (gf, gr) = problem.kl_cotangents(cot, row);
        if gf == 0.0 && gr == 0.0 {
            return None;
        }
        let (kl, ids, a) = (
            problem.options.topk_kl?,
            problem.topk_ids?,
            problem.teacher_topk_log_probs?,
        );
        Some(KlSide {
            ids: ids.row(row).iter().map(|&i| i as usize).collect(),
            teacher: a.row(row).to_vec(),
            renormalized: kl.renormalized,
            gf: A::from_f64(gf),
            gr: A::from_f64(gr),
        })
    }
}

/// The loss-side terms of one row (docs/design.md, "The loss side"), folded into the
/// write pass's row constants: the total weight of `-p_j` loses `(a +
/// zb lse) + ell eps` (the kernel's own `lse = m / T + ln S`), and every
/// allowed entry gains the constant `u`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossSide<A> {
    /// `a`, the cotangent of `lse`.
    pub a: A,
    /// `zb = (coef b) 2`, `b` the cotangent of `z_loss`.
    pub zb: A,
    /// `ell eps`: the loss's smoothing share of `p_j`'s weight.
    pub ell_eps: A,
    /// `u = -(ell eps / |A|)` (before the division by `T`).
    pub u: A,
}

impl<A: Acc> LossSide<A> {
    /// The weight these terms add to `p_j`: `(a + zb lse) + ell eps`, with
    /// `lse = m / T + ln S` from the row's statistics (as the forward's).
    fn p_weight(&self, st: &RowStats<A>, p: &CallParams<A>) -> A {
        let m = match p.scale {
            Some(t) => st.m / t,
            None => st.m,
        };
        (self.a + self.zb * (m + st.ell)) + self.ell_eps
    }
}

impl<A: Acc> RowCot<A> {
    /// Row `row`'s cotangents; `p` holds the call's loss constants
    /// ([`CallParams::loss_grad`]).
    pub fn new(problem: &Problem<'_>, cot: &Cotangents<'_>, row: usize, p: &CallParams<A>) -> Self {
        let mut sources = Vec::new();
        if let (Some(g), true) = (cot.column(Output::LogProbs), problem.has_target(row)) {
            sources.push((
                problem.tokens.map_or(0, |t| t[row]) as usize,
                A::from_f64(g[row]),
            ));
        }
        // The loss's row coefficient `ell = g w` (`/ W` under `mean`).
        let mut ell_eps = A::ZERO;
        let mut u = A::ZERO;
        if let (Some((g, w)), Some(lg)) = (problem.loss_cotangent(cot, row), p.loss_grad) {
            let gw = A::from_f64(g) * A::from_f64(w);
            let ell = match lg.divisor {
                Some(d) => gw / d,
                None => gw,
            };
            let t = problem.tokens.map_or(0, |t| t[row]) as usize;
            sources.push((t, -(ell * (A::ONE - lg.eps))));
            if lg.eps != A::ZERO {
                let count = match problem.sampling_mask {
                    None => p.v,
                    Some(_) => (0..p.v).filter(|&j| problem.allowed(row, j)).count(),
                };
                ell_eps = ell * lg.eps;
                u = -(ell_eps / A::from_f64(count as f64));
            }
        }
        if let (Some(gk), Some(ids)) = (cot.get(Output::TopkLogProbs), problem.topk_ids) {
            for (k, &id) in ids.row(row).iter().enumerate() {
                let id = id as usize;
                if problem.allowed(row, id) {
                    sources.push((id, A::from_f64(gk[[row, k]])));
                }
            }
        }
        let h = cot
            .column(Output::Entropy)
            .map(|h| A::from_f64(h[row]))
            .filter(|&h| h != A::ZERO);
        let a = cot
            .column(Output::Lse)
            .map_or(A::ZERO, |a| A::from_f64(a[row]));
        let zb = match (cot.column(Output::ZLoss), p.z_loss_coef) {
            (Some(b), Some(c)) => c * A::from_f64(b[row]) * A::from_f64(2.0),
            _ => A::ZERO,
        };
        let any = cot.column(Output::Lse).is_some()
            || cot.column(Output::ZLoss).is_some()
            || cot.column(Output::Loss).is_some();
        let loss = any.then_some(LossSide { a, zb, ell_eps, u });
        RowCot {
            sources,
            h,
            loss,
            policy: crate::policy::PolicySide::of(problem, cot, row),
            kl: KlSide::of(problem, cot, row),
        }
    }

    /// Sum of all weights, in source order, less the loss side's weight
    /// of `p_j` (then also the constant `u`; `0` without a loss side).
    fn total(&self, st: &RowStats<A>, p: &CallParams<A>) -> (A, A) {
        let s = self.sources.iter().fold(A::ZERO, |a, &(_, w)| a + w);
        match &self.loss {
            None => (s, A::ZERO),
            Some(l) => (s - l.p_weight(st, p), l.u),
        }
    }
}

/// One block of a row's write pass ([`RowIo::block`]): columns `start ..
/// start + n`, of the row's columns `.. end` (the next block, which may be
/// prefetched, lies in `start + n .. end`).
#[derive(Clone, Copy, Debug)]
pub struct BlockCols {
    /// First column.
    pub start: usize,
    /// Columns in the block (at most [`BLOCK`]).
    pub n: usize,
    /// End of the row's computed columns.
    pub end: usize,
}

/// The write pass over one block ([`RowIo::block`]): `f(z, out)`.
pub type BlockFn<'f, A> = dyn FnMut(&[A], BlockOut<'_, A>) + 'f;

/// Reads and writes one row of the write pass.
pub trait RowIo<A: Acc> {
    /// Values of columns `start .. start + dst.len()`.
    fn load(&self, start: usize, dst: &mut [A]);
    /// Value of column `j`.
    fn get(&self, j: usize) -> A;
    /// Writes gradients of columns `start .. start + vals.len()`.
    fn store(&mut self, start: usize, vals: &[A]);
    /// Writes 0 to columns `range` (padding).
    fn store_zeros(&mut self, range: std::ops::Range<usize>);
    /// The softcap's gradient factors of columns `start .. start +
    /// dst.len()` ([`Source::softcap_factors`]), read before any write to
    /// those columns; `false` when this row applies none (no softcap, or a
    /// buffer of `x'` whose caller applies them: [`apply_softcap_factors`]).
    #[inline(always)]
    fn softcap_factors(&self, start: usize, dst: &mut [A]) -> bool {
        let _ = (start, dst);
        false
    }
    /// One block of the write pass: `f(z, out)` with `z` the values of
    /// the block's columns (`zbuf` holds them unless the row can lend them
    /// in place) and `out` where the gradients of those columns go (the
    /// output row itself when it holds the accumulation dtype, else stored
    /// piece by piece); an implementation may prefetch the next block
    /// ([`BlockCols::end`]) as pieces are emitted.
    #[inline(always)]
    fn block(&mut self, at: BlockCols, zbuf: &mut [A], f: &mut BlockFn<'_, A>) {
        let BlockCols { start, n, .. } = at;
        self.load(start, &mut zbuf[..n]);
        f(
            &zbuf[..n],
            BlockOut {
                direct: None,
                emit: &mut |k, vals| self.store(start + k, vals),
            },
        );
    }
}

/// Prefetch-for-write hints (`prefetchw`: the lines come in exclusive, so
/// the stores that follow need no read for ownership) for `s[k .. k + len]`
/// clamped to `s`; no effect on any value (a no-op off x86_64).
#[inline(always)]
fn prefetch_write<T>(s: &[T], k: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let a = k.min(s.len());
        let s = &s[a..k.saturating_add(len).min(s.len())];
        let p = s.as_ptr() as *const i8;
        let mut off = 0;
        while off < std::mem::size_of_val(s) {
            // SAFETY: `p + off` lies inside `s`; a prefetch never faults.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_ET0 }>(p.add(off));
            }
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (s, k, len);
}

/// Prefetches the columns of the next block (`next .. end`) matching
/// the piece `k .. k + len` of the current one.
#[inline(always)]
fn prefetch_next<A: Acc, S: Source<A> + ?Sized>(
    src: &S,
    next: usize,
    end: usize,
    k: usize,
    len: usize,
) {
    if next + k < end {
        src.prefetch(next + k, len.min(end - next - k));
    }
}

/// `x` rounded once to nearest in `G` (from f32 accumulation by
/// [`GradElement::from_f32`], from f64 by the spec's correct rounding).
#[inline(always)]
fn round_to<A: Acc, G: GradElement>(x: A) -> G {
    match A::DTYPE {
        Dtype::F64 => G::from_f64(x.to_f64()),
        _ => G::from_f32(x.to_f64() as f32),
    }
}

/// How gradient values in the accumulation dtype are written to the
/// output's element type.
pub trait GradSink<A: Acc>: Sync {
    /// The output's element type.
    type Elem: Copy + Send + Sync;
    /// `vals` rounded into `dst` (same length).
    fn write(&self, vals: &[A], dst: &mut [Self::Elem]);
    /// `+0`.
    fn zero(&self) -> Self::Elem;
    /// `dst` itself when its elements are the accumulation dtype and
    /// [`GradSink::write`] would copy them unchanged (then the write pass
    /// computes straight into it).
    #[inline(always)]
    fn as_acc<'b>(&self, dst: &'b mut [Self::Elem]) -> Option<&'b mut [A]> {
        let _ = dst;
        None
    }
}

/// `s` as `&[A]` when `E` and `A` are the same type.
#[inline(always)]
fn same_type_ref<A: 'static, E: 'static>(s: &[E]) -> Option<&[A]> {
    if std::any::TypeId::of::<A>() == std::any::TypeId::of::<E>() {
        // SAFETY: `A` and `E` are the same type, so the slice is the same.
        Some(unsafe { std::slice::from_raw_parts(s.as_ptr() as *const A, s.len()) })
    } else {
        None
    }
}

/// `dst` as `&mut [A]` when `E` and `A` are the same type.
#[inline(always)]
fn same_type<A: 'static, E: 'static>(dst: &mut [E]) -> Option<&mut [A]> {
    if std::any::TypeId::of::<A>() == std::any::TypeId::of::<E>() {
        // SAFETY: `A` and `E` are the same type, so the slice is the same.
        Some(unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr() as *mut A, dst.len()) })
    } else {
        None
    }
}

/// f64 storage of values rounded to `Dtype` (the [`crate::Kernel::backward`]
/// output).
#[derive(Clone, Copy, Debug)]
pub struct F64Rounded(pub Dtype);

impl<A: Acc> GradSink<A> for F64Rounded {
    type Elem = f64;
    #[inline]
    fn write(&self, vals: &[A], dst: &mut [f64]) {
        // The accumulation dtype's values are exact in any dtype at least as wide.
        let exact = self.0 == Dtype::F64 || (self.0 == Dtype::F32 && A::DTYPE == Dtype::F32);
        if exact {
            for (d, &v) in dst.iter_mut().zip(vals) {
                *d = v.to_f64();
            }
        } else {
            for (d, &v) in dst.iter_mut().zip(vals) {
                *d = self.0.round_f64(v.to_f64());
            }
        }
    }
    fn zero(&self) -> f64 {
        0.0
    }
    #[inline(always)]
    fn as_acc<'b>(&self, dst: &'b mut [f64]) -> Option<&'b mut [A]> {
        // f64 accumulation stored as f64 output: the values unchanged.
        if self.0 == Dtype::F64 {
            same_type::<A, f64>(dst)
        } else {
            None
        }
    }
}

/// Storage in `G` itself, rounded once to nearest ([`backward_into`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Typed<G>(pub std::marker::PhantomData<G>);

impl<A: Acc, G: GradElement> GradSink<A> for Typed<G> {
    type Elem = G;
    #[inline]
    fn write(&self, vals: &[A], dst: &mut [G]) {
        match same_type_ref::<f32, A>(vals) {
            Some(v) => G::from_f32_slice(v, dst),
            None => {
                for (d, &v) in dst.iter_mut().zip(vals) {
                    *d = round_to::<A, G>(v);
                }
            }
        }
    }
    fn zero(&self) -> G {
        G::from_f32(0.0)
    }
    #[inline(always)]
    fn as_acc<'b>(&self, dst: &'b mut [G]) -> Option<&'b mut [A]> {
        // `round_to` is the identity when `G` is the accumulation dtype.
        same_type::<A, G>(dst)
    }
}

/// Out of place: read from a source, write through a [`GradSink`].
pub struct ToSink<'a, A: Acc, S: Source<A> + ?Sized, K: GradSink<A>> {
    /// Source row.
    pub src: &'a S,
    /// Output row `[V_total]`.
    pub dst: &'a mut [K::Elem],
    /// How values are rounded and stored.
    pub sink: &'a K,
}

impl<A: Acc, S: Source<A> + ?Sized, K: GradSink<A>> RowIo<A> for ToSink<'_, A, S, K> {
    #[inline(always)]
    fn load(&self, start: usize, dst: &mut [A]) {
        self.src.load(start, dst)
    }
    fn get(&self, j: usize) -> A {
        self.src.get(j)
    }
    #[inline(always)]
    fn softcap_factors(&self, start: usize, dst: &mut [A]) -> bool {
        self.src.softcap_factors(start, dst)
    }
    #[inline(always)]
    fn store(&mut self, start: usize, vals: &[A]) {
        self.sink
            .write(vals, &mut self.dst[start..start + vals.len()]);
    }
    fn store_zeros(&mut self, range: std::ops::Range<usize>) {
        self.dst[range].fill(self.sink.zero());
    }
    #[inline(always)]
    fn block(&mut self, at: BlockCols, zbuf: &mut [A], f: &mut BlockFn<'_, A>) {
        let BlockCols { start, n, end } = at;
        let (src, sink) = (self.src, self.sink);
        let (dst, rest) = self.dst[start..].split_at_mut(n);
        let rest = &rest[..rest.len().min(end - start - n)];
        let z = match src.contiguous(start, n) {
            Some(z) => z,
            None => {
                src.load(start, &mut zbuf[..n]);
                &zbuf[..n]
            }
        };
        match sink.as_acc(dst) {
            Some(direct) => f(
                z,
                BlockOut {
                    direct: Some(direct),
                    emit: &mut |k, vals| {
                        prefetch_next(src, start + n, end, k, vals.len());
                        prefetch_write(rest, k, vals.len());
                    },
                },
            ),
            None => f(
                z,
                BlockOut {
                    direct: None,
                    emit: &mut |k, vals| {
                        prefetch_next(src, start + n, end, k, vals.len());
                        prefetch_write(rest, k, vals.len());
                        sink.write(vals, &mut dst[k..k + vals.len()]);
                    },
                },
            ),
        }
    }
}

/// Staged: read a widened buffer row, write an accumulation-dtype buffer row.
pub struct ToBuffer<'a, A> {
    /// Widened row `[V]`.
    pub src: &'a [A],
    /// Gradient row `[V]`.
    pub dst: &'a mut [A],
}

impl<A: Acc> RowIo<A> for ToBuffer<'_, A> {
    #[inline(always)]
    fn load(&self, start: usize, dst: &mut [A]) {
        self.src.load(start, dst)
    }
    fn get(&self, j: usize) -> A {
        self.src[j]
    }
    #[inline(always)]
    fn store(&mut self, start: usize, vals: &[A]) {
        self.dst[start..start + vals.len()].copy_from_slice(vals);
    }
    fn store_zeros(&mut self, range: std::ops::Range<usize>) {
        self.dst[range].fill(A::ZERO);
    }
    #[inline(always)]
    fn block(&mut self, at: BlockCols, _zbuf: &mut [A], f: &mut BlockFn<'_, A>) {
        let BlockCols { start, n, end } = at;
        let src = self.src;
        f(
            &src[start..start + n],
            BlockOut {
                direct: Some(&mut self.dst[start..start + n]),
                emit: &mut |k, vals| prefetch_next(src, start + n, end, k, vals.len()),
            },
        );
    }
}

/// In place over a typed logits row (rounded to the logits' dtype).
pub struct InPlace<'a, T> {
    /// The row `[V_total]`, read then overwritten block by block.
    pub row: ArrayViewMut1<'a, T>,
    /// `Some(T)` with `TemperatureDtype::Input`.
    pub input_temperature: Option<f64>,
    /// The softcap, if any.
    pub softcap: Option<Softcap>,
}

impl<T: Input> InPlace<'_, T> {
    fn typed(&self) -> TypedRow<'_, T> {
        TypedRow {
            row: self.row.view(),
            input_temperature: self.input_temperature,
            softcap: self.softcap,
        }
    }
}

impl<T: GradElement> RowIo<T::Acc> for InPlace<'_, T> {
    #[inline(always)]
    fn load(&self, start: usize, dst: &mut [T::Acc]) {
        self.typed().load(start, dst)
    }
    fn get(&self, j: usize) -> T::Acc {
        self.typed().get(j)
    }
    #[inline(always)]
    fn softcap_factors(&self, start: usize, dst: &mut [T::Acc]) -> bool {
        self.typed().softcap_factors(start, dst)
    }
    #[inline(always)]
    fn store(&mut self, start: usize, vals: &[T::Acc]) {
        match self.row.as_slice_mut() {
            Some(s) => {
                let s = &mut s[start..start + vals.len()];
                match same_type_ref::<f32, T::Acc>(vals) {
                    // `narrow` from f32 is `from_f32`: rounded once to nearest.
                    Some(v) => T::from_f32_slice(v, s),
                    None => {
                        for (d, &v) in s.iter_mut().zip(vals) {
                            *d = T::narrow(v);
                        }
                    }
                }
            }
            None => {
                for (i, &v) in vals.iter().enumerate() {
                    self.row[start + i] = T::narrow(v);
                }
            }
        }
    }
    fn store_zeros(&mut self, range: std::ops::Range<usize>) {
        for j in range {
            self.row[j] = T::narrow(<T::Acc as Acc>::ZERO);
        }
    }
}

/// The entropy term of the row's non-source entries. With no mask, or a
/// masked entropy, the entropy's logits are the row's own `z` and
/// [`row_stats`] takes its statistics from the same reduction (`m_w = m`,
/// `ell_w = ell` bit for bit), so `q_j = p_j` and `e_j = d_j`.
fn entropy_term<A: Acc>(
    st: &RowStats<A>,
    h: Option<A>,
    masked: bool,
    masked_entropy: bool,
) -> EntropyTerm<A> {
    match (h, st.w.as_ref()) {
        (Some(h), Some(w)) if masked && !masked_entropy => EntropyTerm::Unmasked {
            h,
            m: w.m,
            ell: w.ell,
            r: w.r,
        },
        (Some(h), Some(w)) => {
            debug_assert_eq!(w.m.to_f64().to_bits(), st.m.to_f64().to_bits());
            debug_assert_eq!(w.ell.to_f64().to_bits(), st.ell.to_f64().to_bits());
            EntropyTerm::Own { h, r: w.r }
        }
        _ => EntropyTerm::None,
    }
}

/// Writes the gradient of one row (columns `0..v`, padding `v..v_total`):
/// the non-source entries block by block (`crate::grad_block`, blocks
/// of [`BLOCK`] columns from column 0, the next block prefetched while one
/// is computed), then the source columns.
pub fn grad_row<A: Acc, Io: RowIo<A>>(
    io: &mut Io,
    mask: Option<ArrayView1<'_, bool>>,
    st: &RowStats<A>,
    p: &CallParams<A>,
    rc: &RowCot<A>,
    v_total: usize,
    masked_entropy: bool,
) {
    let v = p.v;
    let (mut total, u) = rc.total(st, p);
    // The policy terms' source at the target (read before any write).
    let pol = rc.policy.as_ref().map(|ps| {
        let lp = crate::stats::log_prob(io.get(ps.target), st, p.scale);
        (ps.target, ps.weight(lp))
    });
    // The top-k KL's sources at the ids (read before any write).
    let kl: Vec<(usize, A)> = match &rc.kl {
        Some(ks) => {
            let lps: Vec<A> = ks
                .ids
                .iter()
                .map(|&id| crate::stats::log_prob(io.get(id), st, p.scale))
                .collect();
            let w = crate::stats::topk_kl_slopes(&lps, &ks.teacher, ks.renormalized, ks.gf, ks.gr);
            ks.ids.iter().copied().zip(w).collect()
        }
        None => Vec::new(),
    };
    let sources: Vec<(usize, A)> = rc
        .sources
        .iter()
        .copied()
        .chain(pol)
        .chain(kl.iter().copied())
        .collect();
    if let Some((_, w)) = pol {
        total = total + w;
    }
    for &(_, w) in &kl {
        total = total + w;
    }
    let h = rc.h;
    // Source columns: read before the block pass (it may overwrite them),
    // with their softcap factors.
    let mut spec: Vec<(usize, A, Option<A>)> = Vec::with_capacity(rc.sources.len());
    for &(j, _) in &sources {
        if !spec.iter().any(|&(c, _, _)| c == j) {
            let mut f = [A::ONE];
            let capped = io.softcap_factors(j, &mut f);
            spec.push((j, io.get(j), capped.then_some(f[0])));
        }
    }
    let allowed = |j: usize| mask.is_none_or(|m| m[j]);
    let consts = BlockConsts {
        m: st.m,
        ell: st.ell,
        scale: p.scale,
        grad_scale: p.grad_scale,
        total,
        u,
        entropy: entropy_term(st, h, mask.is_some(), masked_entropy),
    };
    let mask_slice = mask.and_then(|m| m.to_slice());
    let mut zbuf = [A::ZERO; BLOCK];
    let mut mbuf = [false; BLOCK];
    let mut fbuf = [A::ONE; BLOCK];
    let mut start = 0;
    while start < v {
        let n = BLOCK.min(v - start);
        let mk: Option<&[bool]> = match (mask, mask_slice) {
            (None, _) => None,
            (Some(_), Some(s)) => Some(&s[start..start + n]),
            (Some(m), None) => {
                for (d, &x) in mbuf[..n]
                    .iter_mut()
                    .zip(m.slice(ndarray::s![start..start + n]))
                {
                    *d = x;
                }
                Some(&mbuf[..n])
            }
        };
        if io.softcap_factors(start, &mut fbuf[..n]) {
            let fac = &fbuf[..n];
            io.block(BlockCols { start, n, end: v }, &mut zbuf, &mut |z, out| {
                let BlockOut { direct, emit } = out;
                match direct {
                    Some(d) => {
                        grad_block(
                            &consts,
                            z,
                            mk,
                            BlockOut {
                                direct: Some(&mut *d),
                                emit: &mut *emit,
                            },
                        );
                        for (g, &f) in d.iter_mut().zip(fac) {
                            *g = softcapped(*g, f);
                        }
                    }
                    None => {
                        let mut tmp = [A::ZERO; BLOCK];
                        grad_block(
                            &consts,
                            z,
                            mk,
                            BlockOut {
                                direct: None,
                                emit: &mut |k, vals| {
                                    let t = &mut tmp[..vals.len()];
                                    for ((o, &g), &f) in t.iter_mut().zip(vals).zip(&fac[k..]) {
                                        *o = softcapped(g, f);
                                    }
                                    emit(k, t)
                                },
                            },
                        );
                    }
                }
            });
        } else {
            io.block(BlockCols { start, n, end: v }, &mut zbuf, &mut |z, out| {
                grad_block(&consts, z, mk, out)
            });
        }
        start += n;
    }
    io.store_zeros(v..v_total);
    // Source columns: c_j (1 - p_j) - o_j p_j - h q_j (e_j + R), cancellation-free.
    for &(j, zj, fj) in &spec {
        let (mut c, mut o) = (A::ZERO, A::ZERO);
        for &(i, w) in &sources {
            if i == j {
                c = c + w;
            } else {
                o = o + w;
            }
        }
        let d = shift(zj, st.m, p.scale);
        let pj = (d - st.ell).exp();
        let one_minus_p = if d == A::ZERO {
            st.s / (A::ONE + st.s)
        } else {
            A::ONE - pj
        };
        // The others' weight of `p_j` less the loss side's (`total - c`);
        // `u` is every allowed entry's (a source is allowed).
        let o = match &rc.loss {
            None => o,
            Some(l) => o - l.p_weight(st, p),
        };
        let mut g = c * one_minus_p - o * pj + u;
        if let (Some(h), Some(w)) = (h, st.w.as_ref()) {
            let zw = if allowed(j) || !masked_entropy {
                zj
            } else {
                A::NEG_INF
            };
            let e = shift(zw, w.m, p.scale);
            let q = (e - w.ell).exp();
            let t = if q > A::ZERO { q * (e + w.r) } else { A::ZERO };
            g = g - h * t;
        }
        let g = match p.grad_scale {
            None => g,
            Some(t) => g / t,
        };
        io.store(
            j,
            &[match fj {
                None => g + A::ZERO,
                Some(f) => softcapped(g, f),
            }],
        );
    }
}

/// A gradient `g` with respect to `x'` times the softcap factor `f =
/// dx'/dx`, one rounding, zeros `+0` (the same operation in every staging).
#[inline(always)]
fn softcapped<A: Acc>(g: A, f: A) -> A {
    g * f + A::ZERO
}

/// The softcap factors applied to a row's gradients `g [V]` computed from
/// a buffer of `x'` (chunked staging): `g_j <- g_j f_j` with `f_j` from the
/// raw logits `raw` ([`Softcap::grad_factor`]), as the fused write pass
/// does per block. No-op without a softcap.
pub fn apply_softcap_factors<T: Input>(
    softcap: Option<Softcap>,
    raw: ArrayView1<'_, T>,
    g: &mut [T::Acc],
) {
    if let Some(sc) = softcap {
        for (j, gj) in g.iter_mut().enumerate() {
            *gj = softcapped(*gj, sc.grad_factor(raw[j]));
        }
    }
}

fn params<A: Acc>(
    problem: &Problem<'_>,
    shape: &Shape,
    cot: &Cotangents<'_>,
    widths: &[usize],
) -> CallParams<A> {
    let mut p = CallParams::<A>::new(problem, shape);
    p.ranges = shard_ranges(widths, shape.vocab_size);
    if cot.column(Output::Entropy).is_none() {
        p.entropy = None;
    }
    if let (Some(_), Some(ce)) = (cot.column(Output::Loss), problem.cross_entropy()) {
        // Validated before (`Problem::validate`): eps in [0, 1].
        let eps = ce
            .effective_label_smoothing(shape.dtype.accumulation())
            .unwrap_or(0.0);
        let divisor = (ce.reduction == Reduction::Mean)
            .then(|| {
                let counted = |r: usize| problem.has_target(r);
                // The whole problem's `W` when these rows are a view of it.
                if let Some(d) = cot.loss_divisor {
                    let parts = d.parts();
                    return pairwise_sum(0..parts.len(), &|i| A::from_f64(parts[i]));
                }
                match ce.loss_weights {
                    Some(_) => pairwise_sum(0..shape.n, &|r| {
                        if counted(r) {
                            A::from_f64(ce.weight(r))
                        } else {
                            A::ZERO
                        }
                    }),
                    None => A::from_f64((0..shape.n).filter(|&r| counted(r)).count() as f64),
                }
            })
            .filter(|&d| d != A::ZERO);
        p.loss_grad = Some(LossGrad {
            eps: A::from_f64(eps),
            divisor,
        });
    }
    p
}

fn masked_entropy(problem: &Problem<'_>) -> bool {
    problem.options.entropy == Some(logprobe_reference::spec::EntropyLogits::Masked)
}

/// Stats of every row of `lv` (the first error in row order wins).
fn all_stats<T: Input>(
    problem: &Problem<'_>,
    shape: &Shape,
    lv: &ArrayView2<'_, T>,
    p: &CallParams<T::Acc>,
) -> Result<Vec<RowStats<T::Acc>>, SpecError> {
    let rows: Vec<Result<RowStats<T::Acc>, SpecError>> = (0..shape.n)
        .into_par_iter()
        .map(|r| {
            let src = typed_row(lv, r, p);
            if ids_suspect(problem, &src, r, p.v) {
                return Err(row_error(problem, shape, r));
            }
            row_stats(&src, mask_row(problem.sampling_mask, r), p)
                .map_err(|_| row_error(problem, shape, r))
        })
        .collect();
    rows.into_iter().collect()
}

/// The gradient of every row into `grad` (`[N, V_total]`, row-major)
/// through `sink`. Fused staging: per row its stats, then its write pass
/// (the row is read twice while it is still in cache); rows in parallel.
#[allow(clippy::too_many_arguments)]
fn backward_rows<T: Input, K: GradSink<T::Acc>>(
    problem: &Problem<'_>,
    shape: &Shape,
    lv: ArrayView2<'_, T>,
    cot: &Cotangents<'_>,
    sink: &K,
    staging: Staging,
    widths: &[usize],
    grad: &mut [K::Elem],
) -> Result<(), SpecError> {
    let p = params::<T::Acc>(problem, shape, cot, widths);
    let me = masked_entropy(problem);
    let (n, vt) = (shape.n, shape.v_total);
    if n == 0 || vt == 0 {
        if n > 0 {
            return Err(row_error(problem, shape, 0));
        }
        return Ok(());
    }
    match staging {
        Staging::Fused => {
            let res: Vec<Result<(), SpecError>> = grad
                .par_chunks_mut(vt)
                .enumerate()
                .map(|(r, dst)| {
                    let src = typed_row(&lv, r, &p);
                    if ids_suspect(problem, &src, r, p.v) {
                        return Err(row_error(problem, shape, r));
                    }
                    let mask = mask_row(problem.sampling_mask, r);
                    let st = row_stats(&src, mask, &p).map_err(|_| row_error(problem, shape, r))?;
                    let rc = RowCot::new(problem, cot, r, &p);
                    let mut io = ToSink {
                        src: &src,
                        dst,
                        sink,
                    };
                    grad_row(&mut io, mask, &st, &p, &rc, vt, me);
                    Ok(())
                })
                .collect();
            res.into_iter().collect()
        }
        Staging::Chunked { chunk_size: cs } => {
            let v = p.v;
            let c = cs.min(n);
            let mut zbuf = vec![<T::Acc as Acc>::ZERO; c * v];
            let mut gbuf = vec![<T::Acc as Acc>::ZERO; c * v];
            for (ci, out_chunk) in grad.chunks_mut(cs * vt).enumerate() {
                let r0 = ci * cs;
                let rows = out_chunk.len() / vt;
                chunked_grad_chunk(
                    problem, shape, &lv, &p, cot, me, r0, rows, &mut zbuf, &mut gbuf,
                )?;
                out_chunk
                    .par_chunks_mut(vt)
                    .zip(gbuf.par_chunks(v.max(1)))
                    .for_each(|(dst, g)| {
                        sink.write(g, &mut dst[..v]);
                        dst[v..].fill(sink.zero());
                    });
            }
            Ok(())
        }
    }
}

fn backward_typed<T: Input>(
    problem: &Problem<'_>,
    shape: &Shape,
    lv: ArrayView2<'_, T>,
    cot: &Cotangents<'_>,
    out: Dtype,
    staging: Staging,
    widths: &[usize],
) -> Result<Array2<f64>, SpecError> {
    let mut grad = Array2::<f64>::zeros((shape.n, shape.v_total));
    let gs = grad.as_slice_mut().expect("fresh array is contiguous");
    backward_rows(
        problem,
        shape,
        lv,
        cot,
        &F64Rounded(out),
        staging,
        widths,
        gs,
    )?;
    Ok(grad)
}

/// One chunk of the chunked backward: widen rows `r0 .. r0 + rows` into
/// `zbuf`, their stats, gradients into `gbuf` (accumulation dtype).
#[allow(clippy::too_many_arguments)]
fn chunked_grad_chunk<T: Input>(
    problem: &Problem<'_>,
    shape: &Shape,
    lv: &ArrayView2<'_, T>,
    p: &CallParams<T::Acc>,
    cot: &Cotangents<'_>,
    me: bool,
    r0: usize,
    rows: usize,
    zbuf: &mut [T::Acc],
    gbuf: &mut [T::Acc],
) -> Result<(), SpecError> {
    let v = p.v;
    if v == 0 {
        return Err(row_error(problem, shape, r0));
    }
    zbuf[..rows * v]
        .par_chunks_mut(v)
        .enumerate()
        .for_each(|(i, z)| typed_row(lv, r0 + i, p).load(0, z));
    let res: Vec<Result<(), SpecError>> = zbuf[..rows * v]
        .par_chunks(v)
        .zip(gbuf[..rows * v].par_chunks_mut(v))
        .enumerate()
        .map(|(i, (z, g))| {
            let r = r0 + i;
            if ids_suspect(problem, z, r, v) {
                return Err(row_error(problem, shape, r));
            }
            let mask = mask_row(problem.sampling_mask, r);
            let st = row_stats(z, mask, p).map_err(|_| row_error(problem, shape, r))?;
            let rc = RowCot::new(problem, cot, r, p);
            grad_row(&mut ToBuffer { src: z, dst: g }, mask, &st, p, &rc, v, me);
            apply_softcap_factors(p.softcap, lv.row(r), g);
            Ok(())
        })
        .collect();
    res.into_iter().collect()
}

/// Grad logits `[N, V_total]` rounded to `out` (the module's formula),
/// stored as f64, for a `problem` whose shapes gave `shape` and whose
/// cotangents the caller validated. `widths`: vocabulary shard widths
/// whose statistics are reduced per shard and merged in shard order
/// (empty: one row-wide reduction); callers check that they sum to
/// `V_total`, and that a chunk size is at least 1.
///
/// # Errors
/// The spec's row errors (first bad row in row order).
pub(crate) fn backward(
    problem: &Problem<'_>,
    shape: &Shape,
    cot: &Cotangents<'_>,
    out: Dtype,
    staging: Staging,
    widths: &[usize],
) -> Result<Array2<f64>, SpecError> {
    logprobe_reference::with_logits!(problem.logits, lv => backward_typed(problem, shape, lv, cot, out, staging, widths))
}

/// Grad logits `[N, V_total]` (the module's formula) written into `grad`,
/// each value rounded once to nearest in `G` (f64, f32, bf16 or f16);
/// padded columns get `+0`. `shape`, `staging` and `widths` as in
/// [`backward`]. Every entry of `grad` is written; on error its contents
/// are unspecified.
///
/// # Errors
/// [`SpecError::ShapeMismatch`] (tensor `grad_logits`) when `grad` is not
/// `[N, V_total]`; otherwise as [`backward`].
pub(crate) fn backward_into<G: GradElement>(
    problem: &Problem<'_>,
    shape: &Shape,
    cot: &Cotangents<'_>,
    staging: Staging,
    widths: &[usize],
    mut grad: ArrayViewMut2<'_, G>,
) -> Result<(), SpecError> {
    if grad.dim() != (shape.n, shape.v_total) {
        return Err(SpecError::ShapeMismatch {
            tensor: "grad_logits",
            expected: vec![shape.n, shape.v_total],
            found: grad.shape().to_vec(),
        });
    }
    let sink = Typed::<G>(std::marker::PhantomData);
    macro_rules! go {
        ($lv:expr, $gs:expr) => {
            logprobe_reference::with_logits!(problem.logits, lv => backward_rows(problem, shape, lv, cot, &sink, staging, widths, $gs))
        };
    }
    match grad.as_slice_mut() {
        Some(gs) => go!(lv, gs),
        None => {
            let mut tmp = Array2::from_elem(grad.dim(), G::from_f32(0.0));
            go!(lv, tmp.as_slice_mut().expect("fresh array is contiguous"))?;
            grad.assign(&tmp);
            Ok(())
        }
    }
}

/// Grad logits written over `problem.logits`, rounded to the logits'
/// dtype. Shapes and cotangents are validated here, then every row (a
/// stats pass over all rows) before anything is written: on error the
/// logits are unchanged. `staging` and `widths` as in [`backward`].
///
/// # Errors
/// The spec's validation errors (shapes, cotangents, first bad row).
pub(crate) fn backward_in_place(
    problem: ProblemMut<'_>,
    cot: &Cotangents<'_>,
    staging: Staging,
    widths: &[usize],
) -> Result<(), SpecError> {
    let ProblemMut {
        logits,
        tokens,
        sampling_mask,
        topk_ids,
        policy,
        teacher_topk_log_probs,
        options,
        loss_weights,
    } = problem;
    macro_rules! go {
        ($lv:expr, $wrap:path) => {{
            let mut lv = $lv;
            let write = {
                let problem = Problem {
                    logits: $wrap(lv.view()),
                    tokens,
                    sampling_mask,
                    topk_ids,
                    policy: policy.shorten(),
                    teacher_topk_log_probs,
                    options,
                    loss_weights,
                };
                let shape = problem.validate_shapes()?;
                problem.validate_cotangents(&shape, cot)?;
                plan_in_place(&problem, &shape, lv.view(), cot, widths)?
            };
            apply_in_place(&mut lv, sampling_mask, &options, write, staging);
            Ok(())
        }};
    }
    match logits {
        LogitsMut::F64(lv) => go!(lv, Logits::F64),
        LogitsMut::F32(lv) => go!(lv, Logits::F32),
        LogitsMut::Bf16(lv) => go!(lv, Logits::Bf16),
        LogitsMut::F16(lv) => go!(lv, Logits::F16),
    }
}

/// Everything the in-place write pass needs, computed before any write.
struct InPlacePlan<A: Acc> {
    shape: Shape,
    p: CallParams<A>,
    stats: Vec<RowStats<A>>,
    cots: Vec<RowCot<A>>,
}

fn plan_in_place<T: Input>(
    problem: &Problem<'_>,
    shape: &Shape,
    lv: ArrayView2<'_, T>,
    cot: &Cotangents<'_>,
    widths: &[usize],
) -> Result<InPlacePlan<T::Acc>, SpecError> {
    let p = params::<T::Acc>(problem, shape, cot, widths);
    if shape.n > 0 && shape.vocab_size == 0 {
        return Err(row_error(problem, shape, 0));
    }
    let stats = all_stats(problem, shape, &lv, &p)?;
    let cots = (0..shape.n)
        .map(|r| RowCot::new(problem, cot, r, &p))
        .collect();
    Ok(InPlacePlan {
        shape: *shape,
        p,
        stats,
        cots,
    })
}

fn apply_in_place<T: GradElement>(
    lv: &mut ArrayViewMut2<'_, T>,
    sampling_mask: Option<ArrayView2<'_, bool>>,
    options: &Options,
    plan: InPlacePlan<T::Acc>,
    staging: Staging,
) {
    let me = options.entropy == Some(logprobe_reference::spec::EntropyLogits::Masked);
    let vt = plan.shape.v_total;
    let p = &plan.p;
    match staging {
        Staging::Fused => {
            let rows: Vec<ArrayViewMut1<'_, T>> = lv.outer_iter_mut().collect();
            rows.into_par_iter().enumerate().for_each(|(r, row)| {
                let mut io = InPlace {
                    row,
                    input_temperature: p.input_temperature,
                    softcap: p.softcap,
                };
                grad_row(
                    &mut io,
                    mask_row(sampling_mask, r),
                    &plan.stats[r],
                    p,
                    &plan.cots[r],
                    vt,
                    me,
                );
            });
        }
        Staging::Chunked { chunk_size: cs } => {
            let v = p.v;
            let c = cs.min(plan.shape.n);
            let mut zbuf = vec![<T::Acc as Acc>::ZERO; c * v];
            let mut gbuf = vec![<T::Acc as Acc>::ZERO; c * v];
            let mut r0 = 0;
            while r0 < plan.shape.n {
                let rows = cs.min(plan.shape.n - r0);
                let mut sl = lv.slice_mut(ndarray::s![r0..r0 + rows, ..]);
                let mut chunk: Vec<ArrayViewMut1<'_, T>> = sl.outer_iter_mut().collect();
                zbuf[..rows * v]
                    .par_chunks_mut(v)
                    .zip(chunk.par_iter())
                    .for_each(|(z, row)| {
                        TypedRow {
                            row: row.view(),
                            input_temperature: p.input_temperature,
                            softcap: p.softcap,
                        }
                        .load(0, z)
                    });
                zbuf[..rows * v]
                    .par_chunks(v)
                    .zip(gbuf[..rows * v].par_chunks_mut(v))
                    .zip(chunk.par_iter())
                    .enumerate()
                    .for_each(|(i, ((z, g), row))| {
                        let r = r0 + i;
                        grad_row(
                            &mut ToBuffer { src: z, dst: g },
                            mask_row(sampling_mask, r),
                            &plan.stats[r],
                            p,
                            &plan.cots[r],
                            v,
                            me,
                        );
                        apply_softcap_factors(p.softcap, row.view(), g);
                    });
                chunk
                    .par_iter_mut()
                    .zip(gbuf[..rows * v].par_chunks(v))
                    .for_each(|(row, g)| {
                        for (j, &x) in g.iter().enumerate() {
                            row[j] = T::narrow(x);
                        }
                        for j in v..vt {
                            row[j] = T::narrow(<T::Acc as Acc>::ZERO);
                        }
                    });
                r0 += rows;
            }
        }
    }
}
