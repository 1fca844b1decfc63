//! Where a row's values come from: the caller's typed logits
//! ([`TypedRow`], widened on load) or a widened buffer (`[A]`); the cache
//! prefetch hints the block loops issue.

use ndarray::ArrayView1;

use super::{Acc, Input};

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
