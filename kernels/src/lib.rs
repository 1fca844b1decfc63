//! `logprobe-kernels`: reference kernels for per-token log-probs, entropy,
//! top-k log-probs and their gradients over logits `[N, V]`.
#![warn(missing_docs)]

#[cfg(feature = "candle")]
pub mod candle;
pub mod chunked;
#[cfg(any(feature = "cuda", feature = "cuda-host"))]
pub mod cuda;
pub mod exp;
pub mod fused;
mod grad_block;
pub mod kernel;
pub mod row;
pub mod stats;
pub mod vjp;
pub mod vocab_parallel;

pub use chunked::Chunked;
pub use fused::Fused;
pub use kernel::{Algorithm, Capabilities, ForwardOutput, Kernel, KernelError, Shift, Summation};
pub use row::cpu_path;
pub use vocab_parallel::VocabParallel;
