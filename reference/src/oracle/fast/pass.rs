//! The one exp pass over a softmax family and the a-priori bounds of its
//! sums (derivation: the module docs of [`super`], steps (F1)-(F6)).

use super::Mutant;
use crate::interval::Interval;
use crate::interval::{add_dn, add_up, div_up, mul_dn, mul_up, two_sum, TINY, U};

/// How the shift `a_j = (v_max - v_j) / ts` is divided.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Div {
    /// `ts = 1`: no division.
    One,
    /// `ts` a power of two: exact unless the quotient leaves the normal
    /// range, which `q * ts == n` detects.
    Pow2(f64),
    /// Any other `ts`: the quotient is taken as inexact (unless `n = 0`).
    Other(f64),
}

impl Div {
    pub(crate) fn new(ts: f64) -> Div {
        if ts == 1.0 {
            Div::One
        } else if ts.is_finite() && ts > 0.0 && {
            let (m, _) = frexp(ts);
            m == 0.5
        } {
            Div::Pow2(ts)
        } else {
            Div::Other(ts)
        }
    }
}

/// `(m, e)` with `x = m 2^e`, `0.5 <= m < 1`, for finite positive `x`.
fn frexp(x: f64) -> (f64, i32) {
    let bits = x.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32;
    if exp == 0 {
        let (m, e) = frexp(x * 2f64.powi(64));
        return (m, e - 64);
    }
    let m = f64::from_bits((bits & !(0x7ffu64 << 52)) | (1022u64 << 52));
    (m, exp - 1022)
}

/// `(a^, exact)`: the f64 shift `a^ = fl(fl(v_max - v) / ts)` and whether
/// it equals `a = (v_max - v) / ts` exactly (TwoSum's error is 0 and the
/// division is exact). `a^` is `+inf` only if the quotient overflows.
#[inline(always)]
pub(crate) fn shift(vmax: f64, x: f64, div: Div) -> (f64, bool) {
    let (n, err) = two_sum(vmax, -x);
    let (a, exact_div) = match div {
        Div::One => (n, true),
        Div::Pow2(t) => {
            let a = n / t;
            (a, a * t == n)
        }
        Div::Other(t) => (n / t, n == 0.0),
    };
    (a, err == 0.0 && exact_div)
}

/// `c1 >= (2u + u^2) / (1 - u)^2`: relative error bound of `a^` (F1).
pub(crate) const C1: f64 = 2.0 * U * (1.0 + 4.0 * U);
/// `kappa = 2^-42 >= c1 * 745.14 + 2^-1074`: the largest `Delta_j` of an
/// entry whose exp does not underflow to 0 (F2).
pub(crate) const KAPPA: f64 = 2.2737367544323206e-13;

/// `Delta(a^) = c1 a^ + 2^-1074 >= |a^ - a|` for an inexact shift (F1),
/// rounded up.
#[inline(always)]
pub(crate) fn delta(a_hat: f64) -> f64 {
    add_up(mul_up(C1, a_hat), TINY)
}

/// Enclosure of `a_j` from its f64 shift (F1): the point when exact,
/// `[a^ - Delta, a^ + Delta]` otherwise.
#[inline(always)]
pub(crate) fn a_interval(a_hat: f64, exact: bool, mutant: Option<Mutant>) -> Interval {
    if exact || mutant == Some(Mutant::ShiftNotWidened) {
        return Interval::point(a_hat);
    }
    let d = delta(a_hat);
    Interval {
        lo: add_dn(a_hat, -d).max(0.0),
        hi: add_up(a_hat, d),
    }
}

