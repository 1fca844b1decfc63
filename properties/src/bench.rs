//! `logprobe bench`: throughput and memory of the CPU kernels as ratios
//! measured in one run (DESIGN "Performance targets"), on logits `[N, V]`
//! (default `N = 64`, `V = 152064`, Qwen2's padded vocabulary) in f32 and
//! bf16.
//!
//! Measured, per logits dtype:
//! - the read roofline: a plain sum over the same `[N, V]` buffer on every
//!   thread of the pool (contiguous parts, 64 f32 lanes in 4 registers so
//!   the adds never limit it; AVX-512 / AVX2 when the CPU has them, as the
//!   kernels), best of `reps`;
//! - the fused forward (log-probs + entropy, and log-probs only), the chunked
//!   forward and the vocab-parallel forward, each as GB/s of logits
//!   read (`N V b` bytes per call, `b` the element size), as a fraction of
//!   the roofline, and as core cycles per entry (clock x threads x time /
//!   `N V`, the clock estimated by a chain of dependent integer adds);
//! - the read + write roofline (the logits copied into a reused `[N, V]`
//!   buffer of their dtype, one contiguous part per thread) and the fused
//!   backward (log-prob and entropy cotangents) into a reused `[N, V]`
//!   gradient of the logits' dtype, and through [`Kernel::backward`] (a
//!   fresh f64 `[N, V]`, page faults included), each as GB/s read and
//!   written, as a fraction of that roofline and in cycles per entry;
//! - candle's composed path (`max -> sub -> exp -> sum -> log -> sub`, then
//!   a gather, on a `Tensor` the caller holds: what candle users run), and
//!   the ratio of its time to the fused forward's;
//! - peak extra memory of the fused and chunked forward (outputs excluded),
//!   counted by [`logprobe_testkit::memory::CountingAllocator`] when it is the binary's
//!   global allocator (the `logprobe` binary installs it: a few relaxed
//!   atomics per allocation, nothing per entry), else `None` and only the
//!   kernels' declared `workspace_bytes`;
//! - the oracle's cost per vocabulary entry on one LLM-like row (f32 and
//!   bf16 logits, f32 and bf16 targets, forward = log-prob + entropy, VJP =
//!   log-prob and entropy cotangents), on one thread.
//!
//! Every time is the best (and the median) of `reps` calls after one warm-up
//! call; beside it, the fewest CPU seconds a call took (all the process's
//! threads, preemption excluded: on a loaded machine the on-CPU cycles are
//! the steadier figure at one thread). Nothing here asserts a timing: the targets table says whether each
//! ratio meets DESIGN's target, for a human to read.

use std::time::Instant;

use candle_core::{Device, Tensor};
use half::bf16;
use ndarray::{Array1, Array2};
use rayon::prelude::*;
use serde::Serialize;

use logprobe_kernels::candle::candle_log_softmax;
use logprobe_kernels::{cpu_path, CpuKernel, GradElement, Kernel};
use logprobe_reference::oracle::Oracle;
use logprobe_reference::spec::{Cotangents, Dtype, EntropyLogits, Logits, Options, Problem};
use logprobe_reference::splitmix::SplitMix64;

use logprobe_testkit::memory::{allocator_installed, budget, peak_extra};

/// What `logprobe bench` measures and how often.
#[derive(Clone, Debug, Serialize)]
pub struct BenchConfig {
    /// Rows `N`.
    pub n: usize,
    /// Vocabulary size `V` (columns).
    pub v: usize,
    /// Timed calls per path (after one warm-up call); best and median reported.
    pub reps: usize,
    /// `chunk_size` of the chunked kernel.
    pub chunk_size: usize,
    /// Vocabulary shards of the vocab-parallel kernel (uneven widths).
    pub shards: usize,
    /// Worker threads (`None`: rayon's default, one per core).
    pub threads: Option<usize>,
    /// Columns of the oracle's row (0: skip the oracle).
    pub oracle_v: usize,
    /// Timed oracle calls per figure (no warm-up: one call is long).
    pub oracle_reps: usize,
    /// Time candle's composed path.
    pub candle: bool,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            n: 64,
            v: 152_064,
            reps: 10,
            chunk_size: 16,
            shards: 4,
            threads: None,
            oracle_v: 152_064,
            oracle_reps: 1,
            candle: true,
        }
    }
}

/// Errors of a bench run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A configuration that cannot run (`N`, `V`, `reps`, `shards` or `chunk_size` zero).
    #[error("bad bench configuration: {0}")]
    Config(String),
    /// A kernel refused or failed (a bug: the inputs are valid).
    #[error("kernel {kernel}: {message}")]
    Kernel {
        /// Kernel name.
        kernel: String,
        /// Its error.
        message: String,
    },
    /// The rayon pool could not be built.
    #[error("thread pool: {0}")]
    Pool(String),
}

