//! Cost of the exact oracle per vocabulary entry on an LLM-like row
//! (V = 152064, Qwen2's padded vocabulary), for f32 and bf16 targets:
//! forward (log-prob + entropy) and VJP (log-prob and entropy cotangents).
//!
//! Run: `cargo run --release -p logprobe-reference --example oracle_bench`
//! (`-- --rows N` for more rows; `RAYON_NUM_THREADS=1` for one core).

use std::time::Instant;

use half::bf16;
use logprobe_reference::oracle::Oracle;
use logprobe_reference::spec::{Cotangents, Dtype, Logits, Problem};
use ndarray::{Array1, Array2};

/// xorshift64*: deterministic, dependency-free.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f64 {
        let u = self.unit().max(1e-300);
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * self.unit()).cos()
    }
}

/// LLM-like logits: a Gaussian bulk (sd 2.5, mean -2), a Zipf-shaped head
/// of likely tokens, one dominant token.
fn llm_row(rng: &mut Rng, v: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..v).map(|_| (2.5 * rng.normal() - 2.0) as f32).collect();
    for r in 1..=64usize {
        let j = (rng.next() % v as u64) as usize;
        x[j] = (18.0 - 3.0 * (r as f64).ln()) as f32;
    }
    x[(rng.next() % v as u64) as usize] = 22.0;
    x
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rows = args
        .iter()
        .position(|a| a == "--rows")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(2usize);
    let v = 152_064usize;
    let mut rng = Rng(0x5EED_1234_ABCD_0001);
    let data: Vec<f32> = (0..rows).flat_map(|_| llm_row(&mut rng, v)).collect();
    let x32 = Array2::from_shape_vec((rows, v), data).unwrap();
    let xb = x32.mapv(bf16::from_f32);
    let tokens = Array1::from_iter((0..rows).map(|r| ((r * 7919) % v) as i64));
    let g = Array1::from_elem(rows, -1.0);
    let h = Array1::from_elem(rows, 0.25);
    let oracle = Oracle::default();
    println!(
        "oracle_bench: {rows} rows x V = {v}, threads = {}",
        rayon::current_num_threads()
    );
    for (name, logits) in [
        ("f32 logits", Logits::F32(x32.view())),
        ("bf16 logits", Logits::Bf16(xb.view())),
    ] {
        let mut p = Problem::new(logits);
        p.tokens = Some(tokens.view());
        for target in [Dtype::F32, Dtype::Bf16] {
            let t0 = Instant::now();
            let f = oracle.forward(&p, target).unwrap();
            let fwd = t0.elapsed().as_secs_f64();
            let undecided = f
                .entropy
                .as_ref()
                .unwrap()
                .iter()
                .filter(|e| !e.decided)
                .count();
            let cot = Cotangents {
                grad_log_probs: Some(g.view()),
                grad_entropy: Some(h.view()),
                grad_topk_log_probs: None,
            };
            let t0 = Instant::now();
            let grad = oracle.vjp(&p, &cot, target).unwrap();
            let bwd = t0.elapsed().as_secs_f64();
            let und_g = grad.iter().filter(|e| !e.decided).count();
            let per = |s: f64| s * 1e9 / (rows * v) as f64;
            println!(
                "{name:11} -> {target:4}: forward (log-prob + entropy) {:7.1} ns/entry, VJP {:7.1} ns/entry (wall, all threads; undecided: {undecided} fwd, {und_g} grad)",
                per(fwd),
                per(bwd)
            );
        }
    }
}
