//! The host build of the CUDA kernels (feature `cuda-host`): the same
//! `kernels/cuda/*.cu` sources, compiled as C++ by `kernels/build.rs`, run
//! on the CPU through the [`Launcher`] the GPU back end also implements, so
//! the chunk planner, the launch sequences and the kernel bodies run in
//! every `cargo test`, on machines without a GPU.
//!
//! # How it runs
//!
//! - **Sources.** Each module is the program NVRTC compiles (`common.cuh`,
//!   then the `.cu` file), preceded by `cuda/host/lp_host.h` (CUDA's
//!   built-ins for a C++ compiler) and compiled with `-x c++ -std=c++17 -O2
//!   -ffp-contract=off` (the device's `--fmad=false`: every fused
//!   multiply-add is an explicit `fmaf`). The kernel bodies are unchanged;
//!   `common.cuh`'s two inline-PTX conversions (f16 <-> f32) take bit-exact C
//!   fallbacks under `LP_HOST_BUILD`.
//! - **Builds.** Every build has its own namespace and kernel-name prefix,
//!   so the real build and the planted mutants ([`builds::MUTANTS`]) link
//!   side by side; [`HostBuild`] picks one.
//! - **Launches.** Blocks run one after another on an OS thread (disjoint
//!   block ranges on rayon's workers); a block's threads are cooperative
//!   fibers with their own stacks, switched in user space (no system call
//!   per switch on x86-64). `__syncthreads` and the warp operations are
//!   barriers of that scheduler; a barrier nobody can complete is reported
//!   as a [`CudaError::Launch`] fault, not a hang. See
//!   `cuda/host/runtime.cpp`.
//! - **Arguments.** Each kernel's parameter types are recorded at compile
//!   time; a launch whose [`Arg`]s do not match is refused.
//! - **Platforms.** A C++17 compiler (`scripts/run.sh` installs g++) on a
//!   POSIX system; the user-space switch is x86-64 ELF, other targets use
//!   `swapcontext` (build with `LOGPROBE_CUDA_HOST_UCONTEXT=1` to test that
//!   path on x86-64).
//! - **Math.** `expf` and `log1pf` are the CPU kernels' [`exp_f32`] and
//!   [`ln_1p_f32`] (`kernels/src/exp.rs`), so the declared algorithm of a
//!   host-built kernel carries their error bounds ([`EXP_F32_MAX_ULPS`],
//!   [`LN_1P_F32_MAX_ULPS`]) where the GPU declares libdevice's (2 and 1
//!   ulp). Other float math functions do not compile until routed.
//!
//! # What the host build cannot show
//!
//! It runs the kernels' arithmetic, indexing, reduction order, barriers and
//! warp exchanges as written, and the property gate, the golden fixtures
//! (`fixtures/snapshots/cuda_host_bits.snap`) and the planted mutants run
//! it in every `cargo test`. It cannot show:
//! - the device math library's bits: libdevice's `expf` / `log1pf` differ
//!   from the CPU's in the last bits (within the declared 2 and 1 ulp), so
//!   host-built outputs are not the GPU's bits, and a host-built kernel is
//!   judged under the CPU functions' bounds (0.952 and 0.5 ulp), not under
//!   libdevice's; nor the sign of a zero from `fmaxf(-0, +0)` or the
//!   payload of a NaN from `cvt`;
//! - timing and bandwidth (`logprobe bench`, `cuda::bench` on a GPU);
//! - memory coalescing, bank conflicts, occupancy, register or shared-memory
//!   limits (beyond 48 KiB of dynamic shared memory and 1024 threads);
//! - real warp scheduling: independent thread scheduling, races between
//!   warps, or a missing barrier that a real GPU would expose (here threads
//!   run in a fixed order and only barriers interleave them), partial-warp
//!   masks (refused);
//! - memory faults as the device raises them: an out-of-bounds access reads
//!   or writes host memory (or faults the process) instead of an illegal
//!   address error (`compute-sanitizer` on a GPU); 64-bit offsets are shown
//!   through offset views ([`offset`]), not through buffers past 2^31
//!   elements in device memory;
//! - nvcc / NVRTC code generation: PTX and SASS, `--fmad=false` honoured by
//!   ptxas, the JIT for newer GPUs, driver and launch errors.
//!
//! So `scripts/gpu-check.sh` still matters: on a GPU it runs the same
//! properties under libdevice's declared bounds, the NVRTC-compiled code
//! and the real scheduler, and the bandwidth benchmark, whenever one is lent.

