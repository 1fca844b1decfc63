//! The kernel registry: every kernel of the workspace, listed once, with
//! how it is built and which runs it takes part in. The property gate
//! ([`crate::suite`]'s kernel lists and families), the golden fixtures
//! (`tests/golden.rs`), the memory test (`tests/memory.rs`), `logprobe
//! fuzz --kernel` and `logprobe bench` all read it, so a new kernel
//! registers here once and every run that suits it picks it up.
//!
//! Back ends behind features: candle (`candle`, on by default), CUDA on a
//! GPU (`cuda`, when a device is usable), and the host build of the same
//! `.cu` sources (`cuda-host`, on by default: `logprobe fuzz --kernel
//! cuda-host,...` runs the chunk planner, launch code and kernel bodies of
//! the CUDA back end on every machine). The host-built kernels are in the
//! gate as the GPU's are: fused, chunked at chunk sizes 1 and 64 in the
//! kernel list, chunked and vocab-parallel in the invariance families.

use logprobe_kernels::kernel::Kernel;
use logprobe_kernels::CpuKernel;

/// Where a kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// This workspace's CPU kernels.
    Cpu,
    /// candle's op / composed path on candle's CPU device.
    Candle,
    /// The CUDA kernels on a GPU (cudarc + NVRTC).
    Cuda,
    /// The CUDA kernels' `.cu` sources built for the host (fibers as threads).
    CudaHost,
}

impl Backend {
    /// Why this back end cannot run here (`None`: it can).
    pub fn unavailable(self) -> Option<String> {
        match self {
            Backend::Cpu | Backend::Candle | Backend::CudaHost => None,
            #[cfg(feature = "cuda")]
            Backend::Cuda => logprobe_kernels::cuda::unavailable_reason(),
            #[cfg(not(feature = "cuda"))]
            Backend::Cuda => Some(
                "this logprobe was built without the `cuda` feature (cargo build --features cuda)"
                    .to_string(),
            ),
        }
    }
}

/// How a kernel is built for a case.
#[derive(Clone, Copy)]
pub enum Build {
    /// One kernel, whatever the case.
    Fixed(fn() -> Box<dyn Kernel>),
    /// By `chunk_size` (rows per chunk, `>= 1`).
    ByChunk(fn(usize) -> Box<dyn Kernel>),
    /// By vocabulary shard widths (summing to `V_total`).
    ByShards(fn(&[usize]) -> Box<dyn Kernel>),
}

/// The memory budget a kernel is checked against (property 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryBudget {
    /// `O(N)` extra bytes (fused).
    Rows,
    /// `2 * chunk_size * V * 4` bytes `+ O(N)` (chunked).
    Chunks,
}

/// One registered kernel.
#[derive(Clone, Copy)]
pub struct Entry {
    /// The name `logprobe fuzz --kernel` takes.
    pub name: &'static str,
    /// The name in the property gate's family reports.
    pub family: &'static str,
    /// Where it runs.
    pub backend: Backend,
    /// How it is built.
    pub build: Build,
    /// The chunk sizes it runs at in the gate's kernel list
    /// ([`crate::suite::cpu_kernels`]); one instance for a kernel not built
    /// by chunk; empty: not in the list.
    pub gate_chunk_sizes: &'static [usize],
    /// In the gate's families ([`crate::suite::cpu_families`] by chunk,
    /// [`crate::suite::sharded_families`] by shards), and in fuzz checked for
    /// chunk-size and row-slicing invariance (bit for bit).
    pub invariance: bool,
    /// The memory budget it is checked against (memory test, fuzz), if any.
    pub memory: Option<MemoryBudget>,
    /// In the golden fixtures' kernel-error figures, at this chunk size
    /// (CPU kernels in each fixture's snapshot, the host-built CUDA kernels
    /// in `cuda_host_bits`).
    pub golden_chunk_size: Option<usize>,
    /// In `logprobe fuzz`'s default `--kernel` list.
    pub fuzz_default: bool,
}

