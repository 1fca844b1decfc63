//! Bugs of the backward pass alone: row 0's cotangents broadcast, and an
//! in-place backward that overwrites rows before validating them all.
//! Both wrap [`CpuKernel::fused`].

use ndarray::{s, Array2};

use logprobe_kernels::kernel::{Kernel, KernelError};
use logprobe_reference::spec::{Cotangents, Dtype, LogitsMut, Output, Problem, ProblemMut};

use super::rewired::broadcast_row0;
use super::{PlantedBug, FUSED};

/// Backward uses `grad_output[0]` for every row.
pub struct GradOutput0Broadcast;

impl GradOutput0Broadcast {
    /// Catalog name.
    pub const NAME: &'static str = "grad-output-0-broadcast";

    /// The bug around [`CpuKernel::fused`](logprobe_kernels::CpuKernel::fused) (`chunk_size` ignored).
    pub fn new(_chunk_size: usize) -> GradOutput0Broadcast {
        GradOutput0Broadcast
    }
}

impl PlantedBug for GradOutput0Broadcast {
    fn inner(&self) -> &dyn Kernel {
        &FUSED
    }

    fn backward(
        &self,
        problem: &Problem<'_>,
        cotangents: &Cotangents<'_>,
        out: Dtype,
    ) -> Result<Array2<f64>, KernelError> {
        let (g, h, gk) = broadcast_row0(cotangents);
        let shape = problem.validate_shapes()?;
        // Shapes and finiteness are checked on the real cotangents first.
        problem.validate_cotangents(&shape, cotangents)?;
        let c = Cotangents::default()
            .with_column(Output::LogProbs, g.as_ref().map(|a| a.view()))
            .with_column(Output::Entropy, h.as_ref().map(|a| a.view()))
            .with(Output::TopkLogProbs, gk.as_ref().map(|a| a.view()));
        FUSED.backward(problem, &c, out)
    }

    fn backward_in_place(
        &self,
        problem: ProblemMut<'_>,
        cotangents: &Cotangents<'_>,
    ) -> Result<(), KernelError> {
        let (g, h, gk) = broadcast_row0(cotangents);
        let c = Cotangents::default()
            .with_column(Output::LogProbs, g.as_ref().map(|a| a.view()))
            .with_column(Output::Entropy, h.as_ref().map(|a| a.view()))
            .with(Output::TopkLogProbs, gk.as_ref().map(|a| a.view()));
        FUSED.backward_in_place(problem, &c)
    }
}

/// In-place backward that leaves the logits half overwritten on error:
/// rows are validated and overwritten one at a time, so an error on row
/// `r` leaves rows `< r` already overwritten (the trait promises unchanged
/// logits on error). Forward and new-buffer backward are [`CpuKernel::fused`](logprobe_kernels::CpuKernel::fused)'s.
pub struct InPlaceCorruption;

impl InPlaceCorruption {
    /// Catalog name.
    pub const NAME: &'static str = "in-place-corruption";

    /// The bug around [`CpuKernel::fused`](logprobe_kernels::CpuKernel::fused) (`chunk_size` ignored).
    pub fn new(_chunk_size: usize) -> InPlaceCorruption {
        InPlaceCorruption
    }
}

impl PlantedBug for InPlaceCorruption {
    fn inner(&self) -> &dyn Kernel {
        &FUSED
    }

    fn backward_in_place(
        &self,
        mut problem: ProblemMut<'_>,
        cot: &Cotangents<'_>,
    ) -> Result<(), KernelError> {
        let shape = {
            let p = problem.view();
            let shape = p.validate_shapes()?;
            p.validate_cotangents(&shape, cot)?;
            shape
        };
        for row in 0..shape.n {
            let r = row..row + 1;
            let reduction = problem
                .options
                .loss
                .map_or(logprobe_reference::spec::Reduction::None, |l| l.reduction);
            let c = cot.slice_rows(r.clone(), reduction);
            let logits = match &mut problem.logits {
                LogitsMut::F64(a) => LogitsMut::F64(a.slice_mut(s![r.clone(), ..])),
                LogitsMut::F32(a) => LogitsMut::F32(a.slice_mut(s![r.clone(), ..])),
                LogitsMut::Bf16(a) => LogitsMut::Bf16(a.slice_mut(s![r.clone(), ..])),
                LogitsMut::F16(a) => LogitsMut::F16(a.slice_mut(s![r.clone(), ..])),
            };
            let sub = ProblemMut {
                logits,
                tokens: problem.tokens.map(|t| t.slice_move(s![r.clone()])),
                sampling_mask: problem
                    .sampling_mask
                    .map(|m| m.slice_move(s![r.clone(), ..])),
                topk_ids: problem.topk_ids.map(|k| k.slice_move(s![r.clone(), ..])),
                policy: problem.policy.slice_rows(r.clone()),
                teacher_topk_log_probs: problem
                    .teacher_topk_log_probs
                    .map(|k| k.slice_move(s![r.clone(), ..])),
                teacher_probs: problem
                    .teacher_probs
                    .map(|k| k.slice_move(s![r.clone(), ..])),
                options: problem.options,
                loss_weights: problem.loss_weights.map(|w| w.slice_move(s![r.clone()])),
            };
            FUSED.backward_in_place(sub, &c)?;
        }
        Ok(())
    }
}
