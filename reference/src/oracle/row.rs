//! One row of the problem at one working precision: the exact inputs, the
//! enclosures of `d_j`, `exp(d_j)` and the row sums (`s = S - 1`, `s_w`,
//! `B = sum F_j |e_j|`, `sum F_j e_j^2`), the forward values and the row
//! statistics. Formulas: DESIGN.md "The math"; see the module docs of
//! [`crate::oracle`].

use std::cmp::Ordering;
use std::ops::Range;

use ndarray::{ArrayView1, Axis};
use rayon::prelude::*;
use rug::float::Round;
use rug::ops::{AddAssignRound, AssignRound, DivAssignRound, MulAssignRound, NegAssign};
use rug::{Assign, Float};

use super::mpfr_interval::MpfrInterval;
use super::{Interval, RowStats};
use crate::spec::{
    Element, EntropyLogits, Problem, Shape, SoftcapDtype, SpecError, TemperatureDtype,
};
use crate::with_logits;

/// Entries per parallel work item inside a row. Fixed (never derived from
/// the thread count), so every enclosure is the same whatever the threads.
pub(crate) const CHUNK: usize = 8192;

/// Extra bits of the row-sum accumulators over the working precision, so
/// that the summation's own rounding is negligible next to each term's.
pub(crate) const ACC_EXTRA: u32 = 64;

/// A chunk of a row with its slices of the `p` and `q` caches.
type WorkItem<'c> = (
    Range<usize>,
    Option<&'c mut [MpfrInterval]>,
    Option<&'c mut [MpfrInterval]>,
);

/// A softmax family: the entries it runs over and its maximum.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Family {
    /// `max_j v_j` over the family (finite).
    pub vmax: f64,
    /// The first index attaining it: its term (exactly 1) is the one left
    /// out of `s = S - 1`.
    pub argmax: usize,
}

/// A top-k id as the math sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum TopId {
    /// Disallowed by the sampling mask: log-prob `-inf`, a constant.
    Masked,
    /// Allowed (its logit may be `-inf`: log-prob `-inf`, still
    /// differentiated by the formula).
    Live(usize),
}

/// The softcap as the oracle takes it (DESIGN: "Loss side").
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RowSoftcap {
    /// No softcap.
    None,
    /// `SoftcapDtype::Accumulation`: `x'_j = c tanh(x_j / c)` exactly, `v`
    /// holds the raw `x` and every shift encloses `x'` at the working
    /// precision ([`Top`], [`Entry::shift`]); gradient factor
    /// `sech^2(x_j / c)`.
    Exact(f64),
    /// `SoftcapDtype::Input`: `v` holds the materialised `x'`
    /// ([`crate::spec::Dtype::softcapped_input`]), exact; the gradient
    /// factor is `1 - t_j^2` with these materialised `t_j` (`[V]`).
    Input(Vec<f64>),
}

/// One row's exact inputs.
#[derive(Debug)]
pub(crate) struct Row<'a> {
    /// `v_j`: `x_j` (temperature in the accumulation) or
    /// `z_j = round_input(x_j / T)` (temperature in the input dtype), `[V]`,
    /// finite or `-inf`; with a softcap `x'_j` (input) or the raw `x_j`
    /// (exact softcap: then a `-inf` is the finite `x' = -c`).
    pub v: Vec<f64>,
    /// The softcap.
    pub softcap: RowSoftcap,
    /// Sampling-mask row (`true` = allowed), `[V_total]`.
    pub mask: Option<ArrayView1<'a, bool>>,
    /// Divisor of the shifted logits: `d_j = (v_j - v_max) / ts` (`T`, or 1
    /// when `v` already is `z`).
    pub ts: f64,
    /// Temperature `T` (divisor of every gradient).
    pub temperature: f64,
    /// Family of `p = softmax(z')` (allowed finite entries).
    pub p: Family,
    /// Family of the entropy's `q = softmax(w)`; `None` when not needed.
    pub q: Option<Family>,
    /// Whether `w` is masked (`q`'s entries are `p`'s).
    pub q_masked: bool,
    /// `q` exists and shares `p`'s maximum: one exp per entry serves both.
    pub shared: bool,
    /// Target column (None without tokens or on `ignore_index` rows).
    pub target: Option<usize>,
    /// Top-k ids `[K]`.
    pub topk: Vec<TopId>,
    /// The row's `loss_weights` entry (1 without weights).
    pub weight: f64,
    /// The teacher's log-probs `a_k [K]` of the top-k KL (empty without
    /// `options.topk_kl`).
    pub teacher: Vec<f64>,
}

