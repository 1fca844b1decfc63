//! candle-core adapter (feature `candle`, on by default).
//!
//! - [`LogProbOp`]: a candle [`CustomOp2`](candle_core::CustomOp2) that runs a
//!   [`Kernel`](crate::Kernel) (by default our fused kernel) on candle
//!   `Tensor`s on the CPU: logits `[N, V]` (f32 / bf16 / f16 / f64) and
//!   tokens `[N]` (u32 / i64) in, f32 log-probs `[N]` (or log-probs and
//!   entropy `[N, 2]`) out; its backward is the kernel's VJP.
//! - [`CandleComposed`]: the baseline candle users write today
//!   (`max_keepdim -> broadcast_sub -> exp -> sum_keepdim -> log -> sub ->
//!   gather`, all in the input dtype, as `candle_nn::ops::log_softmax`
//!   does), wrapped as a [`Kernel`](crate::Kernel) so the property suite and
//!   the benchmarks judge it like any other implementation. It declares
//!   candle's real numerical algorithm (input-dtype accumulation, candle's
//!   CPU summation order), so the tolerance model can say "no bound" for its
//!   bf16 / f16 paths instead of passing them.
//!
//! Source of the algorithm declarations: candle-core 0.11.1,
//! `src/cpu_backend/mod.rs` (`ReduceSum`, `ReduceIndex`),
//! `src/cpu/kernels.rs` (`VecOps::vec_reduce_sum`), `src/cpu/{avx,neon}.rs`
//! (`vec_sum`), `src/op.rs` (`unary_op!(Exp ..)`, `unary_op!(Log ..)`).

mod composed;
mod op;

pub use composed::{candle_log_softmax, candle_logsumexp, candle_summation, CandleComposed};
pub use op::{kernel_error, log_probs_and_entropy, LogProbOp};
