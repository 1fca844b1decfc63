//! Per-row statistics and forward values, built on [`crate::row::reduce`],
//! and the per-call plumbing the CPU kernels share (validation, output
//! rounding, the declared algorithm).
//!
//! Formulas (docs/design.md, "The math", restated in the oracle's docs): with `m` the
//! max of the allowed `z`, `s = S - 1`, `ell = ln_1p(s) = ln S`:
//! `log_prob = (z_t - m) / T - ell`; `topk_log_probs[k] = (z_id - m) / T - ell`
//! (`-inf` for a masked id); `entropy = ell_w + B_w / (1 + s_w)` over the
//! entropy's logits `w` (unmasked by default, masked on request).

// `!(x > -inf)` is meant: it is true for NaN.
#![allow(clippy::neg_cmp_op_on_partial_ord)]

use ndarray::{ArrayView1, ArrayView2, Axis};

use logprobe_reference::spec::{
    Dtype, EntropyLogits, Output, PolicyTerm, Problem, Shape, SpecError, TeacherForm,
    TemperatureDtype,
};

use crate::kernel::{Algorithm, Shift};
use crate::row::{
    reduce, rescaling_exps, round_input, shift, summation, Acc, Input, Partial, Softcap, Source,
};
use crate::topk_kl::topk_kl;

/// Per-call constants: options resolved for the accumulation dtype.
#[derive(Clone, Debug)]
pub struct CallParams<A> {
    /// Real vocabulary size `V`.
    pub v: usize,
    /// Column ranges reduced separately, then merged in order (as an
    /// all-reduce over vocabulary shards would): `[0..V]` for one row-wide
    /// reduction, the shards' ranges truncated to `V` for vocab-parallel.
    pub ranges: Vec<std::ops::Range<usize>>,
    /// Division by `T` after the shift; `None` when `T == 1` or with
    /// `TemperatureDtype::Input` (then `z = round_input(x / T)` and `T = 1`).
    pub scale: Option<A>,
    /// `Some(T)` with `TemperatureDtype::Input`.
    pub input_temperature: Option<f64>,
    /// The softcap applied to the raw logits before the temperature
    /// (every output sees `z = x' / T`; the gradient gets `dx'/dx`).
    pub softcap: Option<Softcap>,
    /// Divisor of every gradient: `Some(T)` unless `T == 1` (in both
    /// temperature modes: with `Input`, `dz/dx = 1/T` as the oracle takes it).
    pub grad_scale: Option<A>,
    /// Entropy wanted, and over which logits.
    pub entropy: Option<EntropyLogits>,
    /// `ignore_index`.
    pub ignore_index: i64,
    /// The z-loss coefficient in the accumulation dtype (`None` without
    /// `z_loss_coef`).
    pub z_loss_coef: Option<A>,
    /// Label smoothing `eps` in the accumulation dtype when the cross-entropy
    /// row loss is wanted ([`CpuKernel::cross_entropy`](crate::CpuKernel::cross_entropy)).
    pub label_smoothing: Option<A>,
    /// The loss's constants in a backward with `grad_loss`
    /// ([`crate::vjp`]); `None` otherwise.
    pub loss_grad: Option<LossGrad<A>>,
}

/// The cross-entropy loss's call constants of a backward (docs/design.md, "The
/// loss side"), in the accumulation dtype.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossGrad<A> {
    /// Label smoothing `eps`.
    pub eps: A,
    /// The mean's divisor `W` (the forward's: [`pairwise_sum`] of the
    /// counted rows' weights, or their count), `None` under `none` / `sum`
    /// and when `W = 0` (every row ignored: no row has a coefficient).
    pub divisor: Option<A>,
}

