//! Throughput of the fused forward (log-probs + entropy) on `N = 64`,
//! `V = 152064` logits, f32 and bf16, against the machine's read bandwidth
//! (a plain lane-parallel sum over the same buffer, same run).
//! Run: `cargo run --release -p logprobe-kernels --example fused_bench`.

use std::time::Instant;

use half::bf16;
use ndarray::{Array1, Array2};
use rayon::prelude::*;

use logprobe_kernels::{cpu_path, CpuKernel, Kernel};
use logprobe_reference::spec::{Dtype, Logits, Problem};

const N: usize = 64;
const V: usize = 152_064;
const REPS: usize = 10;

/// Best-of-REPS seconds of `f`.
fn best(mut f: impl FnMut()) -> f64 {
    f();
    (0..REPS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// Parallel sum over rows, 16 lanes: the read roofline.
fn read_sum<T: Copy + Sync>(x: &[T], widen: impl Fn(T) -> f32 + Sync) -> f32 {
    x.par_chunks(V)
        .map(|row| {
            let mut acc = [0f32; 16];
            for c in row.chunks_exact(16) {
                for l in 0..16 {
                    acc[l] += widen(c[l]);
                }
            }
            acc.iter().sum::<f32>()
        })
        .sum()
}

fn main() {
    let mut rng = logprobe_reference::splitmix::SplitMix64::new(1);
    let x = Array2::from_shape_fn((N, V), |_| ((rng.uniform() - 0.5) * 20.0) as f32);
    let xb = x.mapv(bf16::from_f32);
    let tokens = Array1::from_shape_fn(N, |r| (r * 2377 % V) as i64);
    println!(
        "fused_bench: N = {N}, V = {V}, threads = {}, cpu_path = {}",
        rayon::current_num_threads(),
        cpu_path()
    );
    for (name, logits, bytes) in [
        ("f32", Logits::F32(x.view()), 4usize),
        ("bf16", Logits::Bf16(xb.view()), 2usize),
    ] {
        let mut p = Problem::new(logits);
        p.tokens = Some(tokens.view());
        let gb = (N * V * bytes) as f64 / 1e9;
        let t_fused = best(|| {
            std::hint::black_box(CpuKernel::fused().forward(&p, Dtype::F32).unwrap());
        });
        let mut p_noent = p;
        p_noent.options.entropy = None;
        let t_noent = best(|| {
            std::hint::black_box(CpuKernel::fused().forward(&p_noent, Dtype::F32).unwrap());
        });
        let t_read = match name {
            "f32" => best(|| {
                std::hint::black_box(read_sum(x.as_slice().unwrap(), |v| v));
            }),
            _ => best(|| {
                std::hint::black_box(read_sum(xb.as_slice().unwrap(), |v: bf16| {
                    f32::from_bits((v.to_bits() as u32) << 16)
                }));
            }),
        };
        println!(
            "{name}: {:.1} MB | read sum {:.2} GB/s | fused (log_prob + entropy) {:.2} GB/s = {:.0}% of read | fused (log_prob only) {:.2} GB/s = {:.0}%",
            gb * 1e3,
            gb / t_read,
            gb / t_fused,
            100.0 * t_read / t_fused,
            gb / t_noent,
            100.0 * t_read / t_noent
        );
    }
}
