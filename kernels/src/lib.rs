//! `logprobe-kernels`: reference kernels for per-token log-probs, entropy,
//! top-k log-probs and their gradients over logits `[N, V]`.
#![warn(missing_docs)]

pub mod kernel;

pub use kernel::{Algorithm, Capabilities, ForwardOutput, Kernel, KernelError, Shift, Summation};