impl Row<'_> {
    /// Allowed by the sampling mask.
    pub fn allowed(&self, j: usize) -> bool {
        self.mask.is_none_or(|m| m[j])
    }

    /// The exact softcap `c` (`RowSoftcap::Exact`), else `None`.
    pub fn cap(&self) -> Option<f64> {
        match self.softcap {
            RowSoftcap::Exact(c) => Some(c),
            _ => None,
        }
    }

    /// Whether entry `j`'s `z` is finite (under an exact softcap every
    /// entry is: `x' >= -c`).
    pub fn finite(&self, j: usize) -> bool {
        self.v[j] > f64::NEG_INFINITY || self.cap().is_some()
    }

    /// Entry of `p`'s family (allowed, finite).
    pub fn in_p(&self, j: usize) -> bool {
        self.finite(j) && self.allowed(j)
    }

    /// Entry of `q`'s family.
    pub fn in_q(&self, j: usize) -> bool {
        self.q.is_some() && self.finite(j) && (!self.q_masked || self.allowed(j))
    }

    /// The shift reference of a family whose max entry has `v = vmax`, at
    /// precision `prec` ([`Top::new`]).
    pub fn top(&self, vmax: f64, prec: u32) -> Top {
        Top::new(vmax, self.cap(), self.ts, prec)
    }
}

/// A family's shift reference at one precision: `a_j = (m - x'_j) / ts`
/// with `m` the family's max (exact without an exact softcap; else an
/// enclosure of `x'_max = c tanh(vmax / c)`).
#[derive(Debug)]
pub(crate) struct Top {
    /// The max's `v` (raw logit under an exact softcap).
    pub raw: f64,
    /// Enclosure of the max (a point without an exact softcap).
    pub m: MpfrInterval,
    /// The exact softcap `c`, if any.
    pub cap: Option<f64>,
    /// Divisor of the shift.
    pub ts: f64,
}

impl Top {
    /// The reference of max `vmax` (its enclosure at `prec` bits under an
    /// exact softcap `cap`), shifts divided by `ts`.
    pub fn new(vmax: f64, cap: Option<f64>, ts: f64, prec: u32) -> Self {
        let m = match cap {
            None => MpfrInterval::point(53, vmax),
            Some(c) => {
                let mut m = MpfrInterval::new(prec);
                let mut y = Float::new(prec);
                let mut d = Float::new(prec);
                softcap_enclosure(&mut m, &mut y, &mut d, vmax, c);
                m
            }
        };
        Top {
            raw: vmax,
            m,
            cap,
            ts,
        }
    }

    /// `m / ts` outward (the max's `z`, e.g. for `lse`).
    pub fn z_max(&self, prec: u32) -> MpfrInterval {
        let mut out = MpfrInterval::new(prec);
        out.lo.assign_round(&self.m.lo / self.ts, Round::Down);
        out.hi.assign_round(&self.m.hi / self.ts, Round::Up);
        out
    }
}