impl<A: Acc> CallParams<A> {
    /// Resolves `problem`'s options for a validated `shape`.
    pub fn new(problem: &Problem<'_>, shape: &Shape) -> Self {
        let t = shape.temperature;
        let (scale, input_temperature) = match problem.options.temperature_dtype {
            TemperatureDtype::Input => (None, Some(t)),
            TemperatureDtype::Accumulation => {
                (if t == 1.0 { None } else { Some(A::from_f64(t)) }, None)
            }
        };
        CallParams {
            v: shape.vocab_size,
            ranges: std::iter::once(0..shape.vocab_size).collect(),
            scale,
            input_temperature,
            softcap: Softcap::of(&problem.options, shape.dtype),
            grad_scale: if t == 1.0 { None } else { Some(A::from_f64(t)) },
            entropy: problem.options.entropy,
            ignore_index: problem.options.ignore_index,
            z_loss_coef: problem.options.z_loss_coef.map(A::from_f64),
            label_smoothing: None,
            loss_grad: None,
        }
    }
}

/// Entropy statistics of one row over its logits `w`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EntropyStats<A> {
    /// Max of `w`.
    pub m: A,
    /// `ln S_w`.
    pub ell: A,
    /// `R = B_w / S_w` (nats).
    pub r: A,
    /// `ell + R` (nats).
    pub entropy: A,
}

/// Statistics of one row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowStats<A> {
    /// Max of the allowed `z`.
    pub m: A,
    /// `S - 1` over the allowed entries.
    pub s: A,
    /// `ln S = ln_1p(s)`.
    pub ell: A,
    /// Entropy statistics when the entropy is wanted.
    pub w: Option<EntropyStats<A>>,
}

/// A row the reduction flagged (NaN / `+inf`, or no allowed finite value):
/// build its typed error with [`row_error`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadRow;

/// The statistics of one row read from `src` over columns `0..v`, or `Err(())`
/// when the row holds a NaN / `+inf` or no allowed finite value (the caller
/// builds the typed error with [`row_error`]).
pub fn row_stats<A: Acc, S: Source<A> + ?Sized>(
    src: &S,
    mask: Option<ArrayView1<'_, bool>>,
    p: &CallParams<A>,
) -> Result<RowStats<A>, BadRow> {
    let masked_b =
        p.entropy.is_some() && (mask.is_none() || p.entropy == Some(EntropyLogits::Masked));
    let r = reduce_ranges(src, &p.ranges, mask, p.scale, masked_b);
    if r.bad || r.partial.is_empty() {
        return Err(BadRow);
    }
    let ell = r.partial.s.ln_1p();
    let w = match p.entropy {
        None => None,
        Some(_) if masked_b => Some(entropy_stats(r.partial, ell)),
        Some(_) => {
            let ru = reduce_ranges(src, &p.ranges, None, p.scale, true);
            Some(entropy_stats(ru.partial, ru.partial.s.ln_1p()))
        }
    };
    Ok(RowStats {
        m: r.partial.m,
        s: r.partial.s,
        ell,
        w,
    })
}

/// Column ranges of vocabulary shards of widths `widths` (in order from
/// column 0), truncated to the real vocabulary `0..v` (padding sits in the
/// last shards; a shard wholly past `v` gets an empty range). Empty
/// `widths` means one range `0..v`.
pub fn shard_ranges(widths: &[usize], v: usize) -> Vec<std::ops::Range<usize>> {
    if widths.is_empty() {
        return std::iter::once(0..v).collect();
    }
    let mut off = 0usize;
    widths
        .iter()
        .map(|&w| {
            let r = off.min(v)..(off + w).min(v);
            off += w;
            r
        })
        .collect()
}

/// [`reduce`] over each range, the partials merged in range order (a
/// sequential fold, as an all-reduce in shard order). Empty, all-padding
/// and all-masked ranges give the empty partial, which merges without NaN.
pub fn reduce_ranges<A: Acc, S: Source<A> + ?Sized>(
    src: &S,
    ranges: &[std::ops::Range<usize>],
    mask: Option<ArrayView1<'_, bool>>,
    scale: Option<A>,
    want_b: bool,
) -> crate::row::Reduction<A> {
    let mut acc = crate::row::Reduction {
        partial: Partial::EMPTY,
        bad: false,
    };
    for r in ranges {
        let x = reduce(src, r.clone(), mask, scale, want_b);
        acc = crate::row::Reduction {
            partial: acc.partial.merge(x.partial, scale),
            bad: acc.bad | x.bad,
        };
    }
    acc
}

