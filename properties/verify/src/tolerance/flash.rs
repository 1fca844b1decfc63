//! The flash-attention rule, reported alongside the bound (never required):
//! a candidate's error is at most twice the error of the naive computation
//! in the candidate's own dtype, max over the tensor, with a floor of half
//! an ulp (Dao et al., FlashAttention-2 / FlashAttention-3 test suites
//! compare a kernel's error with that of a same-precision reference).
//!
//! The naive computation rounds to the dtype after every operation: each
//! operand is widened to f64, the operation done in f64, the result rounded
//! with [`Dtype::round_f64`] (`exp` / `ln` in f64 are within 1 ulp of f64,
//! so the rounded result is within a hair of correctly rounded).

use logprobe_reference::oracle::Exact;
use logprobe_reference::spec::{pow2, Dtype, EntropyLogits, Family, Output, Problem, RowStat};

use super::walk::RowTargets;

mod exp_f32;
use exp_f32::{exp_f32_in_place, BLOCK};

/// The naive log_softmax of one row in `dtype`, `[V]` (nats).
///
/// `row` holds the logits (`-inf` for disallowed entries); `temperature`
/// is rounded to `dtype` first. Steps, each rounded to `dtype`:
/// `z_j = x_j / T`, `d_j = z_j - max z`, `e_j = exp(d_j)`, `S` summed in
/// index order, `l = ln S`, `lp_j = d_j - l`. NaN/inf propagate as they
/// would in the naive code (an empty or all `-inf` row gives NaN).
pub fn naive_log_softmax(row: &[f64], temperature: f64, dtype: Dtype) -> Vec<f64> {
    let r = |x: f64| dtype.round_f64(x);
    let t = r(temperature);
    let z: Vec<f64> = row
        .iter()
        .map(|&x| if t == 1.0 { r(x) } else { r(x / t) })
        .collect();
    let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let d: Vec<f64> = z.iter().map(|&zj| r(zj - m)).collect();
    let s = d.iter().fold(0.0, |s, &dj| r(s + r(dj.exp())));
    let l = r(s.ln());
    d.iter().map(|&dj| r(dj - l)).collect()
}

/// The naive entropy of one row in `dtype` (nats): `-sum_j p_j lp_j` with
/// `lp` from [`naive_log_softmax`], `p_j = exp(lp_j)`, every product and
/// partial sum rounded to `dtype`, summed in index order; entries with
/// `p_j = 0` add nothing (the defined semantics of `-inf` logits).
pub fn naive_entropy(row: &[f64], temperature: f64, dtype: Dtype) -> f64 {
    naive_entropy_of(&naive_log_softmax(row, temperature, dtype), dtype)
}

/// [`naive_entropy`] from the naive log-softmax `lp` `[V]` of the same
/// logits ([`naive_log_softmax`]), so a caller that has it does not redo it.
pub fn naive_entropy_of(lp: &[f64], dtype: Dtype) -> f64 {
    let r = |x: f64| dtype.round_f64(x);
    let mut acc = 0.0;
    for &l in lp {
        let p = r(l.exp());
        if p != 0.0 {
            acc = r(acc - r(p * l));
        }
    }
    acc
}

/// The naive same-dtype results of one row, computed per dtype when first
/// asked: the flash rule's reference values.
///
/// Equal bit for bit to [`naive_log_softmax`] and [`naive_entropy`] (tested
/// against them), computed without their `[V]` vectors: one pass for
/// `max z`, one for `S` (in index order, as they do), the log-softmax only
/// at the ids asked for, one pass for the entropy. In bf16 and f16 each
/// entry's `exp` terms depend only on its rounded shift `d_j` (a 16-bit
/// value), so they come from a per-thread cache keyed by `d_j`
/// ([`ExpCache`]); in f32 they are computed four at a time in vector lanes,
/// the same bits ([`exp_f32`]). The order-dependent roundings of the sums
/// stay per entry.
#[derive(Debug)]
pub struct NaiveRow {
    /// Logits over the real vocabulary, `-inf` where the mask disallows
    /// (a per-thread reused buffer, [`crate::scratch`]).
    masked: Vec<f64>,
    /// The entropy's logits over the real vocabulary (masked or not);
    /// empty when they are `masked` (masked entropy, or no sampling mask).
    entropy_logits: Vec<f64>,
    /// The temperature as the options give it.
    temperature: f64,
    /// The logits' dtype.
    logits_dtype: Dtype,
    /// Per dtype: `(rounded temperature, max z, ln S)` of `masked`.
    log_softmax: Vec<(Dtype, Naive)>,
    entropy: Vec<(Dtype, f64)>,
}

