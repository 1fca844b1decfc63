//! Per-worker reusable row buffers (issue 12): a row's `[V]` scratch
//! vectors are taken from the current thread's pool and given back when
//! the row is done, so a rayon worker judging row after row reuses the
//! same pages instead of mapping, zeroing and unmapping fresh ones per row.
//! Memory: at most [`KEEP`] idle buffers per thread (each as large as the
//! largest row it held).

use std::cell::RefCell;
use std::thread::LocalKey;

use logprobe_reference::oracle::Interval;

/// Idle buffers kept per thread and element type.
const KEEP: usize = 8;

/// An element type with a per-thread pool of buffers.
pub(crate) trait Pooled: Sized + 'static {
    /// This thread's idle buffers of `Self`.
    fn pool() -> &'static LocalKey<RefCell<Vec<Vec<Self>>>>;
}

macro_rules! pooled {
    ($($t:ty => $pool:ident),* $(,)?) => {$(
        thread_local! {
            static $pool: RefCell<Vec<Vec<$t>>> = const { RefCell::new(Vec::new()) };
        }
        impl Pooled for $t {
            fn pool() -> &'static LocalKey<RefCell<Vec<Vec<Self>>>> {
                &$pool
            }
        }
    )*};
}

// f64: row values; enclosures: the row statistics' `d`, `e`; f32 and i16:
// the gradient screen's ratio bounds and ulp exponents.
pooled!(f64 => F64, Interval => IV, f32 => F32, i16 => I16);

/// An empty `Vec<T>` with the capacity of a buffer given back earlier on
/// this thread (or a new one): fill it, then [`give`] it back.
pub(crate) fn take<T: Pooled>() -> Vec<T> {
    T::pool().with(|p| p.borrow_mut().pop()).unwrap_or_default()
}

/// Returns a buffer of [`take`] to this thread's pool (cleared).
pub(crate) fn give<T: Pooled>(mut v: Vec<T>) {
    if v.capacity() == 0 {
        return;
    }
    v.clear();
    T::pool().with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < KEEP {
            p.push(v);
        }
    });
}
