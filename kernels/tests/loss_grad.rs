//! The CPU kernels' VJP of the loss-side outputs (`grad_lse`,
//! `grad_z_loss`, `grad_loss`; docs/design.md, "The loss side"): bit-identical across
//! chunk sizes, thread counts and in place; the loss's gradient without
//! smoothing is the negated log-prob cotangent's, bit for bit; f64 logits
//! agree with the oracle to a few f64 ulps of the row's scale. The real
//! bounds are judged in the properties gate.

use half::bf16;
use ndarray::{Array1, Array2};

use logprobe_kernels::{CpuKernel, Kernel, Sharding, Staging};
use logprobe_reference::oracle::Oracle;
use logprobe_reference::spec::{
    Cotangents, Dtype, Logits, LogitsMut, LossOptions, MeanAllIgnored, Output, Problem, ProblemMut,
    Reduction,
};
use logprobe_reference::splitmix::SplitMix64;

struct Data {
    x: Array2<f32>,
    tokens: Array1<i64>,
    mask: Array2<bool>,
    w: Array1<f64>,
    a: Array1<f64>,
    b: Array1<f64>,
    g_rows: Array1<f64>,
    g_one: Array1<f64>,
}

fn data(n: usize, v: usize, seed: u64) -> Data {
    let mut rng = SplitMix64::new(seed);
    let x = Array2::from_shape_fn((n, v), |_| (rng.normal() * 4.0) as f32);
    let tokens = Array1::from_shape_fn(n, |r| {
        if r % 5 == 2 {
            -100
        } else {
            (r * 371 % v) as i64
        }
    });
    let mask = Array2::from_shape_fn((n, v), |(r, j)| {
        (r + j) % 7 != 0 || j == tokens[r].max(0) as usize
    });
    Data {
        x,
        mask,
        w: Array1::from_shape_fn(n, |r| if r == 3 { 0.0 } else { 0.5 + r as f64 * 0.25 }),
        a: Array1::from_shape_fn(n, |r| 0.75 - r as f64 * 0.125),
        b: Array1::from_shape_fn(n, |r| 1.0 + r as f64),
        g_rows: Array1::from_shape_fn(n, |r| 2.0 - r as f64 * 0.5),
        g_one: Array1::from(vec![1.5]),
        tokens,
    }
}

fn problem<'a>(d: &'a Data, reduction: Reduction, eps: f64, masked: bool) -> Problem<'a> {
    let mut p = Problem::new(Logits::F32(d.x.view()));
    p.tokens = Some(d.tokens.view());
    p.options.temperature = 0.9;
    p.options.entropy = None;
    p.options.lse = true;
    p.options.z_loss_coef = Some(1e-4);
    p.options.loss = Some(LossOptions {
        reduction,
        label_smoothing: eps,
        mean_all_ignored: MeanAllIgnored::Nan,
    });
    p.loss_weights = Some(d.w.view());
    if masked {
        p.sampling_mask = Some(d.mask.view());
    }
    p
}

fn cot<'a>(d: &'a Data, reduction: Reduction) -> Cotangents<'a> {
    Cotangents::default()
        .with_column(Output::Lse, d.a.view())
        .with_column(Output::ZLoss, d.b.view())
        .with_column(
            Output::Loss,
            match reduction {
                Reduction::None => d.g_rows.view(),
                _ => d.g_one.view(),
            },
        )
}

