//! The format-version-2 metadata this build reads (`docs/dump-from-pytorch.md`):
//! `format_version`, `cotangent_reduction`, `topk_ids_source`,
//! `topk_sorted`, `chunk_size` (checked, informational). Version-1 keys are parsed with the options in
//! [`crate::dump`].

use std::collections::HashMap;

use crate::dump::DumpError;

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
}

fn choice(
    meta: &HashMap<String, String>,
    key: &'static str,
    values: &[&'static str],
    reason: &'static str,
) -> Result<usize, DumpError> {
    match meta.get(key) {
        None => Ok(0),
        Some(v) => {
            values
                .iter()
                .position(|c| *c == v.trim())
                .ok_or_else(|| DumpError::BadMetadata {
                    key,
                    value: v.clone(),
                    reason,
                })
        }
    }
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
        let version = match choice(meta, "format_version", &["1", "2"], "expected `1` or `2`")? {
            1 => 2,
            _ => 1,
        };
        let cotangent_sum = choice(
            meta,
            "cotangent_reduction",
            &["none", "sum"],
            "expected `none` or `sum`",
        )? == 1;
        let topk_kernel = choice(
            meta,
            "topk_ids_source",
            &["given", "kernel"],
            "expected `given` or `kernel`",
        )? == 1;
        let topk_sorted = choice(
            meta,
            "topk_sorted",
            &["false", "true"],
            "expected `false` or `true`",
        )? == 1;
        // Informational: the chunk size the kernel used (fuzz writes it);
        // outputs are chunk-size invariant, so it changes no judgement.
        if let Some(v) = meta.get("chunk_size") {
            if !v.trim().parse::<u64>().is_ok_and(|c| c >= 1) {
                return Err(DumpError::BadMetadata {
                    key: "chunk_size",
                    value: v.clone(),
                    reason: "expected an integer >= 1",
                });
            }
        }
        if topk_sorted && !topk_kernel {
            return Err(DumpError::BadMetadata {
                key: "topk_sorted",
                value: meta["topk_sorted"].clone(),
                reason: "needs topk_ids_source=\"kernel\" (given ids are inputs, in any order)",
            });
        }
        Ok(FormatOptions {
            version,
            cotangent_sum,
            topk_kernel,
            topk_sorted,
        })
    }
}