/// `out` = an enclosure of `x' = c tanh(x / c)` at `out`'s precision
/// (`c > 0`): `y = x / c` rounded down (exact when MPFR's ternary says so,
/// else `y_hi = next_up(y)`), `tanh` rounded down at `y` and up at `y`
/// plus `y_hi - y` (`tanh' <= 1`), clamped to `[-1, 1]`, times `c` outward.
/// `x = -inf` gives exactly `-c`. `y` and `d` are scratch (at least 53 bits).
pub(crate) fn softcap_enclosure(
    out: &mut MpfrInterval,
    y: &mut Float,
    d: &mut Float,
    x: f64,
    c: f64,
) {
    if x == f64::NEG_INFINITY {
        out.lo.assign(c);
        out.lo.neg_assign();
        out.hi.assign(&out.lo);
        return;
    }
    d.assign(x);
    let exact_y = y.assign_round(&*d / c, Round::Down) == Ordering::Equal;
    out.lo.assign(&*y);
    let exact_t = out.lo.tanh_round(Round::Down) == Ordering::Equal;
    out.hi.assign(&*y);
    out.hi.tanh_round(Round::Up);
    if !exact_y {
        // tanh(y_hi) <= tanh(y) + (y_hi - y); next_up(y) - y is exact.
        d.assign(&*y);
        d.next_up();
        *d -= &*y;
        out.hi.add_assign_round(&*d, Round::Up);
        if out.hi > 1u32 {
            out.hi.assign(1u32);
        }
    } else if exact_t {
        out.hi.assign(&out.lo);
    }
    out.lo.mul_assign_round(c, Round::Down);
    out.hi.mul_assign_round(c, Round::Up);
}

/// Enclosure of the softcap's gradient factor `dx'/dx` of entry `j` (value
/// `x`): `sech^2(x / c)` (exact softcap; decreasing in `|x / c|`, so its
/// ends come from the ends of `x / c`'s enclosure; 0 at `x = -inf`),
/// `1 - t^2 = (1 - t)(1 + t)` for a materialised `t` (input softcap), 1
/// without a softcap. `y` is scratch.
pub(crate) fn softcap_factor(
    out: &mut MpfrInterval,
    y: &mut MpfrInterval,
    sc: &RowSoftcap,
    j: usize,
    x: f64,
) {
    match sc {
        RowSoftcap::None => out.assign_f64(1.0),
        RowSoftcap::Exact(c) => {
            if x == f64::NEG_INFINITY {
                out.assign_f64(0.0);
                return;
            }
            y.lo.assign(x);
            y.hi.assign(x);
            y.lo.div_assign_round(*c, Round::Down);
            y.hi.div_assign_round(*c, Round::Up);
            y.lo.abs_mut();
            y.hi.abs_mut();
            // |y| at its smallest and largest (x / c keeps x's sign in
            // both directed roundings, so the enclosure never straddles 0).
            let (near, far) = if y.lo <= y.hi {
                (&y.lo, &y.hi)
            } else {
                (&y.hi, &y.lo)
            };
            out.hi.assign(near);
            out.hi.sech_round(Round::Up);
            out.hi.square_round(Round::Up);
            if out.hi > 1u32 {
                out.hi.assign(1u32);
            }
            out.lo.assign(far);
            out.lo.sech_round(Round::Down);
            out.lo.square_round(Round::Down);
        }
        RowSoftcap::Input(t) => {
            let t = t[j];
            // (1 - t)(1 + t), each factor >= 0 and rounded outward.
            y.lo.assign(1u32);
            y.lo.add_assign_round(-t, Round::Down);
            y.hi.assign(1u32);
            y.hi.add_assign_round(-t, Round::Up);
            out.lo.assign(1u32);
            out.lo.add_assign_round(t, Round::Down);
            out.hi.assign(1u32);
            out.hi.add_assign_round(t, Round::Up);
            out.lo.mul_assign_round(&y.lo, Round::Down);
            out.hi.mul_assign_round(&y.hi, Round::Up);
        }
    }
}

