//! Time per call of candle's composed log-prob path against our fused
//! kernel, on LLM-sized logits (default `N = 64`, `V = 152064`, f32).
//!
//! ```text
//! cargo run --release -p logprobe-kernels --example candle_bench [N] [V] [REPS]
//! RAYON_NUM_THREADS=1 cargo run --release ...   # per-core comparison
//! ```
//!
//! Paths timed (median of `REPS` calls after one warm-up call):
//! - `candle composed`: `candle_log_softmax` (max, sub, exp, sum, log, sub:
//!   `candle_nn::ops::log_softmax`) then `gather`, on a `Tensor` the caller
//!   already holds (what candle users run); single-threaded in candle-core
//!   0.11.1 without MKL.
//! - `CandleComposed kernel`: the same through the `Kernel` trait (adds the
//!   validation pass and the copy into a `Tensor`).
//! - `fused (log_probs)`, `fused (+ entropy)`: `CpuKernel::fused()` through the
//!   `Kernel` trait, rows in parallel with rayon.
//! - `LogProbOp (fused, + entropy)`: the candle `CustomOp2` on the tensor.
//!
//! Reported: milliseconds per call, logits read bandwidth (`N V b` bytes per
//! call, GB/s) and each path's time over the fused log-prob time.

use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use ndarray::{Array1, Array2};

use logprobe_kernels::candle::{
    candle_log_softmax, log_probs_and_entropy, CandleComposed, LogProbOp,
};
use logprobe_kernels::CpuKernel;
use logprobe_kernels::Kernel;
use logprobe_reference::spec::{Dtype, EntropyLogits, Logits, Options, Problem};
use logprobe_reference::splitmix::SplitMix64;

/// Median seconds per call of `f` over `reps` calls, after one warm-up.
fn time<F: FnMut()>(reps: usize, mut f: F) -> f64 {
    f();
    let mut t: Vec<f64> = (0..reps.max(1))
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// Gaussian logits (sd 2) from a splitmix64 stream, `[n, v]`.
fn logits(n: usize, v: usize) -> Vec<f32> {
    let mut rng = SplitMix64::new(0x5eed);
    (0..n * v).map(|_| (2.0 * rng.normal()) as f32).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arg = |i: usize, d: usize| {
        std::env::args()
            .nth(i)
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let (n, v, reps) = (arg(1, 64), arg(2, 152_064), arg(3, 10));
    let data = logits(n, v);
    let tokens: Vec<u32> = (0..n)
        .map(|i| ((i as u64 * 2_654_435_761) % v as u64) as u32)
        .collect();
    let threads = rayon::current_num_threads();
    println!("N = {n}, V = {v}, {reps} reps (median), rayon threads = {threads}");
    println!(
        "{:<32} {:>10} {:>9} {:>8}",
        "path", "ms/call", "GB/s", "x fused"
    );

    for dtype in [DType::F32, DType::BF16] {
        let dev = Device::Cpu;
        let t = Tensor::from_slice(&data, (n, v), &dev)?.to_dtype(dtype)?;
        let tok = Tensor::from_slice(&tokens, n, &dev)?;
        let idx = tok.to_dtype(DType::I64)?.reshape((n, 1))?;
        let tok_i64 = Array1::from(tokens.iter().map(|&t| i64::from(t)).collect::<Vec<_>>());
        let bytes = (n * v * dtype.size_in_bytes()) as f64;

        let arr32;
        let arr16;
        let lv = match dtype {
            DType::F32 => {
                arr32 = Array2::from_shape_vec((n, v), t.flatten_all()?.to_vec1::<f32>()?)?;
                Logits::F32(arr32.view())
            }
            _ => {
                arr16 = Array2::from_shape_vec((n, v), t.flatten_all()?.to_vec1::<half::bf16>()?)?;
                Logits::Bf16(arr16.view())
            }
        };
        let lp_only = Options {
            entropy: None,
            ..Options::default()
        };
        let with_entropy = Options {
            entropy: Some(EntropyLogits::Unmasked),
            ..Options::default()
        };
        let problem = |options| Problem {
            tokens: Some(tok_i64.view()),
            options,
            ..Problem::new(lv)
        };

        let fused = time(reps, || {
            CpuKernel::fused()
                .forward(&problem(lp_only), Dtype::F32)
                .expect("fused forward");
        });
        let rows: Vec<(&str, f64)> = vec![
            (
                "candle composed",
                time(reps, || {
                    let lp = candle_log_softmax(&t)
                        .and_then(|x| x.gather(&idx, 1))
                        .expect("candle");
                    let lp = lp
                        .to_dtype(DType::F32)
                        .and_then(|x| x.flatten_all())
                        .and_then(|x| x.to_vec1::<f32>());
                    std::hint::black_box(lp.expect("candle"));
                }),
            ),
            (
                "CandleComposed kernel",
                time(reps, || {
                    CandleComposed
                        .forward(&problem(lp_only), Dtype::F32)
                        .expect("composed");
                }),
            ),
            ("fused (log_probs)", fused),
            (
                "fused (+ entropy)",
                time(reps, || {
                    CpuKernel::fused()
                        .forward(&problem(with_entropy), Dtype::F32)
                        .expect("fused");
                }),
            ),
            (
                "LogProbOp (fused, + entropy)",
                time(reps, || {
                    let op = LogProbOp::new(Arc::new(CpuKernel::fused()), with_entropy);
                    std::hint::black_box(log_probs_and_entropy(&t, &tok, &op).expect("op"));
                }),
            ),
        ];
        println!("-- {dtype:?} logits");
        for (name, s) in rows {
            println!(
                "{name:<32} {:>10.2} {:>9.2} {:>8.2}",
                s * 1e3,
                bytes / s / 1e9,
                s / fused
            );
        }
    }
    Ok(())
}
