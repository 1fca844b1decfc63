//! Unit tests of the planted mutants.

use ndarray::{Array1, Array2};

use logprobe_kernels::kernel::{ForwardOutput, Kernel};
use logprobe_reference::spec::{Dtype, Output};

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
        loss: false,
        policy: false,
        kl: false,
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
    m.backward_in_place(p.with_logits(x.view_mut()), &cot.view())
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

/// Each loss mutant is its twin bit for bit where its bug is not
/// triggered and differs where it is.
#[test]
fn loss_mutants_differ_from_their_twin_only_where_triggered() {
    use logprobe_reference::spec::{CrossEntropy, MeanAllIgnored, Reduction};
    let mut r = ProblemRecipe::plain(3, 7, 50);
    r.ignore_rate = 0.0;
    let mut data = r.expand();
    let ii = data.options.ignore_index;
    data.tokens.as_mut().unwrap()[2] = ii;
    data.tokens.as_mut().unwrap()[5] = ii;
    let p = data.problem();
    let mut none = data.clone();
    none.tokens.as_mut().unwrap().fill(ii);
    let pn = none.problem();
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let same = |m: &dyn Kernel, twin: &dyn Kernel, p: &Problem<'_>, ce: &CrossEntropy<'_>| {
        bits(&m.cross_entropy(p, ce, Dtype::F32).unwrap().values)
            == bits(&twin.cross_entropy(p, ce, Dtype::F32).unwrap().values)
    };
    let (fused, chunked) = (CpuKernel::fused(), CpuKernel::chunked(3));
    let ls = Mutant::new(
        LabelSmoothingCountsIgnored::NAME,
        LabelSmoothingCountsIgnored::new(3),
    );
    let cm = Mutant::new(ChunkedMeanTimesChunks::NAME, ChunkedMeanTimesChunks::new(3));
    let ai = Mutant::new(AllIgnoredMeanNan::NAME, AllIgnoredMeanNan::new(3));
    for reduction in [Reduction::None, Reduction::Sum, Reduction::Mean] {
        for eps in [0.0, 0.25] {
            for mean_all_ignored in [MeanAllIgnored::Nan, MeanAllIgnored::Zero] {
                let ce = CrossEntropy {
                    reduction,
                    label_smoothing: eps,
                    mean_all_ignored,
                    loss_weights: None,
                };
                assert_eq!(same(&ls, &fused, &p, &ce), eps == 0.0, "{ce:?}");
                assert!(same(&ls, &fused, &pn, &ce), "{ce:?}");
                assert_eq!(
                    same(&cm, &chunked, &p, &ce),
                    reduction != Reduction::Mean,
                    "{ce:?}"
                );
                assert!(same(&ai, &fused, &p, &ce), "{ce:?}");
                let hit = reduction == Reduction::Mean && mean_all_ignored == MeanAllIgnored::Zero;
                assert_eq!(same(&ai, &fused, &pn, &ce), !hit, "{ce:?}");
            }
        }
    }
    // Under `none` only the ignored rows change.
    let ce = CrossEntropy {
        label_smoothing: 0.25,
        ..Default::default()
    };
    let (m, c) = (
        ls.cross_entropy(&p, &ce, Dtype::F32).unwrap().values,
        fused.cross_entropy(&p, &ce, Dtype::F32).unwrap().values,
    );
    for row in 0..7 {
        assert_eq!(m[row] != c[row], row == 2 || row == 5, "row {row}");
    }
}
