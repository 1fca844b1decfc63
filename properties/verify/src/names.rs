//! The names a dump may hold (`docs/dump-from-pytorch.md`): tensors and
//! `__metadata__` keys of format version 1, the names reserved for version 2
//! and which of those are built. Every check here is a function over a list
//! of [`Name`]s, so one table drives the reader, the writer's tests, `--help`
//! and the docs.
//!
//! An unknown name is bad input naming the closest valid one (edit distance,
//! `strsim`); a version-2 name in a version-1 dump asks for
//! `format_version=2`; a reserved name not built yet is rejected as "not
//! supported yet", never ignored.

use std::collections::HashMap;

use logprobe_reference::spec::Output;

use crate::dump::DumpError;
use crate::keys::{self, Key, MetaValue};

/// Whether a name is a tensor or a metadata key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A tensor of the safetensors file.
    Tensor,
    /// A key of `__metadata__`.
    Meta,
}

impl Kind {
    /// `tensor` or `metadata key`.
    pub fn noun(self) -> &'static str {
        match self {
            Kind::Tensor => "tensor",
            Kind::Meta => "metadata key",
        }
    }
}

/// The input tensors' names (the outputs' and their cotangents' are
/// [`Output::name`](logprobe_reference::spec::Output::name) and
/// [`Output::cotangent_name`](logprobe_reference::spec::Output::cotangent_name)).
pub mod tensor {
    /// `logits [N, V_total]` (or `[B, T, V_total]`).
    pub const LOGITS: &str = "logits";
    /// `tokens [N]`: each row's target id.
    pub const TOKENS: &str = "tokens";
    /// `sampling_mask [N, V_total]`: the allowed entries.
    pub const SAMPLING_MASK: &str = "sampling_mask";
    /// `topk_ids [N, K]`.
    pub const TOPK_IDS: &str = "topk_ids";
    /// `row_mask [N]`: rows checked (true) or excluded.
    pub const ROW_MASK: &str = "row_mask";
    /// `loss_weights [N]`: the loss's per-row weights.
    pub const LOSS_WEIGHTS: &str = "loss_weights";
    /// `ref_log_probs [N]`: the KL terms' reference log-probs.
    pub const REF_LOG_PROBS: &str = "ref_log_probs";
    /// `old_log_probs [N]`: the ratio's behaviour log-probs.
    pub const OLD_LOG_PROBS: &str = "old_log_probs";
    /// `teacher_topk_log_probs [N, K]`: the top-k KL's teacher.
    pub const TEACHER_TOPK_LOG_PROBS: &str = "teacher_topk_log_probs";
    /// `teacher_probs [N, V_total]`: the teacher's probabilities of
    /// `soft_cross_entropy`.
    pub const TEACHER_PROBS: &str = "teacher_probs";
    /// The soft cross-entropy's teacher as log-probabilities `[N, V_total]`.
    pub const TEACHER_LOG_PROBS: &str = "teacher_log_probs";
    /// `hidden [N, H]` (or `[B, T, H]`): a fused linear + loss kernel's
    /// input, given instead of `logits`.
    pub const HIDDEN: &str = "hidden";
    /// `lm_head_weight [V_total, H]`: the LM head (Megatron's layout).
    pub const LM_HEAD_WEIGHT: &str = "lm_head_weight";
    /// `lm_head_bias [V_total]`: the LM head's bias.
    pub const LM_HEAD_BIAS: &str = "lm_head_bias";
    /// `grad_hidden [N, H]`: candidate gradient of the hidden states.
    pub const GRAD_HIDDEN: &str = "grad_hidden";
    /// `grad_lm_head_weight [V_total, H]`: candidate gradient of the LM head.
    pub const GRAD_LM_HEAD_WEIGHT: &str = "grad_lm_head_weight";
    /// `grad_lm_head_bias [V_total]`: candidate gradient of its bias.
    pub const GRAD_LM_HEAD_BIAS: &str = "grad_lm_head_bias";
}

