//! The relative rule, "as accurate as careful code" (TOLERANCE.md,
//! "The relative rule"): an output whose largest error exceeds
//! [`RELATIVE_R`] times the largest error careful code makes on the same
//! rows, or half an ulp of the output where that is larger, is SUSPECT
//! (a failure under `--strict`). It makes exact the flash-attention
//! suites' rule (a kernel's error at most twice a same-precision
//! reference's, Dao et al.), with a reference whose error is known exactly.
//!
//! Careful code ([`CarefulRow`]) is the textbook row computation in the
//! declared accumulation dtype, every operation rounded to it, summed in
//! the declared summation order ([`Order`]: blocks of its leaf in index
//! order, merged pairwise), in each form the declaration allows (`any`:
//! scale first and, for log-probs, the raw `z_t - logsumexp(z)` too; the
//! reference error of an element is the largest over them), its result
//! rounded to the output's dtype. It covers the log-softmax outputs
//! (`log_probs`, `topk_log_probs`, `entropy`), `lse = r(max z + l)`,
//! `z_loss = r(r(coef lse) lse)`, the cross-entropy `loss` under
//! `reduction = none`, a reduced one (`sum` / `mean`, [`reduced`]), the
//! soft cross-entropy, the top-k KLs and the policy terms (`kl_k1`,
//! `kl_k2`, `kl_k3` in the `expm1` form, `kl_abs`, `ratio`, from careful
//! code's log-prob).

use logprobe_reference::oracle::{Exact, Interval};
use logprobe_reference::spec::{
    Dtype, EntropyLogits, Family, KlDirection, LossTerm, Output, PolicyRow, PolicyTerm, Problem,
    RowStat, Shift, SoftcapDtype, TeacherForm, TemperatureDtype,
};

use super::model::Order;
use super::walk::RowTargets;

mod careful;
mod exp_f32;
mod reduced;
use careful::{policy_term, topk_kl, Naive, Plan};
pub use reduced::{careful_reduced_loss, CarefulLossRow, ReducedPlan};

/// `R` of the relative rule: an output is SUSPECT when its largest error
/// exceeds `R` times careful code's (or half an ulp); chosen from the
/// calibration in TOLERANCE.md ("The relative rule").
pub const RELATIVE_R: f64 = 4.0;

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

/// Careful code's values of one row (the module docs' computation), computed
/// when first asked: the relative rule's reference.
#[derive(Debug)]
pub struct CarefulRow {
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
    plan: Plan,
    /// Log-probs in the raw form too (`any`), or in it alone (`raw`).
    raw: Option<bool>,
    /// The row's policy inputs, clamps rounded to the accumulation dtype
    /// (`None` without policy inputs).
    policy: Option<PolicyRow>,
    /// `z_loss_coef` rounded to the accumulation dtype.
    z_loss_coef: Option<f64>,
    /// The row's cross-entropy under `reduction = none`.
    loss: Option<LossRow>,
    /// The top-k KL: renormalised, and the teacher's log-probs `[K]`.
    topk_kl: Option<(bool, Vec<f64>)>,
    /// The soft cross-entropy's teacher entries over the real vocabulary
    /// `[V]` and their form.
    teacher: Option<(Vec<f64>, TeacherForm)>,
    log_softmax: Option<Naive>,
    entropy: Option<f64>,
}

/// What careful code's per-row cross-entropy needs besides the log-probs
/// (`spec::loss`'s definition; `kernels`' `row_loss` and `loss_term`).
#[derive(Clone, Copy, Debug)]
struct LossRow {
    /// The row has a target (its token is not `ignore_index`).
    target: bool,
    /// Its weight (1 without `loss_weights`).
    weight: f64,
    /// Label smoothing rounded to the accumulation dtype.
    eps: f64,
    /// Allowed entries `|A|`.
    count: usize,
    /// An allowed entry has a `-inf` logit (`l = +inf` when `eps > 0`).
    neg_inf: bool,
}

impl Drop for CarefulRow {
    fn drop(&mut self) {
        crate::scratch::give(std::mem::take(&mut self.masked));
        crate::scratch::give(std::mem::take(&mut self.entropy_logits));
    }
}

