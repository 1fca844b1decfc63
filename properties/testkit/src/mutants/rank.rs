//! A bug of vLLM's `token_ranks` (issue 47): ties not counted against the
//! token, `(logprobs > logprobs[t]).sum(-1) + 1` instead of `>=`. Rows
//! where another allowed entry's log-prob equals the token's (a repeated
//! logit: frequent in bf16 rows) rank the token too high. The entries'
//! log-probs are the wrapped kernel's own, in the accumulation dtype (one
//! forward per row with every column as a top-k id: O(V) memory).

use ndarray::Array2;

use logprobe_kernels::kernel::{ForwardOutput, Kernel};
use logprobe_reference::spec::{Dtype, Logits, Output, Problem, Shape};

use super::{PlantedBug, FUSED};

unit_bug!(
    /// `token_ranks` with ties counted for the token (module docs).
    RankTiesForToken,
    "rank-ties-for-token"
);

impl PlantedBug for RankTiesForToken {
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
        let (Some(tokens), Some(ranks)) = (problem.tokens, fo.values.get_mut(Output::TokenRanks))
        else {
            return;
        };
        let acc = shape.dtype.accumulation();
        let ids = Array2::from_shape_fn((1, shape.vocab_size), |(_, j)| j as i64);
        for row in 0..shape.n {
            if !problem.has_target(row) {
                continue;
            }
            let t = tokens[row] as usize;
            let mut p = Problem::new(shorter(problem.logits.slice_rows(row..row + 1)));
            p.sampling_mask = problem
                .sampling_mask
                .map(|m| m.slice_move(ndarray::s![row..row + 1, ..]));
            p.topk_ids = Some(ids.view());
            p.options = problem.options;
            p.options.entropy = None;
            p.options.token_ranks = false;
            p.options.lse = false;
            p.options.z_loss_coef = None;
            p.options.loss = None;
            p.options.topk_kl = None;
            let Ok(f) = FUSED.forward(&p, acc) else {
                continue;
            };
            let lps = f.values[Output::TopkLogProbs].row(0).to_owned();
            let ties = (0..shape.vocab_size)
                .filter(|&j| j != t && problem.allowed(row, j) && lps[j] == lps[t])
                .count();
            ranks[[row, 0]] -= ties as f64;
        }
    }
}

/// `logits` under a shorter lifetime (beside a local `topk_ids`).
fn shorter<'a: 'b, 'b>(logits: Logits<'a>) -> Logits<'b> {
    match logits {
        Logits::F64(v) => Logits::F64(v.reborrow()),
        Logits::F32(v) => Logits::F32(v.reborrow()),
        Logits::Bf16(v) => Logits::Bf16(v.reborrow()),
        Logits::F16(v) => Logits::F16(v.reborrow()),
    }
}
