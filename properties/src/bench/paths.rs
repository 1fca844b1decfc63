//! The benched paths: each registered kernel's forward and backward, the
//! candle baseline, peak memory, the oracle's cost.

use std::time::Instant;

#[cfg(feature = "candle")]
use candle_core::{Device, Tensor};
use half::bf16;
use ndarray::{Array1, Array2};

use logprobe_reference::spec::meta_key;

#[cfg(feature = "candle")]
use logprobe_kernels::candle::candle_log_softmax;
use logprobe_kernels::{cpu_path, CpuKernel, GradElement, Kernel};
use logprobe_reference::oracle::{Oracle, Tier};
use logprobe_reference::spec::{
    Cotangents, Dtype, EntropyLogits, Logits, Options, Output, Problem,
};
use logprobe_testkit::registry;

use logprobe_testkit::memory::{allocator_installed, budget, peak_extra};

use super::*;

pub(crate) fn kernel_err(kernel: &dyn Kernel, e: impl std::fmt::Display) -> BenchError {
    BenchError::Kernel {
        kernel: kernel.name(),
        message: e.to_string(),
    }
}

/// The fused backward into a reused `[N, V]` gradient of `G` (the logits'
/// dtype: f32 or bf16), timed as [`time`] does. [`CpuKernel::backward_into`]
/// is the CPU kernel's own entry point (not on the [`Kernel`] trait), so it
/// is built here rather than taken from the registry.
pub(crate) fn backward_into<G: GradElement>(
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

#[cfg(feature = "candle")]
pub(crate) fn candle_err(e: candle_core::Error) -> BenchError {
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
        (meta_key::CHUNK_SIZE, config.chunk_size),
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

pub(crate) fn run_in_pool(config: &BenchConfig) -> Result<BenchReport, BenchError> {
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
    let cot = Cotangents::default()
        .with_column(Output::LogProbs, g.view())
        .with_column(Output::Entropy, h.view());
    let with_entropy = Options {
        entropy: Some(EntropyLogits::Unmasked),
        ..Options::default()
    };
    let lp_only = Options {
        entropy: None,
        ..Options::default()
    };
    // The benched kernels, from the test kit's registry.
    let registered = |name: &str| registry::find(name).expect("a registered CPU kernel");
    let fused = registered("fused").kernel(0, &[]);
    let fused = fused.as_ref();
    let chunked = registered("chunked").kernel(config.chunk_size, &[]);
    let chunked = chunked.as_ref();
    let vp = registered("vocab-parallel").kernel(0, &uneven_shards(v, config.shards));
    let vp = vp.as_ref();
    let entries = (n * v) as f64;

    let mut paths = Vec::new();
    #[cfg_attr(not(feature = "candle"), allow(unused_mut))]
    let mut candle_ratios: Vec<CandleRatio> = Vec::new();
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
        let t_fused = fwd(fused, &p_ent)?;
        let t_fused_lp = fwd(fused, &p_lp)?;
        timed.push((
            "fused forward (log_prob + entropy)".into(),
            t_fused,
            threads,
        ));
        timed.push(("fused forward (log_prob)".into(), t_fused_lp, threads));
        timed.push((
            format!("chunked forward (chunk_size = {})", config.chunk_size),
            fwd(chunked, &p_ent)?,
            threads,
        ));
        timed.push((
            format!("vocab-parallel forward ({} shards)", config.shards),
            fwd(vp, &p_ent)?,
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
        fused
            .backward(&p_ent, &cot, Dtype::F32)
            .map_err(|e| kernel_err(fused, e))?;
        timed_rw.push((
            "fused backward (f64 [N, V] out, fresh)".into(),
            time(config.reps, || {
                std::hint::black_box(fused.backward(&p_ent, &cot, Dtype::F32).ok());
            }),
            threads,
            bytes + n * v * 8,
        ));
        // Built without candle (feature `candle`, e.g. the Python wheel's
        // link of this crate): no candle baseline.
        #[cfg(feature = "candle")]
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
        let shape = p_ent.validate_shapes().map_err(|e| kernel_err(fused, e))?;
        for (k, chunk) in [(fused, None), (chunked, Some(config.chunk_size))] {
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

/// `(result, wall seconds, CPU seconds of this thread)` of `f`.
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64, Option<f64>) {
    let (c0, t0) = (super::measure::thread_cpu_s(), Instant::now());
    let out = f();
    let wall = t0.elapsed().as_secs_f64();
    let cpu = c0
        .zip(super::measure::thread_cpu_s())
        .map(|(a, b)| b - a)
        .filter(|&c| c > 0.0);
    (out, wall, cpu)
}

/// The oracle's ns per entry on one LLM-like row of `v` columns, on one
/// thread, best of `reps` calls, on both tiers side by side: the certified
/// f64 tier (`Tier::FastVjp`: forward values and VJP elements decided in
/// f64, MPFR for the rest) and the MPFR path (`Tier::Mpfr`), with the
/// fraction of outputs MPFR decided.
pub(crate) fn oracle_costs(v: usize, reps: usize) -> Result<Vec<OracleResult>, BenchError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .map_err(|e| BenchError::Pool(e.to_string()))?;
    let x32 = llm_logits(1, v, 0x000a_11ce);
    let xb = x32.mapv(bf16::from_f32);
    let tokens = Array1::from_elem(1, (v / 3) as i64);
    let (g, h) = (Array1::from_elem(1, -1.0), Array1::from_elem(1, 0.25));
    let cot = Cotangents::default()
        .with_column(Output::LogProbs, g.view())
        .with_column(Output::Entropy, h.view());
    let err = |e: logprobe_reference::spec::SpecError| BenchError::Kernel {
        kernel: "oracle".into(),
        message: e.to_string(),
    };
    let min = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let per = |s: f64| s * 1e9 / v as f64;
    let mut out = Vec::new();
    for (tier_name, tier) in [("f64", Tier::FastVjp), ("mpfr", Tier::Mpfr)] {
        let oracle = Oracle {
            tier,
            ..Oracle::default()
        };
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
                let (mut fc, mut bc) = (None, None);
                let (mut ffb, mut bfb) = (0.0, 0.0);
                for _ in 0..reps.max(1) {
                    let (fo, wall, cpu) = pool.install(|| timed(|| oracle.forward(&p, target)));
                    ffb = fo.map_err(err)?.fallback.output_rate();
                    f = f.min(wall);
                    fc = min(fc, cpu);
                    let (go, wall, cpu) =
                        pool.install(|| timed(|| oracle.vjp_counted(&p, &cot, target)));
                    bfb = go.map_err(err)?.1.output_rate();
                    b = b.min(wall);
                    bc = min(bc, cpu);
                }
                out.push(OracleResult {
                    tier: tier_name,
                    logits: name,
                    target: target.name(),
                    v,
                    forward_ns_per_entry: per(f),
                    vjp_ns_per_entry: per(b),
                    forward_cpu_ns_per_entry: fc.map(per),
                    vjp_cpu_ns_per_entry: bc.map(per),
                    forward_fallback: ffb,
                    vjp_fallback: bfb,
                });
            }
        }
    }
    Ok(out)
}
