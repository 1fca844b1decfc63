//! Verify from tensors in memory (the Python package's entry point): named
//! tensors and metadata strings, as a dump holds them, judged exactly as
//! `logprobe verify` judges the file.
//!
//! [`verify_tensors`] reads the tensors in place, as a dump holding them
//! (nothing is copied: `[N, V]` tensors are decoded row by row from the
//! caller's memory, as from a file's bytes), with the dump reader
//! ([`crate::dump`]) and the verify engine ([`crate::verify::verify_dump`]),
//! so names, dtypes, shapes
//! (`[N, V]` or `[B, T, V]`), metadata and values are checked by the same code,
//! with the same messages, as for a file. A caller need not add
//! `format_version=2`: it is set when a version-2 name is given
//! ([`needs_version2`]).

use std::path::Path;

use safetensors::Dtype as StDtype;

use crate::dump::DumpError;
use crate::keys;
use crate::names::{Kind, NAMES};
use crate::verify::{FileReport, VerifyConfig};

/// One tensor, borrowed: safetensors dtype, shape, and its elements'
/// little-endian bytes in row-major order (`prod(shape) * size(dtype)` of
/// them). bf16 / f16 are their raw 16-bit patterns: bit-exact.
#[derive(Clone, Copy, Debug)]
pub struct TensorBytes<'a> {
    /// Element dtype (`F64`, `F32`, `BF16`, `F16`, integer ids, `BOOL` / `U8` masks).
    pub dtype: StDtype,
    /// Shape, e.g. `[N, V]` or `[B, T, V]` for `logits`.
    pub shape: &'a [usize],
    /// Little-endian element bytes, row-major.
    pub data: &'a [u8],
}

impl safetensors::View for &TensorBytes<'_> {
    fn dtype(&self) -> StDtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        self.data.into()
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// The names a caller passes as keywords, in table order: every built
/// name of `kind` ([`crate::names::NAMES`]) but `format_version` (set by
/// [`verify_tensors`]), `outputs` (a fuzz protocol request's list of wanted
/// outputs) and the `fuzz_*` provenance keys (written by `logprobe fuzz`,
/// ignored by verify).
pub fn keyword_names(kind: Kind) -> impl Iterator<Item = &'static str> {
    crate::names::built(kind, NAMES).filter(|n| {
        // `k3_form` is also an option of the same name and meaning (the
        // Python `k3_form=`): one keyword.
        *n != keys::FORMAT_VERSION.name
            && *n != keys::OUTPUTS.name
            && *n != keys::K3_FORM.name
            && !n.starts_with("fuzz_")
    })
}

/// Whether any of `names` (tensor or metadata names) first appears in
/// format version 2.
pub fn needs_version2<'a>(names: impl IntoIterator<Item = &'a str>) -> bool {
    names
        .into_iter()
        .any(|n| NAMES.iter().any(|e| e.name == n && e.version >= 2))
}