impl Drop for NaiveRow {
    fn drop(&mut self) {
        crate::scratch::give(std::mem::take(&mut self.masked));
        crate::scratch::give(std::mem::take(&mut self.entropy_logits));
    }
}

/// The row-level values of one naive log-softmax: `lp_j = r(r(z_j - m) - l)`.
#[derive(Clone, Copy, Debug)]
struct Naive {
    dtype: Dtype,
    /// The temperature rounded to `dtype`.
    t: f64,
    /// `max_j z_j`.
    m: f64,
    /// `r(ln S)`.
    l: f64,
    /// The row's logits are 16-bit values (`logits_dtype`): the per-entry
    /// terms are cached by the logit itself, whatever `dtype` is (a
    /// term is a function of the logit), and `d_j` is computed only on a
    /// miss; otherwise by the rounded shift `d_j` in a 16-bit `dtype`.
    logits16: Option<Dtype>,
}

impl Naive {
    /// `z_j` of a logit (as [`naive_log_softmax`]).
    #[inline(always)]
    fn z(&self, x: f64) -> f64 {
        let r = |x: f64| self.dtype.round_f64(x);
        if self.t == 1.0 {
            r(x)
        } else {
            r(x / self.t)
        }
    }

    /// `d_j = r(z_j - m)`.
    #[inline(always)]
    fn d(&self, x: f64) -> f64 {
        self.dtype.round_f64(self.z(x) - self.m)
    }

    /// `d_j` ([`Naive::d`]) of each logit of `xs` into `out` when `dtype`
    /// is f32 (its rounding inlined, [`r32`]).
    fn d_f32(&self, xs: &[f64], out: &mut [f64]) {
        let (t, m) = (self.t, self.m);
        for (o, &x) in out.iter_mut().zip(xs) {
            let z = if t == 1.0 { r32(x) } else { r32(x / t) };
            *o = r32(z - m);
        }
    }

    /// `lp_j` of a logit.
    fn lp(&self, x: f64) -> f64 {
        self.dtype.round_f64(self.d(x) - self.l)
    }

