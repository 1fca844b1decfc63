//! Per-worker reusable row buffers (issue 12): a row's `[V]` scratch
//! vectors are taken from the current thread's pool and given back when
//! the row is done, so a rayon worker judging row after row reuses the
//! same pages instead of mapping, zeroing and unmapping fresh ones per row.
//! Memory: at most [`KEEP`] idle buffers per thread (each as large as the
//! largest row it held).

use std::cell::RefCell;

use logprobe_reference::oracle::Interval;

/// Idle buffers kept per thread and element type.
const KEEP: usize = 8;

thread_local! {
    static F64: RefCell<Vec<Vec<f64>>> = const { RefCell::new(Vec::new()) };
    static IV: RefCell<Vec<Vec<Interval>>> = const { RefCell::new(Vec::new()) };
    static F32: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// An empty `Vec<f64>` with the capacity of a buffer given back earlier on
/// this thread (or a new one): fill it, then [`give_f64`] it back.
pub(crate) fn take_f64() -> Vec<f64> {
    F64.with(|p| p.borrow_mut().pop()).unwrap_or_default()
}

/// Returns a buffer of [`take_f64`] to this thread's pool (cleared).
pub(crate) fn give_f64(mut v: Vec<f64>) {
    if v.capacity() == 0 {
        return;
    }
    v.clear();
    F64.with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < KEEP {
            p.push(v);
        }
    });
}

/// [`take_f64`] for enclosures (the row statistics' `d`, `e`).
pub(crate) fn take_iv() -> Vec<Interval> {
    IV.with(|p| p.borrow_mut().pop()).unwrap_or_default()
}

/// [`give_f64`] for enclosures.
pub(crate) fn give_iv(mut v: Vec<Interval>) {
    if v.capacity() == 0 {
        return;
    }
    v.clear();
    IV.with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < KEEP {
            p.push(v);
        }
    });
}

/// [`take_f64`] for f32 values (the gradient screen's ratio bounds).
pub(crate) fn take_f32() -> Vec<f32> {
    F32.with(|p| p.borrow_mut().pop()).unwrap_or_default()
}

/// [`give_f64`] for f32 values.
pub(crate) fn give_f32(mut v: Vec<f32>) {
    if v.capacity() == 0 {
        return;
    }
    v.clear();
    F32.with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < KEEP {
            p.push(v);
        }
    });
}
