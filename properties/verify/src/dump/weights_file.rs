//! A shared LM-head weights file (docs/dump-from-pytorch.md, "A shared
//! weights file"): a fused linear + loss dump may name the safetensors file
//! holding `lm_head_weight` (and `lm_head_bias`) instead of carrying them.
//! A real head (152064 x 4096 bf16) is 1.25 GB, the same for every dump of
//! a run.
//!
//! `lm_head_weight_file` is the file's path (a relative path is taken from
//! the dump's folder), and `lm_head_weight_sha256` the SHA-256 of its
//! bytes (what `sha256sum` prints), checked before anything is judged: a
//! dump judged against other weights would fail correct code. The file is
//! read in place (mapped, no copy); its tensors join the dump's as if the
//! dump held them ([`resolve`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::SafeTensors;

use super::{DumpError, DumpFile, Header};
use crate::keys;
use crate::names::tensor;

/// What is wrong with a dump's weights file. Each names the file or key.
#[derive(Debug, thiserror::Error)]
pub enum WeightsFileError {
    /// `lm_head_weight_file` (or `lm_head_weight_generator`) without
    /// `lm_head_weight_sha256`.
    #[error("metadata `lm_head_weight_file` or `lm_head_weight_generator` needs `lm_head_weight_sha256`, the SHA-256 of the weights' bytes (`sha256sum FILE`, or what `logprobe.save_weights` or `logprobe.generate_weights` returns)")]
    NoHash,
    /// `lm_head_weight_sha256` without `lm_head_weight_file`: nothing would
    /// be checked against it.
    #[error("metadata `lm_head_weight_sha256` is given without `lm_head_weight_file` or `lm_head_weight_generator`: it names no weights to check")]
    HashWithoutFile,
    /// A hash that is not 64 hex digits.
    #[error("metadata `lm_head_weight_sha256` = {value:?}: expected 64 hexadecimal digits")]
    BadHash {
        /// The stored value.
        value: String,
    },
    /// The file's bytes do not hash to the dump's hash.
    #[error("{}: SHA-256 {found}, the dump names {expected}: these are not the weights the dump was made with", path.display())]
    HashMismatch {
        /// The weights file.
        path: PathBuf,
        /// The dump's hash.
        expected: String,
        /// The file's.
        found: String,
    },
    /// The dump names a file and holds the weights too.
    #[error("tensor `{tensor}` is in the dump and in its weights file {}: give it once", path.display())]
    Twice {
        /// The tensor.
        tensor: &'static str,
        /// The weights file.
        path: PathBuf,
    },
    /// The weights file lacks `lm_head_weight`, or holds another tensor.
    #[error("{}: a weights file holds `lm_head_weight` and optionally `lm_head_bias`, found {found:?}", path.display())]
    Contents {
        /// The weights file.
        path: PathBuf,
        /// Its tensors.
        found: Vec<String>,
    },
    /// Tensors in memory (or bytes) naming a file: there is no dump folder
    /// to find it from, and nothing reads it.
    #[error("metadata `lm_head_weight_file` is read only for a dump file (`logprobe verify FILE`, `logprobe.verify_file`): with tensors in memory, pass `lm_head_weight=` itself")]
    NotResolved,
    /// The weights file itself is bad input.
    #[error("{}: {source}", path.display())]
    File {
        /// The weights file.
        path: PathBuf,
        /// What is wrong with it.
        source: Box<DumpError>,
    },
}

/// The weights file a dump at `dump_path` names, read and checked; `None`
/// when the dump names none.
///
/// # Errors
/// [`WeightsFileError`] for a missing or malformed hash, a file that does
/// not read or does not hash to it, or that holds other tensors.
pub fn open(
    meta: &HashMap<String, String>,
    dump_path: &Path,
) -> Result<Option<(PathBuf, DumpFile)>, DumpError> {
    let Some(name) = keys::LM_HEAD_WEIGHT_FILE.get(meta)? else {
        return Ok(None);
    };
    let expected = expected_hash(meta)?;
    let path = dump_path
        .parent()
        .unwrap_or_else(|| Path::new(""))
        .join(name);
    let in_file = |e: DumpError| WeightsFileError::File {
        path: path.clone(),
        source: Box::new(e),
    };
    let file = DumpFile::open(&path).map_err(in_file)?;
    let found = super::weights_generator::sha256_hex(file.bytes());
    if found != expected {
        return Err(WeightsFileError::HashMismatch {
            path,
            expected,
            found,
        }
        .into());
    }
    Ok(Some((path, file)))
}