pub mod builds;
pub mod offset;
pub mod probe;

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::ptr::NonNull;
use std::sync::{Arc, Once, OnceLock};

use rayon::prelude::*;

use super::backend::{
    check_config, Arg, Backend, CallGuard, DeviceMath, LaunchConfig, Launcher, RawBuffer,
};
use super::error::CudaError;
use crate::exp::{exp_f32, ln_1p_f32, EXP_F32_MAX_ULPS, LN_1P_F32_MAX_ULPS};
use builds::{MutantPatch, DYNAMIC_SHARED_BYTES, MUTANTS, REAL_BUILD};

/// One kernel of a generated unit (`LpHostEntry` in `cuda/host/lp_host.h`).
#[repr(C)]
struct RawEntry {
    name: *const c_char,
    run: Option<KernelFn>,
    signature: *const c_char,
}

type KernelFn = unsafe extern "C" fn(*const *mut c_void);
type TableFn = unsafe extern "C" fn(*mut usize) -> *const RawEntry;

include!(concat!(env!("OUT_DIR"), "/host_entries.rs"));

extern "C" {
    fn lp_host_set_math(exp_fn: extern "C" fn(f32) -> f32, log1p_fn: extern "C" fn(f32) -> f32);
    fn lp_host_launch(
        entry: KernelFn,
        args: *const *mut c_void,
        grid: *const u32,
        block: *const u32,
        shared_bytes: u32,
        block_begin: u64,
        block_end: u64,
        msg: *mut c_char,
        msg_len: usize,
    ) -> i32;
}

/// `expf` of the host build: the CPU kernels' [`exp_f32`].
extern "C" fn host_expf(x: f32) -> f32 {
    exp_f32(x)
}

/// `log1pf` of the host build: the CPU kernels' [`ln_1p_f32`].
extern "C" fn host_log1pf(x: f32) -> f32 {
    ln_1p_f32(x)
}

/// Routes the host build's `expf` / `log1pf` (once per process).
pub(crate) fn ensure_math() {
    static ONCE: Once = Once::new();
    // SAFETY: stores two function pointers before any host launch reads them.
    ONCE.call_once(|| unsafe { lp_host_set_math(host_expf, host_log1pf) });
}

/// Which host build a [`HostLauncher`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostBuild {
    /// The sources as they are.
    Real,
    /// A planted bug ([`builds::MUTANTS`]): kernels of the patched file
    /// (every file for a `common.cuh` patch), the real build's otherwise.
    Mutant(&'static MutantPatch),
}

impl HostBuild {
    /// The build's name (`real`, or the mutant's).
    pub fn name(&self) -> &'static str {
        match self {
            HostBuild::Real => REAL_BUILD,
            HostBuild::Mutant(m) => m.build,
        }
    }

    /// The mutant build named `name`.
    pub fn mutant(name: &str) -> Option<HostBuild> {
        MUTANTS
            .iter()
            .find(|m| m.build == name)
            .map(HostBuild::Mutant)
    }

    /// Every mutant build.
    pub fn mutants() -> impl Iterator<Item = HostBuild> {
        MUTANTS.iter().map(HostBuild::Mutant)
    }
}

/// One kernel of a host build.
#[derive(Clone, Copy, Debug)]
struct HostKernel {
    run: KernelFn,
    signature: &'static str,
    module: &'static str,
}