/// Machine facts of the run.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    /// `model name` from `/proc/cpuinfo` (`None` elsewhere).
    pub cpu_model: Option<String>,
    /// Threads of the pool the kernels and the roofline ran on.
    pub threads: usize,
    /// The kernels' block-loop path ([`cpu_path`]).
    pub cpu_path: &'static str,
    /// Core clock estimated from a chain of dependent integer adds (GHz),
    /// x86_64 only.
    pub clock_ghz: Option<f64>,
    /// 1-minute load average at the start (`/proc/loadavg`), when readable.
    pub load_average: Option<f64>,
}

/// Best and median seconds of the timed calls.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Timing {
    /// Fastest call (s).
    pub best_s: f64,
    /// Median call (s).
    pub median_s: f64,
    /// Fewest CPU seconds one call took, summed over the process's threads
    /// (preemption excluded; with more than one thread it includes rayon's
    /// idle spinning). `None` where unavailable.
    pub best_on_cpu_s: Option<f64>,
}

/// One timed path.
#[derive(Clone, Debug, Serialize)]
pub struct PathResult {
    /// What ran (`roofline`, `fused forward (log_prob + entropy)`, ...).
    pub path: String,
    /// Logits dtype (`f32`, `bf16`).
    pub dtype: &'static str,
    /// Bytes per call: logits read (`N V b`), plus the output written for
    /// the backward paths and the read + write roofline.
    pub bytes: usize,
    /// Times.
    pub timing: Timing,
    /// `bytes / best_s` in GB/s (1e9 bytes).
    pub gb_per_s: f64,
    /// `gb_per_s` over the roofline of the same dtype (read + write for
    /// the backward paths, read for the others).
    pub fraction_of_roofline: f64,
    /// Core cycles per logit: `clock x threads x best_s / (N V)` (`None`
    /// without a clock estimate; for a single-threaded path, threads = 1).
    pub cycles_per_entry: Option<f64>,
    /// Core cycles per logit on CPU: `clock x best_on_cpu_s / (N V)`, all
    /// threads together (`None` without a clock estimate or CPU time).
    pub cycles_per_entry_on_cpu: Option<f64>,
    /// Threads the path ran on.
    pub threads: usize,
}

/// Peak extra memory of one forward call.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryResult {
    /// Kernel name.
    pub kernel: String,
    /// Logits dtype.
    pub dtype: &'static str,
    /// Measured peak of live heap bytes above the start, outputs excluded
    /// (`None`: the counting allocator is not installed).
    pub peak_extra_bytes: Option<usize>,
    /// The kernel's declared [`Kernel::workspace_bytes`].
    pub workspace_bytes: usize,
    /// DESIGN's budget: `2 * chunk_size * V * 4` for chunked (0 for fused)
    /// plus the `O(N)` and constant allowances of [`budget`].
    pub budget_bytes: usize,
    /// `N V 4`: what a materialised f32 `[N, V]` buffer would take.
    pub materialised_bytes: usize,
}

/// The oracle's cost on one row.
#[derive(Clone, Debug, Serialize)]
pub struct OracleResult {
    /// Logits dtype.
    pub logits: &'static str,
    /// Target dtype of the rounded results.
    pub target: &'static str,
    /// Columns of the row.
    pub v: usize,
    /// Forward (log-prob + entropy), ns per vocabulary entry, best call.
    pub forward_ns_per_entry: f64,
    /// VJP (log-prob and entropy cotangents), ns per entry, best call.
    pub vjp_ns_per_entry: f64,
}

/// One DESIGN target and whether this run meets it.
#[derive(Clone, Debug, Serialize)]
pub struct TargetResult {
    /// The target in words.
    pub target: String,
    /// The measured ratio or figure.
    pub measured: f64,
    /// The threshold.
    pub threshold: f64,
    /// `measured >= threshold` (or `<=`, per target); `None` when not measured.
    pub met: Option<bool>,
}

/// Everything one `logprobe bench` run measured.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// The configuration.
    pub config: BenchConfig,
    /// The machine.
    pub machine: Machine,
    /// Timed paths, roofline first per dtype.
    pub paths: Vec<PathResult>,
    /// Speedups of the fused forward over candle's composed path (time ratios).
    pub candle_ratios: Vec<CandleRatio>,
    /// Peak extra memory.
    pub memory: Vec<MemoryResult>,
    /// Whether `peak_extra_bytes` was measured (counting allocator installed).
    pub memory_counted: bool,
    /// The oracle.
    pub oracle: Vec<OracleResult>,
    /// DESIGN's targets.
    pub targets: Vec<TargetResult>,
}

