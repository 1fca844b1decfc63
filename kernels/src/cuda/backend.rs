//! The one launcher the CUDA launch code drives: device buffers, kernel
//! launches by name, synchronisation. Two back ends implement it: the GPU
//! through cudarc (`runtime::CudaRuntime`, feature `cuda`) and the
//! host build of the same `.cu` sources (`host::HostLauncher`,
//! feature `cuda-host`), so the chunk planner and every launch sequence of
//! [`super::forward`] and [`super::backward`] also run without a driver.

use std::any::Any;
use std::marker::PhantomData;
use std::sync::MutexGuard;

use super::error::CudaError;
use super::memory::{AllocKind, MemoryTracker};

/// A launch's geometry (`cuLaunchKernel`'s): blocks, threads per block,
/// dynamic shared memory in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks `(x, y, z)`.
    pub grid_dim: (u32, u32, u32),
    /// Threads per block `(x, y, z)`.
    pub block_dim: (u32, u32, u32),
    /// Dynamic shared memory per block, bytes.
    pub shared_mem_bytes: u32,
}

/// A kernel argument, by value (pointers are device addresses).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    /// A device pointer (0 for null).
    Ptr(u64),
    /// `long long`.
    I64(i64),
    /// `int`.
    I32(i32),
    /// `unsigned`.
    U32(u32),
    /// `float`.
    F32(f32),
}

impl Arg {
    /// The parameter code of the host build's kernel signatures
    /// (`cuda/host/lp_host.h`: `p`, `l`, `i`, `u`, `f`).
    pub fn code(&self) -> u8 {
        match self {
            Arg::Ptr(_) => b'p',
            Arg::I64(_) => b'l',
            Arg::I32(_) => b'i',
            Arg::U32(_) => b'u',
            Arg::F32(_) => b'f',
        }
    }
}

/// Error bounds of a back end's `expf` and `log1pf`, in ulps of f32: what
/// the declared [`crate::Algorithm`] of its kernels says.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeviceMath {
    /// `expf`.
    pub exp_ulps: f64,
    /// `log1pf`.
    pub log_ulps: f64,
}

/// Which back end a launcher is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// A GPU through cudarc (NVRTC-compiled PTX).
    Cuda,
    /// The host build; `mutant` names a planted-bug build
    /// (`cuda/host` builds), `None` the real one.
    Host {
        /// Mutant build name, or `None`.
        mutant: Option<&'static str>,
    },
}

/// Element types of device buffers: plain old data whose every bit pattern
/// is a value (sealed).
pub trait DeviceElem: Copy + Default + Send + Sync + 'static + sealed::Sealed {}
impl DeviceElem for f32 {}
impl DeviceElem for i32 {}
impl DeviceElem for u32 {}
impl DeviceElem for u16 {}
impl DeviceElem for u8 {}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for i32 {}
    impl Sealed for u32 {}
    impl Sealed for u16 {}
    impl Sealed for u8 {}
}

/// One device allocation of a back end, untyped.
pub trait RawBuffer: Send + Sync {
    /// Device address of byte 0.
    fn ptr(&self) -> u64;
    /// Bytes allocated.
    fn bytes(&self) -> usize;
    /// For the back end that made it.
    fn as_any(&self) -> &dyn Any;
}

/// Holds a back end's per-call lock (the GPU serialises calls so each
/// call's tracked allocations are its own; the host build needs none).
pub struct CallGuard<'a>(#[allow(dead_code)] pub(crate) Option<MutexGuard<'a, ()>>);

/// A back end of the CUDA kernels.
pub trait Launcher: Send + Sync + std::fmt::Debug {
    /// Which back end.
    fn backend(&self) -> Backend;

    /// Prefix of kernel names (`cuda`, `cuda-host`, `cuda-host[mutant]`).
    fn name_prefix(&self) -> String;

    /// Error bounds of the kernels' `expf` / `log1pf`.
    fn math(&self) -> DeviceMath;

    /// Serialises one kernel call.
    fn exclusive(&self) -> CallGuard<'_>;

    /// A zero-filled allocation of `bytes` bytes (at least 1).
    ///
    /// # Errors
    /// [`CudaError`] (out of memory...).
    fn alloc_zeroed(&self, bytes: usize) -> Result<Box<dyn RawBuffer>, CudaError>;

    /// An allocation holding `data` (at least 1 byte).
    ///
    /// # Errors
    /// [`CudaError`].
    fn upload_bytes(&self, data: &[u8]) -> Result<Box<dyn RawBuffer>, CudaError>;

    /// Copies the first `dst.len()` bytes of `buf` to `dst` (synchronises).
    ///
    /// # Errors
    /// [`CudaError`]; a buffer of another back end or shorter than `dst`.
    fn download_bytes(&self, buf: &dyn RawBuffer, dst: &mut [u8]) -> Result<(), CudaError>;

