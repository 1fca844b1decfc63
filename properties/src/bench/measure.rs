//! Measuring: best-of timings (wall and CPU), the read-sum and read + write
//! rooflines, the machine (CPU
//! model, clock, load), the benchmark logits and shard layouts.

use std::time::Instant;

use half::bf16;
use ndarray::Array2;
use rayon::prelude::*;

use logprobe_kernels::cpu_path;
use logprobe_reference::splitmix::SplitMix64;

use super::*;

/// Best and median of `reps` calls of `f` after one warm-up call.
pub(crate) fn time(reps: usize, mut f: impl FnMut()) -> Timing {
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
    cpu_clock_s(CpuClock::Process)
}

/// CPU seconds consumed so far by the calling thread
/// (`CLOCK_THREAD_CPUTIME_ID`, nanosecond resolution; `None` where
/// unavailable). `/proc/thread-self/schedstat`, read before, is only
/// brought up to date at the scheduler tick, so a call shorter than a tick
/// (the oracle's forward on one row: ~3 ms) could read as 0 CPU seconds.
pub(crate) fn thread_cpu_s() -> Option<f64> {
    cpu_clock_s(CpuClock::Thread)
}

#[derive(Clone, Copy)]
enum CpuClock {
    Process,
    Thread,
}

fn cpu_clock_s(clock: CpuClock) -> Option<f64> {
    #[cfg(unix)]
    {
        let id = match clock {
            CpuClock::Process => libc::CLOCK_PROCESS_CPUTIME_ID,
            CpuClock::Thread => libc::CLOCK_THREAD_CPUTIME_ID,
        };
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec.
        let rc = unsafe { libc::clock_gettime(id, &mut ts) };
        (rc == 0).then_some(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9)
    }
    #[cfg(not(unix))]
    {
        let _ = clock;
        None
    }
}

/// Sum of `x` widened by `w`: 64 independent f32 lanes (4 AVX-512
/// registers, so the adds overlap and only the loads limit it).
#[inline(always)]
pub(crate) fn sum_body<T: Copy>(x: &[T], w: impl Fn(T) -> f32) -> f32 {
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

pub(crate) fn widen_bf16(v: bf16) -> f32 {
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

pub(crate) fn sum_f32(x: &[f32]) -> f32 {
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

pub(crate) fn sum_bf16(x: &[bf16]) -> f32 {
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
pub(crate) fn read_sum<T: Copy + Sync>(x: &[T], threads: usize, sum: fn(&[T]) -> f32) -> f32 {
    let part = x.len().div_ceil(threads.max(1)).max(1);
    x.par_chunks(part).map(sum).sum()
}

/// The read + write roofline: `src` copied into `dst` (same length, already
/// touched: no page faults), one contiguous part per thread.
pub(crate) fn read_write<T: Copy + Send + Sync>(src: &[T], dst: &mut [T], threads: usize) {
    let part = src.len().div_ceil(threads.max(1)).max(1);
    dst.par_chunks_mut(part)
        .zip(src.par_chunks(part))
        .for_each(|(d, s)| d.copy_from_slice(s));
    std::hint::black_box(dst);
}

/// Core clock in GHz from 10^7 dependent register-register integer adds
/// (1 cycle each on every x86_64 core), best of 30 runs (short runs dodge
/// preemption). Not `add reg, imm`: Golden Cove and later Intel cores
/// execute chains of immediate adds at several per cycle (measured 11 GHz
/// on a ~2.9 GHz Xeon).
#[cfg(target_arch = "x86_64")]
pub(crate) fn clock_ghz() -> Option<f64> {
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
pub(crate) fn clock_ghz() -> Option<f64> {
    None
}

pub(crate) fn cpu_model() -> Option<String> {
    let s = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    s.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|m| m.trim().to_string())
}

pub(crate) fn load_average() -> Option<f64> {
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
pub(crate) fn llm_logits(n: usize, v: usize, seed: u64) -> Array2<f32> {
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
