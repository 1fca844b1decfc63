//! CUDA kernels: the fused, chunked and vocab-parallel algorithms of the CPU
//! kernels as CUDA C (`kernels/cuda/*.cu`), behind the same
//! [`Kernel`](crate::Kernel) trait, so every property runs on them unchanged.
//!
//! Two back ends run the same sources through one [`Launcher`]:
//! - feature `cuda`: a GPU, the sources compiled by NVRTC (`CudaRuntime`);
//! - feature `cuda-host`: the host build, the sources compiled as C++ and
//!   launched block by block with a block's threads as fibers
//!   (`host::HostLauncher`); no GPU, so it runs in every `cargo test`.
//!   Its limits are in `host`'s docs; `scripts/gpu-check.sh` still runs
//!   the GPU back end where one is lent.
//!
//! - One block per row, 16-bit logits loaded as 16-bit words and widened
//!   exactly, f32 accumulation, 64-bit row offsets.
//! - Row statistics (`cuda/common.cuh`): per thread an online max / sum /
//!   sum e*d over tiles of 4 columns, the max raised at most once per group
//!   of 4 tiles, then a fixed block tree; the reduction order depends on `V`
//!   and the block size (a function of `V`) only, so outputs are bit-identical
//!   for any chunk size and any `N`. The declared algorithm
//!   ([`plan::Layout::algorithm`]) counts every rounding on that path.
//! - `expf` (2 ulp) and `log1pf` (1 ulp), never the fast intrinsics; IEEE
//!   division; `--fmad=false`. The host build routes `expf` / `log1pf` to
//!   the CPU kernels' `exp_f32` / `ln_1p_f32` and declares their bounds
//!   ([`DeviceKernel::algorithm`] takes them from [`Launcher::math`]).
//! - Dynamic loading (cudarc, CUDA 13.0 bindings): a binary built with this
//!   feature starts on machines without CUDA. `runtime::driver_present` and
//!   `source::nvrtc_present` (feature `cuda` only) are checked before any
//!   driver or NVRTC call; constructors return [`CudaError`], never panic.
//! - Without NVRTC at run time, set [`source::PTX_DIR_ENV`] to a folder of
//!   PTX written by `source::write_ptx` (feature `cuda` only).
//! - Device allocations are counted by a [`memory::MemoryTracker`] per kernel
//!   ([`DeviceKernel::memory`], through `Deref` on [`CudaFused`] and the
//!   others), for the memory property.

pub mod backend;
pub mod backward;
#[cfg(feature = "cuda")]
pub mod bench;
pub mod device_kernel;
pub mod error;
pub mod forward;
#[cfg(feature = "cuda-host")]
pub mod host;
pub mod inputs;
pub mod launch;
pub mod memory;
pub mod plan;
#[cfg(feature = "cuda")]
pub mod runtime;
pub mod slots;
pub mod source;

use std::ops::Deref;
use std::sync::Arc;

pub use backend::{Arg, Backend, DeviceBuffer, DeviceMath, LaunchConfig, Launcher};
pub use device_kernel::DeviceKernel;
pub use error::CudaError;
#[cfg(feature = "cuda-host")]
pub use host::{HostBuild, HostLauncher};
pub use memory::{AllocKind, MemoryReport, MemoryTracker};
pub use plan::{Layout, Shards};
#[cfg(feature = "cuda")]
pub use runtime::{driver_present, unavailable_reason, CudaRuntime};

use device_kernel::delegate_kernel;
use logprobe_reference::spec::SpecError;

/// Fused CUDA forward and backward: one streaming pass per row over the
/// logits (row statistics, then gathers), extra device memory O(N * K).
#[derive(Clone, Debug)]
pub struct CudaFused(DeviceKernel);

impl CudaFused {
    /// On the shared runtime (device 0).
    ///
    /// # Errors
    /// [`CudaError`] when no CUDA device is usable (no driver, no device,
    /// no NVRTC and no PTX folder): never a panic.
    #[cfg(feature = "cuda")]
    pub fn new() -> Result<Self, CudaError> {
        Ok(CudaFused(DeviceKernel::new(Layout::Fused)?))
    }

    /// On the real host build ([`HostLauncher::shared`]).
    #[cfg(feature = "cuda-host")]
    pub fn host() -> Self {
        Self::on(HostLauncher::shared())
    }

    /// On `launcher`.
    pub fn on(launcher: Arc<dyn Launcher>) -> Self {
        CudaFused(DeviceKernel::on(launcher, Layout::Fused))
    }
}

