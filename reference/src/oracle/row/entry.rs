//! One entry at a working precision: the enclosures of `a_j = -d_j` and
//! `exp(d_j)` against a family's shift reference ([`Top`]).

use std::cmp::Ordering;

use rug::float::Round;
use rug::ops::{AddAssignRound, AssignRound, DivAssignRound, MulAssignRound, NegAssign};
use rug::{Assign, Float};

use super::{softcap_enclosure, Top};
use crate::interval::MpfrInterval;

/// Scratch for one entry: `a = -d = (vmax - v) / ts >= 0` and `exp(-a)`.
#[derive(Debug)]
pub(crate) struct Entry {
    /// Enclosure of `a_j = -d_j >= 0`.
    pub a: MpfrInterval,
    /// Enclosure of `exp(d_j)`.
    pub ex: MpfrInterval,
    num: Float,
    t: Float,
    xs: MpfrInterval,
}

impl Entry {
    pub fn new(prec: u32) -> Self {
        Entry {
            a: MpfrInterval::new(prec),
            ex: MpfrInterval::new(prec),
            num: Float::new(prec),
            t: Float::new(prec),
            xs: MpfrInterval::new(prec),
        }
    }

    /// `a = (m - x'_v) / ts` against the family reference `top`: exact
    /// inputs as [`Entry::shift_exact`]; under an exact softcap `x'_v` is
    /// [`softcap_enclosure`]'d and `a = [(m.lo - x'.hi)^+, m.hi - x'.lo] / ts`
    /// outward (a point 0 for the max's own raw value: `x'` is a function
    /// of `x`).
    pub fn shift(&mut self, top: &Top, v: f64) {
        let Some(c) = top.cap else {
            return self.shift_exact(&top.m.lo, v, top.ts);
        };
        if v == top.raw {
            self.a.lo.assign(0u32);
            self.a.hi.assign(0u32);
            return;
        }
        softcap_enclosure(&mut self.xs, &mut self.num, &mut self.t, v, c);
        self.a.hi.assign_round(&top.m.hi - &self.xs.lo, Round::Up);
        self.a.lo.assign_round(&top.m.lo - &self.xs.hi, Round::Down);
        if self.a.lo < 0u32 {
            self.a.lo.assign(0u32);
        }
        if top.ts != 1.0 {
            self.a.hi.div_assign_round(top.ts, Round::Up);
            self.a.lo.div_assign_round(top.ts, Round::Down);
        }
    }

    /// `a = (vmax - v) / ts`. The subtraction is rounded up with its ternary
    /// value: exact differences (the usual case) give a point, others an
    /// interval one ulp wide; the division likewise (exact when `ts` is a
    /// power of two).
    pub fn shift_exact(&mut self, vmax: &Float, v: f64, ts: f64) {
        let ord = self.num.assign_round(vmax - v, Round::Up);
        if ts == 1.0 {
            self.a.hi.assign(&self.num);
            self.a.lo.assign(&self.num);
            if ord != Ordering::Equal {
                self.a.lo.next_down();
            }
        } else {
            let ord2 = self.a.hi.assign_round(&self.num / ts, Round::Up);
            if ord == Ordering::Equal {
                self.a.lo.assign(&self.a.hi);
                if ord2 != Ordering::Equal {
                    self.a.lo.next_down();
                }
            } else {
                self.num.next_down();
                self.a.lo.assign_round(&self.num / ts, Round::Down);
            }
        }
    }

    /// `ex = exp(-a)`: one MPFR exp rounded down at `-a.hi`; the upper end
    /// is its `next_up` (the exp itself when MPFR's ternary says exact),
    /// widened for the width `delta = a.hi - a.lo` by
    /// `exp(delta) <= 1 + 2 delta` (`delta <= 1/2`; a second exp otherwise).
    pub fn exp(&mut self) {
        self.ex.lo.assign(&self.a.hi);
        self.ex.lo.neg_assign();
        let ord = self.ex.lo.exp_round(Round::Down);
        self.ex.hi.assign(&self.ex.lo);
        if ord != Ordering::Equal {
            self.ex.hi.next_up();
        }
        if self.a.lo != self.a.hi {
            self.t.assign_round(&self.a.hi - &self.a.lo, Round::Up);
            if self.t > 0.5 {
                self.ex.hi.assign(&self.a.lo);
                self.ex.hi.neg_assign();
                self.ex.hi.exp_round(Round::Up);
            } else {
                self.t <<= 1u32;
                self.t.add_assign_round(1u32, Round::Up);
                self.ex.hi.mul_assign_round(&self.t, Round::Up);
            }
        }
    }
}
