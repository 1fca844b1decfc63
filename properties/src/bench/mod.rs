//! `logprobe bench`: throughput and memory of the CPU kernels as ratios
//! measured in one run (docs/design.md, "Performance targets"), on logits `[N, V]`
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
//! the steadier figure at one thread). Nothing here asserts a timing: the
//! targets table says whether each ratio meets its target (docs/design.md,
//! "Performance targets"), for a human to read.
//!
//! [`Kernel::backward`]: logprobe_kernels::Kernel::backward

use serde::Serialize;

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
    /// The kernels' block-loop path ([`logprobe_kernels::cpu_path`]).
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
    /// The kernel's declared
    /// [`Kernel::workspace_bytes`](logprobe_kernels::Kernel::workspace_bytes).
    pub workspace_bytes: usize,
    /// The memory budget: `2 * chunk_size * V * 4` for chunked (0 for fused)
    /// plus the `O(N)` and constant allowances of
    /// [`budget`](logprobe_testkit::memory::budget).
    pub budget_bytes: usize,
    /// `N V 4`: what a materialised f32 `[N, V]` buffer would take.
    pub materialised_bytes: usize,
}

/// The oracle's cost on one row, on one tier.
#[derive(Clone, Debug, Serialize)]
pub struct OracleResult {
    /// The oracle tier: `f64` (the certified f64 tier for the forward
    /// values and the VJP, `Tier::FastVjp`, MPFR only for what it leaves
    /// undecided) or `mpfr` (`Tier::Mpfr`).
    pub tier: &'static str,
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
    /// Forward, ns of CPU time of the timing thread per entry, best call
    /// (`None` off Linux). On a loaded machine the wall figures above
    /// include time the thread waited for a core; these do not.
    pub forward_cpu_ns_per_entry: Option<f64>,
    /// VJP, CPU ns per entry, best call (as above).
    pub vjp_cpu_ns_per_entry: Option<f64>,
    /// Fraction of the forward outputs MPFR had to decide (1 on `mpfr`:
    /// every output is MPFR's there).
    pub forward_fallback: f64,
    /// Fraction of the VJP elements MPFR had to decide.
    pub vjp_fallback: f64,
}

/// One performance target (docs/design.md) and whether this run meets it.
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
    /// The targets of docs/design.md, "Performance targets".
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

mod measure;
mod paths;
mod render;
#[cfg(test)]
mod tests;

pub use measure::*;
pub use paths::*;
pub use render::*;