/// Entropy statistics from a merged partial with `b`, and its `ln_1p(s)`.
pub fn entropy_stats<A: Acc>(p: Partial<A>, ell: A) -> EntropyStats<A> {
    let r = p.b / (A::ONE + p.s);
    EntropyStats {
        m: p.m,
        ell,
        r,
        entropy: ell + r,
    }
}

/// `(z - m) / T - ell` for an allowed value `z`.
#[inline]
pub fn log_prob<A: Acc>(z: A, st: &RowStats<A>, scale: Option<A>) -> A {
    shift(z, st.m, scale) - st.ell
}

/// The first error of row `row` in [`Problem::validate_row`]'s order; then,
/// with `SoftcapDtype::Input`, those of the materialised `x'`
/// ([`Problem::validate_softcapped_row`]); then, with
/// `TemperatureDtype::Input`, those of the materialised
/// `z = round_input(x' / T)` ([`Problem::validate_input_row`]), as the
/// oracle reports them.
pub fn row_error(problem: &Problem<'_>, shape: &Shape, row: usize) -> SpecError {
    if let Err(e) = problem.validate_row(shape, row) {
        return e;
    }
    let which = if problem.sampling_mask.is_some() {
        "allowed by sampling_mask"
    } else {
        "any"
    };
    let softcap = Softcap::of(&problem.options, shape.dtype);
    if let Some(Softcap::Input(c)) = softcap {
        let xs: Vec<f64> = logprobe_reference::with_logits!(problem.logits, lv => {
            let r = lv.row(row);
            (0..shape.vocab_size).map(|j| shape.dtype.softcapped_input(r[j].to_f64(), c)).collect()
        });
        if let Err(e) = problem.validate_softcapped_row(row, &xs) {
            return e;
        }
        if problem.options.temperature_dtype == TemperatureDtype::Input {
            let z: Vec<f64> = xs
                .iter()
                .map(|&x| shape.dtype.scaled_input(x, shape.temperature))
                .collect();
            if let Err(e) = problem.validate_input_row(row, &z) {
                return e;
            }
        }
    } else if problem.options.temperature_dtype == TemperatureDtype::Input {
        let t = shape.temperature;
        let z: Vec<f64> = logprobe_reference::with_logits!(problem.logits, lv => {
            let r = lv.row(row);
            (0..shape.vocab_size).map(|j| round_input(r[j], t).to_f64()).collect()
        });
        if let Err(e) = problem.validate_input_row(row, &z) {
            return e;
        }
    }
    // Unreachable for rows the fast path flagged; name the row all the same.
    SpecError::NoFiniteLogit {
        tensor: "logits",
        row,
        which,
    }
}

/// Fast O(1 + K) checks of the token and top-k ids of a row (the O(V) ones
/// are folded into the reduction): `true` if the row needs [`row_error`].
pub fn ids_suspect<A: Acc, S: Source<A> + ?Sized>(
    problem: &Problem<'_>,
    src: &S,
    row: usize,
    v: usize,
) -> bool {
    if let Some(tokens) = problem.tokens {
        let t = tokens[row];
        if t != problem.options.ignore_index {
            if t < 0 || t as u64 >= v as u64 {
                return true;
            }
            let tu = t as usize;
            if !problem.allowed(row, tu) || !(src.get(tu) > A::NEG_INF) {
                return true;
            }
        }
    }
    if let Some(ids) = problem.topk_ids {
        if ids
            .row(row)
            .iter()
            .any(|&id| id < 0 || id as u64 >= v as u64)
        {
            return true;
        }
        if let Some(kl) = problem.options.topk_kl {
            if problem.validate_topk_kl_row(&kl, row).is_err() {
                return true;
            }
        }
    }
    false
}