/// Builds row `row` (validated already by [`Problem::validate_row`]);
/// `entropy` chooses the entropy's logits (`None`: no entropy family).
///
/// # Errors
/// With `TemperatureDtype::Input`, where `round_input(x / T)` overflows:
/// `+inf` is [`SpecError::NonFiniteLogit`]; a `-inf` target is
/// [`SpecError::TokenNegInf`]; no allowed finite `z` is
/// [`SpecError::NoFiniteLogit`].
pub(crate) fn prepare<'a>(
    problem: &Problem<'a>,
    shape: &Shape,
    row: usize,
    entropy: Option<EntropyLogits>,
) -> Result<Row<'a>, SpecError> {
    let vsz = shape.vocab_size;
    let temperature = shape.temperature;
    let mut v: Vec<f64> = with_logits!(problem.logits, lv => lv.row(row).iter().take(vsz).map(|x| x.to_f64()).collect());
    let mask = problem
        .sampling_mask
        .map(|m| m.index_axis_move(Axis(0), row));
    // The softcap first (DESIGN: before the temperature); validated already.
    let softcap = match problem
        .options
        .effective_softcap(shape.dtype.accumulation())?
    {
        None => RowSoftcap::None,
        Some(c) => match problem.options.softcap_dtype {
            SoftcapDtype::Accumulation => RowSoftcap::Exact(c),
            SoftcapDtype::Input => {
                let t: Vec<f64> = v
                    .iter()
                    .map(|&x| shape.dtype.softcap_tanh_input(x, c))
                    .collect();
                for x in v.iter_mut() {
                    *x = shape.dtype.softcapped_input(*x, c);
                }
                problem.validate_softcapped_row(row, &v)?;
                RowSoftcap::Input(t)
            }
        },
    };
    let capped = matches!(softcap, RowSoftcap::Exact(_));
    let ts = match problem.options.temperature_dtype {
        TemperatureDtype::Accumulation => temperature,
        TemperatureDtype::Input => {
            for x in v.iter_mut() {
                *x = shape.dtype.scaled_input(*x, temperature);
            }
            problem.validate_input_row(row, &v)?;
            1.0
        }
    };
    let allowed = |j: usize| mask.is_none_or(|m| m[j]);
    let p = family(&v, capped, allowed).ok_or(SpecError::NoFiniteLogit {
        tensor: "logits / temperature",
        row,
        which: if mask.is_some() {
            "allowed by sampling_mask"
        } else {
            "any"
        },
    })?;
    // A target with v = -inf was rejected by `validate_row` (raw logits)
    // or `validate_input_row` (materialised z).
    let target = match problem.tokens {
        Some(t) if problem.has_target(row) => Some(t[row] as usize),
        _ => None,
    };
    let (q, q_masked) = match entropy {
        None => (None, false),
        Some(EntropyLogits::Masked) => (Some(p), true),
        Some(EntropyLogits::Unmasked) if mask.is_none() => (Some(p), false),
        Some(EntropyLogits::Unmasked) => {
            let all = family(&v, capped, |_| true).expect("p's entry is finite");
            (Some(if all.vmax == p.vmax { p } else { all }), false)
        }
    };
    let shared = q.is_some_and(|q| q.vmax == p.vmax);
    let topk = problem.topk_ids.map_or(Vec::new(), |ids| {
        ids.row(row)
            .iter()
            .map(|&id| {
                if allowed(id as usize) {
                    TopId::Live(id as usize)
                } else {
                    TopId::Masked
                }
            })
            .collect()
    });
    Ok(Row {
        v,
        softcap,
        mask,
        ts,
        temperature,
        p,
        q,
        q_masked,
        shared,
        target,
        topk,
        weight: problem.loss_weight(row),
        teacher: match (problem.options.topk_kl, problem.teacher_topk_log_probs) {
            (Some(_), Some(a)) => a.row(row).to_vec(),
            _ => Vec::new(),
        },
    })
}

/// The family over `member` entries with finite `z` (every entry under an
/// exact softcap, where `x' = c tanh(x / c)` is increasing in `x`, so the
/// raw max is the max; a family of `-inf` raw logits has `vmax = -inf`).
fn family(v: &[f64], capped: bool, member: impl Fn(usize) -> bool) -> Option<Family> {
    let mut best: Option<Family> = None;
    for (j, &x) in v.iter().enumerate() {
        if (capped || x > f64::NEG_INFINITY) && member(j) && best.is_none_or(|b| x > b.vmax) {
            best = Some(Family { vmax: x, argmax: j });
        }
    }
    best
}

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