/// The version-1 tensor names (the first rows of [`NAMES`]).
pub const TENSOR_NAMES: [&str; 11] = [
    "logits",
    "tokens",
    "sampling_mask",
    "log_probs",
    "entropy",
    "topk_ids",
    "topk_log_probs",
    "grad_log_probs",
    "grad_entropy",
    "grad_topk_log_probs",
    "grad_logits",
];

/// One name of the format.
#[derive(Clone, Copy, Debug)]
pub struct Name {
    /// The name as stored.
    pub name: &'static str,
    /// Tensor or metadata key.
    pub kind: Kind,
    /// The first format version that has it (1 or 2).
    pub version: u8,
    /// Whether this build reads it (reserved-but-unbuilt names are rejected).
    pub built: bool,
    /// The value's type (`tensor` for a tensor, [`MetaValue::TYPE`] for a key).
    pub ty: &'static str,
    /// One line on what it means (empty for a tensor: the docs hold those).
    pub doc: &'static str,
    /// A key's check of a stored value (`None` for a tensor).
    check: Option<ValueCheck>,
    /// A key's reason for a malformed value ([`Key::reason`]).
    reason: &'static str,
}

/// A key's value check: `(key, reason, stored)`.
type ValueCheck = fn(&'static str, &'static str, &str) -> Result<(), DumpError>;

const fn t(name: &'static str, version: u8, built: bool) -> Name {
    Name {
        name,
        kind: Kind::Tensor,
        version,
        built,
        ty: "tensor",
        doc: "",
        check: None,
        reason: "",
    }
}

/// The tensor of `output`'s cotangent (`grad_<name>`), spelt by the output
/// table ([`Output::cotangent_name`]).
const fn cot(output: Output, version: u8, built: bool) -> Name {
    match output.cotangent_name() {
        Some(name) => t(name, version, built),
        None => panic!("an output without a cotangent"),
    }
}

const fn m<T: MetaValue>(key: Key<T>, version: u8, built: bool, doc: &'static str) -> Name {
    Name {
        name: key.name,
        kind: Kind::Meta,
        version,
        built,
        ty: T::TYPE,
        doc,
        check: Some(keys::check::<T>),
        reason: key.reason,
    }
}