/// The tight enclosure of `a_j = (v_max - v_j) / ts` (used for the
/// statistics `d_j`, `e_j` and the log-probs): the subtraction rounded in
/// both directions exactly (TwoSum), then each end divided and moved one
/// ulp outward unless the division is exact.
pub(crate) fn a_tight(vmax: f64, x: f64, div: Div, mutant: Option<Mutant>) -> Interval {
    let (n, err) = two_sum(vmax, -x);
    if mutant == Some(Mutant::ShiftNotWidened) {
        return Interval::point(shift(vmax, x, div).0);
    }
    let (nl, nh) = if err == 0.0 {
        (n, n)
    } else if err > 0.0 {
        (n, n.next_up())
    } else {
        (n.next_down(), n)
    };
    match div {
        Div::One => Interval { lo: nl, hi: nh },
        Div::Pow2(t) | Div::Other(t) => {
            let (ql, qh) = (nl / t, nh / t);
            let exact_l = matches!(div, Div::Pow2(_)) && ql * t == nl || nl == 0.0;
            let exact_h = matches!(div, Div::Pow2(_)) && qh * t == nh || nh == 0.0;
            Interval {
                lo: if exact_l { ql } else { ql.next_down().max(0.0) },
                hi: if exact_h { qh } else { qh.next_up() },
            }
        }
    }
}

/// Enclosure of `E_j = exp(-a_j)` from `r = RN(exp(-a^))` (F2): `[pred r,
/// succ r]` (`[1, 1]` at an exact `a = 0`; `[0, 2^-1074]` when `r = 0`),
/// widened by `exp(+-Delta)` for an inexact shift.
#[inline(always)]
pub(crate) fn exp_interval(r: f64, a_hat: f64, exact: bool, mutant: Option<Mutant>) -> Interval {
    if a_hat == 0.0 && exact {
        return Interval::point(1.0);
    }
    if r == 0.0 {
        return Interval { lo: 0.0, hi: TINY };
    }
    let mut e = if mutant == Some(Mutant::ExpNotWidened) {
        Interval::point(r)
    } else {
        Interval {
            lo: r.next_down(),
            hi: r.next_up(),
        }
    };
    if !exact && mutant != Some(Mutant::ShiftNotWidened) {
        // e^{-Delta} >= 1 - Delta; e^{Delta} <= 1 + Delta (1 + kappa) (Delta <= kappa).
        let d = delta(a_hat);
        e.lo = add_dn(e.lo, -mul_up(e.lo, d)).max(0.0);
        e.hi = add_up(e.hi, mul_up(e.hi, mul_up(d, 1.0 + KAPPA)));
    }
    e
}

/// Sequential TwoSum accumulator of nonnegative terms: `hi + lo` is the
/// sum up to the bound [`Dd::err`].
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Dd {
    pub hi: f64,
    pub lo: f64,
}

impl Dd {
    #[inline(always)]
    pub fn add(&mut self, x: f64) {
        let (s, e) = two_sum(self.hi, x);
        self.hi = s;
        self.lo += e;
    }

    /// Bound (rounded up) on `|hi + lo - sum|` after `n` additions of
    /// nonnegative terms (F3): `gamma_n n u hi`.
    pub fn err(&self, n: u64) -> f64 {
        mul_up(mul_up(gamma(n), mul_up(n as f64, U)), self.hi)
    }

    /// `[hi + lo - w_lo, hi + lo + w_hi]` rounded outward (exactly in the
    /// direction of each end), lower end kept `>= 0`.
    pub fn enclose(&self, w_lo: f64, w_hi: f64) -> Interval {
        Interval {
            lo: add_dn(self.hi, add_dn(self.lo, -w_lo)).max(0.0),
            hi: add_up(self.hi, add_up(self.lo, w_hi)),
        }
    }
}

/// `gamma_n = n u / (1 - n u)` rounded up (Higham, "Accuracy and Stability
/// of Numerical Algorithms", 2nd ed., Lemma 3.1); `inf` when `n u >= 1/2`.
pub(crate) fn gamma(n: u64) -> f64 {
    let nu = mul_up(n as f64, U);
    if nu >= 0.5 {
        return f64::INFINITY;
    }
    div_up(nu, add_dn(1.0, -nu))
}

/// Per-entry values of one family, kept for the statistics, the
/// probabilities and the VJP: `a^_j`, `r_j = RN(exp(-a^_j))`, exactness.
#[derive(Clone, Debug, Default)]
pub(crate) struct Cache {
    pub a: Vec<f64>,
    pub r: Vec<f64>,
    pub exact: Vec<bool>,
}

