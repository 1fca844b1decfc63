//! `impl Kernel for Mutant`: the correct kernel, then the bug where it
//! is triggered; the in-place writers.

use ndarray::{s, Array2};

use logprobe_kernels::kernel::{
    Algorithm, Capabilities, EntropyForm, ForwardOutput, Kernel, KernelError,
};
use logprobe_kernels::CpuKernel;
use logprobe_reference::spec::{
    Cotangents, Dtype, LogitsMut, Output, Problem, ProblemMut, Shape, SpecError,
};

use super::*;

impl Kernel for Mutant {
    fn name(&self) -> String {
        match self.kind {
            k if k.is_chunked() => format!("mutant:{}(chunk_size={})", k.name(), self.chunk_size),
            k => format!("mutant:{}", k.name()),
        }
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn algorithm(&self, shape: &Shape) -> Algorithm {
        match self.kind {
            MutantKind::TpVocabOffset => self.tp_kernel(shape.v_total).algorithm(shape),
            _ => self.inner.algorithm(shape),
        }
    }

    /// The inner kernel's declaration (a mutant is judged by its correct
    /// twin's model).
    fn entropy_form(&self) -> Option<EntropyForm> {
        self.inner.entropy_form()
    }

    /// The inner kernel's declaration (the ignored-chunk-size mutant keeps
    /// declaring its nominal `chunk_size`: the memory property catches it).
    fn workspace_bytes(&self, shape: &Shape) -> usize {
        match self.kind {
            MutantKind::TpVocabOffset => self.tp_kernel(shape.v_total).workspace_bytes(shape),
            _ => self.inner.workspace_bytes(shape),
        }
    }

    fn forward(&self, problem: &Problem<'_>, out: Dtype) -> Result<ForwardOutput, KernelError> {
        match self.kind {
            MutantKind::TpVocabOffset => {
                let shape = problem.validate_shapes()?;
                let vp = self.tp_kernel(shape.v_total);
                let mut fo = vp.forward(problem, out)?;
                let trig = tp_triggers(problem, vp.shard_widths());
                let (Some(tokens), false) = (problem.tokens, trig.is_empty()) else {
                    return Ok(fo);
                };
                // The real kernel, run with the wrong column as the target.
                let wrong = wrong_targets(problem, tokens, &trig);
                let fw = vp.forward(&with_tokens(problem, &wrong), out)?;
                if let (Some(lp), Some(lw)) = (
                    fo.values.get_mut(Output::LogProbs),
                    fw.values.get(Output::LogProbs),
                ) {
                    for &(row, _, w) in &trig {
                        // A masked or -inf column gathers -inf.
                        lp[[row, 0]] = if gatherable(problem, row, w) {
                            lw[[row, 0]]
                        } else {
                            f64::NEG_INFINITY
                        };
                    }
                }
                Ok(fo)
            }
            MutantKind::PaddedVocabNotTruncated
            | MutantKind::TemperatureIgnored
            | MutantKind::TemperatureTwice
            | MutantKind::EntropyWrongLogits => {
                // Validate as the correct kernel would, then compute with the wrong options.
                let mut q = *problem;
                problem.validate_shapes()?;
                q.options = self.wrong_options(problem);
                if q.options.temperature != problem.options.temperature {
                    // The doubled or dropped temperature must not turn valid input into an error.
                    q.options
                        .effective_temperature(problem.logits.dtype().accumulation())?;
                }
                self.inner.forward(&q, out)
            }
            MutantKind::IgnoredChunkSize => {
                if self.chunk_size == 0 {
                    return Err(SpecError::ZeroChunkSize.into());
                }
                let n = problem.logits.dim().0;
                CpuKernel::chunked(n.max(1)).forward(problem, out)
            }
            MutantKind::ChunkDependentOrder => {
                let mut fo = self.inner.forward(problem, out)?;
                let shape = problem.validate_shapes()?;
                let rows = self.odd_chunk_rows(shape.n);
                if rows.is_empty() {
                    return Ok(fo);
                }
                let rv = Reversed::new(problem, &shape, &rows);
                let ro = self.inner.forward(&rv.problem(problem.options), out)?;
                for (i, &r) in rows.iter().enumerate() {
                    for (o, a) in fo.values.iter_mut() {
                        if let Some(b) = ro.values.get(o) {
                            a.row_mut(r).assign(&b.row(i));
                        }
                    }
                }
                Ok(fo)
            }
            _ => {
                let mut fo = self.inner.forward(problem, out)?;
                let shape = problem.validate_shapes()?;
                self.corrupt_forward(problem, &shape, out, &mut fo);
                Ok(fo)
            }
        }
    }

    fn backward(
        &self,
        problem: &Problem<'_>,
        cotangents: &Cotangents<'_>,
        out: Dtype,
    ) -> Result<Array2<f64>, KernelError> {
        match self.kind {
            MutantKind::TpVocabOffset => {
                let shape = problem.validate_shapes()?;
                let vp = self.tp_kernel(shape.v_total);
                let mut grad = vp.backward(problem, cotangents, out)?;
                let (Some(g), Some(tokens)) = (cotangents.grad_log_probs, problem.tokens) else {
                    return Ok(grad);
                };
                let trig: Vec<_> = tp_triggers(problem, vp.shard_widths())
                    .into_iter()
                    .filter(|&(row, _, _)| g[row] != 0.0)
                    .collect();
                if trig.is_empty() {
                    return Ok(grad);
                }
                let wrong = wrong_targets(problem, tokens, &trig);
                let gw = vp.backward(&with_tokens(problem, &wrong), cotangents, out)?;
                for &(row, t, w) in &trig {
                    if gatherable(problem, row, w) {
                        grad.row_mut(row).assign(&gw.row(row));
                    } else {
                        // A -inf gather is still differentiated: the one-hot
                        // term moves from the target to the wrong column.
                        let d = g[row] / shape.temperature;
                        grad[[row, t]] = out.round_f64(grad[[row, t]] - d);
                        grad[[row, w]] = out.round_f64(grad[[row, w]] + d);
                    }
                }
                Ok(grad)
            }
            MutantKind::PaddedVocabNotTruncated
            | MutantKind::TemperatureIgnored
            | MutantKind::TemperatureTwice
            | MutantKind::EntropyWrongLogits => {
                let mut q = *problem;
                problem.validate_shapes()?;
                q.options = self.wrong_options(problem);
                if q.options.temperature != problem.options.temperature {
                    q.options
                        .effective_temperature(problem.logits.dtype().accumulation())?;
                }
                self.inner.backward(&q, cotangents, out)
            }
            MutantKind::IgnoredChunkSize => {
                if self.chunk_size == 0 {
                    return Err(SpecError::ZeroChunkSize.into());
                }
                let n = problem.logits.dim().0;
                CpuKernel::chunked(n.max(1)).backward(problem, cotangents, out)
            }
            MutantKind::GradOutput0Broadcast => {
                let (g, h, gk) = broadcast_row0(cotangents);
                let shape = problem.validate_shapes()?;
                // Shapes and finiteness are checked on the real cotangents first.
                problem.validate_cotangents(&shape, cotangents)?;
                let c = Cotangents {
                    grad_log_probs: g.as_ref().map(|a| a.view()),
                    grad_entropy: h.as_ref().map(|a| a.view()),
                    grad_topk_log_probs: gk.as_ref().map(|a| a.view()),
                };
                self.inner.backward(problem, &c, out)
            }
            MutantKind::ChunkDependentOrder => {
                let mut grad = self.inner.backward(problem, cotangents, out)?;
                let shape = problem.validate_shapes()?;
                let rows = self.odd_chunk_rows(shape.n);
                if rows.is_empty() {
                    return Ok(grad);
                }
                let rv = Reversed::new(problem, &shape, &rows);
                let (g, h, gk) = (
                    pick_rows1(cotangents.grad_log_probs, &rows),
                    pick_rows1(cotangents.grad_entropy, &rows),
                    pick_rows2(cotangents.grad_topk_log_probs, &rows),
                );
                let c = Cotangents {
                    grad_log_probs: g.as_ref().map(|a| a.view()),
                    grad_entropy: h.as_ref().map(|a| a.view()),
                    grad_topk_log_probs: gk.as_ref().map(|a| a.view()),
                };
                let rg = self.inner.backward(&rv.problem(problem.options), &c, out)?;
                let v = shape.vocab_size;
                for (i, &r) in rows.iter().enumerate() {
                    for j in 0..shape.v_total {
                        let src = if j < v { v - 1 - j } else { j };
                        grad[[r, j]] = rg[[i, src]];
                    }
                }
                Ok(grad)
            }
            _ => {
                let mut grad = self.inner.backward(problem, cotangents, out)?;
                let shape = problem.validate_shapes()?;
                self.corrupt_backward(problem, &shape, cotangents, &mut grad);
                Ok(grad)
            }
        }
    }

    fn backward_in_place(
        &self,
        mut problem: ProblemMut<'_>,
        cotangents: &Cotangents<'_>,
    ) -> Result<(), KernelError> {
        match self.kind {
            MutantKind::TpVocabOffset => {
                let vp = self.tp_kernel(problem.logits.view().dim().1);
                let triggered = {
                    let p = problem.view();
                    p.validate_shapes().is_ok()
                        && cotangents.grad_log_probs.is_some_and(|g| {
                            tp_triggers(&p, vp.shard_widths())
                                .iter()
                                .any(|&(row, _, _)| g.get(row).is_some_and(|&x| x != 0.0))
                        })
                };
                if !triggered {
                    return vp.backward_in_place(problem, cotangents);
                }
                let grad = {
                    let p = problem.view();
                    self.backward(&p, cotangents, p.logits.dtype())?
                };
                write_over(problem.logits, &grad);
                Ok(())
            }
            MutantKind::InPlaceCorruption => {
                in_place_row_by_row(self.inner.as_ref(), problem, cotangents)
            }
            MutantKind::GradOutput0Broadcast => {
                let (g, h, gk) = broadcast_row0(cotangents);
                let c = Cotangents {
                    grad_log_probs: g.as_ref().map(|a| a.view()),
                    grad_entropy: h.as_ref().map(|a| a.view()),
                    grad_topk_log_probs: gk.as_ref().map(|a| a.view()),
                };
                self.inner.backward_in_place(problem, &c)
            }
            MutantKind::PaddedVocabNotTruncated
            | MutantKind::TemperatureIgnored
            | MutantKind::TemperatureTwice
            | MutantKind::EntropyWrongLogits => {
                let o = {
                    let p = problem.view();
                    p.validate_shapes()?;
                    let o = self.wrong_options(&p);
                    if o.temperature != p.options.temperature {
                        o.effective_temperature(p.logits.dtype().accumulation())?;
                    }
                    o
                };
                problem.options = o;
                self.inner.backward_in_place(problem, cotangents)
            }
            _ => {
                // The remaining kinds: the buggy backward, written over the logits.
                let grad = {
                    let p = problem.view();
                    let dtype = p.logits.dtype();
                    self.backward(&p, cotangents, dtype)?
                };
                write_over(problem.logits, &grad);
                Ok(())
            }
        }
    }
}

/// Writes `grad` (exact in the logits' dtype) over `logits`.
pub(crate) fn write_over(logits: LogitsMut<'_>, grad: &Array2<f64>) {
    use logprobe_reference::spec::Element;
    match logits {
        LogitsMut::F64(mut a) => a.zip_mut_with(grad, |x, &g| *x = g),
        LogitsMut::F32(mut a) => a.zip_mut_with(grad, |x, &g| *x = f32::from_f64(g)),
        LogitsMut::Bf16(mut a) => a.zip_mut_with(grad, |x, &g| *x = half::bf16::from_f64(g)),
        LogitsMut::F16(mut a) => a.zip_mut_with(grad, |x, &g| *x = half::f16::from_f64(g)),
    }
}

/// The in-place corruption bug: rows are validated and overwritten one at a
/// time, so an error on row `r` leaves rows `< r` already overwritten (the
/// trait promises unchanged logits on error).
pub(crate) fn in_place_row_by_row(
    inner: &dyn Kernel,
    mut problem: ProblemMut<'_>,
    cotangents: &Cotangents<'_>,
) -> Result<(), KernelError> {
    let shape = {
        let p = problem.view();
        let shape = p.validate_shapes()?;
        p.validate_cotangents(&shape, cotangents)?;
        shape
    };
    let (tokens, sampling_mask, topk_ids, options) = (
        problem.tokens,
        problem.sampling_mask,
        problem.topk_ids,
        problem.options,
    );
    for row in 0..shape.n {
        let r = row..row + 1;
        let c = Cotangents {
            grad_log_probs: cotangents
                .grad_log_probs
                .map(|g| g.slice_move(s![r.clone()])),
            grad_entropy: cotangents.grad_entropy.map(|g| g.slice_move(s![r.clone()])),
            grad_topk_log_probs: cotangents
                .grad_topk_log_probs
                .map(|g| g.slice_move(s![r.clone(), ..])),
        };
        let logits = match &mut problem.logits {
            LogitsMut::F64(a) => LogitsMut::F64(a.slice_mut(s![r.clone(), ..])),
            LogitsMut::F32(a) => LogitsMut::F32(a.slice_mut(s![r.clone(), ..])),
            LogitsMut::Bf16(a) => LogitsMut::Bf16(a.slice_mut(s![r.clone(), ..])),
            LogitsMut::F16(a) => LogitsMut::F16(a.slice_mut(s![r.clone(), ..])),
        };
        inner.backward_in_place(
            ProblemMut {
                logits,
                tokens: tokens.map(|t| t.slice_move(s![r.clone()])),
                sampling_mask: sampling_mask.map(|m| m.slice_move(s![r.clone(), ..])),
                topk_ids: topk_ids.map(|k| k.slice_move(s![r.clone(), ..])),
                options,
            },
            &c,
        )?;
    }
    Ok(())
}