impl Entry {
    /// The kernel for a case with this `chunk_size` and these shard widths
    /// (each ignored by kernels not built from it).
    ///
    /// # Panics
    /// A GPU kernel whose device was usable a moment ago and fails to build
    /// (a broken device; the property and fuzz panic guards report it).
    pub fn kernel(&self, chunk_size: usize, shard_widths: &[usize]) -> Box<dyn Kernel> {
        match self.build {
            Build::Fixed(f) => f(),
            Build::ByChunk(f) => f(chunk_size),
            Build::ByShards(f) => f(shard_widths),
        }
    }

    /// Whether it is built over shard widths.
    pub fn is_sharded(&self) -> bool {
        matches!(self.build, Build::ByShards(_))
    }

    /// Whether it is built by chunk size.
    pub fn is_chunked(&self) -> bool {
        matches!(self.build, Build::ByChunk(_))
    }

    /// The gate's instances of this kernel ([`Entry::gate_chunk_sizes`];
    /// a sharded kernel is never in the list: it needs a layout).
    pub fn gate_kernels(&self) -> Vec<Box<dyn Kernel>> {
        if self.is_sharded() {
            return Vec::new();
        }
        let sizes = if self.is_chunked() {
            self.gate_chunk_sizes
        } else {
            &self.gate_chunk_sizes[..self.gate_chunk_sizes.len().min(1)]
        };
        sizes.iter().map(|&c| self.kernel(c, &[])).collect()
    }
}

/// Every registered kernel, in report order: CPU, candle, CUDA, host-built
/// CUDA (those of back ends not compiled in are absent).
pub fn entries() -> Vec<Entry> {
    #[allow(unused_mut)]
    let mut v = vec![
        Entry {
            name: "fused",
            family: "fused",
            backend: Backend::Cpu,
            build: Build::Fixed(|| Box::new(CpuKernel::fused())),
            gate_chunk_sizes: &[0],
            invariance: true,
            memory: Some(MemoryBudget::Rows),
            golden_chunk_size: Some(0),
            fuzz_default: true,
        },
        Entry {
            name: "chunked",
            family: "chunked",
            backend: Backend::Cpu,
            build: Build::ByChunk(|c| Box::new(CpuKernel::chunked(c))),
            gate_chunk_sizes: &[1, 3, 64],
            invariance: true,
            memory: Some(MemoryBudget::Chunks),
            golden_chunk_size: Some(3),
            fuzz_default: true,
        },
        Entry {
            name: "vocab-parallel",
            family: "vocab_parallel",
            backend: Backend::Cpu,
            build: Build::ByShards(|w| Box::new(CpuKernel::vocab_parallel(w.to_vec()))),
            gate_chunk_sizes: &[],
            invariance: true,
            memory: None,
            golden_chunk_size: None,
            fuzz_default: true,
        },
    ];
    // candle's composed path declares input-dtype accumulation: the model
    // gives its bf16 / f16 rows at large `V` no bound, by design, so it is
    // opt-in everywhere (its own checks: `tests/properties.rs`).
    #[cfg(feature = "candle")]
    v.push(Entry {
        name: "candle",
        family: "candle_composed",
        backend: Backend::Candle,
        build: Build::Fixed(|| Box::new(logprobe_kernels::candle::CandleComposed)),
        gate_chunk_sizes: &[],
        invariance: false,
        memory: None,
        golden_chunk_size: None,
        fuzz_default: false,
    });
    #[cfg(feature = "cuda")]
    {
        use logprobe_kernels::cuda::{CudaChunked, CudaFused, CudaVocabParallel, Shards};
        v.push(Entry {
            name: "cuda-fused",
            family: "cuda_fused",
            backend: Backend::Cuda,
            build: Build::Fixed(|| Box::new(CudaFused::new().expect("CUDA fused kernel"))),
            gate_chunk_sizes: &[0],
            invariance: false,
            memory: None,
            golden_chunk_size: None,
            fuzz_default: false,
        });
        v.push(Entry {
            name: "cuda",
            family: "cuda_chunked",
            backend: Backend::Cuda,
            build: Build::ByChunk(|c| Box::new(CudaChunked::new(c).expect("CUDA chunked kernel"))),
            gate_chunk_sizes: &[1, 64],
            invariance: true,
            memory: None,
            golden_chunk_size: None,
            fuzz_default: false,
        });
        v.push(Entry {
            name: "cuda-vocab-parallel",
            family: "cuda_vocab_parallel",
            backend: Backend::Cuda,
            build: Build::ByShards(|w| {
                Box::new(
                    CudaVocabParallel::new(Shards::Widths(w.to_vec()))
                        .expect("CUDA vocab-parallel kernel"),
                )
            }),
            gate_chunk_sizes: &[],
            invariance: true,
            memory: None,
            golden_chunk_size: None,
            fuzz_default: false,
        });
    }
    #[cfg(feature = "cuda-host")]
    {
        use logprobe_kernels::cuda::{CudaChunked, CudaFused, CudaVocabParallel, Shards};
        v.push(Entry {
            name: "cuda-host-fused",
            family: "cuda_host_fused",
            backend: Backend::CudaHost,
            build: Build::Fixed(|| Box::new(CudaFused::host())),
            gate_chunk_sizes: &[0],
            invariance: false,
            memory: None,
            golden_chunk_size: Some(0),
            fuzz_default: false,
        });
        v.push(Entry {
            name: "cuda-host",
            family: "cuda_host_chunked",
            backend: Backend::CudaHost,
            build: Build::ByChunk(|c| {
                Box::new(CudaChunked::host(c).expect("chunk sizes here are >= 1"))
            }),
            gate_chunk_sizes: &[1, 64],
            invariance: true,
            memory: None,
            golden_chunk_size: Some(3),
            fuzz_default: false,
        });
        v.push(Entry {
            name: "cuda-host-vocab-parallel",
            family: "cuda_host_vocab_parallel",
            backend: Backend::CudaHost,
            build: Build::ByShards(|w| {
                Box::new(CudaVocabParallel::host(Shards::Widths(w.to_vec())))
            }),
            gate_chunk_sizes: &[],
            invariance: true,
            memory: None,
            golden_chunk_size: None,
            fuzz_default: false,
        });
    }
    v
}

