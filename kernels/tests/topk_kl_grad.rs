//! The CPU kernels' backward of the top-k KL to a teacher
//! (`grad_forward_kl`, `grad_reverse_kl`, renormalised or not): the
//! log-prob backward of a top-k cotangent `w = topk_kl_slopes(lp^)` at the
//! ids, from the kernel's own f32 log-probs, bit for bit, fused, chunked,
//! vocabulary-parallel and in place. The exact bound is
//! judged in `properties/verify/tests/kl_grad_bound.rs`.

use ndarray::{Array1, Array2};

use logprobe_kernels::topk_kl_slopes;
use logprobe_kernels::{CpuKernel, Kernel};
use logprobe_reference::spec::{
    Cotangents, Dtype, Logits, LogitsMut, Output, Problem, ProblemMut, TopkKl,
};
use logprobe_reference::splitmix::SplitMix64;

struct Data {
    x: Array2<f32>,
    ids: Array2<i64>,
    a: Array2<f64>,
    gf: Array1<f64>,
    gr: Array1<f64>,
}

fn data(n: usize, v: usize, k: usize, seed: u64) -> Data {
    let mut rng = SplitMix64::new(seed);
    let mut x = Array2::from_shape_fn((n, v), |_| (rng.normal() * 3.0) as f32);
    let mut ids = Array2::<i64>::zeros((n, k));
    let mut a = Array2::<f64>::zeros((n, k));
    for r in 0..n {
        for c in 0..k {
            ids[[r, c]] = ((r * 7919 + c * 131) % v) as i64;
            a[[r, c]] = (-2.5 - 3.0 * rng.uniform()) as f32 as f64;
        }
        // A student zero at a teacher id on some rows (forward: +inf KL,
        // finite gradient; reverse: no term).
        if r % 5 == 2 {
            x[[r, ids[[r, 0]] as usize]] = f32::NEG_INFINITY;
        }
    }
    let gf = Array1::from_shape_fn(n, |r| 0.5 + r as f64 * 0.25 - 2.0);
    let gr = Array1::from_shape_fn(n, |r| 1.25 - r as f64 * 0.125);
    Data { x, ids, a, gf, gr }
}

fn problem(d: &Data, renormalized: bool) -> Problem<'_> {
    let mut p = Problem::new(Logits::F32(d.x.view()));
    p.options.entropy = None;
    p.topk_ids = Some(d.ids.view());
    p.teacher_topk_log_probs = Some(d.a.view());
    p.options.topk_kl = Some(TopkKl {
        forward: true,
        reverse: true,
        renormalized,
        teacher_dtype: Dtype::F32,
    });
    p
}

#[test]
fn kl_backward_is_the_top_k_backward_with_its_slopes() {
    let (n, v, k) = (19, 2100, 9);
    let d = data(n, v, k, 31);
    for renorm in [false, true] {
        let p = problem(&d, renorm);
        let cot = Cotangents::default()
            .with_column(Output::ForwardKl, d.gf.view())
            .with_column(Output::ReverseKl, d.gr.view());
        // Each kernel against itself (a vocabulary-parallel row's merged
        // statistics differ from the fused ones in their last bits).
        let reference = |kern: &CpuKernel| {
            let fo = kern.forward(&p, Dtype::F32).unwrap();
            let lps = &fo.values[Output::TopkLogProbs];
            let mut w = Array2::<f64>::zeros((n, k));
            for r in 0..n {
                let l: Vec<f32> = lps.row(r).iter().map(|&x| x as f32).collect();
                let s = topk_kl_slopes(
                    &l,
                    &d.a.row(r).to_vec(),
                    renorm,
                    d.gf[r] as f32,
                    d.gr[r] as f32,
                );
                for (c, x) in s.into_iter().enumerate() {
                    assert!(x.is_finite(), "row {r} id {c}: {x}");
                    w[[r, c]] = x as f64;
                }
            }
            let topk_cot = Cotangents::default().with(Output::TopkLogProbs, w.view());
            kern.backward(&p, &topk_cot, Dtype::F32).unwrap()
        };
        let want = reference(&CpuKernel::fused());
        for kern in [
            CpuKernel::fused(),
            CpuKernel::chunked(3),
            CpuKernel::chunked(64),
            CpuKernel::vocab_parallel(vec![700, 900, 500]),
        ] {
            let got = kern.backward(&p, &cot, Dtype::F32).unwrap();
            let own = reference(&kern);
            assert!(
                own.iter()
                    .zip(&got)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{} renorm {renorm}",
                kern.name()
            );
        }
        let mut y = d.x.clone();
        CpuKernel::chunked(5)
            .backward_in_place(
                ProblemMut {
                    logits: LogitsMut::F32(y.view_mut()),
                    tokens: None,
                    sampling_mask: None,
                    topk_ids: p.topk_ids,
                    loss_weights: None,
                    teacher_topk_log_probs: p.teacher_topk_log_probs,
                    teacher_probs: p.teacher_probs,
                    policy: p.policy.shorten(),
                    options: p.options,
                },
                &cot,
            )
            .unwrap();
        assert!(want
            .iter()
            .zip(&y)
            .all(|(a, &b)| a.to_bits() == (b as f64).to_bits()));
    }
}
