//! Time (or, under `valgrind --tool=callgrind`, count instructions of) the
//! fused backward: logits `[N, V]` (f32 or bf16, LLM-like: a Gaussian bulk
//! and a few large logits per row), log-prob and entropy cotangents, the
//! gradient written into a reused `[N, V]` buffer of the logits' dtype.
//!
//! Run: `RAYON_NUM_THREADS=1 cargo run --release -p logprobe-kernels
//! --example backward_bench -- [f32|bf16] [N] [V] [REPS]` (defaults f32,
//! 64, 152064, 10). It prints the best time per call and ns per entry, and those of the
//! fused forward with entropy (the backward's stats pass alone);
//! `logprobe bench` gives the same path as cycles per entry against the
//! read + write roofline.

use std::time::Instant;

use half::bf16;
use ndarray::{Array1, Array2};

use logprobe_kernels::{CpuKernel, GradElement, Kernel};
use logprobe_reference::spec::{
    Cotangents, Dtype, EntropyLogits, Logits, Options, Output, Problem,
};

fn logits(n: usize, v: usize) -> Array2<f32> {
    let mut rng = logprobe_reference::splitmix::SplitMix64::new(1);
    let mut unit = move || rng.uniform() as f32;
    let mut x = Array2::from_shape_fn((n, v), |_| (unit() + unit() + unit() - 1.5) * 5.0 - 2.0);
    for mut row in x.rows_mut() {
        for k in 0..16 {
            let j = (unit() * v as f32) as usize % v;
            row[j] = 18.0 - k as f32;
        }
    }
    x
}

fn run<G: GradElement>(p: &Problem<'_>, cot: &Cotangents<'_>, reps: usize) -> f64 {
    let (n, v) = p.logits.dim();
    let mut grad = Array2::from_elem((n, v), G::from_f32(0.0));
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) + 1 {
        let t = Instant::now();
        CpuKernel::fused()
            .backward_into(p, cot, grad.view_mut())
            .expect("valid problem");
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&grad);
    best
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dtype = args.get(1).map_or("f32", |s| s.as_str()).to_string();
    let arg = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (n, v, reps) = (arg(2, 64), arg(3, 152_064), arg(4, 10));
    let x = logits(n, v);
    let xb = x.mapv(bf16::from_f32);
    let tokens = Array1::from_shape_fn(n, |r| (r * 2377 % v) as i64);
    let g = Array1::from_elem(n, -1.0);
    let h = Array1::from_elem(n, 0.25);
    let cot = Cotangents::default()
        .with_column(Output::LogProbs, g.view())
        .with_column(Output::Entropy, h.view());
    let logits = match dtype.as_str() {
        "bf16" => Logits::Bf16(xb.view()),
        _ => Logits::F32(x.view()),
    };
    let p = Problem {
        tokens: Some(tokens.view()),
        options: Options {
            entropy: Some(EntropyLogits::Unmasked),
            ..Options::default()
        },
        ..Problem::new(logits)
    };
    let best = match dtype.as_str() {
        "bf16" => run::<bf16>(&p, &cot, reps),
        _ => run::<f32>(&p, &cot, reps),
    };
    // The forward with entropy is the backward's stats pass alone.
    let mut fwd = f64::INFINITY;
    for _ in 0..reps.max(1) + 1 {
        let t = Instant::now();
        std::hint::black_box(
            CpuKernel::fused()
                .forward(&p, Dtype::F32)
                .expect("valid problem"),
        );
        fwd = fwd.min(t.elapsed().as_secs_f64());
    }
    let per = |s: f64| s * 1e9 / (n * v) as f64;
    println!(
        "{dtype}: N = {n}, V = {v}, threads = {}: backward ({dtype} out) best {:.3} ms = {:.3} ns/entry; forward (its stats pass) {:.3} ns/entry",
        rayon::current_num_threads(),
        best * 1e3,
        per(best),
        per(fwd)
    );
}