/// `candle composed time / fused time` for one dtype.
#[derive(Clone, Debug, Serialize)]
pub struct CandleRatio {
    /// Logits dtype.
    pub dtype: &'static str,
    /// Over the fused forward with log-probs only (the same outputs as candle's).
    pub fused_log_prob_speedup: f64,
    /// Over the fused forward with log-probs and entropy (more outputs).
    pub fused_with_entropy_speedup: f64,
}

/// Best and median of `reps` calls of `f` after one warm-up call.
fn time(reps: usize, mut f: impl FnMut()) -> Timing {
    f();
    let (mut t, mut cpu): (Vec<f64>, Vec<f64>) = (0..reps.max(1))
        .map(|_| {
            let (s, c) = (Instant::now(), process_cpu_s());
            f();
            let wall = s.elapsed().as_secs_f64();
            (
                wall,
                process_cpu_s().zip(c).map_or(f64::NAN, |(b, a)| b - a),
            )
        })
        .unzip();
    t.sort_by(f64::total_cmp);
    cpu.sort_by(f64::total_cmp);
    Timing {
        best_s: t[0],
        median_s: t[t.len() / 2],
        best_on_cpu_s: cpu[0].is_finite().then_some(cpu[0]),
    }
}

/// CPU seconds consumed so far by every thread of this process
/// (`CLOCK_PROCESS_CPUTIME_ID`; `None` where unavailable). Unlike wall
/// time it excludes time spent preempted by other processes.
fn process_cpu_s() -> Option<f64> {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
        (rc == 0).then_some(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9)
    }
    #[cfg(not(unix))]
    None
}

/// Sum of `x` widened by `w`: 64 independent f32 lanes (4 AVX-512
/// registers, so the adds overlap and only the loads limit it).
#[inline(always)]
fn sum_body<T: Copy>(x: &[T], w: impl Fn(T) -> f32) -> f32 {
    let mut acc = [0f32; 64];
    let mut it = x.chunks_exact(64);
    for c in &mut it {
        for l in 0..64 {
            acc[l] += w(c[l]);
        }
    }
    let s: f32 = it.remainder().iter().map(|&v| w(v)).sum();
    s + acc.iter().sum::<f32>()
}

