//! Unit tests of the planted mutants.

use ndarray::{Array1, Array2};

use logprobe_kernels::kernel::{ForwardOutput, Kernel};
use logprobe_reference::spec::{Dtype, Output, ProblemMut};

use super::*;
use crate::strategies::{CotangentRecipe, ProblemRecipe};

/// The TP mutant is the real [`CpuKernel::vocab_parallel`] bit for bit on rows whose
/// target lies in the first shard, and differs on the others, forward
/// and backward (new buffer and in place).
#[test]
fn tp_mutant_differs_from_vocab_parallel_only_where_triggered() {
    let mut r = ProblemRecipe::plain(11, 16, 40);
    r.topk = 3;
    let mut data = r.expand();
    // Targets on both sides of the cut at column 13, and one ignored row.
    let tokens: Vec<i64> = (0..16).map(|i| (i * 5 % 40) as i64).collect();
    data.tokens = Some(Array1::from_vec(tokens.clone()));
    data.tokens.as_mut().unwrap()[3] = data.options.ignore_index;
    let cot = CotangentRecipe {
        seed: 5,
        log_probs: true,
        entropy: true,
        topk: true,
    }
    .expand(&data);
    let widths = vec![13, 0, 20, 7];
    let (m, vp) = (
        Mutant::tp_vocab_offset(widths.clone()),
        CpuKernel::vocab_parallel(widths),
    );
    let p = data.problem();
    let (fm, fv) = (
        m.forward(&p, Dtype::F32).unwrap(),
        vp.forward(&p, Dtype::F32).unwrap(),
    );
    let g = cot.grad_log_probs.as_ref().unwrap();
    let (gm, gv) = (
        m.backward(&p, &cot.view(), Dtype::F32).unwrap(),
        vp.backward(&p, &cot.view(), Dtype::F32).unwrap(),
    );
    let mut triggered = 0;
    for row in 0..16 {
        let hit = row != 3 && tokens[row] >= 13;
        let lp = (
            fm.values[Output::LogProbs][[row, 0]],
            fv.values[Output::LogProbs][[row, 0]],
        );
        assert_eq!(
            lp.0.to_bits() != lp.1.to_bits(),
            hit,
            "row {row} log_prob {lp:?}"
        );
        let same_grad = gm
            .row(row)
            .iter()
            .zip(gv.row(row))
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert_eq!(!same_grad, hit && g[row] != 0.0, "row {row} grad");
        triggered += hit as usize;
    }
    assert!(triggered >= 8);
    assert!(forward_bits_eq_except_lp(&fm, &fv));
    // In place: the mutant's grads, written over the logits.
    let mut x = data.logits.clone();
    m.backward_in_place(
        ProblemMut {
            logits: x.view_mut(),
            tokens: p.tokens,
            sampling_mask: p.sampling_mask,
            topk_ids: p.topk_ids,
            options: p.options,
            loss_weights: p.loss_weights,
        },
        &cot.view(),
    )
    .unwrap();
    let xi = x.view();
    for row in 0..16 {
        for j in 0..40 {
            assert_eq!(xi.row_f64(row)[j].to_bits(), gm[[row, j]].to_bits());
        }
    }
}

/// Entropy and top-k outputs equal bit for bit (the bug is in the target gather).
fn forward_bits_eq_except_lp(a: &ForwardOutput, b: &ForwardOutput) -> bool {
    let bits = |x: &Array2<f64>| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    Output::ALL
        .into_iter()
        .filter(|&o| o != Output::LogProbs)
        .all(|o| a.values.get(o).map(bits) == b.values.get(o).map(bits))
}