/// What one pass accumulated over the members `j != argmax` of a family.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Sums {
    /// Members other than the argmax, `N`.
    pub n: u64,
    /// `sum r_j`.
    pub a0: Dd,
    /// `sum fl(r_j a^_j)` (when the family needs `B`).
    pub a1: Dd,
    /// `sum fl(fl(r_j a^_j) a^_j)` (when `M2` is asked for).
    pub a2: Dd,
    /// `sum fl(r_j a^_j)` over inexact shifts with `r_j > 0` (plain f64).
    pub x0: f64,
    /// `max a^_j` over inexact shifts with `r_j > 0`.
    pub amax: f64,
    /// A shift overflowed: the f64 tier cannot handle this row.
    pub bad: bool,
}

thread_local! {
    /// [`accumulate`]'s memo of `(a^_j, exact, RN(exp(-a^_j)))` by logit.
    static SHIFT_MEMO: std::cell::RefCell<ShiftMemo> = std::cell::RefCell::new(ShiftMemo::default());
}

/// Slots of [`ShiftMemo`] (a 16-bit hash of the logit's bits).
const MEMO_SLOTS: usize = 1 << 16;
/// Members after which [`MemoPass`] checks its hit rate.
const MEMO_TRIAL: u32 = 4096;

/// A direct-mapped memo of one pass's per-entry `(a^, exact, r)`, keyed by
/// the logit's bits: every slot holds the logit it answers for and the
/// pass that wrote it, so a hit is the same value the computation gives
/// (bit for bit). Rows of 16-bit logits repeat a few thousand values over
/// `V`, so most entries skip the shift and the exp; a row whose first
/// [`MEMO_TRIAL`] members hit less than a quarter of the time (f32 logits)
/// stops looking.
#[derive(Default)]
struct ShiftMemo {
    /// `(logit bits, pass, a^, r, exact)`.
    slots: Vec<(u64, u32, f64, f64, bool)>,
    /// The current pass (a slot of another pass is empty).
    pass: u32,
}

#[cfg(test)]
thread_local! {
    /// Tests: the memo is off on this thread.
    static MEMO_OFF: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl ShiftMemo {
    fn start(&mut self) -> MemoPass<'_> {
        #[cfg(test)]
        let on = !MEMO_OFF.with(|o| o.get());
        #[cfg(not(test))]
        let on = true;
        if self.slots.is_empty() {
            self.slots = vec![(0, 0, 0.0, 0.0, false); MEMO_SLOTS];
        }
        self.pass = self.pass.wrapping_add(1);
        if self.pass == 0 {
            // Wrapped: no slot may claim the new pass.
            self.slots.fill((0, 0, 0.0, 0.0, false));
            self.pass = 1;
        }
        MemoPass {
            memo: self,
            on,
            seen: 0,
            hits: 0,
        }
    }
}

/// One pass's use of the [`ShiftMemo`].
struct MemoPass<'m> {
    memo: &'m mut ShiftMemo,
    on: bool,
    seen: u32,
    hits: u32,
}

impl MemoPass<'_> {
    /// `f()` for logit `x`: from the memo when this pass already computed
    /// it for the same bits.
    #[inline(always)]
    fn get(&mut self, x: f64, f: impl FnOnce() -> (f64, bool, f64)) -> (f64, bool, f64) {
        if !self.on {
            return f();
        }
        let bits = x.to_bits();
        // A bf16 value (an f32 with 16 zero low bits, as every 16-bit
        // logit's shift-free value is) keys by its own 16 bits: nearby
        // logits take nearby slots, so a row's few thousand values occupy
        // a compact range of the table; any other value, by a hash.
        let b32 = (x as f32).to_bits();
        let key = if b32 & 0xffff == 0 && f64::from(f32::from_bits(b32)).to_bits() == bits {
            (b32 >> 16) as usize
        } else {
            (bits.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48) as usize
        };
        let pass = self.memo.pass;
        let slot = &mut self.memo.slots[key];
        self.seen += 1;
        if slot.0 == bits && slot.1 == pass {
            self.hits += 1;
            return (slot.2, slot.4, slot.3);
        }
        let (a, exact, r) = f();
        *slot = (bits, pass, a, r, exact);
        if self.seen == MEMO_TRIAL && self.hits < MEMO_TRIAL / 4 {
            self.on = false;
        }
        (a, exact, r)
    }
}