fn widen_bf16(v: bf16) -> f32 {
    f32::from_bits((v.to_bits() as u32) << 16)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,avx")]
unsafe fn sum_f32_avx512(x: &[f32]) -> f32 {
    sum_body(x, |v| v)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,avx")]
unsafe fn sum_bf16_avx512(x: &[bf16]) -> f32 {
    sum_body(x, widen_bf16)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx")]
unsafe fn sum_f32_avx2(x: &[f32]) -> f32 {
    sum_body(x, |v| v)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx")]
unsafe fn sum_bf16_avx2(x: &[bf16]) -> f32 {
    sum_body(x, widen_bf16)
}

fn sum_f32(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if cpu_path() == "avx512" {
            // SAFETY: the kernels' path detection found AVX-512F/BW.
            return unsafe { sum_f32_avx512(x) };
        }
        if cpu_path() == "avx2" {
            // SAFETY: AVX2 detected as above.
            return unsafe { sum_f32_avx2(x) };
        }
    }
    sum_body(x, |v| v)
}

fn sum_bf16(x: &[bf16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if cpu_path() == "avx512" {
            // SAFETY: the kernels' path detection found AVX-512F/BW.
            return unsafe { sum_bf16_avx512(x) };
        }
        if cpu_path() == "avx2" {
            // SAFETY: AVX2 detected as above.
            return unsafe { sum_bf16_avx2(x) };
        }
    }
    sum_body(x, widen_bf16)
}

/// The read roofline: `x` cut into one contiguous part per thread, each
/// summed by [`sum_body`].
fn read_sum<T: Copy + Sync>(x: &[T], threads: usize, sum: fn(&[T]) -> f32) -> f32 {
    let part = x.len().div_ceil(threads.max(1)).max(1);
    x.par_chunks(part).map(sum).sum()
}

/// The read + write roofline: `src` copied into `dst` (same length, already
/// touched: no page faults), one contiguous part per thread.
fn read_write<T: Copy + Send + Sync>(src: &[T], dst: &mut [T], threads: usize) {
    let part = src.len().div_ceil(threads.max(1)).max(1);
    dst.par_chunks_mut(part)
        .zip(src.par_chunks(part))
        .for_each(|(d, s)| d.copy_from_slice(s));
    std::hint::black_box(dst);
}

/// The fused backward into a reused `[N, V]` gradient of `G` (the logits'
/// dtype: f32 or bf16), timed as [`time`] does.
fn backward_into<G: GradElement>(
    p: &Problem<'_>,
    cot: &Cotangents<'_>,
    reps: usize,
) -> Result<Timing, BenchError> {
    let (n, v) = p.logits.dim();
    let mut grad = Array2::from_elem((n, v), G::from_f32(0.0));
    let fused = CpuKernel::fused();
    let run = |g: &mut Array2<G>| fused.backward_into(p, cot, g.view_mut());
    run(&mut grad).map_err(|e| kernel_err(&fused, e))?;
    Ok(time(reps, || {
        std::hint::black_box(run(&mut grad).ok());
    }))
}

/// Core clock in GHz from 10^7 dependent register-register integer adds
/// (1 cycle each on every x86_64 core), best of 30 runs (short runs dodge
/// preemption). Not `add reg, imm`: Golden Cove and later Intel cores
/// execute chains of immediate adds at several per cycle (measured 11 GHz
/// on a ~2.9 GHz Xeon).
#[cfg(target_arch = "x86_64")]
fn clock_ghz() -> Option<f64> {
    const PER: u64 = 100;
    const ITERS: u64 = 100_000;
    let one = std::hint::black_box(1u64);
    let best = (0..30)
        .map(|_| {
            let mut x = 0u64;
            let t = Instant::now();
            for _ in 0..ITERS {
                // SAFETY: register arithmetic only.
                unsafe {
                    std::arch::asm!(
                        ".rept 100",
                        "add {0}, {1}",
                        ".endr",
                        inout(reg) x,
                        in(reg) one,
                        options(nomem, nostack)
                    );
                }
                x = std::hint::black_box(x);
            }
            std::hint::black_box(x);
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    Some((ITERS * PER) as f64 / best / 1e9)
}

#[cfg(not(target_arch = "x86_64"))]
fn clock_ghz() -> Option<f64> {
    None
}

fn cpu_model() -> Option<String> {
    let s = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    s.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|m| m.trim().to_string())
}

fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// LLM-like logits `[n, v]`: a Gaussian bulk (sd 2.5, mean -2), a head of
/// 64 likely tokens (Zipf-shaped logits 18 - 3 ln r) and one dominant token
/// (22) per row.
fn llm_logits(n: usize, v: usize, seed: u64) -> Array2<f32> {
    let mut rng = SplitMix64::new(seed);
    let mut x = Array2::from_shape_simple_fn((n, v), || (2.5 * rng.normal() - 2.0) as f32);
    for mut row in x.rows_mut() {
        for r in 1..=64usize.min(v) {
            let j = rng.below(v);
            row[j] = (18.0 - 3.0 * (r as f64).ln()) as f32;
        }
        let j = rng.below(v);
        row[j] = 22.0;
    }
    x
}

/// Uneven shard widths summing to `v`: shard `k` of `K` gets `v / K`
/// shifted by `(k - K/2) * v / (8 K)`, the last takes the rest.
pub fn uneven_shards(v: usize, k: usize) -> Vec<usize> {
    let k = k.max(1);
    let base = v / k;
    let step = v / (8 * k);
    let mut widths: Vec<usize> = (0..k - 1)
        .map(|i| (base + i * step).saturating_sub(k / 2 * step).min(v))
        .collect();
    let used: usize = widths.iter().sum();
    if used > v {
        widths = vec![v / k; k - 1];
    }
    let used: usize = widths.iter().sum();
    widths.push(v - used);
    widths
}

fn kernel_err(kernel: &dyn Kernel, e: impl std::fmt::Display) -> BenchError {
    BenchError::Kernel {
        kernel: kernel.name(),
        message: e.to_string(),
    }
}

fn candle_err(e: candle_core::Error) -> BenchError {
    BenchError::Kernel {
        kernel: "candle composed".into(),
        message: e.to_string(),
    }
}

/// Runs the whole benchmark (see the module docs) on a pool of
/// `config.threads` threads (rayon's default when `None`).
///
/// # Errors
/// [`BenchError::Config`] for a zero `n`, `v`, `reps`, `shards` or
/// `chunk_size`; [`BenchError::Pool`]; [`BenchError::Kernel`] if a kernel
/// fails on the (valid) inputs.
pub fn run(config: &BenchConfig) -> Result<BenchReport, BenchError> {
    for (name, val) in [
        ("n", config.n),
        ("v", config.v),
        ("reps", config.reps),
        ("shards", config.shards),
        ("chunk_size", config.chunk_size),
    ] {
        if val == 0 {
            return Err(BenchError::Config(format!("{name} must be at least 1")));
        }
    }
    if config.shards > config.v {
        return Err(BenchError::Config(format!(
            "shards ({}) must not exceed v ({})",
            config.shards, config.v
        )));
    }
    let mut b = rayon::ThreadPoolBuilder::new();
    if let Some(t) = config.threads {
        b = b.num_threads(t);
    }
    let pool = b.build().map_err(|e| BenchError::Pool(e.to_string()))?;
    pool.install(|| run_in_pool(config))
}

fn run_in_pool(config: &BenchConfig) -> Result<BenchReport, BenchError> {
    let (n, v) = (config.n, config.v);
    let threads = rayon::current_num_threads();
    let load = load_average();
    let clock = clock_ghz();
    let machine = Machine {
        cpu_model: cpu_model(),
        threads,
        cpu_path: cpu_path(),
        clock_ghz: clock,
        load_average: load,
    };
    let x32 = llm_logits(n, v, 0x5eed);
    let xb = x32.mapv(bf16::from_f32);
    let tokens = Array1::from_shape_fn(n, |i| ((i as u64 * 2_654_435_761) % v as u64) as i64);
    let g = Array1::from_elem(n, -1.0);
    let h = Array1::from_elem(n, 0.25);
    let cot = Cotangents {
        grad_log_probs: Some(g.view()),
        grad_entropy: Some(h.view()),
        grad_topk_log_probs: None,
    };
    let with_entropy = Options {
        entropy: Some(EntropyLogits::Unmasked),
        ..Options::default()
    };
    let lp_only = Options {
        entropy: None,
        ..Options::default()
    };
    let chunked = CpuKernel::chunked(config.chunk_size);
    let vp = CpuKernel::vocab_parallel(uneven_shards(v, config.shards));
    let entries = (n * v) as f64;

    let mut paths = Vec::new();
    let mut candle_ratios = Vec::new();
    let mut memory = Vec::new();
    let memory_counted = allocator_installed();
    for (name, logits, b) in [
        ("f32", Logits::F32(x32.view()), 4usize),
        ("bf16", Logits::Bf16(xb.view()), 2usize),
    ] {
        let bytes = n * v * b;
        let problem = |options: Options| Problem {
            tokens: Some(tokens.view()),
            options,
            ..Problem::new(logits)
        };
        let p_ent = problem(with_entropy);
        let p_lp = problem(lp_only);
        let mut timed: Vec<(String, Timing, usize)> = Vec::new();
        let roof = match logits {
            Logits::Bf16(x) => {
                let s = x.as_slice().expect("fresh array is contiguous");
                time(config.reps, || {
                    std::hint::black_box(read_sum(s, threads, sum_bf16));
                })
            }
            _ => {
                let s = x32.as_slice().expect("fresh array is contiguous");
                time(config.reps, || {
                    std::hint::black_box(read_sum(s, threads, sum_f32));
                })
            }
        };
        timed.push(("roofline (read sum)".into(), roof, threads));
        let fwd = |k: &dyn Kernel, p: &Problem<'_>| -> Result<Timing, BenchError> {
            k.forward(p, Dtype::F32).map_err(|e| kernel_err(k, e))?;
            Ok(time(config.reps, || {
                std::hint::black_box(k.forward(p, Dtype::F32).ok());
            }))
        };
        let t_fused = fwd(&CpuKernel::fused(), &p_ent)?;
        let t_fused_lp = fwd(&CpuKernel::fused(), &p_lp)?;
        timed.push((
            "fused forward (log_prob + entropy)".into(),
            t_fused,
            threads,
        ));
        timed.push(("fused forward (log_prob)".into(), t_fused_lp, threads));
        timed.push((
            format!("chunked forward (chunk_size = {})", config.chunk_size),
            fwd(&chunked, &p_ent)?,
            threads,
        ));
        timed.push((
            format!("vocab-parallel forward ({} shards)", config.shards),
            fwd(&vp, &p_ent)?,
            threads,
        ));
        // Backward paths, against the read + write roofline: (path, time,
        // threads, bytes read + written per call).
        let mut timed_rw: Vec<(String, Timing, usize, usize)> = Vec::new();
        let (rw, t_into) = match logits {
            Logits::Bf16(x) => {
                let s = x.as_slice().expect("fresh array is contiguous");
                let mut dst = vec![bf16::ZERO; n * v];
                let rw = time(config.reps, || read_write(s, &mut dst, threads));
                (rw, backward_into::<bf16>(&p_ent, &cot, config.reps)?)
            }
            _ => {
                let s = x32.as_slice().expect("fresh array is contiguous");
                let mut dst = vec![0f32; n * v];
                let rw = time(config.reps, || read_write(s, &mut dst, threads));
                (rw, backward_into::<f32>(&p_ent, &cot, config.reps)?)
            }
        };
        timed_rw.push((
            "roofline (read + write, reused buffer)".into(),
            rw,
            threads,
            2 * bytes,
        ));
        timed_rw.push((
            format!("fused backward ({name} out, reused buffer)"),
            t_into,
            threads,
            2 * bytes,
        ));
        CpuKernel::fused()
            .backward(&p_ent, &cot, Dtype::F32)
            .map_err(|e| kernel_err(&CpuKernel::fused(), e))?;
        timed_rw.push((
            "fused backward (f64 [N, V] out, fresh)".into(),
            time(config.reps, || {
                std::hint::black_box(CpuKernel::fused().backward(&p_ent, &cot, Dtype::F32).ok());
            }),
            threads,
            bytes + n * v * 8,
        ));
        if config.candle {
            let dev = Device::Cpu;
            let t = match logits {
                Logits::Bf16(x) => Tensor::from_slice(
                    x.as_slice().expect("fresh array is contiguous"),
                    (n, v),
                    &dev,
                ),
                _ => Tensor::from_slice(
                    x32.as_slice().expect("fresh array is contiguous"),
                    (n, v),
                    &dev,
                ),
            }
            .map_err(candle_err)?;
            let idx = Tensor::from_slice(tokens.as_slice().expect("contiguous"), (n, 1), &dev)
                .map_err(candle_err)?;
            let composed = || -> candle_core::Result<Vec<f32>> {
                candle_log_softmax(&t)?
                    .gather(&idx, 1)?
                    .to_dtype(candle_core::DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()
            };
            composed().map_err(candle_err)?;
            let tc = time(config.reps, || {
                std::hint::black_box(composed().ok());
            });
            // candle-core's CPU unary and reduce ops run on the calling thread.
            timed.push(("candle composed (log_prob)".into(), tc, 1));
            candle_ratios.push(CandleRatio {
                dtype: name,
                fused_log_prob_speedup: tc.best_s / t_fused_lp.best_s,
                fused_with_entropy_speedup: tc.best_s / t_fused.best_s,
            });
        }
        let roof_gbs = bytes as f64 / roof.best_s / 1e9;
        for (path, timing, th) in timed {
            let gbs = bytes as f64 / timing.best_s / 1e9;
            paths.push(PathResult {
                path,
                dtype: name,
                bytes,
                timing,
                gb_per_s: gbs,
                fraction_of_roofline: gbs / roof_gbs,
                cycles_per_entry: clock.map(|c| c * 1e9 * th as f64 * timing.best_s / entries),
                cycles_per_entry_on_cpu: clock
                    .zip(timing.best_on_cpu_s)
                    .map(|(c, t)| c * 1e9 * t / entries),
                threads: th,
            });
        }
        let rw_gbs = 2.0 * bytes as f64 / rw.best_s / 1e9;
        for (path, timing, th, moved) in timed_rw {
            let gbs = moved as f64 / timing.best_s / 1e9;
            paths.push(PathResult {
                path,
                dtype: name,
                bytes: moved,
                timing,
                gb_per_s: gbs,
                fraction_of_roofline: gbs / rw_gbs,
                cycles_per_entry: clock.map(|c| c * 1e9 * th as f64 * timing.best_s / entries),
                cycles_per_entry_on_cpu: clock
                    .zip(timing.best_on_cpu_s)
                    .map(|(c, t)| c * 1e9 * t / entries),
                threads: th,
            });
        }
        let shape = p_ent
            .validate_shapes()
            .map_err(|e| kernel_err(&CpuKernel::fused(), e))?;
        for (k, chunk) in [
            (&CpuKernel::fused() as &dyn Kernel, None),
            (&chunked as &dyn Kernel, Some(config.chunk_size)),
        ] {
            let peak = if memory_counted {
                Some(
                    peak_extra(k, &p_ent, None, Dtype::F32)
                        .map_err(|e| kernel_err(k, e))?
                        .0,
                )
            } else {
                None
            };
            memory.push(MemoryResult {
                kernel: k.name(),
                dtype: name,
                peak_extra_bytes: peak,
                workspace_bytes: k.workspace_bytes(&shape),
                budget_bytes: budget(chunk, n, v, 0),
                materialised_bytes: n * v * 4,
            });
        }
    }
    let oracle = if config.oracle_v > 0 {
        oracle_costs(config.oracle_v, config.oracle_reps)?
    } else {
        Vec::new()
    };
    let targets = targets(&paths, &candle_ratios, &memory, &oracle);
    Ok(BenchReport {
        config: config.clone(),
        machine,
        paths,
        candle_ratios,
        memory,
        memory_counted,
        oracle,
        targets,
    })
}

/// The oracle's ns per entry on one LLM-like row of `v` columns, on one
/// thread, best of `reps` calls.
fn oracle_costs(v: usize, reps: usize) -> Result<Vec<OracleResult>, BenchError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .map_err(|e| BenchError::Pool(e.to_string()))?;
    let x32 = llm_logits(1, v, 0x000a_11ce);
    let xb = x32.mapv(bf16::from_f32);
    let tokens = Array1::from_elem(1, (v / 3) as i64);
    let (g, h) = (Array1::from_elem(1, -1.0), Array1::from_elem(1, 0.25));
    let cot = Cotangents {
        grad_log_probs: Some(g.view()),
        grad_entropy: Some(h.view()),
        grad_topk_log_probs: None,
    };
    let oracle = Oracle::default();
    let err = |e: logprobe_reference::spec::SpecError| BenchError::Kernel {
        kernel: "oracle".into(),
        message: e.to_string(),
    };
    let mut out = Vec::new();
    for (name, logits) in [
        ("f32", Logits::F32(x32.view())),
        ("bf16", Logits::Bf16(xb.view())),
    ] {
        let p = Problem {
            tokens: Some(tokens.view()),
            ..Problem::new(logits)
        };
        for target in [Dtype::F32, Dtype::Bf16] {
            let (mut f, mut b) = (f64::INFINITY, f64::INFINITY);
            for _ in 0..reps.max(1) {
                let t = Instant::now();
                pool.install(|| oracle.forward(&p, target)).map_err(err)?;
                f = f.min(t.elapsed().as_secs_f64());
                let t = Instant::now();
                pool.install(|| oracle.vjp(&p, &cot, target)).map_err(err)?;
                b = b.min(t.elapsed().as_secs_f64());
            }
            out.push(OracleResult {
                logits: name,
                target: target.name(),
                v,
                forward_ns_per_entry: f * 1e9 / v as f64,
                vjp_ns_per_entry: b * 1e9 / v as f64,
            });
        }
    }
    Ok(out)
}

fn targets(
    paths: &[PathResult],
    candle: &[CandleRatio],
    memory: &[MemoryResult],
    oracle: &[OracleResult],
) -> Vec<TargetResult> {
    let mut t = Vec::new();
    let at_least = |target: String, measured: f64, threshold: f64| TargetResult {
        target,
        measured,
        threshold,
        met: Some(measured >= threshold),
    };
    let at_most = |target: String, measured: f64, threshold: f64| TargetResult {
        target,
        measured,
        threshold,
        met: Some(measured <= threshold),
    };
    if let Some(p) = paths
        .iter()
        .find(|p| p.dtype == "f32" && p.path == "fused forward (log_prob + entropy)")
    {
        t.push(at_least(
            "fused f32 forward (log_prob + entropy) / read roofline".into(),
            p.fraction_of_roofline,
            0.75,
        ));
    }
    for (dtype, path) in [
        ("f32", "fused backward (f32 out, reused buffer)"),
        ("bf16", "fused backward (bf16 out, reused buffer)"),
    ] {
        if let Some(p) = paths.iter().find(|p| p.dtype == dtype && p.path == path) {
            for (what, c) in [
                ("wall", p.cycles_per_entry),
                ("on CPU", p.cycles_per_entry_on_cpu),
            ] {
                if let Some(c) = c {
                    t.push(at_most(
                        format!("backward {dtype} -> {dtype} (reused buffer) cycles/entry, {what}"),
                        c,
                        4.0,
                    ));
                }
            }
        }
    }
    if let Some(c) = candle.iter().find(|c| c.dtype == "f32") {
        t.push(at_least(
            "fused f32 forward (log_prob) speedup over candle composed f32".into(),
            c.fused_log_prob_speedup,
            5.0,
        ));
    }
    for m in memory {
        if let Some(peak) = m.peak_extra_bytes {
            t.push(at_most(
                format!(
                    "{} {} forward peak extra memory / budget",
                    m.kernel, m.dtype
                ),
                peak as f64 / m.budget_bytes as f64,
                1.0,
            ));
        }
    }
    for o in oracle {
        t.push(at_most(
            format!("oracle {} -> {} forward ns/entry", o.logits, o.target),
            o.forward_ns_per_entry,
            1500.0,
        ));
        t.push(at_most(
            format!("oracle {} -> {} VJP ns/entry", o.logits, o.target),
            o.vjp_ns_per_entry,
            1500.0,
        ));
    }
    t
}

/// The report as text tables: machine, paths, candle ratios, memory,
/// oracle, targets.
pub fn render(r: &BenchReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let c = &r.config;
    let m = &r.machine;
    let _ = writeln!(
        s,
        "logprobe bench: N = {}, V = {}, reps = {} (best / median), chunk_size = {}, shards = {}",
        c.n, c.v, c.reps, c.chunk_size, c.shards
    );
    let _ = writeln!(
        s,
        "machine: {} | threads = {} | cpu_path = {} | clock ~ {} GHz | load average (1 min) = {}",
        m.cpu_model.as_deref().unwrap_or("unknown CPU"),
        m.threads,
        m.cpu_path,
        m.clock_ghz.map_or("?".into(), |g| format!("{g:.2}")),
        m.load_average.map_or("?".into(), |l| format!("{l:.2}")),
    );
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<40} {:>5} {:>10} {:>10} {:>9} {:>9} {:>10} {:>10} {:>4}",
        "path",
        "dtype",
        "best ms",
        "median ms",
        "GB/s",
        "roofline",
        "cyc/entry",
        "on-CPU cyc",
        "thr"
    );
    for p in &r.paths {
        let _ = writeln!(
            s,
            "{:<40} {:>5} {:>10.3} {:>10.3} {:>9.2} {:>8.1}% {:>10} {:>10} {:>4}",
            p.path,
            p.dtype,
            p.timing.best_s * 1e3,
            p.timing.median_s * 1e3,
            p.gb_per_s,
            100.0 * p.fraction_of_roofline,
            p.cycles_per_entry.map_or("?".into(), |c| format!("{c:.3}")),
            p.cycles_per_entry_on_cpu
                .map_or("?".into(), |c| format!("{c:.3}")),
            p.threads
        );
    }
    if !r.candle_ratios.is_empty() {
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "{:<5} {:>28} {:>34}",
            "dtype", "candle / fused (log_prob)", "candle / fused (log_prob + entropy)"
        );
        for c in &r.candle_ratios {
            let _ = writeln!(
                s,
                "{:<5} {:>27.2}x {:>33.2}x",
                c.dtype, c.fused_log_prob_speedup, c.fused_with_entropy_speedup
            );
        }
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<28} {:>5} {:>14} {:>14} {:>14} {:>16}",
        "forward memory", "dtype", "peak extra B", "workspace B", "budget B", "[N, V] f32 B"
    );
    for x in &r.memory {
        let _ = writeln!(
            s,
            "{:<28} {:>5} {:>14} {:>14} {:>14} {:>16}",
            x.kernel,
            x.dtype,
            x.peak_extra_bytes
                .map_or("not counted".into(), |b| b.to_string()),
            x.workspace_bytes,
            x.budget_bytes,
            x.materialised_bytes
        );
    }
    if !r.oracle.is_empty() {
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "{:<14} {:>8} {:>18} {:>14}",
            "oracle (1 thr)", "V", "forward ns/entry", "VJP ns/entry"
        );
        for o in &r.oracle {
            let _ = writeln!(
                s,
                "{:<14} {:>8} {:>18.1} {:>14.1}",
                format!("{} -> {}", o.logits, o.target),
                o.v,
                o.forward_ns_per_entry,
                o.vjp_ns_per_entry
            );
        }
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<66} {:>12} {:>10} {:>5}",
        "target", "measured", "threshold", "met"
    );
    for t in &r.targets {
        let _ = writeln!(
            s,
            "{:<66} {:>12.3} {:>10.3} {:>5}",
            t.target,
            t.measured,
            t.threshold,
            match t.met {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "n/a",
            }
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uneven_shards_sum_to_v_and_differ() {
        for (v, k) in [(152_064, 4), (10, 3), (5, 5), (7, 1), (100, 7)] {
            let w = uneven_shards(v, k);
            assert_eq!(w.len(), k, "{v} {k}");
            assert_eq!(w.iter().sum::<usize>(), v, "{v} {k}: {w:?}");
        }
        let w = uneven_shards(152_064, 4);
        assert!(w.windows(2).any(|p| p[0] != p[1]), "{w:?}");
    }

    #[test]
    fn zero_sizes_are_config_errors() {
        let c = BenchConfig {
            n: 0,
            ..BenchConfig::default()
        };
        assert!(matches!(run(&c), Err(BenchError::Config(_))));
    }
}