    /// Passes 1 and 2 of [`naive_log_softmax`] over `row` (logits of
    /// `logits_dtype`).
    fn new(row: &[f64], temperature: f64, dtype: Dtype, logits_dtype: Dtype) -> Naive {
        let r = |x: f64| dtype.round_f64(x);
        let mut nv = Naive {
            dtype,
            t: r(temperature),
            m: f64::NEG_INFINITY,
            l: 0.0,
            logits16: matches!(logits_dtype, Dtype::Bf16 | Dtype::F16).then_some(logits_dtype),
        };
        nv.m = if nv.t > 0.0 && nv.t.is_finite() {
            // `z` is nondecreasing in the logit (a division by `t > 0` and
            // a rounding, both monotone): `max z = z(max x)`, NaN ignored
            // by both.
            nv.z(max_of(row))
        } else {
            row.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(nv.z(x)))
        };
        let s = EXP_CACHE.with(|c| {
            let mut c = c.borrow_mut();
            let mut cache = c.start(nv.logits16.unwrap_or(dtype), nv.m, f64::NAN);
            let mut s = 0.0;
            if cache.is_none() && dtype == Dtype::F32 {
                // f32: the exps a block at a time, in lanes (the same bits).
                let mut buf = [0.0; BLOCK];
                for block in row.chunks(BLOCK) {
                    let e = &mut buf[..block.len()];
                    nv.d_f32(block, e);
                    exp_f32_in_place(e);
                    for &e in e.iter() {
                        s = r32(s + e);
                    }
                }
                return s;
            }
            let term = |x: f64| r(nv.d(x).exp());
            // Logits `x <= below` add nothing to `s` (`below_adds_nothing`).
            let mut below = f64::NEG_INFINITY;
            for &x in row {
                if x <= below && cache.is_some() {
                    continue;
                }
                let e = match cache {
                    Some(ref mut k) if nv.logits16.is_some() => k.get(x, 0, term),
                    Some(ref mut k) => k.get(nv.d(x), 0, |d| r(d.exp())),
                    None => term(x),
                };
                let next = r(s + e);
                if cache.is_some() && next != s {
                    below = below_adds_nothing(next, dtype, nv, term);
                }
                s = next;
            }
            s
        });
        nv.l = r(s.ln());
        nv
    }

    /// [`naive_entropy_of`] of the log-softmax of `row` ([`Naive::new`]'s).
    fn entropy(&self, row: &[f64]) -> f64 {
        let r = |x: f64| self.dtype.round_f64(x);
        // The term of one entry: `r(p lp)` with `p = r(exp(lp))`, or `+inf`
        // for `p = 0` (adds nothing; a real term is `<= 0` or NaN, since
        // `p <= 1` and `lp <= 0`).
        let term = |d: f64| {
            let l = r(d - self.l);
            let p = r(l.exp());
            if p != 0.0 {
                r(p * l)
            } else {
                f64::INFINITY
            }
        };
        EXP_CACHE.with(|c| {
            let mut c = c.borrow_mut();
            let mut cache = c.start(self.logits16.unwrap_or(self.dtype), self.m, self.l);
            let mut acc = 0.0;
            if cache.is_none() && self.dtype == Dtype::F32 {
                // f32: `term` a block at a time, its exps in lanes (the same bits).
                let (mut l, mut p) = ([0.0; BLOCK], [0.0; BLOCK]);
                for block in row.chunks(BLOCK) {
                    let n = block.len();
                    self.d_f32(block, &mut l[..n]);
                    for (l, p) in l[..n].iter_mut().zip(p.iter_mut()) {
                        *l = r32(*l - self.l);
                        *p = *l;
                    }
                    exp_f32_in_place(&mut p[..n]);
                    for (&l, &p) in l[..n].iter().zip(&p[..n]) {
                        // As `term`: `p = 0` adds nothing.
                        let t = if p != 0.0 { r32(p * l) } else { f64::INFINITY };
                        if t != f64::INFINITY {
                            acc = r32(acc - t);
                        }
                    }
                }
                return acc;
            }
            // Logits `x <= below` add nothing to `acc` (`Naive::entropy_below`).
            let mut below = f64::NEG_INFINITY;
            for &x in row {
                if x <= below && cache.is_some() {
                    continue;
                }
                let t = match cache {
                    Some(ref mut k) if self.logits16.is_some() => k.get(x, 1, |x| term(self.d(x))),
                    Some(ref mut k) => k.get(self.d(x), 1, term),
                    None => term(self.d(x)),
                };
                if t != f64::INFINITY {
                    let next = r(acc - t);
                    if cache.is_some() && next != acc {
                        below = self.entropy_below(next);
                    }
                    acc = next;
                }
            }
            acc
        })
    }
}

