//! The gradient bound of the top-k KL's cotangents (TOLERANCE.md (T25))
//! against our CPU kernels and the exact oracle: `grad_forward_kl` and
//! `grad_reverse_kl`, alone and together, renormalised or not, on f32
//! logits at a real vocabulary (V = 32000, K = 32) and on f32, bf16 and f16
//! logits at V = 1500 with a temperature, fused, chunked and
//! vocab-parallel, with a student `-inf` at a teacher id. Every element of
//! every correct kernel passes (the bound within 7x / 22x of the worst
//! observed error for the plain forward / reverse KL, looser renormalised:
//! (T25)); and three wrong derivatives fail: the reverse KL's
//! slope without its `+ p_k` term, the renormalised KL differentiated as if
//! it were not renormalised, and the teacher's probability taken for its
//! log-prob.

mod common;
use common::Worst;
use half::{bf16, f16};
use logprobe_kernels::{topk_kl_slopes, CpuKernel, Kernel};
use logprobe_reference::oracle::{Exact, Oracle};
use logprobe_reference::spec::{Cotangents, Dtype, Logits, Output, Problem, TopkKl};
use logprobe_reference::splitmix::SplitMix64;
use logprobe_verify::tolerance::Model;
use ndarray::{Array1, Array2};

struct Case {
    x: Array2<f32>,
    ids: Array2<i64>,
    a: Array2<f64>,
    gf: Array1<f64>,
    gr: Array1<f64>,
}

/// `n` rows of `v` logits (Gaussian, sigma 3), `k` distinct ids (the
/// student's largest logits first, then random ones), a teacher near the
/// student (log-probs perturbed by 0.3 nats, mass at most 0.99, rounded to
/// f32), cotangents in `[-2, 2]`; row 2's first id has a `-inf` logit.
fn case(n: usize, v: usize, k: usize, seed: u64) -> Case {
    let mut rng = SplitMix64::new(seed);
    let mut x = Array2::from_shape_fn((n, v), |_| (rng.normal() * 3.0) as f32);
    let mut ids = Array2::<i64>::zeros((n, k));
    let mut a = Array2::<f64>::zeros((n, k));
    for r in 0..n {
        let mut order: Vec<usize> = (0..v).collect();
        order.sort_by(|&i, &j| x[[r, j]].total_cmp(&x[[r, i]]));
        let mut chosen: Vec<usize> = order[..k / 2].to_vec();
        while chosen.len() < k {
            let c = rng.below(v);
            if !chosen.contains(&c) {
                chosen.push(c);
            }
        }
        let z: Vec<f64> = x.row(r).iter().map(|&q| q as f64).collect();
        let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + z.iter().map(|&q| (q - m).exp()).sum::<f64>().ln();
        let vals: Vec<f64> = chosen
            .iter()
            .map(|&c| z[c] - lse + 0.3 * rng.normal())
            .collect();
        let mass: f64 = vals.iter().map(|&q| q.exp()).sum();
        let shift = if mass > 0.99 { (mass / 0.99).ln() } else { 0.0 };
        for (c, (&id, &val)) in chosen.iter().zip(&vals).enumerate() {
            ids[[r, c]] = id as i64;
            a[[r, c]] = (val - shift).min(0.0) as f32 as f64;
        }
    }
    if n > 2 {
        x[[2, ids[[2, 0]] as usize]] = f32::NEG_INFINITY;
    }
    let g = |rng: &mut SplitMix64| Dtype::F32.round_f64(rng.uniform_in(-2.0, 2.0));
    let gf = Array1::from_shape_fn(n, |_| g(&mut rng));
    let gr = Array1::from_shape_fn(n, |_| g(&mut rng));
    Case { x, ids, a, gf, gr }
}

fn problem<'a>(c: &'a Case, l: Logits<'a>, renormalized: bool) -> Problem<'a> {
    let mut p = Problem::new(l);
    p.options.entropy = None;
    p.topk_ids = Some(c.ids.view());
    p.teacher_topk_log_probs = Some(c.a.view());
    p.options.topk_kl = Some(TopkKl {
        forward: true,
        reverse: true,
        renormalized,
        teacher_dtype: Dtype::F32,
    });
    p
}