/// The host back end: one host build's kernels, host memory as device
/// memory (device addresses are host addresses), synchronous launches.
/// Thread-safe; calls need no lock.
pub struct HostLauncher {
    build: HostBuild,
    kernels: HashMap<&'static str, HostKernel>,
}

impl std::fmt::Debug for HostLauncher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostLauncher")
            .field("build", &self.build.name())
            .field("kernels", &self.kernels.len())
            .finish()
    }
}

impl HostLauncher {
    /// A launcher of `build`.
    pub fn new(build: HostBuild) -> Arc<Self> {
        ensure_math();
        let mut kernels = HashMap::new();
        // The real build first; a mutant's own units then replace its
        // kernels (the self-test module is the real build's alone).
        let passes: &[&str] = match build {
            HostBuild::Real => &[REAL_BUILD],
            HostBuild::Mutant(m) => &[REAL_BUILD, m.build],
        };
        for &pass in passes {
            for &(b, module, table) in UNITS {
                if b != pass || (build != HostBuild::Real && module == "selftest") {
                    continue;
                }
                let mut n = 0usize;
                // SAFETY: a generated table function: returns `n` entries
                // with static strings and trampolines.
                let entries = unsafe {
                    let p = table(&mut n);
                    std::slice::from_raw_parts(p, n)
                };
                for e in entries {
                    // SAFETY: static NUL-terminated strings of the unit.
                    let (name, signature) = unsafe {
                        (
                            CStr::from_ptr(e.name).to_str(),
                            CStr::from_ptr(e.signature).to_str(),
                        )
                    };
                    if let (Ok(name), Ok(signature), Some(run)) = (name, signature, e.run) {
                        kernels.insert(
                            name,
                            HostKernel {
                                run,
                                signature,
                                module,
                            },
                        );
                    }
                }
            }
        }
        Arc::new(HostLauncher { build, kernels })
    }

    /// The process-wide launcher of the real build.
    pub fn shared() -> Arc<Self> {
        static SHARED: OnceLock<Arc<HostLauncher>> = OnceLock::new();
        SHARED
            .get_or_init(|| HostLauncher::new(HostBuild::Real))
            .clone()
    }

    /// Its build.
    pub fn build(&self) -> HostBuild {
        self.build
    }

    /// Every kernel name it launches, sorted.
    pub fn kernel_names(&self) -> Vec<&'static str> {
        let mut v: Vec<_> = self.kernels.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Kernel `name`'s parameter signature (`p` pointer, `l` long long,
    /// `i` int, `u` unsigned, `f` float, one letter per parameter) and the
    /// module (`.cu` file without extension) it was compiled from.
    pub fn signature(&self, name: &str) -> Option<(&'static str, &'static str)> {
        self.kernels.get(name).map(|k| (k.signature, k.module))
    }
}

/// Host memory standing in for a device allocation (256-byte aligned, as
/// `cudaMalloc`'s).
struct HostRaw {
    ptr: NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: a plain heap allocation; kernels write it only inside launches.
unsafe impl Send for HostRaw {}
// SAFETY: as above.
unsafe impl Sync for HostRaw {}

impl HostRaw {
    fn zeroed(bytes: usize) -> Result<Self, CudaError> {
        let layout = std::alloc::Layout::from_size_align(bytes.max(1), 256).map_err(|e| {
            CudaError::Driver {
                context: "allocating host memory",
                message: e.to_string(),
            }
        })?;
        // SAFETY: non-zero size.
        let ptr =
            NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }).ok_or(CudaError::Driver {
                context: "allocating host memory",
                message: format!("out of memory for {} bytes", layout.size()),
            })?;
        Ok(HostRaw { ptr, layout })
    }
}