/// Row `row`'s [`LossRow`] (`None` without a cross-entropy); `masked`
/// its logits, `-inf` where disallowed.
fn loss_row(problem: &Problem<'_>, row: usize, acc: Dtype, masked: &[f64]) -> Option<LossRow> {
    let loss = problem.options.loss.as_ref()?;
    let (mut count, mut neg_inf) = (0, false);
    for (j, &x) in masked.iter().enumerate() {
        if problem.allowed(row, j) {
            count += 1;
            neg_inf |= x == f64::NEG_INFINITY;
        }
    }
    Some(LossRow {
        target: problem.has_target(row),
        weight: problem.loss_weight(row),
        eps: loss
            .with_weights(None)
            .effective_label_smoothing(acc)
            .ok()?,
        count,
        neg_inf,
    })
}

/// The first `v` entries of `row` as f64 into `out`.
fn fill_row<T: logprobe_reference::spec::Element>(
    row: ndarray::ArrayView1<'_, T>,
    v: usize,
    out: &mut Vec<f64>,
) {
    out.clear();
    out.extend(row.iter().take(v).map(|x| x.to_f64()));
}

impl CarefulRow {
    /// Row `row` of a validated `problem`, computed in `accumulation` in
    /// the declared `form` and summation `order`; `logits_in`: the logits
    /// are first rounded to this dtype (a fused linear kernel's logits
    /// kept in a 16-bit matmul dtype, from the exact matmul's, TOLERANCE.md
    /// (R2)), twice where a bias `[V]` is added (the product rounded, then
    /// the sum, as Liger's chunks do).
    pub fn new(
        problem: &Problem<'_>,
        row: usize,
        accumulation: Dtype,
        (form, order): (Shift, Order),
        logits_in: Option<(Dtype, Option<&[f64]>)>,
    ) -> CarefulRow {
        use logprobe_reference::spec::Logits;
        let (_, v_total) = problem.logits.dim();
        let v = problem.options.vocab_size.unwrap_or(v_total).min(v_total);
        let mask = problem
            .sampling_mask
            .map(|m| m.index_axis_move(ndarray::Axis(0), row));
        // The softcap, then a temperature materialised in the logits'
        // dtype, as the oracle takes them (`oracle::row::prepare`): careful
        // code computes an accumulation-dtype softcap in `accumulation`.
        let dtype = logits_in.map_or(problem.logits.dtype(), |(d, _)| d);
        let c = problem
            .options
            .effective_softcap(accumulation)
            .ok()
            .flatten();
        let softcap_acc = c.filter(|_| problem.options.softcap_dtype == SoftcapDtype::Accumulation);
        let softcap_input = c.filter(|_| problem.options.softcap_dtype == SoftcapDtype::Input);
        let t_input = problem.options.temperature_dtype == TemperatureDtype::Input;
        let transform = |j: usize, x: f64| {
            let r = |v: f64| accumulation.round_f64(v);
            let x = match logits_in {
                None => x,
                Some((d, None)) => d.round_f64(x),
                Some((d, Some(b))) => d.round_f64(d.round_f64(x - b[j]) + b[j]),
            };
            let x = match (softcap_acc, softcap_input) {
                (Some(c), _) => r(c * r(r(x / c).tanh())),
                (_, Some(c)) => dtype.softcapped_input(x, c),
                _ => x,
            };
            if t_input {
                dtype.scaled_input(x, problem.options.temperature)
            } else {
                x
            }
        };
        let transformed = c.is_some() || t_input || logits_in.is_some();
        let fill = |mask: Option<ndarray::ArrayView1<'_, bool>>| {
            let mut out = crate::scratch::take();
            match problem.logits {
                Logits::F64(a) => fill_row(a.row(row), v, &mut out),
                Logits::F32(a) => fill_row(a.row(row), v, &mut out),
                Logits::Bf16(a) => fill_row(a.row(row), v, &mut out),
                Logits::F16(a) => fill_row(a.row(row), v, &mut out),
            }
            if transformed {
                for (j, x) in out.iter_mut().enumerate() {
                    *x = transform(j, *x);
                }
            }
            if let Some(m) = mask {
                for (x, &ok) in out.iter_mut().zip(m.iter()) {
                    if !ok {
                        *x = f64::NEG_INFINITY;
                    }
                }
            }
            out
        };
        let masked = fill(mask);
        let loss = loss_row(problem, row, accumulation, &masked);
        let entropy_logits = match problem.options.entropy {
            _ if problem.sampling_mask.is_none() => Vec::new(),
            Some(EntropyLogits::Masked) => Vec::new(),
            _ => fill(None),
        };
        CarefulRow {
            masked,
            entropy_logits,
            temperature: if t_input {
                1.0
            } else {
                problem.options.temperature
            },
            // An accumulation-dtype softcap leaves values of `accumulation`,
            // not of the logits' dtype (the 16-bit caches' keys).
            logits_dtype: if softcap_acc.is_some() {
                accumulation
            } else {
                dtype
            },
            plan: Plan {
                dtype: accumulation,
                sub_first: form == Shift::SubtractThenScale,
                leaf: order.summation(v).leaf,
            },
            raw: match form {
                Shift::Any => Some(false),
                Shift::Raw => Some(true),
                _ => None,
            },
            policy: (!problem.policy.is_empty()).then(|| PolicyRow {
                clamps: problem
                    .options
                    .policy_clamps
                    .effective(accumulation)
                    .unwrap_or_default(),
                ..PolicyRow::of(problem, row)
            }),
            z_loss_coef: problem
                .options
                .effective_z_loss_coef(accumulation)
                .ok()
                .flatten(),
            loss,
            teacher: problem.teacher_probs.map(|t| {
                let t = t.row(row);
                (
                    t.iter().take(v).copied().collect(),
                    problem.options.teacher_form,
                )
            }),
            topk_kl: problem
                .options
                .topk_kl
                .zip(problem.teacher_topk_log_probs)
                .map(|(kl, a)| (kl.renormalized, a.row(row).to_vec())),
            log_softmax: None,
            entropy: None,
        }
    }

    /// Careful code's values of column `col` of `output`, rounded to
    /// `dtype`: the log-softmax at the target or top-k id in each form the
    /// declaration allows (two values under `any`: shifted and raw), the
    /// policy terms, the per-row cross-entropy and the top-k KLs from each
    /// of them, the entropy, the soft cross-entropy, `lse`, `z_loss`;
    /// `None` for the outputs the rule does not cover or a missing target,
    /// policy input or teacher.
    pub fn values(
        &mut self,
        output: Output,
        col: usize,
        targets: &RowTargets,
        dtype: Dtype,
    ) -> Option<[f64; 2]> {
        let (id, term) = match output.family() {
            Family::LogSoftmax(RowStat::LogProb) => (targets.token?, None),
            Family::TopK => (*targets.topk_ids.get(col)?, None),
            Family::Policy(term) => (targets.token?, Some(term)),
            Family::LogSoftmax(RowStat::Entropy) => {
                let h = dtype.round_f64(self.entropy());
                return Some([h, h]);
            }
            Family::Loss(LossTerm::Lse) => {
                let v = dtype.round_f64(self.naive().lse());
                return Some([v, v]);
            }
            Family::Loss(LossTerm::ZLoss) => {
                let lse = self.naive().lse();
                let r = |x: f64| self.plan.dtype.round_f64(x);
                let v = dtype.round_f64(r(r(self.z_loss_coef? * lse) * lse));
                return Some([v, v]);
            }
            Family::Loss(LossTerm::CrossEntropy) => {
                let l = self.loss?;
                if !l.target || l.weight == 0.0 {
                    return Some([0.0, 0.0]);
                }
                (targets.token?, None)
            }
            Family::TopkKl(direction) => {
                let (renormalized, teacher) = self.topk_kl.clone()?;
                let nv = self.naive();
                let mut values = [[0.0; 2]; 2];
                for (f, raw) in [false, true].into_iter().enumerate() {
                    let lp: Vec<f64> = targets
                        .topk_ids
                        .iter()
                        .map(|&id| {
                            let x = self.masked.get(id).copied().unwrap_or(f64::NAN);
                            match (self.raw, raw) {
                                (Some(true), _) | (Some(false), true) => nv.lp_raw(x),
                                _ => nv.lp(x),
                            }
                        })
                        .collect();
                    let (fw, rv) = topk_kl(&lp, &teacher, renormalized, self.plan.dtype);
                    values[f] = [fw, rv];
                }
                let k = match direction {
                    KlDirection::Forward => 0,
                    KlDirection::Reverse => 1,
                };
                return Some([values[0][k], values[1][k]].map(|v| dtype.round_f64(v)));
            }
            Family::Loss(LossTerm::SoftCrossEntropy) => {
                let (teacher, form) = self.teacher.take()?;
                let h = self
                    .naive()
                    .soft_cross_entropy(&self.masked, &teacher, form);
                self.teacher = Some((teacher, form));
                let h = dtype.round_f64(h);
                return Some([h, h]);
            }
            // Gradients, and the family's counts (exact by (T26)).
            Family::Gradient | Family::LogSoftmax(_) => return None,
        };
        let x = *self.masked.get(id)?;
        let nv = self.naive();
        let (shifted, raw) = (nv.lp(x), nv.lp_raw(x));
        let lps = match self.raw {
            None => [shifted, shifted],
            Some(false) => [shifted, raw],
            Some(true) => [raw, raw],
        };
        let r = |v: f64| dtype.round_f64(v);
        if output.family() == Family::Loss(LossTerm::CrossEntropy) {
            let l = self.loss?;
            let sum = if l.eps > 0.0 && !l.neg_inf {
                self.naive().sum_lp(&self.masked)
            } else {
                0.0
            };
            return Some(lps.map(|lp| r(self.cross_entropy(&l, lp, sum))));
        }
        let Some(term) = term else {
            return Some(lps.map(r));
        };
        let row = self.policy.as_ref()?;
        let [a, b] = lps.map(|lp| policy_term(term, lp, row, self.plan.dtype));
        Some([r(a?), r(b?)])
    }

    /// The floor of careful code's error on `output` at this row,
    /// TOLERANCE.md (R2): what one ulp of the normaliser `S` implies (any
    /// implementation rounds `S` or `ln S` in the accumulation dtype:
    /// `ulp(S) / S` on a log-prob, `lse`, the per-row loss, the entropy
    /// and the soft cross-entropy, `2 coef |lse|` times it on `z_loss`),
    /// and for an output computed from a log-prob `lp` (the policy terms,
    /// the top-k KLs) `|dv / dlp|` times the larger of that and
    /// `ulp(lp)` (summed over the ids for the KLs). A correct kernel's
    /// errors are of that size on every row, while careful code's may
    /// happen to be smaller on the row where the output errs most. 0 for
    /// the outputs the rule does not cover.
    pub fn floor(&mut self, output: Output, targets: &RowTargets) -> f64 {
        let acc = self.plan.dtype;
        let norm = self.naive().norm_ulp();
        let ulp = |lp: f64| {
            if lp.is_finite() {
                acc.ulp(lp).max(norm)
            } else {
                0.0
            }
        };
        match output.family() {
            Family::LogSoftmax(RowStat::LogProb | RowStat::Entropy)
            | Family::TopK
            | Family::Loss(LossTerm::Lse | LossTerm::CrossEntropy | LossTerm::SoftCrossEntropy) => {
                norm
            }
            Family::Loss(LossTerm::ZLoss) => {
                let lse = self.naive().lse();
                let f = 2.0 * self.z_loss_coef.unwrap_or(0.0) * lse.abs() * norm;
                if f.is_finite() {
                    f
                } else {
                    0.0
                }
            }
            Family::Policy(term) => {
                let (Some(t), Some(row)) = (targets.token, self.policy) else {
                    return 0.0;
                };
                let Some(&x) = self.masked.get(t) else {
                    return 0.0;
                };
                let lp = self.naive().lp(x);
                let Some(input) = row.input(term) else {
                    return 0.0;
                };
                let d = lp - input;
                let clamp = |c: Option<f64>| c.map_or(d, |c| d.clamp(-c, c));
                let slope = match term {
                    PolicyTerm::K1 | PolicyTerm::Abs => 1.0,
                    PolicyTerm::K2 => d.abs(),
                    PolicyTerm::K3 => (-clamp(row.clamps.kl_input)).exp_m1().abs(),
                    PolicyTerm::Ratio => clamp(row.clamps.ratio_log).exp(),
                };
                let f = slope * ulp(lp);
                if f.is_finite() {
                    f
                } else {
                    0.0
                }
            }
            Family::TopkKl(direction) => {
                let Some((_, teacher)) = self.topk_kl.clone() else {
                    return 0.0;
                };
                let nv = self.naive();
                let f: f64 = targets
                    .topk_ids
                    .iter()
                    .zip(&teacher)
                    .map(|(&id, &a)| {
                        let lp = self.masked.get(id).map_or(f64::NAN, |&x| nv.lp(x));
                        let slope = match direction {
                            KlDirection::Forward => a.exp(),
                            KlDirection::Reverse => lp.exp() * (lp - a + 1.0).abs(),
                        };
                        slope * ulp(lp)
                    })
                    .filter(|f| f.is_finite())
                    .sum();
                f
            }
            Family::Gradient | Family::LogSoftmax(_) => 0.0,
        }
    }

    /// Careful code's term `w l` of this row's cross-entropy in the
    /// accumulation dtype, in each form the declaration allows, and its
    /// floor ([`CarefulRow::floor`]): a reduced loss's part from this row
    /// (TOLERANCE.md (R5), [`careful_reduced_loss`]); zeros on a row that
    /// is not counted (ignored token or weight 0); `None` without a
    /// cross-entropy.
    pub fn loss_term(&mut self, targets: &RowTargets) -> Option<CarefulLossRow> {
        let l = self.loss?;
        if !l.target || l.weight == 0.0 {
            return Some(CarefulLossRow {
                terms: [0.0; 2],
                floor: 0.0,
            });
        }
        let terms = self.values(Output::Loss, 0, targets, self.plan.dtype)?;
        let floor = self.floor(Output::Loss, targets);
        Some(CarefulLossRow { terms, floor })
    }

    /// Careful code's `w l` at the target's log-prob `lp`, `sum` the
    /// label-smoothing sum ([`Naive::sum_lp`]): `l = r(r((1 - eps) (-lp)) +
    /// r(eps r(-r(sum / |A|))))` (`-lp` alone for `eps = 0`), then times
    /// the weight in the accumulation dtype.
    fn cross_entropy(&self, l: &LossRow, lp: f64, sum: f64) -> f64 {
        let r = |x: f64| self.plan.dtype.round_f64(x);
        let nll = -lp;
        let loss = if l.eps == 0.0 {
            nll
        } else if l.neg_inf {
            f64::INFINITY
        } else {
            let mean = -r(sum / l.count as f64);
            r(r((1.0 - l.eps) * nll) + r(l.eps * mean))
        };
        if l.weight == 1.0 {
            loss
        } else {
            r(r(l.weight) * loss)
        }
    }

    /// (S2a) Careful code's own error in `ln S` on this row (nats): its
    /// `r(ln S^)`, summed in the plan's order, against `ln_s`, the oracle's
    /// enclosure of the exact `ln S` in the same coordinates (the shift by
    /// the row's max). The statistical threshold floors its vocabulary sums
    /// at it ([`super::Statistical::with_careful_error`]): a lane whose
    /// partial sum dwarfs its terms stagnates, a bias the `sqrt(n)` model
    /// does not hold, and careful code measures it on the row. `inf` when
    /// careful code's normaliser is not finite.
    pub fn ln_s_error(&mut self, ln_s: Interval) -> f64 {
        let nv = self.naive();
        let err = |l: f64| (l - ln_s.lo).abs().max((l - ln_s.hi).abs());
        // The larger of its two orders' errors (the second NaN where not
        // computed: `max` ignores it; a NaN first stays NaN).
        let e = match err(nv.l) {
            e if e.is_nan() => e,
            e => e.max(err(nv.l_lanes)),
        };
        if e.is_nan() {
            f64::INFINITY
        } else {
            e * (1.0 + 4.0 * f64::EPSILON)
        }
    }

    /// (S2b) Careful code's own error in the entropy on this row (nats),
    /// against `h`, the oracle's enclosure of the exact entropy (`ln S_w +
    /// R` of the row's entropy family). The statistical threshold floors
    /// the entropy family's sums at it
    /// ([`super::Statistical::with_careful_entropy_error`]): terms of equal
    /// value (a bf16 row has few distinct logits) round alike, so their
    /// sum stagnates with one sign. `inf` when careful code's entropy is
    /// not finite.
    pub fn entropy_error(&mut self, h: Interval) -> f64 {
        let c = self.entropy();
        let e = (c - h.lo).abs().max((c - h.hi).abs());
        if e.is_nan() {
            f64::INFINITY
        } else {
            e * (1.0 + 4.0 * f64::EPSILON)
        }
    }

    fn naive(&mut self) -> Naive {
        match self.log_softmax {
            Some(nv) => nv,
            None => {
                let nv = Naive::new(&self.masked, self.temperature, self.plan, self.logits_dtype);
                self.log_softmax = Some(nv);
                nv
            }
        }
    }

    fn entropy(&mut self) -> f64 {
        if let Some(h) = self.entropy {
            return h;
        }
        let h = if self.entropy_logits.is_empty() {
            // The same logits as the log-softmax: reuse its row values.
            let nv = self.naive();
            nv.entropy(&self.masked)
        } else {
            Naive::new(
                &self.entropy_logits,
                self.temperature,
                self.plan,
                self.logits_dtype,
            )
            .entropy(&self.entropy_logits)
        };
        self.entropy = Some(h);
        h
    }
}

