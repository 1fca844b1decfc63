//! Careful code's row computation in one dtype ([`Naive`]), the relative
//! rule's reference ([`super::CarefulRow`]): every operation rounded to the
//! accumulation dtype, the sums in the declared summation order.
//!
//! Steps: `z_j = r(x_j / T)` and `d_j = r(z_j - max z)` (scale first), or
//! `d_j = r(r(x_j - max x) / T)` (subtract first); `e_j = r(exp d_j)`;
//! `S = sum e_j` in blocks of `leaf` terms summed in index order, the block
//! sums merged pairwise ([`OrderedSum`]; `leaf = V` is one accumulator);
//! `l = r(ln S)`; `lp_j = r(d_j - l)`, or raw `r(z_j - r(max z + l))`; the
//! entropy `-sum r(p_j lp_j)`, `p_j = r(exp lp_j)`, in the same order. NaN
//! and `inf` propagate as they would in such code.

use logprobe_reference::spec::{pow2, Dtype, PolicyRow, PolicyTerm, TeacherForm};

use super::exp_f32::{exp_f32_in_place, BLOCK};

/// A sum in `dtype` of blocks' sums (each block summed in index order by
/// its caller), merged pairwise as they come: a binary counter of partial
/// sums, so `b` blocks take `ceil(log2 b)` merge levels
/// ([`logprobe_reference::spec::Summation`]'s leaf and merges).
#[derive(Debug)]
pub(super) struct OrderedSum {
    dtype: Dtype,
    /// `(level, partial sum)`, levels strictly decreasing upwards.
    stack: Vec<(u32, f64)>,
}

impl OrderedSum {
    pub(super) fn new(dtype: Dtype) -> Self {
        OrderedSum {
            dtype,
            stack: Vec::with_capacity(32),
        }
    }

    /// Adds the next block's sum.
    pub(super) fn push(&mut self, mut v: f64) {
        let mut level = 0;
        while let Some(&(l, top)) = self.stack.last() {
            if l != level {
                break;
            }
            self.stack.pop();
            v = self.dtype.round_f64(top + v);
            level += 1;
        }
        self.stack.push((level, v));
    }

    /// The total: the partial sums merged, latest first (0 for none).
    pub(super) fn finish(self) -> f64 {
        let r = |x: f64| self.dtype.round_f64(x);
        let mut it = self.stack.iter().rev();
        let Some(&(_, mut acc)) = it.next() else {
            return 0.0;
        };
        for &(_, v) in it {
            acc = r(v + acc);
        }
        acc
    }
}

/// Careful code's policy `term` at the log-prob `lp` (a value of `dtype`):
/// the CPU kernels' operations (`kernels/src/policy.rs`) rounded to
/// `dtype`: `d = r(lp - r(x))`; `k1 = d`, `k2 = r(r(d d) / 2)`, `|d|`,
/// `k3 = r(r(expm1(-d_c)) + d_c)` (the `expm1` form, `d_c` clamped, then
/// `min(k3, c_out)`), `ratio = r(exp(clamp(d)))`; `None` without its input.
pub(super) fn policy_term(term: PolicyTerm, lp: f64, row: &PolicyRow, dtype: Dtype) -> Option<f64> {
    let r = |x: f64| dtype.round_f64(x);
    let d = r(lp - r(row.input(term)?));
    let clamp = |d: f64, c: Option<f64>| c.map_or(d, |c| d.clamp(-c, c));
    Some(match term {
        PolicyTerm::K1 => d,
        PolicyTerm::K2 => r(r(d * d) / 2.0),
        PolicyTerm::Abs => d.abs(),
        PolicyTerm::K3 => {
            let dc = clamp(d, row.clamps.kl_input);
            let k = r(r((-dc).exp_m1()) + dc);
            match row.clamps.kl_output {
                Some(c) if k > c => c,
                _ => k,
            }
        }
        PolicyTerm::Ratio => r(clamp(d, row.clamps.ratio_log).exp()),
    })
}