/// Forward values of one row in the accumulation dtype.
#[derive(Clone, Debug)]
pub struct RowForward {
    /// Log-prob (0 for `ignore_index` rows or without tokens), rounded to `out`.
    pub log_prob: f64,
    /// Entropy (0 when not wanted), rounded to `out`.
    pub entropy: f64,
    /// Top-k log-probs `[K]`, rounded to `out`.
    pub topk: Vec<f64>,
    /// `lse = m / T + ln S` (0 when not wanted), rounded to `out`.
    pub lse: f64,
    /// `z_loss = coef * lse * lse` from the unrounded `lse` (0 when not
    /// wanted), rounded to `out`.
    pub z_loss: f64,
    /// The cross-entropy row loss `l` in the accumulation dtype, unrounded
    /// (an exact f64; 0 on `ignore_index` rows or when not wanted): see
    /// [`row_loss`].
    pub loss: f64,
    /// The policy terms ([`crate::policy`], `PolicyTerm::ALL` order) from
    /// the unrounded log-prob, rounded to `out` (0 on `ignore_index` rows
    /// or without their input).
    pub policy: [f64; 5],
    /// `forward_kl` (0 when not wanted), rounded to `out`: [`topk_kl`].
    pub forward_kl: f64,
    /// `reverse_kl` (0 when not wanted), rounded to `out`: [`topk_kl`].
    pub reverse_kl: f64,
    /// `soft_cross_entropy` (0 when not wanted), rounded to `out`:
    /// [`soft_cross_entropy`].
    pub soft_cross_entropy: f64,
    /// `token_ranks`: `#{j < V allowed : lp(j) >= lp(t)}` over the unrounded
    /// log-probs, an exact integer (0 when not wanted or on `ignore_index`
    /// rows): [`token_rank`].
    pub token_rank: f64,
}

/// Rounds an accumulation value to `out` (correctly: [`Dtype::round_f64`]).
#[inline]
pub fn round_out<A: Acc>(x: A, out: Dtype) -> f64 {
    out.round_f64(x.to_f64())
}

