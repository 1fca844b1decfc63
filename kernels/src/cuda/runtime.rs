//! The CUDA runtime of the kernels: driver and NVRTC detection, one context
//! and stream, the compiled modules, tracked device buffers and launches.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig,
    PushKernelArg, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;

use super::error::CudaError;
use super::memory::{AllocKind, MemoryTracker};
use super::source::{arch_for, compile, nvrtc_present, read_ptx, PTX_DIR_ENV, SOURCES};

/// Whether the CUDA driver library can be loaded. Check this before any
/// driver call: cudarc's dynamic loading panics on a missing `libcuda`.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Why CUDA run-time work cannot happen on this machine, as one line for a
/// test's skip message, or `None` when a device is usable.
pub fn unavailable_reason() -> Option<String> {
    match CudaRuntime::shared() {
        Ok(_) => None,
        Err(CudaError::NoDriver) => Some("no CUDA driver".to_string()),
        Err(e) => Some(e.to_string()),
    }
}

/// One device: context, stream, every kernel function, and a lock that
/// serialises calls (so each call's tracked allocations are its own).
pub struct CudaRuntime {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    functions: HashMap<String, CudaFunction>,
    arch: &'static str,
    ptx_dir: Option<PathBuf>,
    lock: Mutex<()>,
}

impl std::fmt::Debug for CudaRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaRuntime")
            .field("ordinal", &self.ctx.ordinal())
            .field("arch", &self.arch)
            .field("ptx_dir", &self.ptx_dir)
            .field("functions", &self.functions.len())
            .finish()
    }
}

impl CudaRuntime {
    /// Opens device `ordinal` and loads every kernel: from the PTX folder
    /// named by [`PTX_DIR_ENV`] when set, else compiled with NVRTC for the
    /// device's architecture.
    ///
    /// # Errors
    /// [`CudaError::NoDriver`] without `libcuda` (checked first: never a
    /// panic), [`CudaError::Driver`] without a device,
    /// [`CudaError::NoNvrtc`] / [`CudaError::Compile`] /
    /// [`CudaError::PtxFile`] when the kernels cannot be built or read.
    pub fn new(ordinal: usize) -> Result<Arc<Self>, CudaError> {
        if !driver_present() {
            return Err(CudaError::NoDriver);
        }
        let ctx =
            CudaContext::new(ordinal).map_err(|e| CudaError::driver("opening the device", e))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| CudaError::driver("compute capability", e))?;
        let arch = arch_for(major, minor)?;
        let ptx_dir = std::env::var_os(PTX_DIR_ENV).map(PathBuf::from);
        if ptx_dir.is_none() && !nvrtc_present() {
            return Err(CudaError::NoNvrtc {
                ptx_env: PTX_DIR_ENV,
            });
        }
        let mut functions = HashMap::new();
        for source in &SOURCES {
            let text = match &ptx_dir {
                Some(dir) => read_ptx(dir, source, arch)?,
                None => compile(source, arch)?,
            };
            let names = entry_names(&text);
            let module = ctx
                .load_module(Ptx::from_src(text))
                .map_err(|e| CudaError::driver("loading PTX", e))?;
            for name in names {
                let f = module
                    .load_function(&name)
                    .map_err(|e| CudaError::driver("loading a kernel", e))?;
                functions.insert(name, f);
            }
        }
        let stream = ctx.default_stream();
        Ok(Arc::new(CudaRuntime {
            ctx,
            stream,
            functions,
            arch,
            ptx_dir,
            lock: Mutex::new(()),
        }))
    }

    /// The process-wide runtime on device 0, created on first use; the
    /// error is kept, so a machine without CUDA answers at once afterwards.
    ///
    /// # Errors
    /// Those of [`CudaRuntime::new`].
    pub fn shared() -> Result<Arc<Self>, CudaError> {
        static SHARED: OnceLock<Result<Arc<CudaRuntime>, CudaError>> = OnceLock::new();
        SHARED.get_or_init(|| CudaRuntime::new(0)).clone()
    }

    /// The virtual architecture the kernels were built for (`compute_90`).
    pub fn arch(&self) -> &'static str {
        self.arch
    }

    /// The device's name.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn device_name(&self) -> Result<String, CudaError> {
        self.ctx
            .name()
            .map_err(|e| CudaError::driver("device name", e))
    }

    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every launch and copy goes to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Serialises one kernel call on this device.
    pub(crate) fn exclusive(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The kernel function `name`.
    ///
    /// # Errors
    /// [`CudaError::Driver`] when no loaded module has it.
    pub fn function(&self, name: &str) -> Result<&CudaFunction, CudaError> {
        self.functions.get(name).ok_or_else(|| CudaError::Driver {
            context: "finding a kernel",
            message: format!("no kernel named {name}"),
        })
    }

    /// Launches kernel `name` with `cfg`; `args` are pushed in order.
    ///
    /// # Safety
    /// `args` must match the kernel's parameters in number and type, and
    /// every device pointer among them must stay allocated until the stream
    /// is synchronised.
    pub(crate) unsafe fn launch(
        &self,
        name: &str,
        cfg: LaunchConfig,
        args: &[Arg],
    ) -> Result<(), CudaError> {
        let f = self.function(name)?;
        let mut b = self.stream.launch_builder(f);
        for a in args {
            match a {
                Arg::Ptr(p) => b.arg(p),
                Arg::I64(v) => b.arg(v),
                Arg::I32(v) => b.arg(v),
                Arg::U32(v) => b.arg(v),
                Arg::F32(v) => b.arg(v),
            };
        }
        // SAFETY: forwarded to the caller.
        unsafe { b.launch(cfg) }.map_err(|e| CudaError::driver("launching a kernel", e))?;
        Ok(())
    }

    /// Waits for every launch and copy.
    ///
    /// # Errors
    /// [`CudaError::Driver`] (a failed kernel shows here).
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(|e| CudaError::driver("synchronising", e))
    }

    /// Uploads `data` as a tracked buffer of `kind` (at least one element is
    /// allocated, so empty data never makes a zero-sized allocation).
    ///
    /// # Errors
    /// [`CudaError::Driver`] (out of memory...).
    pub fn upload<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        tracker: &MemoryTracker,
        kind: AllocKind,
        data: &[T],
    ) -> Result<DeviceBuffer<T>, CudaError> {
        if data.is_empty() {
            return self.zeros(tracker, kind, 0);
        }
        let slice = self
            .stream
            .clone_htod(data)
            .map_err(|e| CudaError::driver("uploading", e))?;
        Ok(DeviceBuffer::new(slice, &self.stream, kind, tracker))
    }

    /// A zero-filled tracked buffer of `len` elements (at least 1 allocated).
    ///
    /// # Errors
    /// [`CudaError::Driver`] (out of memory...).
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        tracker: &MemoryTracker,
        kind: AllocKind,
        len: usize,
    ) -> Result<DeviceBuffer<T>, CudaError> {
        let slice = self
            .stream
            .alloc_zeros::<T>(len.max(1))
            .map_err(|e| CudaError::driver("allocating", e))?;
        Ok(DeviceBuffer::new(slice, &self.stream, kind, tracker))
    }

    /// Downloads a buffer's first `len` elements (synchronises).
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn download<T: DeviceRepr>(
        &self,
        buf: &DeviceBuffer<T>,
        len: usize,
    ) -> Result<Vec<T>, CudaError> {
        let mut v = self
            .stream
            .clone_dtoh(&buf.slice)
            .map_err(|e| CudaError::driver("downloading", e))?;
        v.truncate(len);
        Ok(v)
    }
}