    /// Launches kernel `name` with `cfg`; `args` in parameter order.
    ///
    /// # Errors
    /// [`CudaError`]: an unknown kernel, a refused configuration, a failed
    /// launch (the host build also refuses arguments that do not match the
    /// kernel's parameter types, and reports faults such as a barrier
    /// deadlock).
    ///
    /// # Safety
    /// `args` must match the kernel's parameters in number and type, and
    /// every pointer among them must address live memory of this back end
    /// large enough for what the kernel reads and writes, until
    /// [`Launcher::synchronize`].
    unsafe fn launch(&self, name: &str, cfg: LaunchConfig, args: &[Arg]) -> Result<(), CudaError>;

    /// Waits for every launch and copy.
    ///
    /// # Errors
    /// [`CudaError`] (a failed kernel shows here on the GPU).
    fn synchronize(&self) -> Result<(), CudaError>;
}

fn bytes_of<T: DeviceElem>(v: &[T]) -> &[u8] {
    // SAFETY: DeviceElem types are plain old data without padding.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn bytes_of_mut<T: DeviceElem>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as above, and every bit pattern is a valid DeviceElem.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

impl dyn Launcher + '_ {
    /// Uploads `data` as a tracked buffer of `kind` (at least one element is
    /// allocated, so empty data never makes a zero-sized allocation).
    ///
    /// # Errors
    /// [`CudaError`].
    pub fn upload<T: DeviceElem>(
        &self,
        tracker: &MemoryTracker,
        kind: AllocKind,
        data: &[T],
    ) -> Result<DeviceBuffer<T>, CudaError> {
        if data.is_empty() {
            return self.zeros(tracker, kind, 0);
        }
        let raw = self.upload_bytes(bytes_of(data))?;
        Ok(DeviceBuffer::new(raw, kind, tracker))
    }

    /// A zero-filled tracked buffer of `len` elements (at least 1 allocated).
    ///
    /// # Errors
    /// [`CudaError`].
    pub fn zeros<T: DeviceElem>(
        &self,
        tracker: &MemoryTracker,
        kind: AllocKind,
        len: usize,
    ) -> Result<DeviceBuffer<T>, CudaError> {
        let raw = self.alloc_zeroed(len.max(1) * std::mem::size_of::<T>())?;
        Ok(DeviceBuffer::new(raw, kind, tracker))
    }

    /// Downloads a buffer's first `len` elements (synchronises).
    ///
    /// # Errors
    /// [`CudaError`].
    pub fn download<T: DeviceElem>(
        &self,
        buf: &DeviceBuffer<T>,
        len: usize,
    ) -> Result<Vec<T>, CudaError> {
        let mut v = vec![T::default(); len];
        self.download_bytes(buf.raw.as_ref(), bytes_of_mut(&mut v))?;
        Ok(v)
    }
}

/// A device allocation of `T`s counted by a [`MemoryTracker`] from
/// allocation to drop.
pub struct DeviceBuffer<T> {
    raw: Box<dyn RawBuffer>,
    kind: AllocKind,
    tracker: MemoryTracker,
    _t: PhantomData<T>,
}

impl<T: DeviceElem> DeviceBuffer<T> {
    fn new(raw: Box<dyn RawBuffer>, kind: AllocKind, tracker: &MemoryTracker) -> Self {
        tracker.alloc(kind, raw.bytes());
        DeviceBuffer {
            raw,
            kind,
            tracker: tracker.clone(),
            _t: PhantomData,
        }
    }

    /// Device address of element `offset` (for kernel arguments).
    pub fn ptr_at(&self, offset: usize) -> u64 {
        self.raw.ptr() + (offset * std::mem::size_of::<T>()) as u64
    }

    /// Device address of element 0.
    pub fn ptr(&self) -> u64 {
        self.raw.ptr()
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        self.raw.bytes()
    }
}

impl<T> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        self.tracker.free(self.kind, self.raw.bytes());
    }
}

/// Checks the geometry every back end accepts: 1 to 1024 threads a block,
/// at least one block in each grid dimension.
///
/// # Errors
/// [`CudaError::Launch`] naming the kernel.
pub fn check_config(name: &str, cfg: &LaunchConfig) -> Result<(), CudaError> {
    let (bx, by, bz) = cfg.block_dim;
    let threads = bx as u64 * by as u64 * bz as u64;
    let (gx, gy, gz) = cfg.grid_dim;
    if threads == 0 || threads > 1024 || gx == 0 || gy == 0 || gz == 0 {
        return Err(CudaError::Launch {
            kernel: name.to_string(),
            message: format!("refused geometry {cfg:?} (1..=1024 threads a block, no empty grid)"),
        });
    }
    Ok(())
}
