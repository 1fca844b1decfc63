//! The CUDA C sources (`kernels/cuda/*.cu`, embedded), their compilation to
//! PTX with NVRTC, and prebuilt PTX folders for machines without NVRTC.
//!
//! Each `.cu` file is compiled as one program: the prelude `common.cuh`
//! followed by the file's text (the host build, feature `cuda-host`,
//! compiles the same program text as C++: `kernels/build.rs`). Options: `--fmad=false` (every fused
//! multiply-add is an explicit `fmaf`, so rounding is what the source says),
//! IEEE division and square root, no flush-to-zero, full-precision math.

use std::path::Path;
#[cfg(feature = "cuda")]
use std::path::PathBuf;

#[cfg(feature = "cuda")]
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};

use super::error::CudaError;

/// Environment variable naming a folder of prebuilt PTX files
/// (`<module>.<arch>.ptx`, written by `write_ptx`, feature `cuda`); when
/// set, the runtime loads those instead of compiling with NVRTC.
pub const PTX_DIR_ENV: &str = "LOGPROBE_CUDA_PTX_DIR";

/// The prelude every source is compiled with.
pub const PRELUDE: &str = include_str!("../../cuda/common.cuh");

/// One CUDA C source file: its module name and text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Source {
    /// Module name (the file name without `.cu`).
    pub name: &'static str,
    /// The file's text (without the prelude).
    pub text: &'static str,
}

/// The [`Source`] of `kernels/cuda/<name>.cu`.
macro_rules! cuda_source {
    ($name:literal) => {
        Source {
            name: $name,
            text: include_str!(concat!("../../cuda/", $name, ".cu")),
        }
    };
}

/// Every kernel source, in load order.
pub const SOURCES: [Source; 6] = [
    cuda_source!("row_stats"),
    cuda_source!("forward"),
    cuda_source!("chunked"),
    cuda_source!("backward"),
    cuda_source!("vocab_parallel"),
    cuda_source!("fill"),
];

/// Virtual architectures PTX is produced for, newest first: the runtime
/// picks the newest one at or below the device's compute capability
/// (`compute_90` on H100/H200, `compute_80` on A100; PTX is JIT-compiled
/// forward to newer GPUs by the driver).
pub const ARCHES: [(&str, u32); 3] = [("compute_90", 90), ("compute_80", 80), ("compute_75", 75)];

/// The virtual architecture for a device of compute capability
/// `major.minor`: the newest in [`ARCHES`] not above it.
///
/// # Errors
/// [`CudaError::UnsupportedDevice`] below 7.5 (NVRTC 13 targets Turing and newer).
pub fn arch_for(major: i32, minor: i32) -> Result<&'static str, CudaError> {
    let cc = (major.max(0) as u32) * 10 + minor.clamp(0, 9) as u32;
    ARCHES
        .iter()
        .find(|&&(_, a)| a <= cc)
        .map(|&(name, _)| name)
        .ok_or(CudaError::UnsupportedDevice { major, minor })
}

/// The full program text of `source`: prelude, then the file.
pub fn program_text(source: &Source) -> String {
    format!("{PRELUDE}\n// ---- {}.cu\n{}", source.name, source.text)
}

#[cfg(feature = "cuda")]
/// Whether the NVRTC library can be loaded (cudarc would panic on first use
/// otherwise). Reads `LD_LIBRARY_PATH` as the dynamic loader does.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

#[cfg(feature = "cuda")]
/// Compiles `source` to PTX text for `arch` with NVRTC.
///
/// # Errors
/// [`CudaError::NoNvrtc`] when the library is missing (checked first, so
/// this never panics); [`CudaError::Compile`] with NVRTC's log.
pub fn compile(source: &Source, arch: &'static str) -> Result<String, CudaError> {
    if !nvrtc_present() {
        return Err(CudaError::NoNvrtc {
            ptx_env: PTX_DIR_ENV,
        });
    }
    let opts = CompileOptions {
        ftz: Some(false),
        prec_sqrt: Some(true),
        prec_div: Some(true),
        fmad: Some(false),
        use_fast_math: Some(false),
        arch: Some(arch),
        name: Some(format!("{}.cu", source.name)),
        ..Default::default()
    };
    let ptx =
        compile_ptx_with_opts(program_text(source), opts).map_err(|e| CudaError::Compile {
            file: source.name,
            arch,
            log: match e {
                CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
                other => format!("{other:?}"),
            },
        })?;
    Ok(ptx.to_src())
}

/// The file name of a module's PTX for `arch`: `<name>.<arch>.ptx`.
pub fn ptx_file_name(name: &str, arch: &str) -> String {
    format!("{name}.{arch}.ptx")
}

#[cfg(feature = "cuda")]
/// Compiles every source for every arch in [`ARCHES`] into `dir` (created
/// if missing); returns the files written.
///
/// # Errors
/// Those of [`compile`]; [`CudaError::PtxFile`] on I/O failure.
pub fn write_ptx(dir: &Path) -> Result<Vec<PathBuf>, CudaError> {
    let io = |path: &Path, e: std::io::Error| CudaError::PtxFile {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let mut written = Vec::new();
    for (arch, _) in ARCHES {
        for source in &SOURCES {
            let ptx = compile(source, arch)?;
            let path = dir.join(ptx_file_name(source.name, arch));
            std::fs::write(&path, ptx).map_err(|e| io(&path, e))?;
            written.push(path);
        }
    }
    Ok(written)
}

/// Reads the PTX of `source` for `arch` from `dir`.
///
/// # Errors
/// [`CudaError::PtxFile`] when the file is missing or unreadable.
pub fn read_ptx(dir: &Path, source: &Source, arch: &str) -> Result<String, CudaError> {
    let path = dir.join(ptx_file_name(source.name, arch));
    std::fs::read_to_string(&path).map_err(|e| CudaError::PtxFile {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_is_the_newest_not_above_the_device() {
        assert_eq!(arch_for(9, 0), Ok("compute_90"));
        assert_eq!(arch_for(10, 0), Ok("compute_90"));
        assert_eq!(arch_for(8, 9), Ok("compute_80"));
        assert_eq!(arch_for(8, 0), Ok("compute_80"));
        assert_eq!(arch_for(7, 5), Ok("compute_75"));
        assert_eq!(
            arch_for(7, 0),
            Err(CudaError::UnsupportedDevice { major: 7, minor: 0 })
        );
    }

    #[test]
    fn every_source_is_embedded_with_its_kernels() {
        for s in &SOURCES {
            assert!(s.text.contains("extern \"C\" __global__"), "{}", s.name);
            assert!(program_text(s).starts_with(PRELUDE));
        }
        assert_eq!(
            ptx_file_name("forward", "compute_90"),
            "forward.compute_90.ptx"
        );
    }
}