/// The pass over one family: every member `j` (finite `v_j` with
/// `member(j)`), one correctly rounded exp each (CORE-MATH). `B` adds the
/// `a1` sum, `M2` the `a2` sum; with `cache`, every member's `(a^, r,
/// exact)` is kept (index `j`).
#[inline(never)]
pub(crate) fn accumulate<const B: bool, const M2: bool>(
    v: &[f64],
    member: impl Fn(usize) -> bool,
    vmax: f64,
    argmax: usize,
    div: Div,
    mut cache: Option<&mut Cache>,
) -> Sums {
    let mut s = Sums::default();
    if let Some(c) = cache.as_deref_mut() {
        c.a.clear();
        c.r.clear();
        c.exact.clear();
        c.a.resize(v.len(), f64::INFINITY);
        c.r.resize(v.len(), 0.0);
        c.exact.resize(v.len(), true);
    }
    let (mut x0, mut amax, mut bad) = (0.0f64, 0.0f64, false);
    let (mut a0, mut a1, mut a2) = (Dd::default(), Dd::default(), Dd::default());
    let mut n = 0u64;
    SHIFT_MEMO.with_borrow_mut(|memo| {
        let mut memo = memo.start();
        for (j, &x) in v.iter().enumerate() {
            if x == f64::NEG_INFINITY || !member(j) {
                continue;
            }
            bad |= !(vmax - x <= f64::MAX);
            let (a, exact, r) = memo.get(x, || {
                let (a, exact) = shift(vmax, x, div);
                (a, exact, core_math::exp(-a))
            });
            let r = if j == argmax { 1.0 } else { r };
            if let Some(c) = cache.as_deref_mut() {
                c.a[j] = a;
                c.r[j] = r;
                c.exact[j] = exact;
            }
            if j == argmax {
                continue;
            }
            n += 1;
            a0.add(r);
            let ac = a.min(f64::MAX);
            let flag = ((!exact) & (r > 0.0)) as u8 as f64;
            let pr = r * ac;
            if B {
                a1.add(pr);
                if M2 {
                    a2.add(pr * ac);
                }
            }
            x0 += flag * pr;
            amax = amax.max(flag * ac);
        }
    });
    s.n = n;
    s.a0 = a0;
    s.a1 = a1;
    s.a2 = a2;
    s.x0 = x0;
    s.amax = amax;
    s.bad = bad;
    s
}

/// Enclosures of one family's sums (F4-F6).
#[derive(Clone, Copy, Debug)]
pub(crate) struct FamilyBounds {
    /// `s = S - 1 = sum_{j != argmax} E_j`.
    pub s: Interval,
    /// `S = 1 + s`.
    pub big_s: Interval,
    /// `ln S = ln_1p(s)`.
    pub ln_s: Interval,
    /// `B = sum E_j a_j` (when accumulated).
    pub b: Interval,
    /// `sum E_j a_j^2` (when accumulated).
    pub t2: Interval,
}

/// `ln_1p` rounded down / up from CORE-MATH's correctly rounded `log1p`.
pub(crate) fn ln_1p(s: Interval) -> Interval {
    let dn = |x: f64| {
        if x == 0.0 {
            0.0
        } else {
            core_math::log1p(x).next_down().max(0.0)
        }
    };
    let up = |x: f64| {
        if x == 0.0 {
            0.0
        } else {
            core_math::log1p(x).next_up()
        }
    };
    Interval {
        lo: dn(s.lo),
        hi: up(s.hi),
    }
}

