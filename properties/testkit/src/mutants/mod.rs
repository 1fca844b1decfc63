//! Planted mutant kernels: one per bug kind that chunked / fused log-prob
//! code has shipped (DESIGN: "Why it matters", property 8).
//!
//! Each mutant wraps a correct kernel of this workspace and differs from it
//! only where its bug is triggered: it calls the correct kernel and then
//! replaces exactly the outputs the bug changes, recomputed the buggy way
//! (or calls it with the options the bug gets wrong). So a mutant that
//! survives the default property run proves that the generators never reach
//! its trigger; a killed one proves they do.
//!
//! | kind | wraps | trigger |
//! | --- | --- | --- |
//! | [`MutantKind::NanOnNegInf`] | fused | entropy rows with a `-inf` (or masked, for masked entropy) entry: `p log p = 0 * -inf` |
//! | [`MutantKind::Bf16Accumulation`] | fused | bf16 / f16 logits: every sum accumulated in the input dtype |
//! | [`MutantKind::DroppedChunkRemainder`] | chunked | rows past the last full chunk are left 0 |
//! | [`MutantKind::IgnoredChunkSize`] | chunked | always one chunk of all `N` rows (same values, `N x V` memory) |
//! | [`MutantKind::TpVocabOffset`] | [`CpuKernel::vocab_parallel`] (two even shards, or [`Mutant::tp_vocab_offset`]'s layout) | a target owned by a shard that does not start at column 0 is gathered at its local index (the shard's vocab offset not added back) |
//! | [`MutantKind::PaddedVocabNotTruncated`] | fused | `vocab_size < V_total`: the padding is treated as vocabulary |
//! | [`MutantKind::TemperatureIgnored`] | fused | `T != 1` |
//! | [`MutantKind::TemperatureTwice`] | fused | `T != 1`: logits divided by `T` twice |
//! | [`MutantKind::EntropyWrongLogits`] | fused | a sampling mask: entropy over the other set of logits |
//! | [`MutantKind::GradOutput0Broadcast`] | fused | backward with `N >= 2`: row 0's cotangents used for every row |
//! | [`MutantKind::MissingMaxShift`] | fused | rows whose unshifted `sum exp(z)` overflows or underflows f32 |
//! | [`MutantKind::InPlaceCorruption`] | fused | in-place backward over input with a bad row after a good one: earlier rows already overwritten |
//! | [`MutantKind::RawEntropyFormula`] | fused | every entropy computed as `lse - sum p z` on raw logits in f32 (exact enough at small offsets, digits lost at large ones) |
//! | [`MutantKind::ChunkDependentOrder`] | chunked | rows in odd-numbered chunks reduced in reverse column order |

use logprobe_kernels::kernel::Kernel;
use logprobe_kernels::CpuKernel;

use crate::strategies::even_shards;

/// The bug kinds of the catalog (see the module table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MutantKind {
    /// Entropy is NaN on rows with `-inf` entries (`p * log p` at `p = 0`).
    NanOnNegInf,
    /// Sums accumulated in bf16 / f16 for bf16 / f16 logits.
    Bf16Accumulation,
    /// Rows past the last full chunk are never written (left 0).
    DroppedChunkRemainder,
    /// `chunk_size` ignored: one chunk of all rows.
    IgnoredChunkSize,
    /// Tensor-parallel vocabulary offset not subtracted for the target.
    TpVocabOffset,
    /// Padded vocabulary columns not truncated.
    PaddedVocabNotTruncated,
    /// Temperature ignored.
    TemperatureIgnored,
    /// Temperature applied twice.
    TemperatureTwice,
    /// Entropy over the wrong logits (masked vs unmasked swapped).
    EntropyWrongLogits,
    /// Backward uses `grad_output[0]` for every row.
    GradOutput0Broadcast,
    /// No max shift: `exp(z)` overflows or underflows.
    MissingMaxShift,
    /// In-place backward that leaves the logits half overwritten on error.
    InPlaceCorruption,
    /// Entropy as `lse - sum(p * z)` on raw logits.
    RawEntropyFormula,
    /// Reduction order depends on the row's chunk.
    ChunkDependentOrder,
}

