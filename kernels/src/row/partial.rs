//! The shifted logit ([`shift`]) and a block's partial reduction
//! ([`Partial`]: max, `S - 1`, `B`) with its rescaling merge.

use super::Acc;

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
