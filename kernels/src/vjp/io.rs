//! Where the CPU VJP's write pass reads a row and writes its gradient
//! ([`RowIo`]: a sink of f64 or typed values, a buffer, the logits in place).

use super::*;

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