/// Every name of the format, version 1 first (the table of
/// `docs/dump-from-pytorch.md`).
pub const NAMES: &[Name] = &[
    t(tensor::LOGITS, 1, true),
    t(tensor::TOKENS, 1, true),
    t(tensor::SAMPLING_MASK, 1, true),
    t(Output::LogProbs.name(), 1, true),
    t(Output::Entropy.name(), 1, true),
    t(tensor::TOPK_IDS, 1, true),
    t(Output::TopkLogProbs.name(), 1, true),
    cot(Output::LogProbs, 1, true),
    cot(Output::Entropy, 1, true),
    cot(Output::TopkLogProbs, 1, true),
    t(Output::GradLogits.name(), 1, true),
    m(keys::TEMPERATURE, 1, true, "z = logits / T (default 1)"),
    m(
        keys::VOCAB_SIZE,
        1,
        true,
        "the real columns of logits (default V_total)",
    ),
    m(
        keys::ENTROPY_LOGITS,
        1,
        true,
        "`masked`: entropy after the sampling mask (default `unmasked`)",
    ),
    m(
        keys::IGNORE_INDEX,
        1,
        true,
        "rows with this token are not checked (default -100)",
    ),
    m(
        keys::TEMPERATURE_DTYPE,
        1,
        true,
        "`input`: z = logits / T materialised in the logits' dtype",
    ),
    // Version 2: built.
    m(
        keys::FORMAT_VERSION,
        1,
        true,
        "`2` allows the version-2 names (default 1)",
    ),
    t(tensor::ROW_MASK, 2, true),
    m(
        keys::COTANGENT_REDUCTION,
        2,
        true,
        "`sum`: a `[]` / `[1]` cotangent is broadcast to every row",
    ),
    m(
        keys::TOPK_IDS_SOURCE,
        2,
        true,
        "`kernel`: topk_ids are the kernel's own top-k, checked as a set",
    ),
    m(
        keys::TOPK_SORTED,
        2,
        true,
        "with `kernel`: ids in descending order of z'",
    ),
    m(
        keys::CHUNK_SIZE,
        2,
        true,
        "the kernel's chunk size (informational, >= 1)",
    ),
    // Version 2, written by `logprobe fuzz` on a counterexample (docs/fuzz.md):
    // its provenance, read by `fuzz --replay`, ignored by verify.
    m(
        keys::FUZZ_RECIPE,
        2,
        true,
        "a fuzz finding's recipe (read by `fuzz --replay`)",
    ),
    m(keys::FUZZ_KERNEL, 2, true, "a fuzz finding's `--kernel`"),
    m(
        keys::FUZZ_PROPERTY,
        2,
        true,
        "the property a fuzz finding fails",
    ),
    m(keys::FUZZ_SEED, 2, true, "the fuzz run's `--seed`"),
    // Version 2, the fuzz protocol (docs/fuzz-protocol.md): a request's
    // outputs wanted and protocol version; the command of an `--exec` finding.
    m(
        keys::OUTPUTS,
        2,
        true,
        "a fuzz protocol request's outputs wanted",
    ),
    m(
        keys::FUZZ_PROTOCOL,
        2,
        true,
        "the fuzz protocol version of a request",
    ),
    m(
        keys::FUZZ_EXEC,
        2,
        true,
        "the command of an `--exec` finding",
    ),
    // Version 2, the loss side: built.
    t(Output::Lse.name(), 2, true),
    t(Output::ZLoss.name(), 2, true),
    m(
        keys::Z_LOSS_COEF,
        2,
        true,
        "the z-loss coefficient (required with z_loss)",
    ),
    t(Output::Loss.name(), 2, true),
    m(
        keys::REDUCTION,
        2,
        true,
        "the reduction of loss (default `none`)",
    ),
    m(
        keys::LABEL_SMOOTHING,
        2,
        true,
        "the loss's label smoothing in [0, 1] (default 0)",
    ),
    m(
        keys::MEAN_ALL_IGNORED,
        2,
        true,
        "a mean loss over no row: `nan` (default) or `zero`",
    ),
    t(tensor::LOSS_WEIGHTS, 2, true),
    m(
        keys::SOFTCAP,
        2,
        true,
        "Gemma 2's softcap c > 0 of the raw logits",
    ),
    m(
        keys::SOFTCAP_DTYPE,
        2,
        true,
        "`input`: x' = c tanh(x / c) materialised in the logits' dtype",
    ),
    cot(Output::Lse, 2, true),
    cot(Output::ZLoss, 2, true),
    cot(Output::Loss, 2, true),
    // Version 2, the policy terms (issue 18): built.
    t(tensor::REF_LOG_PROBS, 2, true),
    t(tensor::OLD_LOG_PROBS, 2, true),
    t(Output::KlK1.name(), 2, true),
    t(Output::KlK2.name(), 2, true),
    t(Output::KlK3.name(), 2, true),
    t(Output::KlAbs.name(), 2, true),
    t(Output::Ratio.name(), 2, true),
    m(keys::KL_INPUT_CLAMP, 2, true, "kl_k3's clamp of d"),
    m(keys::KL_OUTPUT_CLAMP, 2, true, "kl_k3's clamp of its value"),
    m(keys::RATIO_LOG_CLAMP, 2, true, "ratio's clamp of its log"),
    cot(Output::KlK1, 2, true),
    cot(Output::KlK2, 2, true),
    cot(Output::KlK3, 2, true),
    cot(Output::KlAbs, 2, true),
    cot(Output::Ratio, 2, true),
    // Version 2: reserved, not built yet.
    m(keys::Z_LOSS_ROWS, 2, false, "reserved"),
    m(keys::LOSS_NORMALIZER, 2, false, "reserved"),
    // (The top-k KL's four names: built.)
    t(tensor::TEACHER_TOPK_LOG_PROBS, 2, true),
    t(Output::ForwardKl.name(), 2, true),
    t(Output::ReverseKl.name(), 2, true),
    m(
        keys::KL_RENORMALIZED,
        2,
        true,
        "the top-k KL's student renormalised over the K ids (default false)",
    ),
    cot(Output::ForwardKl, 2, true),
    cot(Output::ReverseKl, 2, true),
    m(
        keys::MASKED_LOG_PROBS,
        2,
        true,
        "`finfo_min`: masked ids' top-k log-probs stored as -finfo(dtype).max (default `neg_inf`)",
    ),
    // Version 2, vLLM's token ranks and the soft-target cross-entropy (issue 47).
    t(Output::TokenRanks.name(), 2, true),
    t(tensor::TEACHER_PROBS, 2, true),
    t(tensor::TEACHER_LOG_PROBS, 2, true),
    t(Output::SoftCrossEntropy.name(), 2, true),
    cot(Output::SoftCrossEntropy, 2, true),
    // Version 2, the k3 form declared in the dump (issue 42).
    m(
        keys::K3_FORM,
        2,
        true,
        "how kl_k3 is evaluated: `expm1` (expm1(-d) + d) or `any` (default: the naive exp(-d) + d - 1 too)",
    ),
    // Version 2, fused linear + loss kernels (issue 45): the logits from
    // the LM head, and its gradients.
    t(tensor::HIDDEN, 2, true),
    t(tensor::LM_HEAD_WEIGHT, 2, true),
    t(tensor::LM_HEAD_BIAS, 2, true),
    m(
        keys::LM_HEAD_LOGITS_DTYPE,
        2,
        true,
        "`input` (default): the kernel rounds hidden @ lm_head_weight.T to the matmul's dtype; `accumulation`: it keeps them in f32",
    ),
    t(tensor::GRAD_HIDDEN, 2, true),
    t(tensor::GRAD_LM_HEAD_WEIGHT, 2, true),
    t(tensor::GRAD_LM_HEAD_BIAS, 2, true),
    // Version 2, one rank of a tensor-parallel set (issue 42): verified
    // with the other ranks' dumps as one (`crate::dump::tp_set`).
    m(
        keys::TP_RANK,
        2,
        true,
        "this dump's rank in a tensor-parallel set (with tp_size and tp_vocab_start)",
    ),
    m(keys::TP_SIZE, 2, true, "the ranks of the tensor-parallel set"),
    m(
        keys::TP_VOCAB_START,
        2,
        true,
        "the first global vocabulary column of this rank's shard",
    ),
    // Version 2, the LM head in a file of its own (issue 45).
    m(
        keys::LM_HEAD_WEIGHT_FILE,
        2,
        true,
        "the safetensors file holding lm_head_weight (and lm_head_bias), from the dump's folder",
    ),
    m(
        keys::LM_HEAD_WEIGHT_SHA256,
        2,
        true,
        "the SHA-256 of that file's bytes, or of the generated lm_head_weight's (required with either)",
    ),
    // Version 2, the LM head generated from a seed (issue 45).
    m(
        keys::LM_HEAD_WEIGHT_GENERATOR,
        2,
        true,
        "lm_head_weight is generated, not carried: the algorithm (with the four keys below and lm_head_weight_sha256)",
    ),
    m(keys::LM_HEAD_WEIGHT_SEED, 2, true, "the generator's seed"),
    m(
        keys::LM_HEAD_WEIGHT_SCALE,
        2,
        true,
        "the generated weights' standard deviation (normal) or half-width (uniform), > 0",
    ),
    m(keys::LM_HEAD_WEIGHT_SHAPE, 2, true, "the generated [V, H], written V,H"),
    m(keys::LM_HEAD_WEIGHT_DTYPE, 2, true, "the generated weights' dtype"),
];

