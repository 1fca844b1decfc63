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
}

const fn t(name: &'static str, version: u8, built: bool) -> Name {
    Name {
        name,
        kind: Kind::Tensor,
        version,
        built,
    }
}

const fn m(name: &'static str, version: u8, built: bool) -> Name {
    Name {
        name,
        kind: Kind::Meta,
        version,
        built,
    }
}

/// Every name of the format, version 1 first (the table of
/// `docs/dump-from-pytorch.md`).
pub const NAMES: &[Name] = &[
    t("logits", 1, true),
    t("tokens", 1, true),
    t("sampling_mask", 1, true),
    t("log_probs", 1, true),
    t("entropy", 1, true),
    t("topk_ids", 1, true),
    t("topk_log_probs", 1, true),
    t("grad_log_probs", 1, true),
    t("grad_entropy", 1, true),
    t("grad_topk_log_probs", 1, true),
    t("grad_logits", 1, true),
    m("temperature", 1, true),
    m("vocab_size", 1, true),
    m("entropy_logits", 1, true),
    m("ignore_index", 1, true),
    m("temperature_dtype", 1, true),
    // Version 2: built.
    m("format_version", 1, true),
    t("row_mask", 2, true),
    m("cotangent_reduction", 2, true),
    m("topk_ids_source", 2, true),
    m("topk_sorted", 2, true),
    m("chunk_size", 2, true),
    // Version 2, written by `logprobe fuzz` on a counterexample (docs/fuzz.md):
    // its provenance, read by `fuzz --replay`, ignored by verify.
    m("fuzz_recipe", 2, true),
    m("fuzz_kernel", 2, true),
    m("fuzz_property", 2, true),
    m("fuzz_seed", 2, true),
    // Version 2, the fuzz protocol (docs/fuzz-protocol.md): a request's
    // outputs wanted and protocol version; the command of an `--exec` finding.
    m("outputs", 2, true),
    m("fuzz_protocol", 2, true),
    m("fuzz_exec", 2, true),
    // Version 2, the loss side: built.
    t("lse", 2, true),
    t("z_loss", 2, true),
    m("z_loss_coef", 2, true),
    t("loss", 2, true),
    m("reduction", 2, true),
    m("label_smoothing", 2, true),
    m("mean_all_ignored", 2, true),
    t("loss_weights", 2, true),
    m("softcap", 2, true),
    m("softcap_dtype", 2, true),
    t("grad_lse", 2, true),
    t("grad_z_loss", 2, true),
    t("grad_loss", 2, true),
    // Version 2, the policy terms (issue 18): built.
    t("ref_log_probs", 2, true),
    t("old_log_probs", 2, true),
    t("kl_k1", 2, true),
    t("kl_k2", 2, true),
    t("kl_k3", 2, true),
    t("kl_abs", 2, true),
    t("ratio", 2, true),
    m("kl_input_clamp", 2, true),
    m("kl_output_clamp", 2, true),
    m("ratio_log_clamp", 2, true),
    t("grad_kl_k1", 2, true),
    t("grad_kl_k2", 2, true),
    t("grad_kl_k3", 2, true),
    t("grad_kl_abs", 2, true),
    t("grad_ratio", 2, true),
    // Version 2: reserved, not built yet.
    m("z_loss_rows", 2, false),
    m("loss_normalizer", 2, false),
    // (The top-k KL's four names: built.)
    t("teacher_topk_log_probs", 2, true),
    t("forward_kl", 2, true),
    t("reverse_kl", 2, true),
    m("kl_renormalized", 2, true),
    t("grad_forward_kl", 2, true),
    t("grad_reverse_kl", 2, true),
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
