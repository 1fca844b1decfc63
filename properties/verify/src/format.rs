//! The format-version-2 metadata this build reads (`docs/dump-from-pytorch.md`):
//! `format_version`, `cotangent_reduction`, `topk_ids_source`,
//! `topk_sorted`, `chunk_size` (checked, informational), `masked_log_probs`. Version-1 keys are parsed with the options in
//! [`crate::dump`].

use std::collections::HashMap;

use crate::dump::DumpError;
use logprobe_reference::spec::{Dtype, Output};

use crate::keys::{self, CotangentReduction, FormatVersion, TopkIdsSource};

/// Format options of a dump.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FormatOptions {
    /// `format_version`: 1 (default) or 2.
    pub version: u8,
    /// `cotangent_reduction=sum`: a `[]` or `[1]` cotangent is broadcast to
    /// every row (the upstream gradient of a summed loss).
    pub cotangent_sum: bool,
    /// `topk_ids_source=kernel`: `topk_ids` are the kernel's own top-k of
    /// `z'`, checked as a valid top-k set ([`crate::topk_set`]).
    pub topk_kernel: bool,
    /// `topk_sorted=true` (with `kernel`): ids in descending order of `z'`.
    pub topk_sorted: bool,
    /// `masked_log_probs=finfo_min`: a top-k log-prob whose exact value is
    /// `-inf` (a masked id) may be stored as `-finfo(dtype).max`; it is
    /// judged as `-inf` ([`FormatOptions::masked_candidate`]).
    pub masked_finfo_min: bool,
    /// `k3_form=expm1`: the kernel evaluates `kl_k3` as `expm1(-d) + d`
    /// (TOLERANCE.md (T20)); it narrows the bound as `verify --k3-form
    /// expm1` does, whichever of the two declares it.
    pub k3_expm1: bool,
}

impl FormatOptions {
    /// Reads the keys from the metadata strings (defaults when absent).
    /// Whether a key is allowed at the dump's version is checked by
    /// [`crate::names`].
    ///
    /// # Errors
    /// [`DumpError::BadMetadata`] for a value outside its choices, and for
    /// `topk_sorted=true` without `topk_ids_source=kernel`.
    pub fn parse(meta: &HashMap<String, String>) -> Result<Self, DumpError> {
        let version = match keys::FORMAT_VERSION.get(meta)? {
            Some(FormatVersion::V2) => 2,
            _ => 1,
        };
        let cotangent_sum = keys::COTANGENT_REDUCTION.get(meta)? == Some(CotangentReduction::Sum);
        let topk_kernel = keys::TOPK_IDS_SOURCE.get(meta)? == Some(TopkIdsSource::Kernel);
        let topk_sorted = keys::TOPK_SORTED.get(meta)?.unwrap_or(false);
        // Informational: the chunk size the kernel used (fuzz writes it);
        // outputs are chunk-size invariant, so it changes no judgement.
        if keys::CHUNK_SIZE.get(meta)? == Some(0) {
            let k = keys::CHUNK_SIZE;
            return Err(k.bad(&meta[k.name], k.reason));
        }
        if topk_sorted && !topk_kernel {
            let k = keys::TOPK_SORTED;
            return Err(k.bad(
                &meta[k.name],
                "needs topk_ids_source=\"kernel\" (given ids are inputs, in any order)",
            ));
        }
        Ok(FormatOptions {
            version,
            cotangent_sum,
            topk_kernel,
            topk_sorted,
            masked_finfo_min: keys::MASKED_LOG_PROBS.get(meta)?
                == Some(keys::MaskedLogProbs::FinfoMin),
            k3_expm1: keys::K3_FORM.get(meta)? == Some(crate::tolerance::K3Form::Expm1),
        })
    }

    /// The value a candidate of `output` in `dtype` is judged as, for an
    /// element whose exact value is `exact`: under `masked_log_probs =
    /// finfo_min`, a `topk_log_probs` candidate equal to `-dtype.max` where
    /// the exact value is `-inf` (a masked id) is `-inf`; any other
    /// candidate as stored (`-finfo.max` where the exact value is finite is
    /// judged as that finite value, and fails).
    pub fn masked_candidate(
        &self,
        output: Output,
        dtype: Dtype,
        exact: f64,
        candidate: f64,
    ) -> f64 {
        let clamped = self.masked_finfo_min
            && output == Output::TopkLogProbs
            && exact == f64::NEG_INFINITY
            && candidate == -dtype.max_finite();
        if clamped {
            f64::NEG_INFINITY
        } else {
            candidate
        }
    }
}
