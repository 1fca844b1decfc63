//! Cost of the exact oracle per vocabulary entry on an LLM-like row
//! (V = 152064, Qwen2's padded vocabulary), for f32 and bf16 targets:
//! forward (log-prob + entropy) and VJP (log-prob and entropy cotangents),
//! the certified f64 tier (default) and the MPFR path side by side in one
//! run, with the fallback counts (outputs and rows MPFR decided).
//!
//! Run: `RAYON_NUM_THREADS=1 cargo run --release -p logprobe-reference
//! --example oracle_bench` (`-- --rows N` for more rows, `--fast-only` to
//! skip the MPFR runs).

use std::time::Instant;

use half::bf16;
use logprobe_reference::oracle::fast::{FastOptions, FastRow, RowCotangents};
use logprobe_reference::oracle::{Oracle, Tier};
use logprobe_reference::spec::{Cotangents, Dtype, EntropyLogits, Logits, Output, Problem};
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

/// CPU seconds used so far by this process, all threads (from
/// `/proc/self/task/*/schedstat`, nanoseconds on the CPU); `None` off Linux.
fn cpu_seconds() -> Option<f64> {
    let mut ns = 0u64;
    for t in std::fs::read_dir("/proc/self/task").ok()? {
        let s = std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok()?;
        ns += s.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(ns as f64 * 1e-9)
}

/// `(wall, cpu)` seconds of `f`.
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64, f64) {
    let (c0, t0) = (cpu_seconds(), Instant::now());
    let out = f();
    let wall = t0.elapsed().as_secs_f64();
    let cpu = match (c0, cpu_seconds()) {
        (Some(a), Some(b)) => b - a,
        _ => f64::NAN,
    };
    (out, wall, cpu)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rows = args
        .iter()
        .position(|a| a == "--rows")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(2usize);
    // `--fast-only`: skip the MPFR runs (for profiling the f64 tier).
    let fast_only = args.iter().any(|a| a == "--fast-only");
    let v = 152_064usize;
    let mut rng = Rng(0x5EED_1234_ABCD_0001);
    let data: Vec<f32> = (0..rows).flat_map(|_| llm_row(&mut rng, v)).collect();
    let x32 = Array2::from_shape_vec((rows, v), data).unwrap();
    let xb = x32.mapv(bf16::from_f32);
    let tokens = Array1::from_iter((0..rows).map(|r| ((r * 7919) % v) as i64));
    let g = Array1::from_elem(rows, -1.0);
    let h = Array1::from_elem(rows, 0.25);
    let fast = Oracle {
        tier: Tier::FastVjp,
        ..Oracle::default()
    };
    let mpfr = Oracle {
        tier: Tier::Mpfr,
        ..Oracle::default()
    };
    println!(
        "oracle_bench: {rows} rows x V = {v}, threads = {} (ns/entry in CPU time, all threads; wall in parentheses)",
        rayon::current_num_threads()
    );
    let per = |s: f64| s * 1e9 / (rows * v) as f64;
    for (name, logits) in [
        ("f32 logits", Logits::F32(x32.view())),
        ("bf16 logits", Logits::Bf16(xb.view())),
    ] {
        let mut p = Problem::new(logits);
        p.tokens = Some(tokens.view());
        let cot = Cotangents::default()
            .with_column(Output::LogProbs, g.view())
            .with_column(Output::Entropy, h.view());
        for target in [Dtype::F32, Dtype::Bf16] {
            let mut line = format!("{name:11} -> {target:4}:");
            let mut firsts = Vec::new();
            let tiers: &[(&str, &Oracle)] = if fast_only {
                &[("fast", &fast)]
            } else {
                &[("fast", &fast), ("mpfr", &mpfr)]
            };
            for &(tier, oracle) in tiers {
                let (f, fwd_wall, fwd) = timed(|| oracle.forward(&p, target).unwrap());
                let ((grad, fb_g), bwd_wall, bwd) =
                    timed(|| oracle.vjp_counted(&p, &cot, target).unwrap());
                let undecided = f.values[Output::Entropy]
                    .iter()
                    .filter(|e| !e.decided)
                    .count()
                    + grad.iter().filter(|e| !e.decided).count();
                line += &format!(
                    " {tier}: forward {:8.1} ns/entry (wall {:.1}), VJP {:8.1} ns/entry (wall {:.1}) (MPFR decided {}/{} forward outputs in {}/{} rows, {}/{} grad elements in {}/{} rows; undecided {undecided});",
                    per(fwd),
                    per(fwd_wall),
                    per(bwd),
                    per(bwd_wall),
                    f.fallback.outputs_mpfr,
                    f.fallback.outputs,
                    f.fallback.rows_mpfr,
                    f.fallback.rows,
                    fb_g.outputs_mpfr,
                    fb_g.outputs,
                    fb_g.rows_mpfr,
                    fb_g.rows,
                );
                firsts.push((fwd, bwd));
            }
            if firsts.len() == 2 {
                line += &format!(
                    " speed-up forward {:.0}x, VJP {:.0}x",
                    firsts[1].0 / firsts[0].0,
                    firsts[1].1 / firsts[0].1
                );
            }
            println!("{line}");
        }
        // The prepared pass alone (what `logprobe verify` will call per row):
        // exps, sums, statistics inputs and per-entry cache, then every VJP
        // element decided in f32.
        let opts = FastOptions {
            entropy: Some(EntropyLogits::Unmasked),
            per_entry: true,
            ..Default::default()
        };
        let (decided, _, t) = timed(|| {
            let mut decided = 0usize;
            for r in 0..rows {
                let row = FastRow::new(&p, r, opts).unwrap();
                let fv = row.vjp(&RowCotangents {
                    g: -1.0,
                    h: 0.25,
                    topk: &[],
                    ..Default::default()
                });
                decided += fv
                    .decide_row(Dtype::F32)
                    .iter()
                    .filter(|e| e.is_some())
                    .count();
            }
            decided
        });
        let fwd_opts = FastOptions {
            per_entry: false,
            ..opts
        };
        let (_, _, tf) = timed(|| {
            for r in 0..rows {
                let row = FastRow::new(&p, r, fwd_opts).unwrap();
                std::hint::black_box(row.forward(Dtype::F32));
            }
        });
        println!(
            "{name:11}: FastRow pass + forward {:6.1} ns/entry; pass + VJP decided in f32 {:6.1} ns/entry ({decided}/{} elements decided)",
            per(tf),
            per(t),
            rows * v
        );
    }
}