/// Verifies named tensors and metadata as a dump holding them; `name`
/// stands for the file path in the report (its table's first line).
///
/// `metadata` values are the strings a dump's `__metadata__` holds
/// (`temperature="0.7"`, `vocab_size="151643"`, ...); `format_version="2"`
/// is added when a version-2 name is present and no `format_version` given.
///
/// # Errors
/// [`DumpError`], as for a file: an unknown or unsupported name (with the
/// closest valid one), a name given twice ([`DumpError::Duplicate`]), a byte
/// length that does not match shape and dtype ([`DumpError::Malformed`]),
/// and every dtype, shape, metadata and value error of the dump reader and
/// the verify engine, naming tensor, row and column.
pub fn verify_tensors(
    tensors: &[(&str, TensorBytes<'_>)],
    metadata: &[(&str, &str)],
    name: &str,
    config: &VerifyConfig,
) -> Result<FileReport, DumpError> {
    crate::verify::files::verify_header(header_of(tensors, metadata)?, Path::new(name), config)
}

/// The checked header of tensors in memory (read in place) and metadata,
/// `format_version="2"` added where [`needs_version2`] and none is given.
///
/// # Errors
/// [`DumpError::Duplicate`] for a name given twice, [`DumpError::Malformed`]
/// for a byte length that does not match shape and dtype, and the header's
/// metadata and name errors.
pub(crate) fn header_of<'a>(
    tensors: &[(&str, TensorBytes<'a>)],
    metadata: &[(&str, &str)],
) -> Result<crate::dump::Header<'a>, DumpError> {
    use crate::header::Repeated;
    for (i, (k, _)) in metadata.iter().enumerate() {
        if metadata[..i].iter().any(|(m, _)| m == k) {
            return Err(DumpError::Duplicate(Repeated::MetaKey(k.to_string())));
        }
    }
    let parts: Vec<(&str, StDtype, &[usize], &'a [u8])> = tensors
        .iter()
        .map(|(n, t)| (*n, t.dtype, t.shape, t.data))
        .collect();
    crate::dump::Header::of_memory(&parts, with_version(tensors, metadata))
}

/// `metadata` as a map, plus `format_version="2"` where [`needs_version2`]
/// and none is given.
fn with_version(
    tensors: &[(&str, TensorBytes<'_>)],
    metadata: &[(&str, &str)],
) -> std::collections::HashMap<String, String> {
    let mut meta: std::collections::HashMap<String, String> = metadata
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let names = tensors
        .iter()
        .map(|(n, _)| *n)
        .chain(metadata.iter().map(|(k, _)| *k));
    if !meta.contains_key(keys::FORMAT_VERSION.name) && needs_version2(names) {
        let (k, v) = keys::FORMAT_VERSION.pair(&keys::FormatVersion::V2);
        meta.insert(k.into(), v);
    }
    meta
}

/// The bytes of a safetensors dump holding `tensors` and `metadata` (plus
/// `format_version="2"` where [`needs_version2`] and none is given): what
/// [`verify_tensors`] judges, as a file `logprobe verify` judges the same
/// way (Python's `logprobe.save_dump`). The names are checked against the
/// table first.
///
/// # Errors
/// As [`header_of`]: a name given twice, a byte length that does not match
/// shape and dtype, an unknown name or a bad format option.
pub fn to_dump_bytes(
    tensors: &[(&str, TensorBytes<'_>)],
    metadata: &[(&str, &str)],
) -> Result<Vec<u8>, DumpError> {
    let header = header_of(tensors, metadata)?;
    safetensors::serialize(tensors.iter().map(|(k, t)| (*k, t)), Some(header.meta)).map_err(|e| {
        DumpError::Malformed {
            reason: e.to_string(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dump::{Dump, DumpTensor};
    use crate::verify::verify_dump;
    use crate::verify::ReportVerdict;

    fn t<'a>(d: &'a DumpTensor) -> TensorBytes<'a> {
        TensorBytes {
            dtype: d.dtype,
            shape: &d.shape,
            data: &d.data,
        }
    }

    #[test]
    fn keywords_come_from_the_table() {
        let tensors: Vec<_> = keyword_names(Kind::Tensor).collect();
        assert_eq!(tensors[0], "logits");
        assert!(tensors.contains(&"row_mask") && tensors.contains(&"lse"));
        assert!(tensors.contains(&"loss") && tensors.contains(&"loss_weights"));
        assert!(tensors.contains(&"grad_loss") && tensors.contains(&"grad_z_loss"));
        let meta: Vec<_> = keyword_names(Kind::Meta).collect();
        assert!(
            !meta.contains(&keys::LOSS_NORMALIZER.name),
            "reserved, not built"
        );
        assert!(meta.contains(&keys::TEMPERATURE.name) && meta.contains(&keys::CHUNK_SIZE.name));
        assert!(
            !meta.contains(&keys::FORMAT_VERSION.name) && !meta.contains(&keys::FUZZ_SEED.name)
        );
    }

    #[test]
    fn a_wrong_row_fails_and_bad_bytes_are_errors() {
        // Row 0 holds log_softmax([0, 1, 2])[2] rounded to f32; row 1 is
        // -1.5 where -ln 3 is exact. `row_mask` (version 2) needs no
        // `format_version`: it is set.
        let logits = DumpTensor::floats(
            logprobe_reference::spec::Dtype::F32,
            &[2, 3],
            &[0.0, 1.0, 2.0, 0.5, 0.5, 0.5],
        );
        let tokens = DumpTensor::i64s(&[2], &[2, 0]);
        let lp = DumpTensor::floats(
            logprobe_reference::spec::Dtype::F32,
            &[2],
            &[-0.407_605_96, -1.5],
        );
        let row_mask = DumpTensor::bools(&[2], &[true, true]);
        let tensors = [
            ("logits", t(&logits)),
            ("tokens", t(&tokens)),
            ("log_probs", t(&lp)),
            ("row_mask", t(&row_mask)),
        ];
        let r = verify_tensors(&tensors, &[], "mem", &VerifyConfig::default()).unwrap();
        assert_eq!(r.verdict, ReportVerdict::Fail);
        assert_eq!(r.outputs[0].worst[0].row, 1);
        // Duplicates and byte lengths are bad input, not a panic.
        let cfg = VerifyConfig::default();
        let dup = [("logits", t(&logits)), ("logits", t(&logits))];
        assert!(matches!(
            verify_tensors(&dup, &[], "mem", &cfg),
            Err(DumpError::Duplicate(_))
        ));
        let short = TensorBytes {
            data: &logits.data[..4],
            ..t(&logits)
        };
        let e = verify_tensors(&[("logits", short)], &[], "mem", &cfg).unwrap_err();
        assert!(
            e.to_string()
                .contains("tensor `logits`: 4 bytes do not match"),
            "{e}"
        );
        // A shape whose byte count overflows is bad input, not a wrap.
        let huge = [usize::MAX / 2, 3];
        let overflow = TensorBytes {
            shape: &huge,
            ..t(&logits)
        };
        assert!(matches!(
            verify_tensors(&[("logits", overflow)], &[], "mem", &cfg),
            Err(DumpError::Malformed { .. })
        ));
        // The dump written from memory is judged as the tensors were.
        let bytes = to_dump_bytes(&tensors, &[]).unwrap();
        let from_file = verify_dump(&Dump::parse(&bytes).unwrap(), Path::new("f"), &cfg).unwrap();
        assert_eq!(from_file.outputs[0].worst[0].row, 1);
        assert!(matches!(
            to_dump_bytes(&dup, &[]),
            Err(DumpError::Duplicate(_))
        ));
        let meta = [("temperature", "1.0"), ("temperature", "2.0")];
        assert!(matches!(
            verify_tensors(&tensors, &meta, "mem", &cfg),
            Err(DumpError::Duplicate(_))
        ));
    }

    /// Tensors in memory are read where they lie: the `[N, V]` tensors the
    /// dump holds are the caller's bytes, not a copy.
    #[test]
    fn tensors_in_memory_are_read_in_place() {
        let logits = DumpTensor::floats(logprobe_reference::spec::Dtype::F32, &[2, 3], &[0.0; 6]);
        let tokens = DumpTensor::i64s(&[2], &[2, 0]);
        let lp = DumpTensor::floats(logprobe_reference::spec::Dtype::F32, &[2], &[-1.0986123; 2]);
        let tensors = [
            ("logits", t(&logits)),
            ("tokens", t(&tokens)),
            ("log_probs", t(&lp)),
        ];
        let dump = Dump::from_header(header_of(&tensors, &[]).unwrap(), true).unwrap();
        let stored = dump.logits.stored().unwrap();
        assert_eq!(stored.data.as_ptr(), logits.data.as_ptr());
        assert_eq!(stored.data.len(), logits.data.len());
    }
}