/// The entries whose back end can run here.
pub fn available() -> Vec<Entry> {
    entries()
        .into_iter()
        .filter(|e| e.backend.unavailable().is_none())
        .collect()
}

/// The entry named `name` ([`Entry::name`]), whether or not its back end
/// can run here.
pub fn find(name: &str) -> Option<Entry> {
    entries().into_iter().find(|e| e.name == name)
}

/// The names the CUDA (GPU) entries have when the `cuda` feature is on.
pub const CUDA_NAMES: [&str; 3] = ["cuda-fused", "cuda", "cuda-vocab-parallel"];

/// Why `name` names no entry of this build although it is a registered
/// name elsewhere (a GPU entry in a build without the `cuda` feature).
pub fn not_compiled_in(name: &str) -> Option<String> {
    (find(name).is_none() && CUDA_NAMES.contains(&name))
        .then(|| Backend::Cuda.unavailable())
        .flatten()
}

/// The names of every entry, comma-separated (for `--help` and errors).
pub fn names() -> String {
    entries()
        .iter()
        .map(|e| e.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `logprobe fuzz` default `--kernel` list ([`Entry::fuzz_default`]).
pub fn fuzz_defaults() -> String {
    entries()
        .iter()
        .filter(|e| e.fuzz_default)
        .map(|e| e.name)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_every_available_entry_builds() {
        let all = entries();
        for (i, a) in all.iter().enumerate() {
            assert!(
                all[i + 1..]
                    .iter()
                    .all(|b| b.name != a.name && b.family != a.family),
                "{} registered twice",
                a.name
            );
        }
        for e in available() {
            let k = e.kernel(2, &[3, 5]);
            assert!(!k.name().is_empty(), "{}", e.name);
        }
        assert_eq!(fuzz_defaults(), "fused,chunked,vocab-parallel");
    }
}