/// `max_j xs_j` as `fold(-inf, f64::max)` (NaN ignored; `-inf` for none),
/// in eight independent lanes.
fn max_of(xs: &[f64]) -> f64 {
    let mut m = [f64::NEG_INFINITY; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for (m, &x) in m.iter_mut().zip(c) {
            *m = m.max(x);
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(f64::NEG_INFINITY, |a, &x| a.max(x));
    m.iter().fold(tail, |a, &x| a.max(x))
}

/// A logit `y` such that every logit `x <= y` leaves a naive sum `s` (a
/// positive `dtype` value, bf16 or f16) as it is, `r(s + term(x)) = s`
/// with `term(x) = r(exp(d(x)))`; `-inf` when none is found (only `-inf`
/// logits, whose term is 0, are then passed over).
///
/// With `E = floor(log2 s)` and `p` the precision, `s + t` rounds to `s`
/// whenever `0 <= t < ulp(s) / 4 = 2^(E - p - 1)` (the f64 sum errs by far
/// less than the quarter ulp left). `y` is taken with `term(y) <= e_max =
/// 2^(E - p - 2)`, `e_max` at least the least normal (checked). For `x <=
/// y`, `d(x) <= d(y)` (monotone IEEE operations and roundings), so libm's
/// `exp(d(x)) <= exp(d(y)) (1 + 2^-50)` (within 2 ulps of `e^t` each, as
/// [`crate::tolerance::upward`] assumes) `<= e_max (1 + 2^-p) (1 + 2^-50)`,
/// and rounded `term(x) <= e_max (1 + 2^-p)^2 (1 + 2^-50) < 2 e_max` (a
/// value below the least normal rounds to at most it): below the quarter ulp.
fn below_adds_nothing(s: f64, dtype: Dtype, nv: Naive, term: impl Fn(f64) -> f64) -> f64 {
    if !(s.is_finite() && s > 0.0 && matches!(dtype, Dtype::Bf16 | Dtype::F16)) {
        return f64::NEG_INFINITY;
    }
    let e = ((s.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    let e_max = pow2(e - dtype.precision() as i32 - 2);
    if e_max < pow2(dtype.min_normal_exp()) {
        return f64::NEG_INFINITY;
    }
    // `term(y) ~ e^(y / t - m)`: a first guess, lowered until it checks.
    let mut y = nv.t * (nv.m + e_max.ln()) - 0.01;
    for _ in 0..4 {
        if !y.is_finite() {
            break;
        }
        if term(y) <= e_max {
            return y;
        }
        y -= y.abs() * (1.0 / 64.0) + 0.1;
    }
    f64::NEG_INFINITY
}

impl Naive {
    /// A logit `y` such that every logit `x <= y` leaves the naive entropy's
    /// partial sum `acc` (a positive bf16 / f16 value) as it is: its term
    /// `t(x) = r(p l)`, `l = r(d(x) - ln S^)`, `p = r(exp(l))`, is the
    /// skipped `p = 0` or has `|t| < ulp(acc) / 4` (then `r(acc - t) = acc`,
    /// as in [`below_adds_nothing`]); `-inf` when none is found.
    ///
    /// `y` is taken with `l(y) <= -2` and `1.2 (-l(y)) e^l(y) < ulp(acc) /
    /// 4`. For `x <= y`, `l(x) <= l(y)` (monotone operations), and `-l e^l`
    /// increases for `l <= -1`, so `p |l| <= (1 + 2^-p)(1 + 2^-50) (-l(y))
    /// e^l(y)` where `exp(l)` rounds to a normal value; where it rounds
    /// below the least normal `N`, `p |l| <= N |l| <= 150 N` (`p > 0` needs
    /// `l > -104`), checked below the quarter ulp too. The rounded `|t|`
    /// gains one more `1 + 2^-p`: all within the `1.2`.
    fn entropy_below(&self, acc: f64) -> f64 {
        let dtype = self.dtype;
        if !(acc.is_finite() && acc > 0.0 && matches!(dtype, Dtype::Bf16 | Dtype::F16)) {
            return f64::NEG_INFINITY;
        }
        let e = ((acc.to_bits() >> 52) & 0x7ff) as i32 - 1023;
        let quarter = pow2(e - dtype.precision() as i32 - 1);
        let least = pow2(dtype.min_normal_exp());
        if quarter < 2.0 * least || 150.0 * least * 1.2 >= quarter {
            return f64::NEG_INFINITY;
        }
        // `-l e^l = c` near `l = ln c - ln(-ln c)`; `l(x) ~ x / t - m - ln S`.
        let c = quarter / 2.0;
        let l0 = (c.ln() - (-c.ln()).ln()).min(-2.0);
        let mut y = self.t * (self.m + self.l + l0) - 0.01;
        for _ in 0..4 {
            if !y.is_finite() {
                break;
            }
            let l = self.dtype.round_f64(self.d(y) - self.l);
            if l <= -2.0 && 1.2 * (-l * l.exp()) < quarter {
                return y;
            }
            y -= y.abs() * (1.0 / 64.0) + 0.1;
        }
        f64::NEG_INFINITY
    }
}

/// [`Dtype::round_f64`] to f32: `x as f32` (zero, infinities and NaN
/// stay what they are; a NaN's payload may differ, never its NaN-ness).
#[inline(always)]
fn r32(x: f64) -> f64 {
    x as f32 as f64
}

/// Slots of [`ExpCache`] (a 16-bit shift's key).
const CACHE_SLOTS: usize = 1 << 16;

thread_local! {
    static EXP_CACHE: std::cell::RefCell<ExpCache> = std::cell::RefCell::new(ExpCache::default());
}

/// A direct-mapped cache of a per-entry term of the naive computation as a
/// function of a 16-bit value (bf16 / f16): the entry's logit, or its
/// rounded shift `d`. Each slot keeps the value it holds, so a lookup is
/// exact whatever the key (a different value is recomputed). Two terms
/// (`kind` 0 and 1) per slot.
#[derive(Debug, Default)]
struct ExpCache {
    /// `(d, term)` per slot and kind; `d = NaN` is empty.
    slots: Vec<[(f64, f64); 2]>,
    /// Slots filled since the last [`ExpCache::start`].
    touched: Vec<u16>,
}

impl ExpCache {
    /// Empties the cache for a new row or dtype, keyed by values of
    /// `dtype`; `None` when it does not apply (f32 / f64 values, or a
    /// non-finite `max z` or `ln S`: every term is computed as is).
    fn start(&mut self, dtype: Dtype, m: f64, l: f64) -> Option<Cache<'_>> {
        if !matches!(dtype, Dtype::Bf16 | Dtype::F16) || !m.is_finite() || l.is_infinite() {
            return None;
        }
        if self.slots.is_empty() {
            self.slots = vec![[(f64::NAN, 0.0); 2]; CACHE_SLOTS];
        }
        for &k in &self.touched {
            self.slots[k as usize] = [(f64::NAN, 0.0); 2];
        }
        self.touched.clear();
        Some(Cache {
            shift: if dtype == Dtype::Bf16 { 16 } else { 13 },
            cache: self,
        })
    }
}

/// An [`ExpCache`] in use for one dtype.
struct Cache<'c> {
    /// `f32` bits dropped for the key: 16 for bf16 (exact: its values are
    /// `f32` values with 16 zero low bits), 13 for f16.
    shift: u32,
    cache: &'c mut ExpCache,
}

impl Cache<'_> {
    /// `f(d)` of term `kind`, from the cache when `d` (a logit or a shift)
    /// was seen.
    #[inline(always)]
    fn get(&mut self, d: f64, kind: usize, f: impl Fn(f64) -> f64) -> f64 {
        if d.is_nan() {
            return f(d);
        }
        let key = ((d as f32).to_bits() >> self.shift) as u16;
        let slot = &mut self.cache.slots[key as usize];
        let (kd, kv) = slot[kind];
        if kd.to_bits() == d.to_bits() {
            return kv;
        }
        let v = f(d);
        if slot[0].0.is_nan() && slot[1].0.is_nan() {
            self.cache.touched.push(key);
        }
        slot[kind] = (d, v);
        v
    }
}

/// `row` `[V]` of `logits` as f64 into `out`, `-inf` where `mask` (`[V]`)
/// disallows.
fn fill_row<T: logprobe_reference::spec::Element>(
    row: ndarray::ArrayView1<'_, T>,
    mask: Option<ndarray::ArrayView1<'_, bool>>,
    v: usize,
    out: &mut Vec<f64>,
) {
    out.clear();
    out.extend(row.iter().take(v).map(|x| x.to_f64()));
    if let Some(m) = mask {
        for (x, &ok) in out.iter_mut().zip(m.iter()) {
            if !ok {
                *x = f64::NEG_INFINITY;
            }
        }
    }
}

impl NaiveRow {
    /// Row `row` of a validated `problem`.
    pub fn new(problem: &Problem<'_>, row: usize) -> NaiveRow {
        use logprobe_reference::spec::Logits;
        let (_, v_total) = problem.logits.dim();
        let v = problem.options.vocab_size.unwrap_or(v_total).min(v_total);
        let mask = problem
            .sampling_mask
            .map(|m| m.index_axis_move(ndarray::Axis(0), row));
        let fill = |mask: Option<ndarray::ArrayView1<'_, bool>>| {
            let mut out = crate::scratch::take();
            match problem.logits {
                Logits::F64(a) => fill_row(a.row(row), mask, v, &mut out),
                Logits::F32(a) => fill_row(a.row(row), mask, v, &mut out),
                Logits::Bf16(a) => fill_row(a.row(row), mask, v, &mut out),
                Logits::F16(a) => fill_row(a.row(row), mask, v, &mut out),
            }
            out
        };
        let masked = fill(mask);
        let entropy_logits = match problem.options.entropy {
            _ if problem.sampling_mask.is_none() => Vec::new(),
            Some(EntropyLogits::Masked) => Vec::new(),
            _ => fill(None),
        };
        NaiveRow {
            masked,
            entropy_logits,
            temperature: problem.options.temperature,
            logits_dtype: problem.logits.dtype(),
            log_softmax: Vec::new(),
            entropy: Vec::new(),
        }
    }

    /// The naive value of column `col` of `output` in `dtype`: the naive
    /// log-softmax at the target or top-k id, the naive entropy; `None` for
    /// grad logits, the loss side's `lse` / `z_loss` and the policy terms (the rule is about
    /// log-softmax outputs) or a missing target.
    pub fn value(
        &mut self,
        output: Output,
        col: usize,
        targets: &RowTargets,
        dtype: Dtype,
    ) -> Option<f64> {
        let id = match output.family() {
            Family::LogSoftmax(RowStat::LogProb) => targets.token?,
            Family::TopK => *targets.topk_ids.get(col)?,
            Family::LogSoftmax(RowStat::Entropy) => return Some(self.entropy(dtype)),
            // The flash rule is stated for these three outputs alone.
            Family::Gradient
            | Family::Loss(_)
            | Family::Policy(_)
            | Family::TopkKl(_)
            | Family::LogSoftmax(RowStat::Rank) => return None,
        };
        let x = *self.masked.get(id)?;
        Some(self.naive(dtype).lp(x))
    }

    fn naive(&mut self, dtype: Dtype) -> Naive {
        match self.log_softmax.iter().find(|(d, _)| *d == dtype) {
            Some(&(_, nv)) => nv,
            None => {
                let nv = Naive::new(&self.masked, self.temperature, dtype, self.logits_dtype);
                self.log_softmax.push((dtype, nv));
                nv
            }
        }
    }

    fn entropy(&mut self, dtype: Dtype) -> f64 {
        if let Some(&(_, h)) = self.entropy.iter().find(|(d, _)| *d == dtype) {
            return h;
        }
        let h = if self.entropy_logits.is_empty() {
            // The same logits as the log-softmax: reuse its row values.
            let nv = self.naive(dtype);
            nv.entropy(&self.masked)
        } else {
            Naive::new(
                &self.entropy_logits,
                self.temperature,
                dtype,
                self.logits_dtype,
            )
            .entropy(&self.entropy_logits)
        };
        self.entropy.push((dtype, h));
        h
    }
}