impl Drop for HostRaw {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl RawBuffer for HostRaw {
    fn ptr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }
    fn bytes(&self) -> usize {
        self.layout.size()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// One kernel argument as the trampolines read it (`*static_cast<T*>(args[i])`).
#[repr(C)]
#[derive(Clone, Copy)]
union ArgSlot {
    ptr: u64,
    i64: i64,
    i32: i32,
    u32: u32,
    f32: f32,
}

/// The argument array of one launch, shared read-only by the block ranges.
struct ArgArray(Vec<*mut c_void>);
// SAFETY: read-only pointers into slots that outlive every block range.
unsafe impl Sync for ArgArray {}

impl ArgArray {
    fn as_ptr(&self) -> *const *mut c_void {
        self.0.as_ptr()
    }
}

impl Launcher for HostLauncher {
    fn backend(&self) -> Backend {
        Backend::Host {
            mutant: match self.build {
                HostBuild::Real => None,
                HostBuild::Mutant(m) => Some(m.build),
            },
        }
    }

    fn name_prefix(&self) -> String {
        match self.build {
            HostBuild::Real => "cuda-host".to_string(),
            HostBuild::Mutant(m) => format!("cuda-host[{}]", m.build),
        }
    }

    /// The CPU kernels' `exp_f32` and `ln_1p_f32`.
    fn math(&self) -> DeviceMath {
        DeviceMath {
            exp_ulps: EXP_F32_MAX_ULPS,
            log_ulps: LN_1P_F32_MAX_ULPS,
        }
    }

    fn exclusive(&self) -> CallGuard<'_> {
        CallGuard(None)
    }

    fn alloc_zeroed(&self, bytes: usize) -> Result<Box<dyn RawBuffer>, CudaError> {
        Ok(Box::new(HostRaw::zeroed(bytes)?))
    }

    fn upload_bytes(&self, data: &[u8]) -> Result<Box<dyn RawBuffer>, CudaError> {
        let raw = HostRaw::zeroed(data.len())?;
        // SAFETY: `raw` holds at least `data.len()` bytes, freshly allocated.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), raw.ptr.as_ptr(), data.len()) };
        Ok(Box::new(raw))
    }

    fn download_bytes(&self, buf: &dyn RawBuffer, dst: &mut [u8]) -> Result<(), CudaError> {
        let raw = buf
            .as_any()
            .downcast_ref::<HostRaw>()
            .filter(|r| r.layout.size() >= dst.len())
            .ok_or_else(|| CudaError::Driver {
                context: "downloading",
                message: "not a large enough buffer of the host build".to_string(),
            })?;
        // SAFETY: `raw` holds at least `dst.len()` bytes; no launch is running
        // (launches are synchronous).
        unsafe { std::ptr::copy_nonoverlapping(raw.ptr.as_ptr(), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn launch(&self, name: &str, cfg: LaunchConfig, args: &[Arg]) -> Result<(), CudaError> {
        let refuse = |message: String| CudaError::Launch {
            kernel: name.to_string(),
            message,
        };
        check_config(name, &cfg)?;
        let k = self.kernels.get(name).ok_or_else(|| {
            refuse(format!(
                "host build `{}` has no such kernel",
                self.build.name()
            ))
        })?;
        let codes: String = args.iter().map(|a| a.code() as char).collect();
        if codes != k.signature {
            return Err(refuse(format!(
                "arguments ({codes}) do not match the kernel's parameters ({}) (p pointer, l long long, i int, u unsigned, f float)",
                k.signature
            )));
        }
        if cfg.shared_mem_bytes > DYNAMIC_SHARED_BYTES {
            return Err(refuse(format!(
                "{} bytes of dynamic shared memory; the host build has {DYNAMIC_SHARED_BYTES}",
                cfg.shared_mem_bytes
            )));
        }
        let slots: Vec<ArgSlot> = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(p) => ArgSlot { ptr: p },
                Arg::I64(v) => ArgSlot { i64: v },
                Arg::I32(v) => ArgSlot { i32: v },
                Arg::U32(v) => ArgSlot { u32: v },
                Arg::F32(v) => ArgSlot { f32: v },
            })
            .collect();
        let ptrs = ArgArray(
            slots
                .iter()
                .map(|s| s as *const ArgSlot as *mut c_void)
                .collect(),
        );
        let grid = [cfg.grid_dim.0, cfg.grid_dim.1, cfg.grid_dim.2];
        let block = [cfg.block_dim.0, cfg.block_dim.1, cfg.block_dim.2];
        let blocks = grid.iter().map(|&g| g as u64).product::<u64>();
        let run = |range: (u64, u64)| -> Result<(), String> {
            let mut msg = [0 as c_char; 512];
            // SAFETY: the trampoline of a kernel whose parameter types match
            // `args` (checked above); pointers are the caller's promise.
            let rc = unsafe {
                lp_host_launch(
                    k.run,
                    ptrs.as_ptr(),
                    grid.as_ptr(),
                    block.as_ptr(),
                    cfg.shared_mem_bytes,
                    range.0,
                    range.1,
                    msg.as_mut_ptr(),
                    msg.len(),
                )
            };
            if rc == 0 {
                Ok(())
            } else {
                // SAFETY: NUL-terminated by snprintf.
                Err(unsafe { CStr::from_ptr(msg.as_ptr()) }
                    .to_string_lossy()
                    .into_owned())
            }
        };
        let tasks = (rayon::current_num_threads() as u64 * 4).clamp(1, blocks);
        let result = if tasks == 1 {
            run((0, blocks))
        } else {
            (0..tasks)
                .into_par_iter()
                .map(|t| run((blocks * t / tasks, blocks * (t + 1) / tasks)))
                .collect::<Vec<_>>()
                .into_iter()
                .collect::<Result<(), String>>()
        };
        result.map_err(refuse)
    }

    fn synchronize(&self) -> Result<(), CudaError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::source::SOURCES;

    #[test]
    fn host_builds_list_the_cuda_sources_in_order() {
        let names: Vec<_> = SOURCES.iter().map(|s| s.name).collect();
        assert_eq!(names, builds::SOURCE_FILES);
    }

    #[test]
    fn every_kernel_of_the_sources_is_in_the_real_build_with_its_signature() {
        let h = HostLauncher::new(HostBuild::Real);
        for name in [
            "lp_row_stats_f32",
            "lp_row_stats_bf16",
            "lp_row_stats_f16",
            "lp_gather_bf16",
            "lp_finish_forward",
            "lp_widen_f16",
            "lp_log_softmax_rows",
            "lp_chunked_finish",
            "lp_backward_f32_to_bf16",
            "lp_merge_shards",
            "lp_fill_f32",
        ] {
            assert!(h.signature(name).is_some(), "{name}");
        }
        assert_eq!(
            h.signature("lp_row_stats_f32").unwrap(),
            ("pliipliffiip", "row_stats")
        );
        assert_eq!(h.signature("lp_fill_bf16").unwrap().0, "plu");
    }

    #[test]
    fn a_mutant_build_replaces_only_its_patched_module() {
        let real = HostLauncher::new(HostBuild::Real);
        for m in HostBuild::mutants() {
            let h = HostLauncher::new(m);
            let HostBuild::Mutant(patch) = m else {
                unreachable!()
            };
            let own = h
                .kernel_names()
                .into_iter()
                .filter(|n| h.kernels[n].run as usize != real.kernels[n].run as usize)
                .count();
            assert!(own > 0, "{}: no kernel of its own", patch.build);
            for n in h.kernel_names() {
                let changed = h.kernels[n].run as usize != real.kernels[n].run as usize;
                let patched_module = patch.file == "common.cuh"
                    || patch.file == format!("{}.cu", h.kernels[n].module);
                assert_eq!(changed, patched_module, "{} {n}", patch.build);
            }
            assert!(!h
                .kernel_names()
                .iter()
                .any(|n| n.starts_with("lp_selftest")));
        }
    }
}