/// Careful code's top-k KL `(forward_kl, reverse_kl)` from the student's
/// log-probs `lp [K]` at the ids (values of `dtype`) and the teacher's
/// `a [K]`: the CPU kernels' operations (`kernels/src/topk_kl.rs`) rounded
/// to `dtype`, the K terms summed in index order. Renormalised: `l'_k =
/// r(r(lp_k - m) - r(ln_1p(s)))`, `s = sum_{j != argmax} r(exp(r(lp_j -
/// m)))`. Terms: `r(r(exp a_k) r(a_k - l_k))` and `r(r(exp l_k) r(l_k -
/// a_k))`; a teacher `-inf` adds 0 forward, `+inf` reverse against a live
/// student, and the other way round.
pub(super) fn topk_kl(lp: &[f64], a: &[f64], renormalized: bool, dtype: Dtype) -> (f64, f64) {
    let r = |x: f64| dtype.round_f64(x);
    let l: Vec<f64> = if renormalized {
        let arg = (0..lp.len()).filter(|&k| lp[k] > f64::NEG_INFINITY).fold(
            None,
            |b: Option<usize>, k| match b {
                Some(b) if lp[b] >= lp[k] => Some(b),
                _ => Some(k),
            },
        );
        match arg {
            None => lp.to_vec(),
            Some(arg) => {
                let m = lp[arg];
                let s = (0..lp.len())
                    .filter(|&j| j != arg && lp[j] > f64::NEG_INFINITY)
                    .fold(0.0, |s, j| r(s + r(r(lp[j] - m).exp())));
                let ell = r(s.ln_1p());
                lp.iter()
                    .map(|&x| {
                        if x > f64::NEG_INFINITY {
                            r(r(x - m) - ell)
                        } else {
                            x
                        }
                    })
                    .collect()
            }
        }
    } else {
        lp.to_vec()
    };
    let a: Vec<f64> = a.iter().map(|&x| r(x)).collect();
    let (mut fwd, mut rev) = (0.0, 0.0);
    for (&l, &a) in l.iter().zip(&a) {
        let f = if a == f64::NEG_INFINITY {
            0.0
        } else if l == f64::NEG_INFINITY {
            f64::INFINITY
        } else {
            r(r(a.exp()) * r(a - l))
        };
        let b = if l == f64::NEG_INFINITY {
            0.0
        } else if a == f64::NEG_INFINITY {
            f64::INFINITY
        } else {
            r(r(l.exp()) * r(l - a))
        };
        fwd = r(fwd + f);
        rev = r(rev + b);
    }
    (fwd, rev)
}

/// The lanes of the second order (S2a) careful code sums `S` in.
const LANES: usize = 16;

/// The row-level values of careful code's log-softmax in one dtype.
#[derive(Clone, Copy, Debug)]
pub(super) struct Naive {
    pub(super) dtype: Dtype,
    /// The temperature rounded to `dtype`.
    t: f64,
    /// Subtract the max first (`d_j = r(r(x_j - max x) / T)`); otherwise
    /// scale first.
    sub_first: bool,
    /// `max_j z_j` (scale first) or `max_j x_j` (subtract first).
    m: f64,
    /// `r(ln S)`.
    pub(super) l: f64,
    /// (S2a) `r(ln S)` with `S` summed in another order, 16 interleaved
    /// f32 lanes merged pairwise (ATen's `Vectorized<float>` reduction on
    /// AVX-512); NaN where not computed (accumulation other than f32).
    pub(super) l_lanes: f64,
    /// Terms per block of the sums ([`OrderedSum`]), at least 1.
    leaf: usize,
    /// The row's logits are 16-bit values (`logits_dtype`): the per-entry
    /// terms are cached by the logit itself, whatever `dtype` is (a
    /// term is a function of the logit), and `d_j` is computed only on a
    /// miss; otherwise by the rounded shift `d_j` in a 16-bit `dtype`.
    logits16: Option<Dtype>,
}

/// How careful code forms and sums a row ([`Naive::new`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Plan {
    /// The dtype every operation rounds to.
    pub(super) dtype: Dtype,
    /// Subtract the max before dividing by `T`.
    pub(super) sub_first: bool,
    /// Terms per block of the sums (`usize::MAX`: one accumulator).
    pub(super) leaf: usize,
}

impl Naive {
    /// `z_j` of a logit: `r(x_j / T)` (scale first), or `x_j` (subtract
    /// first, whose `d` divides after the shift).
    #[inline(always)]
    fn z(&self, x: f64) -> f64 {
        let r = |x: f64| self.dtype.round_f64(x);
        if self.t == 1.0 || self.sub_first {
            r(x)
        } else {
            r(x / self.t)
        }
    }

    /// `d_j`.
    #[inline(always)]
    fn d(&self, x: f64) -> f64 {
        let r = |x: f64| self.dtype.round_f64(x);
        let s = r(self.z(x) - self.m);
        if self.sub_first && self.t != 1.0 {
            r(s / self.t)
        } else {
            s
        }
    }

    /// A logit whose `d` is about `d` (the inverse of [`Naive::d`] without
    /// its roundings): a first guess for the skip thresholds.
    fn x_of_d(&self, d: f64) -> f64 {
        if self.sub_first {
            self.m + self.t * d
        } else {
            self.t * (self.m + d)
        }
    }