fn same_bits(a: &Array2<f64>, b: &Array2<f64>) -> bool {
    a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn loss_side_backward_is_chunk_thread_and_in_place_invariant() {
    let d = data(11, 3000, 5);
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    for reduction in [Reduction::None, Reduction::Sum, Reduction::Mean] {
        for (eps, masked) in [(0.0, false), (0.1, false), (0.1, true), (1.0, true)] {
            let p = problem(&d, reduction, eps, masked);
            let c = cot(&d, reduction);
            let what = format!("{reduction} eps {eps} masked {masked}");
            let want = CpuKernel::fused().backward(&p, &c, Dtype::F32).unwrap();
            assert!(want.iter().all(|g| g.is_finite()), "{what}");
            for cs in [1, 3, 4, 64] {
                let got = CpuKernel::chunked(cs).backward(&p, &c, Dtype::F32).unwrap();
                assert!(same_bits(&got, &want), "{what} chunk {cs}");
            }
            let got = one
                .install(|| CpuKernel::fused().backward(&p, &c, Dtype::F32))
                .unwrap();
            assert!(same_bits(&got, &want), "{what} one thread");
            // Vocab-parallel: its own reduction order, chunk-invariant itself.
            let vp = |s: Staging| CpuKernel::new(s, Sharding::Vocab(vec![1000, 1500, 500]));
            let vref = vp(Staging::Fused).backward(&p, &c, Dtype::F32).unwrap();
            let vch = vp(Staging::Chunked { chunk_size: 3 })
                .backward(&p, &c, Dtype::F32)
                .unwrap();
            assert!(same_bits(&vch, &vref), "{what} vocab-parallel chunked");
            // In place over bf16 logits equals backward(out = bf16).
            let xb = d.x.mapv(bf16::from_f32);
            let mut pb = problem(&d, reduction, eps, masked);
            pb.logits = Logits::Bf16(xb.view());
            for k in [CpuKernel::fused(), CpuKernel::chunked(4)] {
                let want_b = k.backward(&pb, &c, Dtype::Bf16).unwrap();
                let mut yb = xb.clone();
                k.backward_in_place(
                    ProblemMut {
                        logits: LogitsMut::Bf16(yb.view_mut()),
                        tokens: pb.tokens,
                        sampling_mask: pb.sampling_mask,
                        topk_ids: None,
                        policy: pb.policy.shorten(),
                        teacher_topk_log_probs: None,
                        teacher_probs: None,
                        options: pb.options,
                        loss_weights: pb.loss_weights,
                    },
                    &c,
                )
                .unwrap();
                assert!(
                    yb.iter().zip(&want_b).all(|(a, b)| a.to_f64() == *b),
                    "{what} in place {}",
                    k.name()
                );
            }
        }
    }
}

#[test]
fn unsmoothed_loss_gradient_is_the_negated_log_prob_cotangent() {
    let d = data(7, 2000, 9);
    let mut p = problem(&d, Reduction::None, 0.0, true);
    p.loss_weights = None;
    let neg = d.g_rows.mapv(|g| -g);
    let via_loss = Cotangents::default().with_column(Output::Loss, d.g_rows.view());
    let via_lp = Cotangents::default().with_column(Output::LogProbs, neg.view());
    for k in [CpuKernel::fused(), CpuKernel::chunked(2)] {
        let a = k.backward(&p, &via_loss, Dtype::F32).unwrap();
        let b = k.backward(&p, &via_lp, Dtype::F32).unwrap();
        assert!(same_bits(&a, &b), "{}", k.name());
    }
}

#[test]
fn all_ignored_mean_has_zero_gradient() {
    let mut d = data(4, 500, 2);
    d.tokens.fill(-100);
    let mut p = problem(&d, Reduction::Mean, 0.1, false);
    p.options.lse = false;
    p.options.z_loss_coef = None;
    let c = Cotangents::default().with_column(Output::Loss, d.g_one.view());
    let g = CpuKernel::fused().backward(&p, &c, Dtype::F32).unwrap();
    assert!(g.iter().all(|&x| x.to_bits() == 0));
}

#[test]
fn f64_backward_agrees_with_the_oracle() {
    let d = data(6, 300, 13);
    let x64 = d.x.mapv(f64::from);
    for reduction in [Reduction::None, Reduction::Mean] {
        for (eps, masked) in [(0.0, false), (0.25, true)] {
            let mut p = problem(&d, reduction, eps, masked);
            p.logits = Logits::F64(x64.view());
            let c = cot(&d, reduction);
            let got = CpuKernel::fused().backward(&p, &c, Dtype::F64).unwrap();
            let want = Oracle::default().vjp(&p, &c, Dtype::F64).unwrap();
            for r in 0..got.nrows() {
                let scale: f64 = want
                    .row(r)
                    .iter()
                    .map(|e| e.rounded.abs())
                    .fold(1.0, f64::max);
                for (j, (g, e)) in got.row(r).iter().zip(want.row(r)).enumerate() {
                    assert!(
                        (g - e.rounded).abs() <= 1e-13 * scale,
                        "{reduction} eps {eps} [{r}, {j}]: {g} vs {}",
                        e.rounded
                    );
                }
            }
        }
    }
}
