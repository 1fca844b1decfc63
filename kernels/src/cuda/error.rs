//! Why the CUDA kernels are unavailable or a device (or host-build) call failed.

use crate::kernel::KernelError;

/// Errors of the CUDA runtime: missing libraries, no device, NVRTC or driver
/// failures. Never a panic: every path that would make cudarc panic (a
/// missing `libcuda` / `libnvrtc`) is checked first.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// The CUDA driver library (`libcuda.so`) cannot be loaded.
    #[error("no CUDA driver: libcuda could not be loaded")]
    NoDriver,
    /// The NVRTC library (`libnvrtc.so.13`) cannot be loaded and no PTX
    /// directory was given.
    #[error(
        "no NVRTC library: install it with scripts/install-nvrtc.sh and put its lib folder on LD_LIBRARY_PATH, \
         or set {ptx_env} to a folder of prebuilt PTX"
    )]
    NoNvrtc {
        /// The environment variable naming a PTX folder.
        ptx_env: &'static str,
    },
    /// NVRTC rejected a source file.
    #[error("NVRTC failed to compile {file} for {arch}: {log}")]
    Compile {
        /// The `.cu` file.
        file: &'static str,
        /// The virtual architecture (`compute_90`).
        arch: &'static str,
        /// NVRTC's log.
        log: String,
    },
    /// A prebuilt PTX file could not be read.
    #[error("cannot read PTX file {path}: {message}")]
    PtxFile {
        /// The path.
        path: String,
        /// The I/O error.
        message: String,
    },
    /// The device's compute capability is below what the kernels target.
    #[error("compute capability {major}.{minor} is below 7.5")]
    UnsupportedDevice {
        /// Major version.
        major: i32,
        /// Minor version.
        minor: i32,
    },
    /// A launch was refused or its kernel failed: an unknown kernel, a bad
    /// geometry, arguments that do not match the kernel's parameters (the
    /// host build checks them), a fault of the host build (barrier deadlock,
    /// partial-warp mask).
    #[error("launch of {kernel} failed: {message}")]
    Launch {
        /// The kernel's name.
        kernel: String,
        /// What went wrong.
        message: String,
    },
    /// A driver call failed (no device, out of memory, launch failure...).
    #[error("CUDA driver error in {context}: {message}")]
    Driver {
        /// What was being done.
        context: &'static str,
        /// The driver's message.
        message: String,
    },
}

impl CudaError {
    /// Wraps a driver error with what was being done.
    pub fn driver(context: &'static str, err: impl std::fmt::Debug) -> Self {
        CudaError::Driver {
            context,
            message: format!("{err:?}"),
        }
    }

    /// As a [`KernelError::Device`] of kernel `kernel`.
    pub fn into_kernel_error(self, kernel: String) -> KernelError {
        KernelError::Device {
            kernel,
            message: self.to_string(),
        }
    }
}