/// `lm_head_weight_sha256`, lowercase.
///
/// # Errors
/// [`WeightsFileError::NoHash`], [`WeightsFileError::BadHash`].
pub(crate) fn expected_hash(meta: &HashMap<String, String>) -> Result<String, DumpError> {
    let expected = keys::LM_HEAD_WEIGHT_SHA256
        .get(meta)?
        .ok_or(WeightsFileError::NoHash)?
        .to_ascii_lowercase();
    if expected.len() != 64 || !expected.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(WeightsFileError::BadHash { value: expected }.into());
    }
    Ok(expected)
}

/// The dump's tensors with the weights file's joined (borrowed from both),
/// and its metadata without the two keys: what
/// [`Dump::from_memory`](super::Dump::from_memory) parses as if the dump
/// held the weights.
///
/// # Errors
/// [`WeightsFileError::Twice`], [`WeightsFileError::Contents`], and the
/// weights file's own header errors ([`WeightsFileError::File`]).
#[allow(clippy::type_complexity)]
pub(crate) fn resolve<'a>(
    dump: &Header<'a>,
    weights_path: &Path,
    weights: &'a DumpFile,
) -> Result<
    (
        Vec<(String, safetensors::tensor::TensorView<'a>)>,
        HashMap<String, String>,
    ),
    DumpError,
> {
    // A plain safetensors file (no format metadata needed): the offsets
    // and sizes are checked as a dump's are.
    let st = SafeTensors::deserialize(weights.bytes()).map_err(|e| WeightsFileError::File {
        path: weights_path.to_path_buf(),
        source: Box::new(super::source::malformed(e)),
    })?;
    let w = super::source::Source::of_file(&st);
    let names = w.names();
    let allowed = [tensor::LM_HEAD_WEIGHT, tensor::LM_HEAD_BIAS];
    if !names.contains(&tensor::LM_HEAD_WEIGHT) || names.iter().any(|n| !allowed.contains(n)) {
        return Err(WeightsFileError::Contents {
            path: weights_path.to_path_buf(),
            found: names.iter().map(|n| n.to_string()).collect(),
        }
        .into());
    }
    let mut tensors = Vec::new();
    for name in dump.st.names() {
        if let Some(&t) = allowed.iter().find(|t| **t == name && names.contains(t)) {
            return Err(WeightsFileError::Twice {
                tensor: t,
                path: weights_path.to_path_buf(),
            }
            .into());
        }
        tensors.push((name.to_string(), dump.st.tensor(name).expect("listed")));
    }
    for name in names {
        tensors.push((name.to_string(), w.tensor(name).expect("listed")));
    }
    let mut meta = dump.meta.clone();
    meta.remove(keys::LM_HEAD_WEIGHT_FILE.name);
    meta.remove(keys::LM_HEAD_WEIGHT_SHA256.name);
    Ok((tensors, meta))
}

/// Refuses a dump naming a weights file where none can be read (tensors in
/// memory, bytes without a path), and a hash naming no file.
///
/// # Errors
/// [`WeightsFileError::NotResolved`], [`WeightsFileError::HashWithoutFile`].
pub fn refuse_unresolved(meta: &HashMap<String, String>) -> Result<(), DumpError> {
    if meta.contains_key(keys::LM_HEAD_WEIGHT_FILE.name) {
        return Err(WeightsFileError::NotResolved.into());
    }
    // Generated weights are joined before a dump is parsed: keys left
    // here are a generator nothing resolved, or stray ones.
    if super::weights_generator::WeightsGenerator::of_meta(meta)?.is_some() {
        return Err(super::weights_generator::GeneratorError::NotResolved.into());
    }
    if meta.contains_key(keys::LM_HEAD_WEIGHT_SHA256.name) {
        return Err(WeightsFileError::HashWithoutFile.into());
    }
    Ok(())
}
