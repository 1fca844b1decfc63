//! Bugs of top-k distillation KL kernels (issue 18): the teacher's
//! probabilities taken as its log-probs, the renormalisation skipped, the
//! student's log-probs gathered at a shard's local ids. Each changes only
//! the `forward_kl` / `reverse_kl` values (or the options they are
//! computed with); every other output, the backward and the memory are the
//! wrapped kernel's. One more is a backward bug: the KL's gradient with
//! log_softmax's normaliser detached ([`KlGradNormalizerDetached`]).

use ndarray::{Array1, Array2};

use logprobe_kernels::kernel::{ForwardOutput, Kernel, KernelError};
use logprobe_kernels::topk_kl_slopes;
use logprobe_reference::spec::{
    Cotangents, Dtype, Logits, Options, Output, Problem, Shape, TopkKl,
};

use super::{PlantedBug, FUSED};

/// `forward_kl = sum_k a_k (a_k - log p_k)`: the teacher's log-prob `a_k`
/// used as its probability where `e^{a_k}` belongs (the bug kind:
/// `teacher_logprobs * (teacher_logprobs - student_logprobs)`). `-inf`
/// teacher entries are skipped; the sum is in f64 over the wrapped
/// kernel's accumulation-dtype log-probs, rounded once to the output dtype.
/// Triggered on every row with a finite, nonzero `a_k`.
pub struct TeacherProbAsLogProb;

impl TeacherProbAsLogProb {
    /// Catalog name.
    pub const NAME: &'static str = "kl-teacher-prob-as-log-prob";

    /// The bug around [`logprobe_kernels::CpuKernel::fused`] (`chunk_size`
    /// ignored).
    pub fn new(_chunk_size: usize) -> TeacherProbAsLogProb {
        TeacherProbAsLogProb
    }
}

impl PlantedBug for TeacherProbAsLogProb {
    fn inner(&self) -> &dyn Kernel {
        &FUSED
    }

    fn corrupt_forward(&self, p: &Problem<'_>, _: &Shape, out: Dtype, fo: &mut ForwardOutput) {
        let (Some(kl), Some(a)) = (p.options.topk_kl, p.teacher_topk_log_probs) else {
            return;
        };
        if !kl.forward {
            return;
        }
        // The student's top-k log-probs as the kernel holds them (in its
        // accumulation dtype), renormalised as the call asks.
        let acc = p.logits.dtype().accumulation();
        let Ok(full) = FUSED.forward(p, acc) else {
            return;
        };
        let Some(lp) = full.values.get(Output::TopkLogProbs) else {
            return;
        };
        let Some(fk) = fo.values.get_mut(Output::ForwardKl) else {
            return;
        };
        for r in 0..lp.nrows() {
            let l: Vec<f64> = lp.row(r).to_vec();
            let l = if kl.renormalized { renormalized(&l) } else { l };
            let s: f64 = l
                .iter()
                .zip(a.row(r))
                .filter(|(_, &ak)| ak > f64::NEG_INFINITY)
                .map(|(&lk, &ak)| ak * (ak - lk))
                .sum();
            fk[[r, 0]] = out.round_f64(acc.round_f64(s));
        }
    }
}

/// `l_k - ln sum_j e^{l_j}` in f64 (the mutant's own arithmetic).
fn renormalized(l: &[f64]) -> Vec<f64> {
    let m = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let s: f64 = l.iter().map(|&x| (x - m).exp()).sum();
    let ln = m + s.ln();
    l.iter().map(|&x| x - ln).collect()
}

/// `kl_renormalized = true` ignored: the student's log-probs are used over
/// the whole vocabulary's normaliser. Triggered by every renormalised call
/// whose ids do not hold all of the student's mass.
pub struct KlRenormalizationSkipped;

impl KlRenormalizationSkipped {
    /// Catalog name.
    pub const NAME: &'static str = "kl-renormalization-skipped";

    /// The bug around [`logprobe_kernels::CpuKernel::fused`] (`chunk_size`
    /// ignored).
    pub fn new(_chunk_size: usize) -> KlRenormalizationSkipped {
        KlRenormalizationSkipped
    }
}

impl PlantedBug for KlRenormalizationSkipped {
    fn inner(&self) -> &dyn Kernel {
        &FUSED
    }

    fn wrong_options(&self, p: &Problem<'_>) -> Option<Options> {
        let kl = p.options.topk_kl.filter(|k| k.renormalized)?;
        Some(Options {
            topk_kl: Some(TopkKl {
                renormalized: false,
                ..kl
            }),
            ..p.options
        })
    }
}

/// A tensor-parallel (or vocabulary-chunked) gather offset bug in the KL:
/// with the vocabulary split in two halves, a top-k id owned by the second
/// half is looked up at its local index (`id - V/2`, the shard's offset
/// not added back), so `forward_kl` / `reverse_kl` use the student's
/// log-prob of another token. Triggered on rows with an id `>= V/2` (whose
/// shifted ids still form a valid top-k set; other rows are correct).
pub struct KlIdsShardLocal;

impl KlIdsShardLocal {
    /// Catalog name.
    pub const NAME: &'static str = "kl-ids-shard-local";

    /// The bug around [`logprobe_kernels::CpuKernel::fused`] (`chunk_size`
    /// ignored).
    pub fn new(_chunk_size: usize) -> KlIdsShardLocal {
        KlIdsShardLocal
    }
}

impl PlantedBug for KlIdsShardLocal {
    fn inner(&self) -> &dyn Kernel {
        &FUSED
    }

