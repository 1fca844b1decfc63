//! Interval primitives, the bottom of the crate: outward f64 enclosures
//! ([`Interval`], with the directed-rounding operations of module `ival`)
//! and MPFR ones ([`MpfrInterval`]). The oracle's exact (MPFR) path, its
//! certified f64 tier and the family modules above build on these; nothing
//! here imports from them.

mod ival;
mod mpfr;

pub(crate) use ival::{add_dn, add_up, div_dn, div_up, mul_dn, mul_up, two_sum, TINY, U};
pub use mpfr::MpfrInterval;

/// An outward f64 enclosure `[lo, hi]` of an exact real (`lo <= x <= hi`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Interval {
    /// Lower end (rounded down).
    pub lo: f64,
    /// Upper end (rounded up).
    pub hi: f64,
}
