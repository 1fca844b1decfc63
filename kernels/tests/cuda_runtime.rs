//! CUDA run-time properties, written once (`cuda_common`) and run on every
//! back end: the GPU (feature `cuda`, when a device is usable; otherwise one
//! line says why) and the host build of the same sources (feature
//! `cuda-host`, on in every `cargo test` of this crate). With
//! `LOGPROBE_CUDA_BENCH=1` and a GPU, also the fused forward's HBM bandwidth.
#![cfg(any(feature = "cuda", feature = "cuda-host"))]

mod cuda_common;

use cuda_common::*;

#[cfg(feature = "cuda")]
use logprobe_kernels::cuda::{
    bench::{fused_forward_bandwidth, H200_PEAK_BYTES_PER_S},
    driver_present, unavailable_reason, CudaChunked, CudaError, CudaFused, CudaRuntime,
    CudaVocabParallel, Shards,
};
#[cfg(feature = "cuda")]
use logprobe_reference::spec::Dtype;

#[cfg(feature = "cuda")]
#[test]
fn constructing_without_a_driver_is_a_typed_error() {
    if driver_present() {
        return;
    }
    assert_eq!(CudaFused::new().unwrap_err(), CudaError::NoDriver);
    assert!(CudaChunked::new(4).is_err());
    assert!(CudaVocabParallel::new(Shards::Even(2)).is_err());
    assert_eq!(CudaRuntime::shared().unwrap_err(), CudaError::NoDriver);
}

#[test]
fn cuda_kernels_agree_with_the_oracle_in_f32_bf16_f16() {
    on_every_backend(oracle_agreement);
}

#[test]
fn vocab_parallel_shards_agree_with_the_oracle() {
    on_every_backend(vocab_parallel_agreement);
}

#[test]
fn chunk_size_is_bit_invariant_on_the_device() {
    on_every_backend(chunk_invariance);
}

#[test]
fn gradients_agree_with_the_oracle_vjp() {
    on_every_backend(gradients_vs_oracle);
}

#[test]
fn in_place_backward_equals_backward_rounded_to_the_logits_dtype() {
    on_every_backend(in_place_backward);
}

#[test]
fn neg_inf_logits_give_finite_entropy_and_empty_problems_allocate_nothing() {
    on_every_backend(neg_inf_rows_and_empty_problems);
}

#[test]
fn device_workspace_stays_within_the_declared_bound() {
    on_every_backend(workspace_within_declared_bound);
}

#[cfg(feature = "cuda")]
/// The benchmark of issue 6 (N = 8192, V = 152064, bf16 and f32), only with
/// `LOGPROBE_CUDA_BENCH=1`; `LOGPROBE_CUDA_BENCH_MIN=<fraction>` also
/// asserts the fraction of 4.8 TB/s.
#[test]
fn fused_forward_bandwidth_on_the_device() {
    if std::env::var("LOGPROBE_CUDA_BENCH").map_or(true, |v| v != "1") {
        return;
    }
    if let Some(why) = unavailable_reason() {
        println!("skipping the bandwidth benchmark: {why}");
        return;
    }
    let rt = CudaRuntime::shared().unwrap();
    println!(
        "device: {} ({})",
        rt.device_name().unwrap_or_default(),
        rt.arch()
    );
    let min: Option<f64> = std::env::var("LOGPROBE_CUDA_BENCH_MIN")
        .ok()
        .and_then(|v| v.parse().ok());
    for dtype in [Dtype::Bf16, Dtype::F32] {
        let r =
            fused_forward_bandwidth(&rt, 8192, 152_064, dtype, 20, H200_PEAK_BYTES_PER_S).unwrap();
        println!("BENCH {r}");
        if let Some(m) = min {
            assert!(r.fraction_of_peak >= m, "{r}");
        }
    }
}
