//! The decision (F8) of an f64 enclosure in a target dtype (module docs
//! of [`super`]).

use crate::oracle::{Exact, Interval};
use crate::spec::Dtype;

/// `x` rounded to nearest even in `dtype` (exact f64).
#[inline(always)]
pub(super) fn round_to(x: f64, dtype: Dtype) -> f64 {
    match dtype {
        Dtype::F64 => x,
        Dtype::F32 => x as f32 as f64,
        d => d.round_f64(x),
    }
}

/// The decision (F8) of an enclosure in `target`: `Some` with the
/// correctly rounded value when both ends round to the same bits and the
/// enclosure does not contain 0; `None` otherwise (undecided here: the MPFR
/// path decides). Units: those of the value.
///
/// ```
/// use logprobe_reference::oracle::{fast::decide, Interval};
/// use logprobe_reference::spec::Dtype;
/// let e = decide(Interval { lo: 0.1, hi: 0.1 + 1e-12 }, Dtype::F32).unwrap();
/// assert_eq!(e.rounded, 0.1f32 as f64);
/// assert!(decide(Interval { lo: 1.0, hi: 1.0 + 1e-7 }, Dtype::F32).is_none());
/// ```
pub fn decide(enclosure: Interval, target: Dtype) -> Option<Exact> {
    let Interval { lo, hi } = enclosure;
    if !(lo <= hi) || (lo <= 0.0 && hi >= 0.0) {
        return None;
    }
    let rl = round_to(lo, target);
    (rl.to_bits() == round_to(hi, target).to_bits()).then(|| Exact::new(enclosure, rl, true))
}

/// [`decide`] for an exact value known to be `< 0` (`negative`) or `> 0`:
/// an end on the wrong side of 0 stands for a value of that sign next to
/// 0, which rounds to `-0` (`+0`) in every dtype.
pub(crate) fn decide_signed(enclosure: Interval, target: Dtype, negative: bool) -> Option<Exact> {
    let Interval { lo, hi } = enclosure;
    if !(lo <= hi) {
        return None;
    }
    let (rl, rh) = if negative {
        (
            round_to(lo, target),
            if hi >= 0.0 {
                -0.0
            } else {
                round_to(hi, target)
            },
        )
    } else {
        (
            if lo <= 0.0 { 0.0 } else { round_to(lo, target) },
            round_to(hi, target),
        )
    };
    (rl.to_bits() == rh.to_bits()).then(|| Exact::new(enclosure, rl, true))
}
