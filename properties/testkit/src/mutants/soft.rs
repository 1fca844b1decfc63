//! A bug of the soft-target cross-entropy (issue 47): `-(p *
//! log_softmax(z)).sum(-1)` without masking the entries the student cannot
//! reach, so a zero teacher probability times a `-inf` log-prob (a masked
//! entry, or a `-inf` logit without a softcap) is `0 * -inf = NaN` and the
//! row's value is NaN. torchtune's `ForwardKLLoss` masks exactly these
//! (`inf_mask`); code that copies its formula without the mask has this bug.

use logprobe_kernels::kernel::{ForwardOutput, Kernel};
use logprobe_reference::spec::{Dtype, Output, Problem, Shape};

use super::{PlantedBug, FUSED};

unit_bug!(
    /// `soft_cross_entropy` NaN where `0 * -inf` meets (module docs).
    SoftCeNanOnZeroProb,
    "soft-ce-nan-on-zero-prob"
);

impl PlantedBug for SoftCeNanOnZeroProb {
    fn inner(&self) -> &dyn Kernel {
        &FUSED
    }

    fn corrupt_forward(
        &self,
        problem: &Problem<'_>,
        shape: &Shape,
        _out: Dtype,
        fo: &mut ForwardOutput,
    ) {
        let (Some(p), Some(h)) = (
            problem.teacher_probs,
            fo.values.get_mut(Output::SoftCrossEntropy),
        ) else {
            return;
        };
        let capped = problem.options.softcap.is_some();
        for row in 0..shape.n {
            let logit = |j: usize| problem.logits.get_f64(row, j);
            let unreachable =
                |j: usize| !problem.allowed(row, j) || (!capped && logit(j) == f64::NEG_INFINITY);
            if (0..shape.vocab_size).any(|j| p[[row, j]] == 0.0 && unreachable(j)) {
                h[[row, 0]] = f64::NAN;
            }
        }
    }
}