/// The bounds (F4-F6) of `sums`.
pub(crate) fn family_bounds(sums: &Sums, mutant: Option<Mutant>) -> FamilyBounds {
    let n = sums.n;
    let nf = n as f64;
    let one_u = 1.0 + 2.0 * U; // >= 1 + u, exact
    let gn = gamma(n);
    let e0 = sums.a0.err(n);
    // R0 >= sum r_j.
    let r0 = add_up(sums.a0.hi, add_up(sums.a0.lo, e0));
    let shift_widened = mutant != Some(Mutant::ShiftNotWidened);
    let exp_widened = mutant != Some(Mutant::ExpNotWidened);
    // Xex >= sum over inexact shifts of r_j a^_j (products and their plain sum rounded).
    let (xex, c2) = if shift_widened {
        let x0up = div_up(sums.x0, add_dn(1.0, -gn));
        (add_up(mul_up(one_u, x0up), mul_up(nf, TINY)), TINY)
    } else {
        (0.0, 0.0)
    };
    let amax = if shift_widened { sums.amax } else { 0.0 };
    let abs_n = |k: f64| mul_up(nf, k);
    // (F4) s.
    let shift_lo = add_up(mul_up(C1, xex), mul_up(c2, r0));
    let shift_hi = mul_up(mul_up(1.0 + KAPPA, one_u), shift_lo);
    let (exp_rel, exp_abs) = if exp_widened {
        (mul_up(U, r0), abs_n(TINY))
    } else {
        (0.0, 0.0)
    };
    let w_lo = add_up(add_up(e0, exp_rel), add_up(shift_lo, exp_abs));
    let w_hi = add_up(add_up(e0, exp_rel), add_up(shift_hi, exp_abs));
    let s = if mutant == Some(Mutant::SMinusOne) {
        // The planted bug: s taken from S = fl(1 + sum) rounded, as S - 1.
        let big = (sums.a0.hi + sums.a0.lo) + 1.0;
        let sm1 = big - 1.0;
        Interval {
            lo: add_dn(sm1, -w_lo).max(0.0),
            hi: add_up(sm1, w_hi),
        }
    } else {
        sums.a0.enclose(w_lo, w_hi)
    };
    // (F5) B = sum E_j a_j.
    let (ex_up, ex_dn) = if exp_widened {
        (one_u, 1.0 - U)
    } else {
        (1.0, 1.0)
    };
    let e1 = sums.a1.err(n);
    let b1_hi = add_up(sums.a1.hi, add_up(sums.a1.lo, e1));
    let b1_lo = add_dn(sums.a1.hi, add_dn(sums.a1.lo, -e1)).max(0.0);
    let sh_b_lo = add_up(
        mul_up(mul_up(C1, add_up(amax, 1.0)), xex),
        mul_up(747.0, mul_up(c2, r0)),
    );
    let sh_b_hi = mul_up(
        mul_up(one_u, 1.0 + KAPPA),
        add_up(
            mul_up(mul_up(C1, add_up(amax, 1.0 + KAPPA)), xex),
            mul_up(748.0, mul_up(c2, r0)),
        ),
    );
    let b = Interval {
        lo: add_dn(
            mul_dn(mul_dn(b1_lo, 1.0 - U), ex_dn),
            -add_up(sh_b_lo, abs_n(pow2(-1064))),
        )
        .max(0.0),
        hi: add_up(
            mul_up(mul_up(one_u, ex_up), b1_hi),
            add_up(sh_b_hi, abs_n(pow2(-1064))),
        ),
    };
    // (F6) T2 = sum E_j a_j^2.
    let e2 = sums.a2.err(n);
    let b2_hi = add_up(sums.a2.hi, add_up(sums.a2.lo, e2));
    let b2_lo = add_dn(sums.a2.hi, add_dn(sums.a2.lo, -e2)).max(0.0);
    let ak = add_up(amax, KAPPA);
    let q = add_up(add_up(mul_up(ak, ak), mul_up(2.0, amax)), KAPPA);
    let sh2 = mul_up(q, add_up(mul_up(C1, xex), mul_up(c2, r0)));
    let t2 = Interval {
        lo: add_dn(
            mul_dn(mul_dn(mul_dn(b2_lo, 1.0 - U), 1.0 - U), ex_dn),
            -add_up(sh2, abs_n(pow2(-1050))),
        )
        .max(0.0),
        hi: add_up(
            mul_up(mul_up(mul_up(one_u, one_u), ex_up), b2_hi),
            add_up(mul_up(mul_up(one_u, 1.0 + KAPPA), sh2), abs_n(pow2(-1050))),
        ),
    };
    FamilyBounds {
        s,
        big_s: Interval {
            lo: add_dn(1.0, s.lo),
            hi: add_up(1.0, s.hi),
        },
        ln_s: ln_1p(s),
        b,
        t2,
    }
}