/// Accumulates the relative rule over a tensor of one output.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RelativeRule {
    /// Max candidate error seen (far end of the enclosure).
    pub candidate_error: f64,
    /// Max error of careful code seen (the largest over its forms).
    pub careful_error: f64,
    /// Max over the elements seen of half an ulp of the output's dtype at
    /// the (finite) exact value and the element's floor.
    pub floor: f64,
}

impl RelativeRule {
    /// An empty accumulator.
    pub fn new() -> RelativeRule {
        RelativeRule::default()
    }

    /// Records one element: its exact value, the candidate and careful
    /// code's values ([`CarefulRow::values`]), all in `dtype`, and the
    /// element's floor ([`CarefulRow::floor`]).
    pub fn observe(
        &mut self,
        exact: &Exact,
        candidate: f64,
        careful: &[f64],
        floor: f64,
        dtype: Dtype,
    ) {
        let err = |v: f64| {
            if v.is_infinite() && v == exact.rounded {
                0.0
            } else {
                exact.error(v)
            }
        };
        let mid = 0.5 * (exact.enclosure.lo + exact.enclosure.hi);
        self.candidate_error = max_nan(self.candidate_error, err(candidate));
        for &c in careful {
            self.careful_error = max_nan(self.careful_error, err(c));
        }
        if mid.is_finite() {
            self.floor = self.floor.max(0.5 * dtype.ulp(mid));
        }
        self.floor = self.floor.max(floor);
    }

    /// Both tensors' elements together.
    pub fn merge(self, other: RelativeRule) -> RelativeRule {
        RelativeRule {
            candidate_error: max_nan(self.candidate_error, other.candidate_error),
            careful_error: max_nan(self.careful_error, other.careful_error),
            floor: self.floor.max(other.floor),
        }
    }

    /// `max candidate error / max(max careful error, max floor)`; 0 for
    /// an empty tensor or no error, `inf` for a NaN error.
    pub fn ratio(&self) -> f64 {
        let reference = self.careful_error.max(self.floor);
        if self.candidate_error.is_nan() {
            f64::INFINITY
        } else if self.candidate_error == 0.0 {
            0.0
        } else if reference > 0.0 {
            self.candidate_error / reference
        } else {
            f64::INFINITY
        }
    }

    /// Whether the rule fires: the ratio exceeds [`RELATIVE_R`].
    pub fn fires(&self) -> bool {
        self.ratio() > RELATIVE_R
    }
}

/// The larger, NaN if either is.
fn max_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}