/// Chunked CUDA forward and backward (the algorithm training frameworks
/// ship): rows in chunks of `chunk_size`, each widened into an f32
/// `[chunk, V]` buffer plus an f32 log-softmax buffer; extra device memory
/// at most `2 * chunk_size * V * 4` bytes plus O(N * K).
#[derive(Clone, Debug)]
pub struct CudaChunked(DeviceKernel);

impl CudaChunked {
    /// On the shared runtime (device 0).
    ///
    /// # Errors
    /// [`SpecError::ZeroChunkSize`] (as [`CudaChunkedError::Spec`]) for
    /// `chunk_size == 0`; [`CudaError`] when no CUDA device is usable.
    #[cfg(feature = "cuda")]
    pub fn new(chunk_size: usize) -> Result<Self, CudaChunkedError> {
        if chunk_size == 0 {
            return Err(CudaChunkedError::Spec(SpecError::ZeroChunkSize));
        }
        Ok(CudaChunked(DeviceKernel::new(Layout::Chunked {
            chunk_size,
        })?))
    }

    /// On the real host build ([`HostLauncher::shared`]).
    ///
    /// # Errors
    /// [`SpecError::ZeroChunkSize`] for `chunk_size == 0`.
    #[cfg(feature = "cuda-host")]
    pub fn host(chunk_size: usize) -> Result<Self, CudaChunkedError> {
        Self::on(HostLauncher::shared(), chunk_size)
    }

    /// On `launcher`.
    ///
    /// # Errors
    /// [`SpecError::ZeroChunkSize`] for `chunk_size == 0`.
    pub fn on(launcher: Arc<dyn Launcher>, chunk_size: usize) -> Result<Self, CudaChunkedError> {
        if chunk_size == 0 {
            return Err(CudaChunkedError::Spec(SpecError::ZeroChunkSize));
        }
        Ok(CudaChunked(DeviceKernel::on(
            launcher,
            Layout::Chunked { chunk_size },
        )))
    }

    /// Rows per chunk.
    pub fn chunk_size(&self) -> usize {
        match self.0.layout() {
            Layout::Chunked { chunk_size } => *chunk_size,
            _ => 1,
        }
    }
}

/// Why a [`CudaChunked`] could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CudaChunkedError {
    /// Bad chunk size.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// No usable CUDA device.
    #[error(transparent)]
    Cuda(#[from] CudaError),
}

/// Vocab-parallel CUDA forward and backward: the columns split into
/// tensor-parallel shards, each reduced to partial row statistics
/// `(max, sum, sum e*d, argmax)`, merged as an all-reduce would (a fixed
/// pairwise tree over shards), then per-shard gathers and gradients.
/// All-padding and all-masked shards give empty partials that merge exactly.
/// No in-place backward.
#[derive(Clone, Debug)]
pub struct CudaVocabParallel(DeviceKernel);

impl CudaVocabParallel {
    /// `shards` on the shared runtime (device 0). Widths are checked per
    /// call against the logits' column count.
    ///
    /// # Errors
    /// [`CudaError`] when no CUDA device is usable.
    #[cfg(feature = "cuda")]
    pub fn new(shards: Shards) -> Result<Self, CudaError> {
        Ok(CudaVocabParallel(DeviceKernel::new(
            Layout::VocabParallel(shards),
        )?))
    }

    /// `shards` on the real host build ([`HostLauncher::shared`]).
    #[cfg(feature = "cuda-host")]
    pub fn host(shards: Shards) -> Self {
        Self::on(HostLauncher::shared(), shards)
    }

    /// `shards` on `launcher`.
    pub fn on(launcher: Arc<dyn Launcher>, shards: Shards) -> Self {
        CudaVocabParallel(DeviceKernel::on(launcher, Layout::VocabParallel(shards)))
    }
}

delegate_kernel!(CudaFused);
delegate_kernel!(CudaChunked);
delegate_kernel!(CudaVocabParallel);

impl Deref for CudaFused {
    type Target = DeviceKernel;
    fn deref(&self) -> &DeviceKernel {
        &self.0
    }
}

impl Deref for CudaChunked {
    type Target = DeviceKernel;
    fn deref(&self) -> &DeviceKernel {
        &self.0
    }
}

impl Deref for CudaVocabParallel {
    type Target = DeviceKernel;
    fn deref(&self) -> &DeviceKernel {
        &self.0
    }
}
