//! Speed of the host build of the CUDA kernels (feature `cuda-host`): the
//! cost of one fiber switch at a `__syncthreads` of a 512-thread block, and
//! the fused forward / backward of the host build against the CPU fused
//! kernel on the same logits (a ratio, same run, same threads).
//! Run: `cargo run --release -p logprobe-kernels --features cuda-host --example cuda_host_bench`.

use std::time::Instant;

use half::bf16;
use ndarray::{Array1, Array2};

use logprobe_kernels::cuda::AllocKind;
use logprobe_kernels::cuda::{Arg, CudaFused, HostLauncher, LaunchConfig, Launcher, MemoryTracker};
use logprobe_kernels::{CpuKernel, Kernel};
use logprobe_reference::spec::{Cotangents, Dtype, Logits, Output, Problem};

/// Best of 5 runs of `f`, seconds.
fn best(mut f: impl FnMut()) -> f64 {
    f();
    (0..5)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let host = HostLauncher::shared();
    let l: &dyn Launcher = host.as_ref();
    // Barrier rounds of one 512-thread block: 2 barriers a round, each one
    // switch per thread.
    let (threads, rounds) = (512u32, 2000i32);
    let t = MemoryTracker::new();
    let out = l
        .zeros::<i32>(&t, AllocKind::Output, threads as usize)
        .unwrap();
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let secs = best(|| {
        // SAFETY: lp_selftest_shared(int* out, int rounds) writes one int a thread.
        unsafe {
            l.launch(
                "lp_selftest_shared",
                cfg,
                &[Arg::Ptr(out.ptr()), Arg::I32(rounds)],
            )
        }
        .unwrap()
    });
    let switches = (2 * rounds as u64 + 1) * threads as u64;
    println!(
        "barrier: {threads} threads x {} barriers in {:.2} ms = {:.1} ns per thread per barrier",
        2 * rounds + 1,
        secs * 1e3,
        secs * 1e9 / switches as f64
    );

    // Fused forward and backward, bf16 logits, against the CPU fused kernel.
    for (n, v) in [(64usize, 32_000usize), (16, 152_064)] {
        let x = Array2::from_shape_fn((n, v), |(r, c)| {
            bf16::from_f32(((r * 7919 + c * 104_729) % 1000) as f32 / 125.0 - 4.0)
        });
        let tokens = Array1::from_shape_fn(n, |r| ((r * 31) % v) as i64);
        let mut p = Problem::new(Logits::Bf16(x.view()));
        p.tokens = Some(tokens.view());
        let g = Array1::from_elem(n, 1.0);
        let h = Array1::from_elem(n, 0.5);
        let cot = Cotangents::default()
            .with_column(Output::LogProbs, g.view())
            .with_column(Output::Entropy, h.view());
        let hk = CudaFused::host();
        let fwd_host = best(|| drop(hk.forward(&p, Dtype::F32).unwrap()));
        let fwd_cpu = best(|| drop(CpuKernel::fused().forward(&p, Dtype::F32).unwrap()));
        let bwd_host = best(|| drop(hk.backward(&p, &cot, Dtype::F32).unwrap()));
        let bwd_cpu = best(|| drop(CpuKernel::fused().backward(&p, &cot, Dtype::F32).unwrap()));
        let entries = (n * v) as f64;
        println!(
            "N={n} V={v} bf16: forward host {:.1} ms ({:.2} ns/entry), cpu {:.1} ms: host/cpu {:.1}x; \
             backward host {:.1} ms ({:.2} ns/entry), cpu {:.1} ms: host/cpu {:.1}x",
            fwd_host * 1e3,
            fwd_host * 1e9 / entries,
            fwd_cpu * 1e3,
            fwd_host / fwd_cpu,
            bwd_host * 1e3,
            bwd_host * 1e9 / entries,
            bwd_cpu * 1e3,
            bwd_host / bwd_cpu
        );
    }
}