/// Per-entry `exp(d_j)` enclosures kept between the sums and the gradient
/// (one exp per entry serves both). `p[j]`: relative to `p`'s max (in the
/// shared case also for `q`-only entries); `q[j]`: relative to `q`'s max
/// when it differs.
#[derive(Debug, Default)]
pub(crate) struct Cache {
    pub p: Vec<MpfrInterval>,
    pub q: Vec<MpfrInterval>,
    prec: u32,
}

impl Cache {
    fn fit(&mut self, row: &Row<'_>, prec: u32) {
        let v = row.v.len();
        let want_q = row.q.is_some() && !row.shared;
        for (vec, want) in [(&mut self.p, true), (&mut self.q, want_q)] {
            if !want {
                vec.clear();
                continue;
            }
            if self.prec != prec {
                vec.iter_mut().for_each(|b| b.set_prec(prec));
            }
            vec.truncate(v);
            while vec.len() < v {
                vec.push(MpfrInterval::new(prec));
            }
        }
        self.prec = prec;
    }

    /// The cached `exp(e_j)` of `q`'s family.
    pub fn q_slot(&self, row: &Row<'_>, j: usize) -> &MpfrInterval {
        if row.shared {
            &self.p[j]
        } else {
            &self.q[j]
        }
    }
}

/// Row sums at one working precision (accumulators at `prec + ACC_EXTRA`).
#[derive(Debug)]
pub(crate) struct Sums {
    /// `s = S - 1 = sum_{j != argmax} exp(d'_j)`.
    pub s_p: MpfrInterval,
    /// `s_w = S_w - 1` (when `q` exists).
    pub s_q: MpfrInterval,
    /// `B = sum_j exp(e_j) |e_j|`, so `R = B / S_w`.
    pub b: MpfrInterval,
    /// `sum_j exp(e_j) e_j^2`, so `M2 = this / S_w` (only when asked).
    pub m2: MpfrInterval,
}

struct Partial {
    sums: Sums,
    skip_p: u64,
    skip_q: u64,
}

impl Sums {
    fn new(prec: u32) -> Self {
        Sums {
            s_p: MpfrInterval::new(prec),
            s_q: MpfrInterval::new(prec),
            b: MpfrInterval::new(prec),
            m2: MpfrInterval::new(prec),
        }
    }

    fn merge(&mut self, o: &Sums) {
        for (a, b) in [
            (&mut self.s_p, &o.s_p),
            (&mut self.s_q, &o.s_q),
            (&mut self.b, &o.b),
            (&mut self.m2, &o.m2),
        ] {
            a.lo.add_assign_round(&b.lo, Round::Down);
            a.hi.add_assign_round(&b.hi, Round::Up);
        }
    }
}

/// Skip threshold exponent `K = prec + ceil(log2 V) + 2`: terms below
/// `2^-K` (relative to the max term, which is 1) are left out of the sums
/// and bounded: their total is below `V 2^-K <= 2^-(prec + 2)`.
fn skip_exponent(prec: u32, v: usize) -> u32 {
    let lv = usize::BITS - v.max(1).saturating_sub(1).leading_zeros();
    prec + lv + 2
}