    fn corrupt_forward(&self, p: &Problem<'_>, shape: &Shape, out: Dtype, fo: &mut ForwardOutput) {
        let (Some(kl), Some(ids)) = (p.options.topk_kl, p.topk_ids) else {
            return;
        };
        let half = shape.vocab_size / 2;
        if half == 0 {
            return;
        }
        let local: Array2<i64> = ids.mapv(|id| {
            if id as usize >= half {
                id - half as i64
            } else {
                id
            }
        });
        for r in 0..ids.nrows() {
            if !ids.row(r).iter().any(|&id| id as usize >= half) {
                continue;
            }
            // The row alone, at its local ids (skipped if they repeat or
            // are masked: the bug's kernel would be refused there).
            let rows = ndarray::s![r..r + 1, ..];
            // Views reborrowed for this body (`Logits` keeps one lifetime).
            let lg = p.logits.slice_rows(r..r + 1);
            let q = Problem {
                logits: match &lg {
                    Logits::F64(a) => Logits::F64(a.view()),
                    Logits::F32(a) => Logits::F32(a.view()),
                    Logits::Bf16(a) => Logits::Bf16(a.view()),
                    Logits::F16(a) => Logits::F16(a.view()),
                },
                tokens: p.tokens.map(|t| t.slice_move(ndarray::s![r..r + 1])),
                sampling_mask: p.sampling_mask.map(|m| m.slice_move(rows)),
                topk_ids: Some(local.slice(rows)),
                teacher_topk_log_probs: p.teacher_topk_log_probs.map(|a| a.slice_move(rows)),
                teacher_probs: p.teacher_probs.map(|a| a.slice_move(rows)),
                loss_weights: p.loss_weights.map(|w| w.slice_move(ndarray::s![r..r + 1])),
                policy: p.policy.slice_rows(r..r + 1),
                options: p.options,
            };
            let Ok(bad) = FUSED.forward(&q, out) else {
                continue;
            };
            for (o, want) in [
                (Output::ForwardKl, kl.forward),
                (Output::ReverseKl, kl.reverse),
            ] {
                if let (true, Some(dst), Some(src)) =
                    (want, fo.values.get_mut(o), bad.values.get(o))
                {
                    dst[[r, 0]] = src[[0, 0]];
                }
            }
        }
    }
}

/// The top-k KL's backward with the log-softmax normaliser detached: the
/// slopes `w_k` on the student's log-probs at the ids
/// ([`logprobe_kernels::topk_kl_slopes`]) added as `w_k 1[j = id_k]` only,
/// the `- p_j sum_k w_k` of log_softmax's backward lost (a hand-fused
/// backward that differentiates `z_id - lse` through `z_id` alone, as with
/// `lse.detach()`). Formed as the correct gradient plus the `lse`
/// gradient of the cotangent `sum_k w_k` (`d lse / d z_j = p_j`, through
/// the temperature and softcap as the correct term), rounded to the output
/// dtype. Triggered by a nonzero `grad_forward_kl` / `grad_reverse_kl`
/// on a row of a KL that is not renormalised (renormalised, `sum_k w_k = 0`
/// and the normaliser cancels).
pub struct KlGradNormalizerDetached;

impl KlGradNormalizerDetached {
    /// Catalog name.
    pub const NAME: &'static str = "kl-grad-normalizer-detached";

    /// The bug around [`logprobe_kernels::CpuKernel::fused`] (`chunk_size`
    /// ignored).
    pub fn new(_chunk_size: usize) -> KlGradNormalizerDetached {
        KlGradNormalizerDetached
    }
}

impl PlantedBug for KlGradNormalizerDetached {
    fn inner(&self) -> &dyn Kernel {
        &FUSED
    }

    fn backward(
        &self,
        problem: &Problem<'_>,
        cotangents: &Cotangents<'_>,
        out: Dtype,
    ) -> Result<Array2<f64>, KernelError> {
        // The correct kernel's validation and typed errors first.
        let correct = FUSED.backward(problem, cotangents, out)?;
        let (Some(kl), Some(a)) = (problem.options.topk_kl, problem.teacher_topk_log_probs) else {
            return Ok(correct);
        };
        if kl.renormalized
            || (cotangents.column(Output::ForwardKl).is_none()
                && cotangents.column(Output::ReverseKl).is_none())
        {
            return Ok(correct);
        }
        // The student's top-k log-probs as the kernel holds them.
        let acc = problem.logits.dtype().accumulation();
        let mut lp_problem = *problem;
        lp_problem.options.entropy = None;
        lp_problem.options.topk_kl = None;
        lp_problem.teacher_topk_log_probs = None;
        lp_problem.policy = Default::default();
        let Ok(fo) = FUSED.forward(&lp_problem, acc) else {
            return Ok(correct);
        };
        let Some(lp) = fo.values.get(Output::TopkLogProbs) else {
            return Ok(correct);
        };
        let n = lp.nrows();
        let lost = Array1::from_shape_fn(n, |r| {
            let (gf, gr) = problem.kl_cotangents(cotangents, r);
            if gf == 0.0 && gr == 0.0 {
                return 0.0;
            }
            let l: Vec<f64> = lp.row(r).to_vec();
            let w = topk_kl_slopes(&l, &a.row(r).to_vec(), false, gf, gr);
            acc.round_f64(w.iter().sum::<f64>())
        });
        let mut lse_problem = lp_problem;
        lse_problem.options.lse = true;
        lse_problem.options.z_loss_coef = None;
        lse_problem.options.loss = None;
        lse_problem.loss_weights = None;
        lse_problem.topk_ids = None;
        let Ok(extra) = FUSED.backward(
            &lse_problem,
            &Cotangents::default().with_column(Output::Lse, lost.view()),
            Dtype::F64,
        ) else {
            return Ok(correct);
        };
        Ok((correct + extra).mapv(|x| out.round_f64(x)))
    }
}
