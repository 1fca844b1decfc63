//! The GPU back end of the kernels (feature `cuda`): driver and NVRTC
//! detection, one context and stream, the compiled modules, and the
//! [`Launcher`] over them.

use std::any::Any;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, PushKernelArg};
use cudarc::nvrtc::Ptx;

use super::backend::{
    check_config, Arg, Backend, CallGuard, DeviceMath, LaunchConfig, Launcher, RawBuffer,
};
use super::error::CudaError;
use super::plan::{EXPF_ULPS, LOG1PF_ULPS};
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

    /// The kernel function `name`.
    ///
    /// # Errors
    /// [`CudaError::Launch`] when no loaded module has it.
    pub fn function(&self, name: &str) -> Result<&CudaFunction, CudaError> {
        self.functions.get(name).ok_or_else(|| CudaError::Launch {
            kernel: name.to_string(),
            message: "no loaded module has this kernel".to_string(),
        })
    }
}

/// A device allocation through cudarc (bytes; the typed view is
/// [`super::backend::DeviceBuffer`]).
struct CudaRaw {
    slice: CudaSlice<u8>,
    ptr: u64,
}

impl RawBuffer for CudaRaw {
    fn ptr(&self) -> u64 {
        self.ptr
    }
    fn bytes(&self) -> usize {
        self.slice.num_bytes()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl CudaRuntime {
    fn wrap(&self, slice: CudaSlice<u8>) -> Box<dyn RawBuffer> {
        let ptr = {
            let (p, _sync) = slice.device_ptr(&self.stream);
            p
        };
        Box::new(CudaRaw { slice, ptr })
    }
}

impl Launcher for CudaRuntime {
    fn backend(&self) -> Backend {
        Backend::Cuda
    }

    fn name_prefix(&self) -> String {
        "cuda".to_string()
    }

    /// libdevice's `expf` (2 ulp) and `log1pf` (1 ulp).
    fn math(&self) -> DeviceMath {
        DeviceMath {
            exp_ulps: EXPF_ULPS,
            log_ulps: LOG1PF_ULPS,
        }
    }

    fn exclusive(&self) -> CallGuard<'_> {
        CallGuard(Some(
            self.lock.lock().unwrap_or_else(PoisonError::into_inner),
        ))
    }

    fn alloc_zeroed(&self, bytes: usize) -> Result<Box<dyn RawBuffer>, CudaError> {
        let slice = self
            .stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(|e| CudaError::driver("allocating", e))?;
        Ok(self.wrap(slice))
    }

    fn upload_bytes(&self, data: &[u8]) -> Result<Box<dyn RawBuffer>, CudaError> {
        if data.is_empty() {
            return self.alloc_zeroed(1);
        }
        let slice = self
            .stream
            .clone_htod(data)
            .map_err(|e| CudaError::driver("uploading", e))?;
        Ok(self.wrap(slice))
    }

    fn download_bytes(&self, buf: &dyn RawBuffer, dst: &mut [u8]) -> Result<(), CudaError> {
        let raw = buf
            .as_any()
            .downcast_ref::<CudaRaw>()
            .filter(|r| r.slice.num_bytes() >= dst.len())
            .ok_or_else(|| CudaError::Driver {
                context: "downloading",
                message: "not a large enough buffer of this device".to_string(),
            })?;
        let v = self
            .stream
            .clone_dtoh(&raw.slice)
            .map_err(|e| CudaError::driver("downloading", e))?;
        dst.copy_from_slice(&v[..dst.len()]);
        Ok(())
    }

    unsafe fn launch(&self, name: &str, cfg: LaunchConfig, args: &[Arg]) -> Result<(), CudaError> {
        check_config(name, &cfg)?;
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
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: cfg.grid_dim,
            block_dim: cfg.block_dim,
            shared_mem_bytes: cfg.shared_mem_bytes,
        };
        // SAFETY: forwarded to the caller.
        unsafe { b.launch(cfg) }.map_err(|e| CudaError::driver("launching a kernel", e))?;
        Ok(())
    }

    fn synchronize(&self) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(|e| CudaError::driver("synchronising", e))
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