/// Forward values of row `row` from its stats; `lp(j)` gives the log-prob
/// of an allowed column `j` (computed by [`log_prob`], or gathered from a
/// log-softmax buffer holding the same values).
pub fn row_forward<A: Acc>(
    problem: &Problem<'_>,
    row: usize,
    st: &RowStats<A>,
    p: &CallParams<A>,
    lp: impl Fn(usize) -> A,
    out: Dtype,
) -> RowForward {
    let log_prob = match problem.tokens {
        Some(t) if t[row] != p.ignore_index => round_out(lp(t[row] as usize), out),
        _ => 0.0,
    };
    let entropy = st.w.map_or(0.0, |w| round_out(w.entropy, out));
    let topk = match problem.topk_ids {
        Some(ids) => ids
            .row(row)
            .iter()
            .map(|&id| {
                let id = id as usize;
                if problem.allowed(row, id) {
                    round_out(lp(id), out)
                } else {
                    f64::NEG_INFINITY
                }
            })
            .collect(),
        None => Vec::new(),
    };
    // lse = m / T + ln S (the oracle's `lse(z')`, docs/design.md, "The loss side"),
    // all in the accumulation dtype; z_loss squares that unrounded value.
    let want_z = problem.options.z_loss_coef.is_some();
    let (lse, z_loss) = if problem.options.lse || want_z {
        let m = match p.scale {
            Some(t) => st.m / t,
            None => st.m,
        };
        let l = m + st.ell;
        let z = match p.z_loss_coef {
            Some(c) if want_z => round_out(c * l * l, out),
            _ => 0.0,
        };
        (round_out(l, out), z)
    } else {
        (0.0, 0.0)
    };
    let mut policy = [0.0; 5];
    if let (Some(pr), Some(t)) = (
        crate::policy::PolicyRow::<A>::of(problem, row),
        problem.tokens,
    ) {
        if t[row] != p.ignore_index {
            let lp_t = lp(t[row] as usize);
            for (v, term) in policy.iter_mut().zip(PolicyTerm::ALL) {
                *v = pr.value(term, lp_t).map_or(0.0, |x| round_out(x, out));
            }
        }
    }
    let loss = match (p.label_smoothing, problem.tokens) {
        (Some(eps), Some(t)) if t[row] != p.ignore_index => {
            row_loss(problem, row, p.v, eps, lp(t[row] as usize), &lp).to_f64()
        }
        _ => 0.0,
    };
    let (forward_kl, reverse_kl) = match (
        problem.options.topk_kl,
        problem.topk_ids,
        problem.teacher_topk_log_probs,
    ) {
        (Some(kl), Some(ids), Some(a)) => {
            let lps: Vec<A> = ids.row(row).iter().map(|&id| lp(id as usize)).collect();
            let teacher: Vec<f64> = a.row(row).to_vec();
            let (f, r) = topk_kl(&lps, &teacher, kl.renormalized);
            (
                if kl.forward { round_out(f, out) } else { 0.0 },
                if kl.reverse { round_out(r, out) } else { 0.0 },
            )
        }
        _ => (0.0, 0.0),
    };
    let token_rank = match problem.tokens {
        Some(t) if problem.options.token_ranks && t[row] != p.ignore_index => {
            token_rank(problem, row, p.v, t[row] as usize, &lp)
        }
        _ => 0.0,
    };
    let soft_cross_entropy = problem.teacher_probs.map_or(0.0, |tp| {
        let teacher = tp.row(row);
        round_out(
            soft_cross_entropy(problem, row, teacher.slice(ndarray::s![..p.v]), &lp),
            out,
        )
    });
    RowForward {
        soft_cross_entropy,
        token_rank,
        log_prob,
        entropy,
        topk,
        lse,
        z_loss,
        loss,
        policy,
        forward_kl,
        reverse_kl,
    }
}

/// The soft-target cross-entropy of row `row` in `A` (docs/design.md,
/// "The loss side"; TOLERANCE.md (T27)): `-sum_{j < v} p_j lp(j)` over the
/// teacher's probabilities `p [v]` (a view: no allocation), each product
/// rounded to `A` and summed by [`pairwise_sum`]; `p_j = 0` entries add
/// nothing (not `0 * -inf`), teacher mass on a masked entry makes it `+inf`.
pub fn soft_cross_entropy<A: Acc>(
    problem: &Problem<'_>,
    row: usize,
    p: ArrayView1<'_, f64>,
    lp: &impl Fn(usize) -> A,
) -> A {
    // Which entries count is decided on the input `p_j` (the oracle's
    // definition), not on its rounding to `A`.
    let form = problem.options.teacher_form;
    let term = |j: usize| {
        if form.is_zero(p[j]) {
            A::ZERO
        } else if problem.allowed(row, j) {
            teacher_p::<A>(form, p[j]) * lp(j)
        } else {
            A::from_f64(f64::NEG_INFINITY)
        }
    };
    -pairwise_sum(0..p.len(), &term)
}

/// The teacher's `p_j` in `A` from an entry holding `x`: `x` rounded
/// (probabilities), or `exp` of `x` rounded (log-probabilities), the
/// kernel's own `exp`.
#[inline]
pub fn teacher_p<A: Acc>(form: TeacherForm, x: f64) -> A {
    match form {
        TeacherForm::Probs => A::from_f64(x),
        TeacherForm::LogProbs => A::from_f64(x).exp(),
    }
}