/// `2^e` for `-1074 <= e <= 1023`.
fn pow2(e: i32) -> f64 {
    crate::spec::pow2(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The memo changes no bit of a pass: rows of bf16 values (most
    /// entries hit), of f32 values (the memo stops after its trial), the
    /// same logits again under another max and divisor (a slot of the
    /// earlier pass must not answer), with a mask, against the memo off.
    #[test]
    fn the_shift_memo_changes_no_bit() {
        let mut rng = crate::splitmix::SplitMix64::new(5);
        let bf = |x: f64| f64::from(half::bf16::from_f64(x));
        let rows: Vec<Vec<f64>> = vec![
            (0..20000).map(|_| bf(3.0 * rng.normal())).collect(),
            (0..20000)
                .map(|_| 3.0 * rng.normal() as f32 as f64)
                .collect(),
        ];
        let mask: Vec<bool> = (0..20000).map(|j| j % 7 != 3).collect();
        let run = |v: &[f64], vmax: f64, div: Div, masked: bool, per_entry: bool| {
            let argmax = v.iter().position(|&x| x == vmax).unwrap_or(0);
            let mut cache = per_entry.then(Cache::default);
            let sums = if masked {
                accumulate::<true, true>(v, |j| mask[j], vmax, argmax, div, cache.as_mut())
            } else {
                accumulate::<true, false>(v, |_| true, vmax, argmax, div, cache.as_mut())
            };
            let c = cache.map(|c| format!("{:?} {:?} {:?}", c.a, c.r, c.exact));
            format!("{sums:?} {c:?}")
        };
        for v in &rows {
            let vmax = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            for (div, masked, per_entry) in [
                (Div::One, false, true),
                (Div::new(0.7), true, false),
                (Div::new(0.5), false, false),
                (Div::One, true, true),
            ] {
                let with = run(v, vmax, div, masked, per_entry);
                MEMO_OFF.with(|o| o.set(true));
                let without = run(v, vmax, div, masked, per_entry);
                MEMO_OFF.with(|o| o.set(false));
                assert_eq!(with, without, "{div:?} masked {masked}");
            }
        }
    }

    #[test]
    fn constants_hold() {
        // c1 >= (2u + u^2) / (1 - u)^2, kappa >= c1 * 745.14 + 2^-1074.
        let u = rug::Float::with_val(300, U);
        let one = rug::Float::with_val(300, 1);
        let omu = rug::Float::with_val(300, &one - &u);
        let c1 = (rug::Float::with_val(300, 2 * &u) + rug::Float::with_val(300, &u * &u))
            / rug::Float::with_val(300, &omu * &omu);
        assert!(rug::Float::with_val(300, C1) >= c1);
        const { assert!(KAPPA >= C1 * 745.14 * (1.0 + 1e-10)) };
        assert_eq!(KAPPA, 2f64.powi(-42));
        assert_eq!(Div::new(0.25), Div::Pow2(0.25));
        assert_eq!(Div::new(1.0), Div::One);
        assert_eq!(Div::new(0.7), Div::Other(0.7));
        assert_eq!(Div::new(2f64.powi(-1070)), Div::Pow2(2f64.powi(-1070)));
        // r > 0 implies a^ < 745.14: exp rounds to 0 from there on.
        assert_eq!(core_math::exp(-745.14), 0.0);
        assert!(core_math::exp(-745.13) > 0.0);
    }

    #[test]
    fn shift_exactness_is_detected() {
        let (a, ex) = shift(1e30, 1e-30, Div::One);
        assert!(!ex && a == 1e30);
        let (_, ex) = shift(3.5, -2.25, Div::Pow2(0.5));
        assert!(ex);
        let (_, ex) = shift(3.5, -2.25, Div::Other(0.7));
        assert!(!ex);
        let (a, ex) = shift(3.5, 3.5, Div::Other(0.7));
        assert!(ex && a == 0.0);
        // A subnormal quotient that loses bits is inexact.
        let x = f64::from_bits(3);
        let (_, ex) = shift(x, 0.0, Div::Pow2(2.0));
        assert!(!ex);
    }
}
