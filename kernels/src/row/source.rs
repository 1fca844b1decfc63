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
    /// The softcap's gradient factors `dx'/dx` ([`Softcap::grad_factor`])
    /// of columns `start .. start + dst.len()` into `dst`, when this source
    /// applies a softcap to raw logits it holds (`true`); `false` (and
    /// `dst` untouched) otherwise: no softcap, or a widened buffer that
    /// holds `x'` already (its caller applies the factors from the raw row).
    #[inline(always)]
    fn softcap_factors(&self, start: usize, dst: &mut [A]) -> bool {
        let _ = (start, dst);
        false
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

/// The softcap `x' = c tanh(x / c)` as a row source applies it
/// (docs/design.md, "The loss side"); `c` is the spec's value rounded to the accumulation dtype
/// (`Options::effective_softcap`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Softcap {
    /// `SoftcapDtype::Accumulation`: [`softcap_acc`] in the accumulation dtype.
    Acc(f64),
    /// `SoftcapDtype::Input`: the materialised `x'`
    /// ([`Dtype::softcapped_input`](logprobe_reference::spec::Dtype::softcapped_input)),
    /// exact in the logits' dtype.
    Input(f64),
}

impl Softcap {
    /// The softcap of `options` for logits of dtype `dtype` (`None` without
    /// one, or when `c` is invalid: validation reports that first).
    pub fn of(
        options: &logprobe_reference::spec::Options,
        dtype: logprobe_reference::spec::Dtype,
    ) -> Option<Self> {
        let c = options.effective_softcap(dtype.accumulation()).ok()??;
        Some(match options.softcap_dtype {
            logprobe_reference::spec::SoftcapDtype::Accumulation => Softcap::Acc(c),
            logprobe_reference::spec::SoftcapDtype::Input => Softcap::Input(c),
        })
    }

    /// The gradient factor `dx'/dx = 1 - t^2` at logit `x`, in `T::Acc`:
    /// `t = tanh(fl(x / c))` as [`softcap_acc`] computes it (`Acc`), or the
    /// materialised `t` (`Input`, as autograd's tanh backward takes its
    /// saved output); `1 - t * t` with two roundings.
    #[inline]
    pub fn grad_factor<T: Input>(self, x: T) -> T::Acc {
        let one = <T::Acc as Acc>::ONE;
        let t = match self {
            Softcap::Acc(c) => (x.widen() / T::Acc::from_f64(c)).tanh(),
            Softcap::Input(c) => T::Acc::from_f64(T::DTYPE.softcap_tanh_input(x.to_f64(), c)),
        };
        one - t * t
    }
}

/// `fl(c * tanh(fl(x / c)))` in the accumulation dtype: one division, the
/// correctly rounded [`Acc::tanh`], one product (the error the tolerance
/// model's (T18) bounds). `tanh(-inf) = -1`, so `-inf` gives `-c`.
#[inline]
pub fn softcap_acc<A: Acc>(x: A, c: A) -> A {
    c * (x / c).tanh()
}

/// One row of typed logits `[V_total]`, widened on load; with a softcap each
/// value becomes `x'` ([`Softcap`]), then with `TemperatureDtype::Input`
/// `round_input(x' / T)`.
#[derive(Clone, Copy)]
pub struct TypedRow<'a, T> {
    /// The row.
    pub row: ArrayView1<'a, T>,
    /// `Some(T)` for `TemperatureDtype::Input`.
    pub input_temperature: Option<f64>,
    /// The softcap, if any.
    pub softcap: Option<Softcap>,
}

impl<T: Input> TypedRow<'_, T> {
    /// Whether values are the widened logits unchanged.
    #[inline(always)]
    fn plain(&self) -> bool {
        self.input_temperature.is_none() && self.softcap.is_none()
    }

    #[inline(always)]
    fn conv(&self, x: T) -> T::Acc {
        if self.softcap.is_some() && x.to_f64() == f64::INFINITY {
            // Bad input (the spec's NonFiniteLogit): kept `+inf` so that the
            // reduction flags the row, as without a softcap (tanh would
            // turn it into a finite `c`).
            return <T::Acc as Acc>::INF;
        }
        match (self.softcap, self.input_temperature) {
            (None, None) => x.widen(),
            (None, Some(t)) => round_input::<T>(x, t).widen(),
            (Some(Softcap::Acc(c)), None) => softcap_acc(x.widen(), T::Acc::from_f64(c)),
            // The spec rejects this pair (`SoftcapDtypeMismatch`); defined
            // all the same: the accumulation's x' materialised over T.
            (Some(Softcap::Acc(c)), Some(t)) => {
                let xs = softcap_acc(x.widen(), T::Acc::from_f64(c)).to_f64();
                T::Acc::from_f64(T::DTYPE.scaled_input(xs, t))
            }
            (Some(Softcap::Input(c)), t) => {
                let xs = T::DTYPE.softcapped_input(x.to_f64(), c);
                let z = t.map_or(xs, |t| T::DTYPE.scaled_input(xs, t));
                T::from_f64(z).widen()
            }
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
        if let (Some(sl), true) = (self.row.as_slice(), self.plain()) {
            T::widen_slice(&sl[start..start + n], dst);
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
        if !self.plain() {
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
    #[inline]
    fn softcap_factors(&self, start: usize, dst: &mut [T::Acc]) -> bool {
        match self.softcap {
            None => false,
            Some(sc) => {
                for (i, d) in dst.iter_mut().enumerate() {
                    *d = sc.grad_factor(self.row[start + i]);
                }
                true
            }
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