/// The rank of the token `t` among row `row`'s log-probs (vLLM's
/// `token_ranks`, `(logprobs >= logprobs[t]).sum(-1)`, TOLERANCE.md
/// (T26)): the allowed columns `j < v` whose log-prob `lp(j)` in the
/// accumulation dtype is at least the token's (ties counted against it;
/// masked columns are `-inf`, below the allowed token), as an exact f64.
pub fn token_rank<A: Acc>(
    problem: &Problem<'_>,
    row: usize,
    v: usize,
    t: usize,
    lp: &impl Fn(usize) -> A,
) -> f64 {
    let lp_t = lp(t);
    (0..v)
        .filter(|&j| problem.allowed(row, j) && lp(j) >= lp_t)
        .count() as f64
}

/// Leaf width of [`pairwise_sum`].
pub const PAIRWISE_LEAF: usize = 8;

/// `sum_{j in range} f(j)` in `A`: sequential leaves of at most
/// [`PAIRWISE_LEAF`] terms, halves merged pairwise (split at the midpoint),
/// so the order depends on the range alone. Error (Higham, "Accuracy and
/// Stability of Numerical Algorithms", 2nd ed., sec. 4.2): at most
/// `(PAIRWISE_LEAF - 1 + ceil(log2(ceil(n / PAIRWISE_LEAF)))) u sum |f(j)|`
/// to first order, [`pairwise_depth`] terms of `u`.
pub fn pairwise_sum<A: Acc>(range: std::ops::Range<usize>, f: &impl Fn(usize) -> A) -> A {
    if range.len() <= PAIRWISE_LEAF {
        let mut s = A::ZERO;
        for j in range {
            s = s + f(j);
        }
        s
    } else {
        let mid = range.start + range.len() / 2;
        pairwise_sum(range.start..mid, f) + pairwise_sum(mid..range.end, f)
    }
}

/// The number of rounded additions on the longest path of
/// [`pairwise_sum`] over `n` terms (0 for `n <= 1`).
pub fn pairwise_depth(n: usize) -> usize {
    if n <= 1 {
        0
    } else if n <= PAIRWISE_LEAF {
        n - 1
    } else {
        1 + pairwise_depth(n - n / 2)
    }
}

/// The cross-entropy row loss in `A` (docs/design.md, "The loss side"):
/// `l = (1 - eps) (-lp_t) + eps (-sum_{j in A} lp(j) / |A|)` over the
/// allowed entries `j < v` (`lp_t` the target's log-prob), the sum by
/// [`pairwise_sum`]; `eps = 0` gives `-lp_t` alone, and a `-inf` logit in
/// `A` makes the sum `-inf`, so `l = +inf` (PyTorch's value).
pub fn row_loss<A: Acc>(
    problem: &Problem<'_>,
    row: usize,
    v: usize,
    eps: A,
    lp_t: A,
    lp: &impl Fn(usize) -> A,
) -> A {
    let nll = -lp_t;
    if eps == A::ZERO {
        return nll;
    }
    let allowed = |j: usize| problem.allowed(row, j);
    let count = (0..v).filter(|&j| allowed(j)).count();
    let s = pairwise_sum(0..v, &|j| if allowed(j) { lp(j) } else { A::ZERO });
    let mean = -(s / A::from_f64(count as f64));
    (A::ONE - eps) * nll + eps * mean
}

/// Row `row`'s cross-entropy term `w l` rounded to `out` (an exact 0 on an
/// `ignore_index` row or for `w = 0`): `l` (the accumulation-dtype row loss
/// of [`RowForward::loss`]) times the weight rounded to the accumulation
/// dtype, one product in it: the term
/// [`CpuKernel::cross_entropy`](crate::CpuKernel::cross_entropy) reduces, and
/// under `reduction = none` its value.
pub fn loss_term(problem: &Problem<'_>, shape: &Shape, row: usize, l: f64, out: Dtype) -> f64 {
    let w = problem.loss_weight(row);
    if !problem.has_target(row) || w == 0.0 {
        return 0.0;
    }
    let t = match shape.dtype.accumulation() {
        Dtype::F64 => w * l,
        _ => f64::from(w as f32 * l as f32),
    };
    out.round_f64(if w == 1.0 { l } else { t })
}