/// What is wrong with one name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Not in the table (for the dump's format version).
    #[error("unknown {} `{name}`{}", kind.noun(), suggestion_text(*suggestion))]
    Unknown {
        /// Tensor or metadata key.
        kind: Kind,
        /// The name as stored.
        name: String,
        /// The closest valid name of the same kind, if one is close.
        suggestion: Option<&'static str>,
    },
    /// A version-2 name in a dump without `format_version=2`.
    #[error("{} `{name}` is a format version 2 name: add metadata format_version=\"2\"", kind.noun())]
    NeedsVersion2 {
        /// Tensor or metadata key.
        kind: Kind,
        /// The name.
        name: &'static str,
    },
    /// Reserved for version 2 but not built in this version of logprobe.
    #[error("{} `{name}` (format version 2) is not supported yet by this logprobe", kind.noun())]
    NotSupported {
        /// Tensor or metadata key.
        kind: Kind,
        /// The name.
        name: &'static str,
    },
}

fn suggestion_text(s: Option<&'static str>) -> String {
    match s {
        Some(s) => format!(": did you mean `{s}`?"),
        None => String::new(),
    }
}

/// The valid name of `kind` in `table` closest to `name` by
/// Damerau-Levenshtein distance, when the distance is at most a third of
/// the longer name (at least 2): a misspelling, not another word.
pub fn closest(name: &str, kind: Kind, table: &[Name]) -> Option<&'static str> {
    table
        .iter()
        .filter(|n| n.kind == kind)
        .map(|n| (strsim::damerau_levenshtein(name, n.name), n.name))
        .filter(|(d, n)| *d <= (name.len().max(n.len()) / 3).max(2))
        .min_by_key(|(d, _)| *d)
        .map(|(_, n)| n)
}

