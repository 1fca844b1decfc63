//! The tensor-parallel bug: a target owned by a shard past column 0 is
//! gathered at its shard-local index, around [`CpuKernel::vocab_parallel`].

use ndarray::Array2;

use logprobe_kernels::kernel::{
    Algorithm, CrossEntropyOutput, ForwardOutput, Kernel, KernelError, Summation,
};
use logprobe_kernels::CpuKernel;
use logprobe_reference::spec::{
    Cotangents, CrossEntropy, Dtype, Output, Problem, ProblemMut, Shape,
};

use super::rewired::{gatherable, tp_triggers, with_tokens, wrong_targets};
use super::{write_over, PlantedBug};
use crate::strategies::even_shards;

/// Tensor-parallel vocabulary offset not added back for the target.
pub struct TpVocabOffset {
    /// The shard widths (`None`: two even shards of each call's `V_total`).
    shards: Option<Vec<usize>>,
    /// The inner kernel [`PlantedBug::inner`] reports (capabilities,
    /// entropy form); calls build [`TpVocabOffset::kernel`] per `V_total`.
    nominal: CpuKernel,
}

impl TpVocabOffset {
    /// Catalog name.
    pub const NAME: &'static str = "tp-vocab-offset";

    /// The bug around [`CpuKernel::vocab_parallel`] over `shards` (`None`: two even
    /// shards of each call's `V_total`).
    pub fn new(shards: Option<Vec<usize>>) -> TpVocabOffset {
        TpVocabOffset {
            nominal: CpuKernel::vocab_parallel(Vec::new()),
            shards,
        }
    }

    /// The correct vocab-parallel kernel the bug wraps, for `v_total`
    /// columns.
    fn kernel(&self, v_total: usize) -> CpuKernel {
        CpuKernel::vocab_parallel(
            self.shards
                .clone()
                .unwrap_or_else(|| even_shards(v_total, 2)),
        )
    }
}

impl PlantedBug for TpVocabOffset {
    fn inner(&self) -> &dyn Kernel {
        &self.nominal
    }

    fn algorithm(&self, shape: &Shape) -> Algorithm {
        self.kernel(shape.v_total).algorithm(shape)
    }

    fn workspace_bytes(&self, shape: &Shape) -> usize {
        self.kernel(shape.v_total).workspace_bytes(shape)
    }

    fn loss_summation(&self, n: usize) -> Summation {
        self.nominal.loss_summation(n)
    }

    /// The loss of the real vocab-parallel kernel over this call's shards
    /// (the bug is planted in the log-prob gather of forward and backward).
    fn cross_entropy(
        &self,
        problem: &Problem<'_>,
        ce: &CrossEntropy<'_>,
        out: Dtype,
    ) -> Result<CrossEntropyOutput, KernelError> {
        let shape = problem.validate_shapes()?;
        self.kernel(shape.v_total).cross_entropy(problem, ce, out)
    }

    fn forward(&self, problem: &Problem<'_>, out: Dtype) -> Result<ForwardOutput, KernelError> {
        let shape = problem.validate_shapes()?;
        let vp = self.kernel(shape.v_total);
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

    fn backward(
        &self,
        problem: &Problem<'_>,
        cotangents: &Cotangents<'_>,
        out: Dtype,
    ) -> Result<Array2<f64>, KernelError> {
        let shape = problem.validate_shapes()?;
        let vp = self.kernel(shape.v_total);
        let mut grad = vp.backward(problem, cotangents, out)?;
        let (Some(g), Some(tokens)) = (cotangents.column(Output::LogProbs), problem.tokens) else {
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

    fn backward_in_place(
        &self,
        problem: ProblemMut<'_>,
        cotangents: &Cotangents<'_>,
    ) -> Result<(), KernelError> {
        let vp = self.kernel(problem.logits.view().dim().1);
        let triggered = {
            let p = problem.view();
            p.validate_shapes().is_ok()
                && cotangents.column(Output::LogProbs).is_some_and(|g| {
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
}