/// Assembles per-row results (first error in row order wins) into a
/// [`crate::ForwardOutput`].
pub fn assemble(
    problem: &Problem<'_>,
    shape: &Shape,
    rows: Vec<Result<RowForward, SpecError>>,
    out: Dtype,
) -> Result<crate::ForwardOutput, SpecError> {
    let mut fo = crate::ForwardOutput::zeros(problem, shape, out);
    for (r, res) in rows.into_iter().enumerate() {
        let f = res?;
        if let Some(lp) = fo.values.get_mut(Output::LogProbs) {
            lp[[r, 0]] = f.log_prob;
        }
        if let Some(e) = fo.values.get_mut(Output::Entropy) {
            e[[r, 0]] = f.entropy;
        }
        if let Some(tk) = fo.values.get_mut(Output::TopkLogProbs) {
            for (k, v) in f.topk.into_iter().enumerate() {
                tk[[r, k]] = v;
            }
        }
        if let Some(l) = fo.values.get_mut(Output::Lse) {
            l[[r, 0]] = f.lse;
        }
        if let Some(z) = fo.values.get_mut(Output::ZLoss) {
            z[[r, 0]] = f.z_loss;
        }
        if let Some(l) = fo.values.get_mut(Output::Loss) {
            l[[r, 0]] = loss_term(problem, shape, r, f.loss, out);
        }
        for (term, &v) in PolicyTerm::ALL.iter().zip(&f.policy) {
            if let Some(a) = fo.values.get_mut(term.output()) {
                a[[r, 0]] = v;
            }
        }
        if let Some(k) = fo.values.get_mut(Output::ForwardKl) {
            k[[r, 0]] = f.forward_kl;
        }
        if let Some(k) = fo.values.get_mut(Output::ReverseKl) {
            k[[r, 0]] = f.reverse_kl;
        }
        if let Some(k) = fo.values.get_mut(Output::TokenRanks) {
            k[[r, 0]] = f.token_rank;
        }
        if let Some(h) = fo.values.get_mut(Output::SoftCrossEntropy) {
            h[[r, 0]] = f.soft_cross_entropy;
        }
    }
    Ok(fo)
}

/// Row `row` of an optional mask.
pub fn mask_row<'a>(
    mask: Option<ArrayView2<'a, bool>>,
    row: usize,
) -> Option<ArrayView1<'a, bool>> {
    mask.map(|m| m.index_axis_move(Axis(0), row))
}

/// The algorithm of [`crate::row::reduce`] over `len` columns in accumulation dtype `acc`.
pub fn declared_algorithm(acc: Dtype, len: usize) -> Algorithm {
    let (exp_ulps, log_ulps) = match acc {
        Dtype::F64 => (<f64 as Acc>::EXP_ULPS, <f64 as Acc>::LOG_ULPS),
        _ => (<f32 as Acc>::EXP_ULPS, <f32 as Acc>::LOG_ULPS),
    };
    Algorithm {
        accumulation: acc,
        exp_ulps,
        log_ulps,
        summation: summation(len),
        rescaling_exps: rescaling_exps(len),
        shift: Shift::SubtractThenScale,
        tanh_ulps: match acc {
            Dtype::F64 => <f64 as Acc>::TANH_ULPS,
            _ => <f32 as Acc>::TANH_ULPS,
        },
    }
}

/// Typed row views of `logits` with the call's input transform.
pub fn typed_row<'a, T: Input>(
    lv: &ArrayView2<'a, T>,
    row: usize,
    p: &CallParams<T::Acc>,
) -> crate::row::TypedRow<'a, T> {
    crate::row::TypedRow {
        row: lv.index_axis_move(Axis(0), row),
        input_temperature: p.input_temperature,
        softcap: p.softcap,
    }
}