/// Checks one stored name of `kind` against `table` for a dump of format
/// `version` (1 or 2).
///
/// # Errors
/// [`NameError`]: unknown (with the closest valid name), version 2 only,
/// or not supported yet.
pub fn check_name(name: &str, kind: Kind, version: u8, table: &[Name]) -> Result<(), NameError> {
    let Some(entry) = table.iter().find(|n| n.kind == kind && n.name == name) else {
        return Err(NameError::Unknown {
            kind,
            name: name.to_string(),
            suggestion: closest(name, kind, table),
        });
    };
    if !entry.built {
        return Err(NameError::NotSupported {
            kind,
            name: entry.name,
        });
    }
    if entry.version > version {
        return Err(NameError::NeedsVersion2 {
            kind,
            name: entry.name,
        });
    }
    Ok(())
}

/// Checks every tensor name and metadata key of a dump, tensors first, each
/// list in sorted order (so the first error is deterministic).
///
/// # Errors
/// The first [`NameError`].
pub fn check_names<'a>(
    tensors: impl IntoIterator<Item = &'a str>,
    meta_keys: impl IntoIterator<Item = &'a str>,
    version: u8,
    table: &[Name],
) -> Result<(), NameError> {
    let mut ts: Vec<&str> = tensors.into_iter().collect();
    ts.sort_unstable();
    for n in ts {
        check_name(n, Kind::Tensor, version, table)?;
    }
    let mut ms: Vec<&str> = meta_keys.into_iter().collect();
    ms.sort_unstable();
    for n in ms {
        check_name(n, Kind::Meta, version, table)?;
    }
    Ok(())
}

/// Checks the value of every key of `meta` that `table` types, whether or
/// not the dump uses it, in sorted key order (a malformed value is bad input
/// the same way everywhere). Names are checked by [`check_names`].
///
/// # Errors
/// The first [`DumpError::BadMetadata`] (or [`DumpError::Spec`]).
pub fn check_values(meta: &HashMap<String, String>, table: &[Name]) -> Result<(), DumpError> {
    let mut ks: Vec<(&String, &String)> = meta.iter().collect();
    ks.sort_unstable();
    for (k, v) in ks {
        let entry = table.iter().find(|n| n.kind == Kind::Meta && n.name == k);
        if let Some(Name {
            name,
            check: Some(check),
            reason,
            ..
        }) = entry
        {
            check(name, reason, v)?;
        }
    }
    Ok(())
}