/// Accumulates the flash-attention rule over a tensor of one output.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FlashRule {
    /// Max candidate error seen (far end of the enclosure).
    pub candidate_error: f64,
    /// Max naive error seen.
    pub naive_error: f64,
    /// Max half ulp of the dtype at the exact values seen.
    pub floor: f64,
}

impl FlashRule {
    /// An empty accumulator.
    pub fn new() -> FlashRule {
        FlashRule::default()
    }

    /// Records one element: its exact value, the candidate and the naive
    /// value, both in `dtype`.
    pub fn observe(&mut self, exact: &Exact, candidate: f64, naive: f64, dtype: Dtype) {
        let err = |v: f64| {
            if v.is_infinite() && v == exact.rounded {
                0.0
            } else {
                exact.error(v)
            }
        };
        let mid = 0.5 * (exact.enclosure.lo + exact.enclosure.hi);
        self.candidate_error = self.candidate_error.max(err(candidate));
        self.naive_error = self.naive_error.max(err(naive));
        self.floor = self.floor.max(0.5 * dtype.ulp(mid));
    }

    /// `max candidate error / max(max naive error, max half ulp)`: the rule
    /// holds when this is at most 2. 0 for an empty tensor.
    pub fn ratio(&self) -> f64 {
        let reference = self.naive_error.max(self.floor);
        if self.candidate_error == 0.0 {
            0.0
        } else if reference > 0.0 {
            self.candidate_error / reference
        } else {
            f64::INFINITY
        }
    }

    /// Whether the rule holds (`ratio <= 2`).
    pub fn holds(&self) -> bool {
        self.ratio() <= 2.0
    }
}
