//! `logprobe-kernels`: reference kernels for per-token log-probs, entropy,
//! top-k log-probs and their gradients over logits `[N, V]`.
//!
//! The CPU kernel is [`CpuKernel`] (staging and sharding are parameters;
//! [`CpuKernel::fused`], [`CpuKernel::chunked`] and
//! [`CpuKernel::vocab_parallel`] are its presets). Its internals (the row
//! reduction, row statistics and the VJP) are private to this crate.
#![warn(missing_docs)]

#[cfg(feature = "candle")]
pub mod candle;
mod capabilities;
pub mod cpu;
#[cfg(any(feature = "cuda", feature = "cuda-host"))]
pub mod cuda;
pub mod exp;
mod grad_block;
pub mod gradient;
pub mod kernel;
pub mod linear;
pub mod policy;
mod row;
mod stats;
mod topk_kl;
mod vjp;

pub use cpu::{CpuKernel, Sharding, Staging};
pub use gradient::{GradElement, Gradient};
pub use kernel::{
    Algorithm, Capabilities, CrossEntropyOutput, Feature, FeatureSet, ForwardOutput, Kernel,
    KernelError, Shift, Summation,
};
pub use row::cpu_path;
pub use stats::{pairwise_depth, PAIRWISE_LEAF};
pub use topk_kl::topk_kl_slopes;