/// The built names of `kind` in `table`, in table order (for `--help`).
pub fn built(kind: Kind, table: &[Name]) -> impl Iterator<Item = &'static str> + '_ {
    table
        .iter()
        .filter(move |n| n.kind == kind && n.built)
        .map(|n| n.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_holds_every_output_and_cotangent_once() {
        let tensors: Vec<&str> = built(Kind::Tensor, NAMES).collect();
        for o in Output::ALL {
            for name in std::iter::once(o.name()).chain(o.cotangent_name()) {
                assert_eq!(tensors.iter().filter(|n| **n == name).count(), 1, "{name}");
            }
        }
        let mut all: Vec<(&str, Kind)> = NAMES.iter().map(|n| (n.name, n.kind)).collect();
        all.sort_unstable_by_key(|n| n.0);
        all.dedup();
        assert_eq!(all.len(), NAMES.len(), "a name listed twice");
    }

    #[test]
    fn the_format_doc_names_every_name_of_the_table() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/dump-from-pytorch.md"
        );
        let doc = std::fs::read_to_string(path).expect("docs/dump-from-pytorch.md");
        let missing: Vec<&str> = NAMES
            .iter()
            .map(|n| n.name)
            .filter(|n| !doc.contains(&format!("`{n}`")) && !doc.contains(&format!("\"{n}\"")))
            .collect();
        assert!(
            missing.is_empty(),
            "not in docs/dump-from-pytorch.md: {missing:?}"
        );
        // Every key has its type and doc line.
        for n in NAMES.iter().filter(|n| n.kind == Kind::Meta) {
            assert!(
                n.check.is_some() && !n.doc.is_empty() && !n.reason.is_empty(),
                "{}",
                n.name
            );
        }
    }

    #[test]
    fn values_are_checked_through_the_table() {
        let meta: HashMap<String, String> = [
            (keys::FUZZ_SEED.name, "anything"),
            (keys::TOPK_SORTED.name, "yes"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(
            check_values(&meta, NAMES).unwrap_err().to_string(),
            "metadata `topk_sorted` = \"yes\": expected `false` or `true`"
        );
    }

    #[test]
    fn misspelt_names_suggest_the_closest() {
        assert_eq!(
            closest("temprature_dtype", Kind::Meta, NAMES),
            Some("temperature_dtype")
        );
        assert_eq!(closest("logit", Kind::Tensor, NAMES), Some("logits"));
        assert_eq!(closest("entirely_else", Kind::Tensor, NAMES), None);
        let e = check_name("temprature_dtype", Kind::Meta, 1, NAMES).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown metadata key `temprature_dtype`: did you mean `temperature_dtype`?"
        );
    }

    #[test]
    fn version_and_reserved_names() {
        assert!(check_name("row_mask", Kind::Tensor, 2, NAMES).is_ok());
        assert!(matches!(
            check_name("row_mask", Kind::Tensor, 1, NAMES),
            Err(NameError::NeedsVersion2 { .. })
        ));
        assert!(check_name("loss", Kind::Tensor, 2, NAMES).is_ok());
        assert!(matches!(
            check_name("loss", Kind::Tensor, 1, NAMES),
            Err(NameError::NeedsVersion2 { .. })
        ));
        assert!(check_name("grad_loss", Kind::Tensor, 2, NAMES).is_ok());
        assert!(matches!(
            check_name("loss_normalizer", Kind::Meta, 2, NAMES),
            Err(NameError::NotSupported {
                name: "loss_normalizer",
                ..
            })
        ));
        // A tensor name used as a metadata key is unknown as a key.
        assert!(matches!(
            check_name("logits", Kind::Meta, 1, NAMES),
            Err(NameError::Unknown { .. })
        ));
    }
}
