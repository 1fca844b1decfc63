//! Bugs of the soft-target cross-entropy (issue 47). The forward: `-(p *
//! log_softmax(z)).sum(-1)` without masking the entries the student cannot
//! reach, so a zero teacher probability times a `-inf` log-prob (a masked
//! entry, or a `-inf` logit without a softcap) is `0 * -inf = NaN` and the
//! row's value is NaN. torchtune's `ForwardKLLoss` masks exactly these
//! (`inf_mask`); code that copies its formula without the mask has this bug.
//! The backward: `c (q_j - p_j)`, the teacher's mass taken as 1.

use ndarray::{Array1, Array2};

use logprobe_kernels::kernel::{ForwardOutput, Kernel, KernelError};
use logprobe_reference::spec::{Cotangents, Dtype, Output, Problem, Shape};

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
            let form = problem.options.teacher_form;
            if (0..shape.vocab_size).any(|j| form.is_zero(p[[row, j]]) && unreachable(j)) {
                h[[row, 0]] = f64::NAN;
            }
        }
    }
}

/// The soft cross-entropy's gradient taken as `c (q_j - p_j)`, as if the
/// teacher's mass `sum_j p_j` were 1 (the textbook form, wrong for a
/// truncated or masked teacher): the wrapped kernel given one more `lse`
/// cotangent `c (1 - sum_j p_j)` (`d lse / dz_j = q_j`), so the problem
/// computes `lse` for it. Trigger: a nonzero `grad_soft_cross_entropy` on a
/// row whose teacher's mass is not 1.
pub struct SoftCeGradUnitMass;

impl SoftCeGradUnitMass {
    /// Catalog name.
    pub const NAME: &'static str = "soft-ce-grad-unit-mass";

    /// The bug around [`CpuKernel::fused`](logprobe_kernels::CpuKernel::fused) (`chunk_size` ignored).
    pub fn new(_chunk_size: usize) -> SoftCeGradUnitMass {
        SoftCeGradUnitMass
    }
}

impl PlantedBug for SoftCeGradUnitMass {
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
        let (Some(c), Some(p)) = (
            cotangents.column(Output::SoftCrossEntropy),
            problem.teacher_probs,
        ) else {
            return Ok(correct);
        };
        let v = problem.validate_shapes()?.vocab_size;
        let lse = Array1::from_shape_fn(c.len(), |row| {
            let form = problem.options.teacher_form;
            let mass: f64 = p.row(row).iter().take(v).map(|&x| form.prob_f64(x)).sum();
            let given = cotangents.column(Output::Lse).map_or(0.0, |a| a[row]);
            given + c[row] * (1.0 - mass)
        });
        let mut wrong = *problem;
        wrong.options.lse = true;
        FUSED.backward(
            &wrong,
            &cotangents.with_column(Output::Lse, lse.view()),
            out,
        )
    }
}