/// Sums of one row at precision `prec`. With `cache`, every member's
/// `exp(d_j)` is also kept (skipped entries included: the sums still skip
/// them). `want_m2` adds `sum exp(e_j) e_j^2`.
pub(crate) fn pass(row: &Row<'_>, prec: u32, want_m2: bool, cache: Option<&mut Cache>) -> Sums {
    let v = row.v.len();
    let acc = prec + ACC_EXTRA;
    let ranges: Vec<Range<usize>> = (0..v)
        .step_by(CHUNK)
        .map(|s| s..(s + CHUNK).min(v))
        .collect();
    let mut items: Vec<WorkItem<'_>> = Vec::with_capacity(ranges.len());
    match cache {
        Some(c) => {
            c.fit(row, prec);
            let mut cp = c.p.chunks_mut(CHUNK);
            let mut cq = c.q.chunks_mut(CHUNK);
            for r in ranges {
                items.push((r, cp.next(), cq.next()));
            }
        }
        None => items.extend(ranges.into_iter().map(|r| (r, None, None))),
    }
    let parts: Vec<Partial> = if items.len() <= 1 {
        items
            .into_iter()
            .map(|(r, cp, cq)| chunk_pass(row, prec, r, cp, cq, want_m2))
            .collect()
    } else {
        items
            .into_par_iter()
            .map(|(r, cp, cq)| chunk_pass(row, prec, r, cp, cq, want_m2))
            .collect()
    };
    let mut sums = Sums::new(acc);
    let (mut skip_p, mut skip_q) = (0u64, 0u64);
    for p in &parts {
        sums.merge(&p.sums);
        skip_p += p.skip_p;
        skip_q += p.skip_q;
    }
    // Skipped terms: each exp(-a) < 2^-K with a > K ln 2 >= 2, where a e^-a
    // and a^2 e^-a decrease, so a e^-a < K 2^-K and a^2 e^-a < K^2 2^-K.
    let k = skip_exponent(prec, v);
    let mut t = Float::new(acc);
    for (n, target, pow) in [
        (skip_p, &mut sums.s_p, 0),
        (skip_q, &mut sums.s_q, 0),
        (skip_q, &mut sums.b, 1),
        (skip_q, &mut sums.m2, 2),
    ] {
        if n > 0 {
            t.assign(n);
            for _ in 0..pow {
                t.mul_assign_round(k, Round::Up);
            }
            t >>= k;
            target.hi.add_assign_round(&t, Round::Up);
        }
    }
    sums
}