/// Which cotangents a run gives.
#[derive(Clone, Copy, Debug)]
enum Which {
    Forward,
    Reverse,
    Both,
}

fn cotangents<'a>(c: &'a Case, which: Which) -> Cotangents<'a> {
    let (f, r) = match which {
        Which::Forward => (true, false),
        Which::Reverse => (false, true),
        Which::Both => (true, true),
    };
    Cotangents::default()
        .with_column(Output::ForwardKl, f.then(|| c.gf.view()))
        .with_column(Output::ReverseKl, r.then(|| c.gr.view()))
}

/// Judges `grad` against the exact `dx` under `model` ([`common::judge`]),
/// marking the top-k ids.
fn judge(
    p: &Problem<'_>,
    cot: &Cotangents<'_>,
    model: &Model,
    grad: &Array2<f64>,
    dx: &Array2<Exact>,
    out: Dtype,
) -> Worst {
    common::judge(p, cot, model, grad, dx, out, |t, j| t.topk_ids.contains(&j))
}

#[test]
fn correct_kernels_pass_and_the_bound_is_tight_at_real_vocab() {
    let c = case(4, 32000, 32, 41);
    let k = CpuKernel::fused();
    let mut report = Vec::new();
    for renorm in [false, true] {
        let p = problem(&c, Logits::F32(c.x.view()), renorm);
        let shape = p.validate_shapes().unwrap();
        let model = Model::declared(&k.algorithm(&shape));
        for which in [Which::Forward, Which::Reverse] {
            let cot = cotangents(&c, which);
            let dx = Oracle::default().vjp(&p, &cot, Dtype::F32).unwrap();
            let grad = k.backward(&p, &cot, Dtype::F32).unwrap();
            let w = judge(&p, &cot, &model, &grad, &dx, Dtype::F32);
            assert_eq!(w.fails, 0, "{which:?} renorm {renorm}: {w:?}");
            report.push((which, renorm, w));
        }
    }
    println!("f32 V = 32000, K = 32, fused, worst err/bound (all, at ids): {report:?}");
    // Measured (TOLERANCE.md (T25)): forward 0.15, reverse 0.046; the
    // renormalised forward 0.0065 and reverse 1.4e-4, loose by what (T24)'s
    // student enclosures (the `ln K` slack) and the any-order sums'
    // `gamma_{K-1}` give: kept from regressing further, not claimed tight.
    for (which, renorm, w) in report {
        let floor = match (which, renorm) {
            (Which::Forward, false) => 1.0 / 12.0,
            (_, false) => 1.0 / 40.0,
            (Which::Forward, true) => 1.0 / 400.0,
            (_, true) => 1.0 / 20000.0,
        };
        assert!(
            w.ratio >= floor,
            "{which:?} renorm {renorm}: the bound is looser than 1/{}: {w:?}",
            1.0 / floor
        );
    }
}

#[test]
fn correct_kernels_pass_every_staging_dtype() {
    let c = case(9, 1500, 12, 42);
    let xb = c.x.mapv(bf16::from_f32);
    let xh = c.x.mapv(f16::from_f32);
    let mut worst = Worst::default();
    for (l, dtype) in [
        (Logits::F32(c.x.view()), Dtype::F32),
        (Logits::Bf16(xb.view()), Dtype::Bf16),
        (Logits::F16(xh.view()), Dtype::F16),
    ] {
        for renorm in [false, true] {
            let mut p = problem(&c, l, renorm);
            p.options.temperature = 0.7;
            let cot = cotangents(&c, Which::Both);
            let shape = p.validate_shapes().unwrap();
            for out in [Dtype::F32, dtype] {
                let dx = Oracle::default().vjp(&p, &cot, out).unwrap();
                for k in [
                    CpuKernel::fused(),
                    CpuKernel::chunked(5),
                    CpuKernel::vocab_parallel(vec![700, 0, 800]),
                ] {
                    let model = Model::declared(&k.algorithm(&shape));
                    let grad = k.backward(&p, &cot, out).unwrap();
                    let w = judge(&p, &cot, &model, &grad, &dx, out);
                    assert_eq!(
                        w.fails,
                        0,
                        "{} {dtype}->{out} renorm {renorm}: {w:?}",
                        k.name()
                    );
                    if out == Dtype::F32 {
                        worst.ratio = worst.ratio.max(w.ratio);
                    }
                }
            }
        }
    }
    println!(
        "V = 1500, every staging, worst f32 err/bound {:.3}",
        worst.ratio
    );
    assert!(worst.ratio > 1.0 / 64.0, "vacuous: {worst:?}");
}

