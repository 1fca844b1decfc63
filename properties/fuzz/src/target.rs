//! What `--kernel` names: the fuzz targets, read from the test kit's
//! kernel registry ([`logprobe_testkit::registry`]) plus the planted
//! mutants (`mutant:NAME`). A target builds a [`Kernel`] per case (chunked
//! ones with the case's `chunk_size`, vocab-parallel ones over the case's
//! shard layout); the judging loop only sees [`Target`], so a kernel
//! running elsewhere (an external process, `fuzz --exec`) plugs in as
//! another `Kernel`.

use logprobe_kernels::kernel::Kernel;
use logprobe_testkit::mutants::{self, Twin};
use logprobe_testkit::registry::{self, Build, MemoryBudget};
use thiserror::Error;

/// A `--kernel` list that names nothing runnable.
#[derive(Debug, Error, PartialEq)]
pub enum TargetError {
    /// A name not in the list (the registry's names, then the mutants').
    #[error("unknown kernel `{0}` (kernels: {names}, mutant:NAME; mutants: {1})", names = registry::names())]
    Unknown(String, String),
    /// A CUDA kernel where no device is usable (or the binary lacks the feature).
    #[error("kernel `cuda` is not available here: {0}")]
    CudaUnavailable(String),
    /// An empty list.
    #[error("--kernel names no kernel")]
    Empty,
}

/// How a target's kernel is built for a case.
enum Make {
    /// A registered kernel.
    Registered(Build),
    /// By `chunk_size` (the mutants).
    Chunked(Box<dyn Fn(usize) -> Box<dyn Kernel> + Send + Sync>),
    /// By shard widths (the TP mutant).
    Sharded(logprobe_testkit::suite::ShardedMaker),
}

/// One fuzz target (see the module docs).
pub struct Target {
    /// The name as given to `--kernel`.
    pub name: String,
    make: Make,
    /// Checked for chunk-size and row-slicing invariance (bit for bit).
    pub invariance: bool,
    /// Checked against the memory budget (chunked: `2 * chunk_size * V * 4`
    /// bytes `+ O(N)`; fused: `O(N)`): our CPU kernels, and the mutants
    /// whose wrapper allocates nothing `V`-sized of its own.
    pub memory: bool,
    /// The correct kernel a mutant wraps (a finding on a mutant is checked
    /// against it: its twin must pass the same case).
    pub twin: Option<Box<Target>>,
    /// Whether the memory budget is the chunked one (else fused's `O(N)`).
    pub chunk_budget: bool,
}

impl Target {
    /// The kernel for a case with this `chunk_size` and these shard widths.
    pub fn kernel(&self, chunk_size: usize, shard_widths: &[usize]) -> Box<dyn Kernel> {
        match &self.make {
            Make::Registered(Build::Fixed(f)) => f(),
            Make::Registered(Build::ByChunk(f)) => f(chunk_size),
            Make::Registered(Build::ByShards(f)) => f(shard_widths),
            Make::Chunked(f) => f(chunk_size),
            Make::Sharded(f) => f(shard_widths),
        }
    }

    /// Whether the kernel is built over shard widths.
    pub fn is_sharded(&self) -> bool {
        matches!(
            self.make,
            Make::Sharded(_) | Make::Registered(Build::ByShards(_))
        )
    }
}

/// The default `--kernel` list: our CPU kernels (the registry's
/// [`registry::Entry::fuzz_default`] ones; a test checks they agree).
/// `candle` (candle's composed path, which declares input-dtype
/// accumulation) is opt-in: the model gives its bf16 / f16 rows at large
/// `V` no bound, by design.
pub const DEFAULT_KERNELS: &str = "fused,chunked,vocab-parallel";

fn mutant_names() -> String {
    mutants::names()
}

/// Parses a `--kernel` list (comma-separated).
///
/// # Errors
/// [`TargetError`] for an unknown name, an empty list, or `cuda` without a
/// usable device.
pub fn parse_targets(list: &str) -> Result<Vec<Target>, TargetError> {
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        out.push(parse_target(name)?);
    }
    if out.is_empty() {
        return Err(TargetError::Empty);
    }
    Ok(out)
}

/// Parses one kernel name.
///
/// # Errors
/// As [`parse_targets`].
pub fn parse_target(name: &str) -> Result<Target, TargetError> {
    if let Some(e) = registry::find(name) {
        if let Some(why) = e.backend.unavailable() {
            return Err(TargetError::CudaUnavailable(why));
        }
        #[cfg(feature = "cuda")]
        if e.backend == registry::Backend::Cuda {
            // A device that answers but cannot run a kernel.
            logprobe_kernels::cuda::CudaChunked::new(1)
                .map_err(|err| TargetError::CudaUnavailable(err.to_string()))?;
        }
        return Ok(Target {
            name: name.to_string(),
            // Bit-for-bit chunk-size and row-slicing invariance; a sharded
            // kernel's layout is the case's, so only by chunk.
            invariance: e.invariance && !e.is_sharded(),
            memory: e.memory.is_some(),
            chunk_budget: e.memory == Some(MemoryBudget::Chunks)
                || (e.memory.is_none() && e.is_chunked()),
            make: Make::Registered(e.build),
            twin: None,
        });
    }
    if let Some(why) = registry::not_compiled_in(name) {
        return Err(TargetError::CudaUnavailable(why));
    }
    let Some(m) = name.strip_prefix("mutant:") else {
        return Err(TargetError::Unknown(name.into(), mutant_names()));
    };
    let entry =
        mutants::find(m).ok_or_else(|| TargetError::Unknown(name.into(), mutant_names()))?;
    Ok(mutant_target(name, entry))
}

fn mutant_target(name: &str, entry: &'static mutants::Entry) -> Target {
    let sharded = entry.twin == Twin::VocabParallel;
    let make = match entry.build_sharded {
        Some(f) => Make::Sharded(Box::new(move |w| Box::new(f(w)) as Box<dyn Kernel>)),
        // Fused-based mutants ignore chunk_size.
        None => Make::Chunked(Box::new(move |c| {
            Box::new((entry.build)(c)) as Box<dyn Kernel>
        })),
    };
    let mut twin = parse_target(entry.twin.name()).expect("a built-in kernel name");
    // The twin runs the mutant's checks. Wrappers that only change options,
    // cotangents or written rows allocate nothing V-sized beyond their inner
    // kernel (the memory model holds).
    twin.memory = entry.memory_model;
    twin.invariance = !sharded;
    Target {
        name: name.into(),
        make,
        invariance: !sharded,
        memory: entry.memory_model,
        chunk_budget: entry.is_chunked(),
        twin: Some(Box::new(twin)),
    }
}