fn chunk_pass(
    row: &Row<'_>,
    prec: u32,
    range: Range<usize>,
    mut cp: Option<&mut [MpfrInterval]>,
    mut cq: Option<&mut [MpfrInterval]>,
    want_m2: bool,
) -> Partial {
    let acc = prec + ACC_EXTRA;
    let mut part = Partial {
        sums: Sums::new(acc),
        skip_p: 0,
        skip_q: 0,
    };
    let sums = &mut part.sums;
    let mut en = Entry::new(prec);
    let mut t = Float::new(acc);
    let mut t2 = Float::new(acc);
    let k = skip_exponent(prec, row.v.len());
    // Pre-filter in f64: a_f = fl(fl(vmax - v) / ts) is within a factor
    // (1 + 2^-53)^2 of a (or overflows, when a is larger still), so
    // a_f > K ln2 (1 + 2^-40) proves exp(-a) < 2^-K.
    let thr = k as f64 * std::f64::consts::LN_2 * (1.0 + 2f64.powi(-40));
    let top_p = row.top(row.p.vmax, prec);
    let top_q = row.top(row.q.map_or(0.0, |q| q.vmax), prec);
    let capped = row.cap().is_some();
    let start = range.start;
    for j in range {
        let x = row.v[j];
        if !row.finite(j) {
            continue;
        }
        let in_p = row.allowed(j);
        let in_q = row.in_q(j);
        // (family max, membership in p, in q, cache slot)
        let mut jobs: [(bool, bool, bool); 2] = [(false, false, false); 2];
        if row.shared {
            jobs[0] = (in_p || in_q, in_p, in_q);
        } else {
            jobs[0] = (in_p, true, false);
            jobs[1] = (in_q, false, true);
        }
        for (slot, &(active, to_p, to_q)) in jobs.iter().enumerate() {
            if !active {
                continue;
            }
            let (vmax, top) = if slot == 0 {
                (row.p.vmax, &top_p)
            } else {
                (row.q.map_or(0.0, |q| q.vmax), &top_q)
            };
            // Under an exact softcap the raw gap says nothing: the skip test
            // reads the enclosure of `a` itself (one tanh, no exp).
            let skip = if capped {
                en.shift(top, x);
                en.a.lo > thr
            } else {
                (vmax - x) / row.ts > thr
            };
            let store = if slot == 0 {
                cp.as_deref_mut()
            } else {
                cq.as_deref_mut()
            };
            if skip && store.is_none() {
                part.skip_p += to_p as u64;
                part.skip_q += to_q as u64;
                continue;
            }
            if !capped {
                en.shift(top, x);
            }
            en.exp();
            if let Some(c) = store {
                let b = &mut c[j - start];
                b.lo.assign(&en.ex.lo);
                b.hi.assign(&en.ex.hi);
            }
            if skip {
                part.skip_p += to_p as u64;
                part.skip_q += to_q as u64;
                continue;
            }
            if to_p && j != row.p.argmax {
                sums.s_p.lo.add_assign_round(&en.ex.lo, Round::Down);
                sums.s_p.hi.add_assign_round(&en.ex.hi, Round::Up);
            }
            if to_q {
                let qa = row.q.map_or(usize::MAX, |q| q.argmax);
                if j != qa {
                    sums.s_q.lo.add_assign_round(&en.ex.lo, Round::Down);
                    sums.s_q.hi.add_assign_round(&en.ex.hi, Round::Up);
                    t.assign_round(&en.ex.lo * &en.a.lo, Round::Down);
                    sums.b.lo.add_assign_round(&t, Round::Down);
                    t.assign_round(&en.ex.hi * &en.a.hi, Round::Up);
                    sums.b.hi.add_assign_round(&t, Round::Up);
                    if want_m2 {
                        t2.assign_round(&en.a.lo * &en.a.lo, Round::Down);
                        t.assign_round(&t2 * &en.ex.lo, Round::Down);
                        sums.m2.lo.add_assign_round(&t, Round::Down);
                        t2.assign_round(&en.a.hi * &en.a.hi, Round::Up);
                        t.assign_round(&t2 * &en.ex.hi, Round::Up);
                        sums.m2.hi.add_assign_round(&t, Round::Up);
                    }
                }
            }
        }
    }
    part
}

/// Forward enclosures of one row at precision `prec`.
#[derive(Debug)]
pub(crate) struct RowValues {
    pub lse: MpfrInterval,
    pub log_prob: Option<MpfrInterval>,
    pub entropy: Option<MpfrInterval>,
    pub topk: Vec<MpfrInterval>,
}

/// `lse = v_max/ts + ln_1p(s)`, `log_prob = d_t - ln_1p(s)`,
/// `topk_k = d_{id_k} - ln_1p(s)` (`-inf` for masked or `-inf` ids),
/// `entropy = ln_1p(s_w) + B / (1 + s_w)`.
pub(crate) fn values(row: &Row<'_>, sums: &Sums, prec: u32) -> RowValues {
    let mut en = Entry::new(prec);
    let top = row.top(row.p.vmax, prec);
    let mut l = MpfrInterval::new(prec);
    l.ln_1p(&sums.s_p);
    let m = top.z_max(prec);
    let mut lse = MpfrInterval::new(prec);
    lse.add(&m, &l);
    let mut minus_a_minus_l = |col: Option<usize>| -> MpfrInterval {
        match col {
            Some(c) if row.finite(c) => {
                en.shift(&top, row.v[c]);
                let mut out = MpfrInterval::new(prec);
                out.add(&en.a, &l);
                out.neg();
                out
            }
            _ => MpfrInterval::point(prec, f64::NEG_INFINITY),
        }
    };
    let log_prob = row.target.map(|t| minus_a_minus_l(Some(t)));
    let topk = row
        .topk
        .iter()
        .map(|id| match id {
            TopId::Masked => minus_a_minus_l(None),
            TopId::Live(c) => minus_a_minus_l(Some(*c)),
        })
        .collect();
    let entropy = row.q.map(|_| {
        let mut lw = MpfrInterval::new(prec);
        lw.ln_1p(&sums.s_q);
        let mut sw = MpfrInterval::new(prec);
        one_plus(&mut sw, &sums.s_q);
        let mut r = MpfrInterval::new(prec);
        r.div_pos(&sums.b, &sw);
        let mut h = MpfrInterval::new(prec);
        h.add(&lw, &r);
        h
    });
    RowValues {
        lse,
        log_prob,
        entropy,
        topk,
    }
}

