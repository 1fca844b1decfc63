//! What `--kernel` names: the fuzz targets. This is the one place kernel
//! names are parsed (it moves to the test kit's kernel registry when that
//! lands). A target builds a [`Kernel`] per case (chunked ones with the
//! case's `chunk_size`, vocab-parallel ones over the case's shard layout);
//! the judging loop only sees [`Target`], so a kernel running elsewhere (an
//! external process, `fuzz --exec`) plugs in as another `Kernel`.

use logprobe_kernels::candle::CandleComposed;
use logprobe_kernels::kernel::Kernel;
use logprobe_kernels::CpuKernel;
use logprobe_testkit::mutants::{Mutant, MutantKind};
use thiserror::Error;

/// A `--kernel` list that names nothing runnable.
#[derive(Debug, Error, PartialEq)]
pub enum TargetError {
    /// A name not in the list.
    #[error("unknown kernel `{0}` (kernels: fused, chunked, vocab-parallel, candle, cuda, mutant:NAME; mutants: {1})")]
    Unknown(String, String),
    /// `cuda` where no device is usable (or the binary lacks the feature).
    #[error("kernel `cuda` is not available here: {0}")]
    CudaUnavailable(String),
    /// An empty list.
    #[error("--kernel names no kernel")]
    Empty,
}

/// How a target's kernel is built for a case.
enum Make {
    /// One kernel, whatever the case.
    Fixed(fn() -> Box<dyn Kernel>),
    /// By `chunk_size`.
    Chunked(Box<dyn Fn(usize) -> Box<dyn Kernel> + Send + Sync>),
    /// By shard widths.
    Sharded(Box<dyn Fn(&[usize]) -> Box<dyn Kernel> + Send + Sync>),
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
            Make::Fixed(f) => f(),
            Make::Chunked(f) => f(chunk_size),
            Make::Sharded(f) => f(shard_widths),
        }
    }

    /// Whether the kernel is built over shard widths.
    pub fn is_sharded(&self) -> bool {
        matches!(self.make, Make::Sharded(_))
    }
}

/// The default `--kernel` list: our CPU kernels. `candle` (candle's composed
/// path, which declares input-dtype accumulation) is opt-in: the model gives
/// its bf16 / f16 rows at large `V` no bound, by design.
pub const DEFAULT_KERNELS: &str = "fused,chunked,vocab-parallel";

fn mutant_names() -> String {
    MutantKind::ALL
        .iter()
        .map(|k| k.name())
        .collect::<Vec<_>>()
        .join(", ")
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
    let t = |make, invariance, memory| Target {
        name: name.to_string(),
        chunk_budget: matches!(make, Make::Chunked(_)),
        make,
        invariance,
        memory,
        twin: None,
    };
    Ok(match name {
        "fused" => t(Make::Fixed(|| Box::new(CpuKernel::fused())), true, true),
        "chunked" => t(
            Make::Chunked(Box::new(|c| Box::new(CpuKernel::chunked(c)))),
            true,
            true,
        ),
        "vocab-parallel" => t(
            Make::Sharded(Box::new(|w| {
                Box::new(CpuKernel::vocab_parallel(w.to_vec()))
            })),
            false,
            false,
        ),
        "candle" => t(Make::Fixed(|| Box::new(CandleComposed)), false, false),
        "cuda" => cuda_target(name)?,
        _ => {
            let Some(m) = name.strip_prefix("mutant:") else {
                return Err(TargetError::Unknown(name.into(), mutant_names()));
            };
            let kind = MutantKind::ALL
                .into_iter()
                .find(|k| k.name() == m)
                .ok_or_else(|| TargetError::Unknown(name.into(), mutant_names()))?;
            mutant_target(name, kind)
        }
    })
}

fn mutant_target(name: &str, kind: MutantKind) -> Target {
    use MutantKind::*;
    // Wrappers that only change options, cotangents or written rows allocate
    // nothing V-sized beyond their inner kernel (the memory model holds).
    let memory = matches!(
        kind,
        PaddedVocabNotTruncated
            | TemperatureIgnored
            | TemperatureTwice
            | EntropyWrongLogits
            | IgnoredChunkSize
            | DroppedChunkRemainder
            | GradOutput0Broadcast
    );
    let make = if kind == TpVocabOffset {
        Make::Sharded(Box::new(|w| Box::new(Mutant::tp_vocab_offset(w.to_vec()))))
    } else {
        // Fused-based mutants ignore chunk_size.
        Make::Chunked(Box::new(move |c| Box::new(Mutant::new(kind, c))))
    };
    let twin = match kind {
        TpVocabOffset => "vocab-parallel",
        k if k.is_chunked() => "chunked",
        _ => "fused",
    };
    let mut twin = parse_target(twin).expect("a built-in kernel name");
    // The twin runs the mutant's checks.
    twin.memory = memory;
    twin.invariance = kind != TpVocabOffset;
    Target {
        name: name.into(),
        make,
        invariance: kind != TpVocabOffset,
        memory,
        chunk_budget: kind.is_chunked(),
        twin: Some(Box::new(twin)),
    }
}

#[cfg(feature = "cuda")]
fn cuda_target(name: &str) -> Result<Target, TargetError> {
    use logprobe_kernels::cuda::{unavailable_reason, CudaChunked};
    if let Some(why) = unavailable_reason() {
        return Err(TargetError::CudaUnavailable(why));
    }
    CudaChunked::new(1).map_err(|e| TargetError::CudaUnavailable(e.to_string()))?;
    Ok(Target {
        name: name.into(),
        // The device was usable a moment ago: a failure to build is a
        // broken device, reported as a finding by the judge's panic guard.
        make: Make::Chunked(Box::new(|c| {
            Box::new(CudaChunked::new(c).expect("CUDA chunked kernel"))
        })),
        invariance: true,
        memory: false,
        twin: None,
        chunk_budget: true,
    })
}

#[cfg(not(feature = "cuda"))]
fn cuda_target(_name: &str) -> Result<Target, TargetError> {
    Err(TargetError::CudaUnavailable(
        "this logprobe was built without the `cuda` feature (cargo build --features cuda)".into(),
    ))
}
