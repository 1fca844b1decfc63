//! Bugs of the backward pass alone: row 0's cotangents broadcast, and an
//! in-place backward that overwrites rows before validating them all.
//! Both wrap [`Fused`].

use ndarray::{s, Array2};

use logprobe_kernels::kernel::{Kernel, KernelError};
use logprobe_kernels::Fused;
use logprobe_reference::spec::{Cotangents, Dtype, LogitsMut, Problem};

use super::rewired::broadcast_row0;
use super::{InPlaceArgs, PlantedBug};

/// Backward uses `grad_output[0]` for every row.
pub struct GradOutput0Broadcast;

impl GradOutput0Broadcast {
    /// Catalog name.
    pub const NAME: &'static str = "grad-output-0-broadcast";

    /// The bug around [`Fused`] (`chunk_size` ignored).
    pub fn new(_chunk_size: usize) -> GradOutput0Broadcast {
        GradOutput0Broadcast
    }
}

impl PlantedBug for GradOutput0Broadcast {
    fn inner(&self) -> &dyn Kernel {
        &Fused
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
        let c = Cotangents {
            grad_log_probs: g.as_ref().map(|a| a.view()),
            grad_entropy: h.as_ref().map(|a| a.view()),
            grad_topk_log_probs: gk.as_ref().map(|a| a.view()),
        };
        Fused.backward(problem, &c, out)
    }

    fn backward_in_place(
        &self,
        logits: LogitsMut<'_>,
        args: InPlaceArgs<'_, '_>,
    ) -> Result<(), KernelError> {
        let (g, h, gk) = broadcast_row0(args.cotangents);
        let c = Cotangents {
            grad_log_probs: g.as_ref().map(|a| a.view()),
            grad_entropy: h.as_ref().map(|a| a.view()),
            grad_topk_log_probs: gk.as_ref().map(|a| a.view()),
        };
        args.run(&Fused, logits, None, Some(&c))
    }
}

/// In-place backward that leaves the logits half overwritten on error:
/// rows are validated and overwritten one at a time, so an error on row
/// `r` leaves rows `< r` already overwritten (the trait promises unchanged
/// logits on error). Forward and new-buffer backward are [`Fused`]'s.
pub struct InPlaceCorruption;

impl InPlaceCorruption {
    /// Catalog name.
    pub const NAME: &'static str = "in-place-corruption";

    /// The bug around [`Fused`] (`chunk_size` ignored).
    pub fn new(_chunk_size: usize) -> InPlaceCorruption {
        InPlaceCorruption
    }
}

impl PlantedBug for InPlaceCorruption {
    fn inner(&self) -> &dyn Kernel {
        &Fused
    }

    fn backward_in_place(
        &self,
        mut logits: LogitsMut<'_>,
        args: InPlaceArgs<'_, '_>,
    ) -> Result<(), KernelError> {
        let shape = {
            let p = args.problem(&logits);
            let shape = p.validate_shapes()?;
            p.validate_cotangents(&shape, args.cotangents)?;
            shape
        };
        let cot = args.cotangents;
        for row in 0..shape.n {
            let r = row..row + 1;
            let sub = |l: LogitsMut<'_>| -> Result<(), KernelError> {
                let c = Cotangents {
                    grad_log_probs: cot.grad_log_probs.map(|g| g.slice_move(s![r.clone()])),
                    grad_entropy: cot.grad_entropy.map(|g| g.slice_move(s![r.clone()])),
                    grad_topk_log_probs: cot
                        .grad_topk_log_probs
                        .map(|g| g.slice_move(s![r.clone(), ..])),
                };
                Fused.backward_in_place(
                    l,
                    args.tokens.map(|t| t.slice_move(s![r.clone()])),
                    args.sampling_mask.map(|m| m.slice_move(s![r.clone(), ..])),
                    args.topk_ids.map(|k| k.slice_move(s![r.clone(), ..])),
                    args.options,
                    &c,
                )
            };
            match &mut logits {
                LogitsMut::F64(a) => sub(LogitsMut::F64(a.slice_mut(s![r.clone(), ..])))?,
                LogitsMut::F32(a) => sub(LogitsMut::F32(a.slice_mut(s![r.clone(), ..])))?,
                LogitsMut::Bf16(a) => sub(LogitsMut::Bf16(a.slice_mut(s![r.clone(), ..])))?,
                LogitsMut::F16(a) => sub(LogitsMut::F16(a.slice_mut(s![r.clone(), ..])))?,
            }
        }
        Ok(())
    }
}