/// `out = 1 + s`.
pub(crate) fn one_plus(out: &mut MpfrInterval, s: &MpfrInterval) {
    out.lo.assign_round(&s.lo + 1u32, Round::Down);
    out.hi.assign_round(&s.hi + 1u32, Round::Up);
}

/// `-a` as an f64 interval (`-inf` for `-inf` entries).
fn neg_interval(a: &MpfrInterval) -> Interval {
    Interval {
        lo: -a.hi.to_f64_round(Round::Up),
        hi: -a.lo.to_f64_round(Round::Down),
    }
}

const NEG_INF: Interval = Interval {
    lo: f64::NEG_INFINITY,
    hi: f64::NEG_INFINITY,
};
const ZERO: Interval = Interval { lo: 0.0, hi: 0.0 };

/// Row statistics at precision `prec` (see [`RowStats`]).
pub(crate) fn stats(row: &Row<'_>, prec: u32) -> RowStats {
    let mut cache = Cache::default();
    let sums = pass(row, prec, true, Some(&mut cache));
    let q = row.q.expect("stats rows have an entropy family");
    let mut sp = MpfrInterval::new(prec + ACC_EXTRA);
    one_plus(&mut sp, &sums.s_p);
    let mut sw = MpfrInterval::new(prec + ACC_EXTRA);
    one_plus(&mut sw, &sums.s_q);
    let mut ln_s = MpfrInterval::new(prec);
    ln_s.ln_1p(&sums.s_p);
    let mut ln_s_w = MpfrInterval::new(prec);
    ln_s_w.ln_1p(&sums.s_q);
    let mut r = MpfrInterval::new(prec);
    r.div_pos(&sums.b, &sw);
    let mut m2 = MpfrInterval::new(prec);
    m2.div_pos(&sums.m2, &sw);
    let top_p = row.top(row.p.vmax, prec);
    let top_q = row.top(q.vmax, prec);
    let mut en = Entry::new(prec);
    let d_t = row.target.map(|t| {
        en.shift(&top_p, row.v[t]);
        neg_interval(&en.a)
    });
    let v = row.v.len();
    let (mut pv, mut qv, mut ev, mut dv) = (
        Vec::with_capacity(v),
        Vec::with_capacity(v),
        Vec::with_capacity(v),
        Vec::with_capacity(v),
    );
    let mut ratio = MpfrInterval::new(prec);
    for j in 0..v {
        if row.in_p(j) {
            en.shift(&top_p, row.v[j]);
            dv.push(neg_interval(&en.a));
            ratio.div_pos(&cache.p[j], &sp);
            pv.push(ratio.interval());
        } else {
            dv.push(NEG_INF);
            pv.push(ZERO);
        }
        if row.in_q(j) {
            en.shift(&top_q, row.v[j]);
            ev.push(neg_interval(&en.a));
            ratio.div_pos(cache.q_slot(row, j), &sw);
            qv.push(ratio.interval());
        } else {
            ev.push(NEG_INF);
            qv.push(ZERO);
        }
    }
    RowStats {
        d_t,
        s: sp.interval(),
        ln_s: ln_s.interval(),
        s_w: sw.interval(),
        ln_s_w: ln_s_w.interval(),
        r: r.interval(),
        m2: m2.interval(),
        p: pv,
        q: qv,
        e: ev,
        d: dv,
    }
}