/// A kernel argument.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg {
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

/// A device allocation counted by a [`MemoryTracker`] from allocation to drop.
pub struct DeviceBuffer<T> {
    slice: CudaSlice<T>,
    ptr: u64,
    kind: AllocKind,
    bytes: usize,
    tracker: MemoryTracker,
}

impl<T> DeviceBuffer<T> {
    fn new(
        slice: CudaSlice<T>,
        stream: &CudaStream,
        kind: AllocKind,
        tracker: &MemoryTracker,
    ) -> Self {
        let bytes = slice.num_bytes();
        let ptr = {
            let (p, _sync) = slice.device_ptr(stream);
            p
        };
        tracker.alloc(kind, bytes);
        DeviceBuffer {
            slice,
            ptr,
            kind,
            bytes,
            tracker: tracker.clone(),
        }
    }

    /// Device address of element `offset` (for kernel arguments).
    pub fn ptr_at(&self, offset: usize) -> u64 {
        self.ptr + (offset * std::mem::size_of::<T>()) as u64
    }

    /// Device address of element 0.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The cudarc slice.
    pub fn slice(&self) -> &CudaSlice<T> {
        &self.slice
    }

    /// Mutable cudarc slice (for downloads into host memory).
    pub fn slice_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.slice
    }
}

impl<T> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        self.tracker.free(self.kind, self.bytes);
    }
}

/// The names of the `.entry` points of a PTX text.
pub fn entry_names(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| {
            let rest = l
                .trim_start()
                .strip_prefix(".visible .entry ")
                .or_else(|| l.trim_start().strip_prefix(".entry "))?;
            Some(rest.split('(').next()?.trim().to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_are_read_from_ptx() {
        let ptx =
            ".version 9.0\n.visible .entry lp_finish_forward(\n\t.param .u64 a\n)\n.entry other(\n";
        assert_eq!(
            entry_names(ptx),
            vec!["lp_finish_forward".to_string(), "other".to_string()]
        );
    }

    #[test]
    fn missing_driver_is_an_error_not_a_panic() {
        if driver_present() {
            return;
        }
        assert_eq!(CudaRuntime::new(0).unwrap_err(), CudaError::NoDriver);
        assert_eq!(unavailable_reason().as_deref(), Some("no CUDA driver"));
    }
}