impl MutantKind {
    /// Every kind, in the module table's order.
    pub const ALL: [MutantKind; 14] = [
        MutantKind::NanOnNegInf,
        MutantKind::Bf16Accumulation,
        MutantKind::DroppedChunkRemainder,
        MutantKind::IgnoredChunkSize,
        MutantKind::TpVocabOffset,
        MutantKind::PaddedVocabNotTruncated,
        MutantKind::TemperatureIgnored,
        MutantKind::TemperatureTwice,
        MutantKind::EntropyWrongLogits,
        MutantKind::GradOutput0Broadcast,
        MutantKind::MissingMaxShift,
        MutantKind::InPlaceCorruption,
        MutantKind::RawEntropyFormula,
        MutantKind::ChunkDependentOrder,
    ];

    /// Short name (kebab case) for reports.
    pub fn name(self) -> &'static str {
        match self {
            MutantKind::NanOnNegInf => "nan-on-neg-inf",
            MutantKind::Bf16Accumulation => "bf16-accumulation",
            MutantKind::DroppedChunkRemainder => "dropped-chunk-remainder",
            MutantKind::IgnoredChunkSize => "ignored-chunk-size",
            MutantKind::TpVocabOffset => "tp-vocab-offset",
            MutantKind::PaddedVocabNotTruncated => "padded-vocab-not-truncated",
            MutantKind::TemperatureIgnored => "temperature-ignored",
            MutantKind::TemperatureTwice => "temperature-twice",
            MutantKind::EntropyWrongLogits => "entropy-wrong-logits",
            MutantKind::GradOutput0Broadcast => "grad-output-0-broadcast",
            MutantKind::MissingMaxShift => "missing-max-shift",
            MutantKind::InPlaceCorruption => "in-place-corruption",
            MutantKind::RawEntropyFormula => "raw-entropy-formula",
            MutantKind::ChunkDependentOrder => "chunk-dependent-order",
        }
    }

    /// Whether the kind wraps a chunked kernel (and so takes a chunk size).
    pub fn is_chunked(self) -> bool {
        matches!(
            self,
            MutantKind::DroppedChunkRemainder
                | MutantKind::IgnoredChunkSize
                | MutantKind::ChunkDependentOrder
        )
    }
}

/// A planted mutant: a correct kernel plus one bug (see the module docs).
pub struct Mutant {
    kind: MutantKind,
    inner: Box<dyn Kernel>,
    chunk_size: usize,
    /// The TP mutant's shard widths (`None`: two even shards of `V_total`).
    shards: Option<Vec<usize>>,
}

impl Mutant {
    /// The mutant of `kind` around this workspace's kernel for it (chunked
    /// ones with `chunk_size` rows per chunk; the TP one around
    /// [`CpuKernel::vocab_parallel`] over two even shards of each call's `V_total`).
    pub fn new(kind: MutantKind, chunk_size: usize) -> Mutant {
        let inner: Box<dyn Kernel> = match kind {
            k if k.is_chunked() => Box::new(CpuKernel::chunked(chunk_size)),
            MutantKind::TpVocabOffset => Box::new(CpuKernel::vocab_parallel(Vec::new())),
            _ => Box::new(CpuKernel::fused()),
        };
        Mutant {
            kind,
            inner,
            chunk_size,
            shards: None,
        }
    }

    /// The TP-vocab-offset mutant around [`CpuKernel::vocab_parallel`] over shards of
    /// these widths (summing to `V_total`, else the kernel's
    /// [`SpecError::ShapeMismatch`]): bit for bit the correct kernel except
    /// on rows whose target lies in a shard starting past column 0.
    pub fn tp_vocab_offset(shard_widths: Vec<usize>) -> Mutant {
        Mutant {
            shards: Some(shard_widths),
            ..Mutant::new(MutantKind::TpVocabOffset, 1)
        }
    }

    /// The correct vocab-parallel kernel the TP mutant wraps, for `v_total`
    /// columns.
    fn tp_kernel(&self, v_total: usize) -> CpuKernel {
        CpuKernel::vocab_parallel(
            self.shards
                .clone()
                .unwrap_or_else(|| even_shards(v_total, 2)),
        )
    }

    /// The bug kind.
    pub fn kind(&self) -> MutantKind {
        self.kind
    }
}

/// Every mutant of the catalog, chunked ones with `chunk_size`.
pub fn catalog(chunk_size: usize) -> Vec<Mutant> {
    MutantKind::ALL
        .iter()
        .map(|&k| Mutant::new(k, chunk_size))
        .collect()
}

mod bugs;
mod kernel;
mod rewired;
#[cfg(test)]
mod tests;

use rewired::*;