/// The kernel's backward of a top-k cotangent `w [N, K]` computed from its
/// own f32 top-k log-probs by `slopes(lp, a, g_f, g_r)` (a wrong derivative).
fn planted(
    p: &Problem<'_>,
    c: &Case,
    slopes: impl Fn(&[f32], &[f64], f32, f32) -> Vec<f32>,
) -> Array2<f64> {
    let k = CpuKernel::fused();
    let lps = k.forward(p, Dtype::F32).unwrap().values[Output::TopkLogProbs].clone();
    let (n, kk) = c.ids.dim();
    let mut w = Array2::<f64>::zeros((n, kk));
    for r in 0..n {
        let l: Vec<f32> = lps.row(r).iter().map(|&x| x as f32).collect();
        let s = slopes(&l, &c.a.row(r).to_vec(), c.gf[r] as f32, c.gr[r] as f32);
        for (i, x) in s.into_iter().enumerate() {
            w[[r, i]] = x as f64;
        }
    }
    let cot = Cotangents::default().with(Output::TopkLogProbs, w.view());
    k.backward(p, &cot, Dtype::F32).unwrap()
}

#[test]
fn wrong_derivatives_fail() {
    let c = case(6, 4096, 16, 43);
    let k = CpuKernel::fused();
    let o = Oracle::default();
    let judged = |renorm: bool, which: Which, grad: &Array2<f64>| {
        let p = problem(&c, Logits::F32(c.x.view()), renorm);
        let shape = p.validate_shapes().unwrap();
        let model = Model::declared(&k.algorithm(&shape));
        let cot = cotangents(&c, which);
        let dx = o.vjp(&p, &cot, Dtype::F32).unwrap();
        judge(&p, &cot, &model, grad, &dx, Dtype::F32)
    };
    // Control: the correct slopes, through the same planted path, pass.
    let p = problem(&c, Logits::F32(c.x.view()), false);
    let ok = planted(&p, &c, |l, a, _, gr| topk_kl_slopes(l, a, false, 0.0, gr));
    let control = judged(false, Which::Reverse, &ok);
    assert_eq!(control.fails, 0, "{control:?}");
    // The reverse KL's slope without `+ p_k`: g_r p_k (l_k - a_k).
    let bug = planted(&p, &c, |l, a, _, gr| {
        l.iter()
            .zip(a)
            .map(|(&lk, &ak)| {
                if lk > f32::NEG_INFINITY {
                    gr * lk.exp() * (lk - ak as f32)
                } else {
                    0.0
                }
            })
            .collect()
    });
    let no_plus_p = judged(false, Which::Reverse, &bug);
    // The renormalised forward KL differentiated as the plain one.
    let pr = problem(&c, Logits::F32(c.x.view()), true);
    let bug = planted(&pr, &c, |l, a, gf, _| topk_kl_slopes(l, a, false, gf, 0.0));
    let no_renorm = judged(true, Which::Forward, &bug);
    // The teacher's probability taken for its log-prob: t = e^{e^a}.
    let bug = planted(&p, &c, |_, a, gf, _| {
        a.iter().map(|&ak| -gf * (ak.exp() as f32).exp()).collect()
    });
    let prob_as_log_prob = judged(false, Which::Forward, &bug);
    println!(
        "control {control:?}; reverse without + p: {no_plus_p:?}; renormalised as plain: {no_renorm:?}; teacher prob as log-prob: {prob_as_log_prob:?}"
    );
    for (name, w) in [
        ("reverse without + p", no_plus_p),
        ("renormalised as plain", no_renorm),
        ("teacher prob as log-prob", prob_as_log_prob),
    ] {
        assert!(w.fails > 1000, "{name} passed: {w:?}");
    }
}