    /// `d_j` ([`Naive::d`]) of each logit of `xs` into `out` when `dtype`
    /// is f32 (its rounding inlined, [`r32`]).
    fn d_f32(&self, xs: &[f64], out: &mut [f64]) {
        let (t, m) = (self.t, self.m);
        if self.sub_first && t != 1.0 {
            for (o, &x) in out.iter_mut().zip(xs) {
                *o = r32(r32(r32(x) - m) / t);
            }
        } else {
            for (o, &x) in out.iter_mut().zip(xs) {
                let z = if t == 1.0 || self.sub_first {
                    r32(x)
                } else {
                    r32(x / t)
                };
                *o = r32(z - m);
            }
        }
    }

    /// `lp_j` of a logit, shifted: `r(d_j - l)`.
    pub(super) fn lp(&self, x: f64) -> f64 {
        self.dtype.round_f64(self.d(x) - self.l)
    }

    /// `lp_j` of a logit in the raw form, `r(z_j - r(max z + l))` (scale
    /// first only; the shifted value when subtracting first).
    pub(super) fn lp_raw(&self, x: f64) -> f64 {
        if self.sub_first {
            return self.lp(x);
        }
        let r = |x: f64| self.dtype.round_f64(x);
        r(self.z(x) - r(self.m + self.l))
    }

    /// One ulp of the normaliser `S = e^l` (`S >= 1`) relative to it, in
    /// the plan's dtype: the error any implementation's rounding of `S` (or
    /// of `ln S`) leaves in every log-prob, whatever careful code's own
    /// rounding happened to give on a row (0 for a non-finite `l`).
    pub(super) fn norm_ulp(&self) -> f64 {
        let s = self.l.exp();
        if s.is_finite() && s > 0.0 {
            self.dtype.ulp(s) / s
        } else {
            0.0
        }
    }

    /// `lse = r(max z + l)` (subtract first: `max z = r(max x / T)`).
    pub(super) fn lse(&self) -> f64 {
        let r = |x: f64| self.dtype.round_f64(x);
        let m = if self.sub_first && self.t != 1.0 {
            r(self.m / self.t)
        } else {
            self.m
        };
        r(m + self.l)
    }

    /// `sum_j r(d_j - l)` over the finite entries of `row` (the logits
    /// [`Naive::new`] read), in the plan's order: the label-smoothing sum
    /// of the cross-entropy.
    pub(super) fn sum_lp(&self, row: &[f64]) -> f64 {
        let r = |x: f64| self.dtype.round_f64(x);
        let mut total = OrderedSum::new(self.dtype);
        for block in row.chunks(self.leaf) {
            let s = block
                .iter()
                .filter(|x| x.is_finite())
                .fold(0.0, |s, &x| r(s + r(self.d(x) - self.l)));
            total.push(s);
        }
        total.finish()
    }

    /// Careful code's soft-target cross-entropy `-sum_j r(r(p_j) lp_j)` of
    /// `row` (the logits [`Naive::new`] read, `-inf` where disallowed)
    /// against the teacher's entries `teacher [V]` (`form`: probabilities,
    /// or log-probabilities with `p_j = r(exp(r(a_j)))`), in the plan's
    /// order; an entry without teacher mass adds nothing, mass on a `-inf`
    /// log-prob makes it `+inf` (`kernels`' `soft_cross_entropy`).
    pub(super) fn soft_cross_entropy(
        &self,
        row: &[f64],
        teacher: &[f64],
        form: TeacherForm,
    ) -> f64 {
        let r = |x: f64| self.dtype.round_f64(x);
        let mut total = OrderedSum::new(self.dtype);
        for (block, t) in row.chunks(self.leaf).zip(teacher.chunks(self.leaf)) {
            let mut s = 0.0;
            for (&x, &a) in block.iter().zip(t) {
                if form.is_zero(a) {
                    continue;
                }
                let p = match form {
                    TeacherForm::Probs => r(a),
                    TeacherForm::LogProbs => r(r(a).exp()),
                };
                let lp = if x == f64::NEG_INFINITY {
                    f64::NEG_INFINITY
                } else {
                    r(self.d(x) - self.l)
                };
                s = r(s + r(p * lp));
            }
            total.push(s);
        }
        -total.finish()
    }

    /// The log-softmax's row values of `row` (logits of `logits_dtype`)
    /// under `plan`.
    pub(super) fn new(row: &[f64], temperature: f64, plan: Plan, logits_dtype: Dtype) -> Naive {
        let dtype = plan.dtype;
        let r = |x: f64| dtype.round_f64(x);
        let mut nv = Naive {
            dtype,
            t: r(temperature),
            sub_first: plan.sub_first,
            m: f64::NEG_INFINITY,
            l: 0.0,
            l_lanes: f64::NAN,
            leaf: plan.leaf.clamp(1, row.len().max(1)),
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
        let mut total = OrderedSum::new(dtype);
        // (S2a) The same exps in ATen's order too (f32 only).
        let mut lanes = [0f32; LANES];
        let mut pos = 0;
        EXP_CACHE.with(|c| {
            let mut c = c.borrow_mut();
            // f32 takes the vector lanes below (faster than the 16-bit
            // logits' cache); a 16-bit dtype, the cache and its skips.
            let mut cache = if dtype == Dtype::F32 {
                None
            } else {
                c.start(nv.logits16.unwrap_or(dtype), nv.m, f64::NAN)
            };
            for row in row.chunks(nv.leaf) {
                let mut s = 0.0;
                if cache.is_none() && dtype == Dtype::F32 {
                    // f32: the exps a block at a time, in lanes (the same bits).
                    // The sum in f32 arithmetic: f32 operands' sum rounded
                    // once to f32 is `r32` of their f64 sum (a double
                    // rounding through f64 is innocuous for `+`, `-`, `*`:
                    // 53 >= 2 * 24 + 2), and the chain is shorter.
                    let mut buf = [0.0; BLOCK];
                    let mut s32 = 0f32;
                    for block in row.chunks(BLOCK) {
                        let e = &mut buf[..block.len()];
                        nv.d_f32(block, e);
                        exp_f32_in_place(e);
                        for (i, &e) in e.iter().enumerate() {
                            s32 += e as f32;
                            lanes[(pos + i) % LANES] += e as f32;
                        }
                        pos += block.len();
                    }
                    total.push(f64::from(s32));
                    continue;
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
                total.push(s);
            }
        });
        nv.l = r(total.finish().ln());
        if pos > 0 {
            let mut w = LANES;
            while w > 1 {
                w /= 2;
                for i in 0..w {
                    lanes[i] += lanes[i + w];
                }
            }
            nv.l_lanes = r(f64::from(lanes[0]).ln());
        }
        nv
    }

    /// Careful code's entropy of `row` (the logits [`Naive::new`] read):
    /// `-sum_j r(p_j lp_j)`, `p_j = r(exp lp_j)`, in the plan's order;
    /// entries with `p_j = 0` add nothing (the defined semantics of `-inf`
    /// logits).
    pub(super) fn entropy(&self, row: &[f64]) -> f64 {
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
        let mut total = OrderedSum::new(self.dtype);
        EXP_CACHE.with(|c| {
            let mut c = c.borrow_mut();
            let mut cache = if self.dtype == Dtype::F32 {
                None
            } else {
                c.start(self.logits16.unwrap_or(self.dtype), self.m, self.l)
            };
            for row in row.chunks(self.leaf) {
                let mut acc = 0.0;
                if cache.is_none() && self.dtype == Dtype::F32 {
                    // f32: `term` a block at a time, its exps in lanes (the same bits).
                    let (mut l, mut p) = ([0.0; BLOCK], [0.0; BLOCK]);
                    // In f32 arithmetic, as `new`'s sum (the same bits).
                    let mut acc32 = 0f32;
                    for block in row.chunks(BLOCK) {
                        let n = block.len();
                        self.d_f32(block, &mut l[..n]);
                        for (l, p) in l[..n].iter_mut().zip(p.iter_mut()) {
                            *l = r32(*l - self.l);
                            *p = *l;
                        }
                        exp_f32_in_place(&mut p[..n]);
                        for (&l, &p) in l[..n].iter().zip(&p[..n]) {
                            // As `term`: `p = 0` adds nothing (`0 * -inf`
                            // would be NaN).
                            let t = if p != 0.0 { p as f32 * l as f32 } else { 0.0 };
                            acc32 -= t;
                        }
                    }
                    total.push(f64::from(acc32));
                    continue;
                }
                // Logits `x <= below` add nothing to `acc` (`Naive::entropy_below`).
                let mut below = f64::NEG_INFINITY;
                for &x in row {
                    if x <= below && cache.is_some() {
                        continue;
                    }
                    let t = match cache {
                        Some(ref mut k) if self.logits16.is_some() => {
                            k.get(x, 1, |x| term(self.d(x)))
                        }
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
                total.push(acc);
            }
        });
        total.finish()
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
    let mut y = nv.x_of_d(e_max.ln()) - 0.01;
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
        let mut y = self.x_of_d(self.l + l0) - 0.01;
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
