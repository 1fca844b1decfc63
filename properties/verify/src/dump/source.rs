//! [`Source`]: a dump's tensors by name, as views into a file's bytes or
//! into memory the caller owns (the Python package's arrays, read in place),
//! and [`Header`]: those tensors with the checked `__metadata__`. Everything
//! downstream ([`super::Dump`], `compare`) reads tensors through it, so a
//! file and tensors in memory are checked by the same code.

use std::collections::HashMap;

use safetensors::{tensor::TensorView, Dtype as StDtype, SafeTensors};

use super::DumpError;

/// A dump's tensors: name, dtype, shape and little-endian bytes, borrowed.
#[derive(Clone)]
pub(crate) struct Source<'a> {
    views: Vec<(String, TensorView<'a>)>,
}

impl<'a> Source<'a> {
    /// The tensors of a deserialised file.
    pub(crate) fn of_file(st: &SafeTensors<'a>) -> Self {
        Source {
            views: st.tensors(),
        }
    }

    /// The tensor `name`, if present.
    pub(crate) fn tensor(&self, name: &str) -> Option<TensorView<'a>> {
        self.views
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }

    /// Every tensor name, sorted.
    pub(crate) fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.views.iter().map(|(n, _)| n.as_str()).collect();
        names.sort_unstable();
        names
    }
}

/// Why the data section does not match the header (truncated or extended
/// file), naming the first tensor that reaches past the end. Reads only the
/// header (already checked to be valid JSON by safetensors).
fn describe_size_mismatch(bytes: &[u8]) -> String {
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("checked by safetensors")) as usize;
    let data_len = bytes.len() - 8 - n;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap_or_default();
    let mut ends: Vec<(u64, &str)> = header
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(name, info)| {
            Some((info.get("data_offsets")?.get(1)?.as_u64()?, name.as_str()))
        })
        .collect();
    ends.sort();
    let declared = ends.last().map_or(0, |e| e.0);
    match ends.iter().find(|(end, _)| *end > data_len as u64) {
        Some((end, name)) => format!(
            "truncated file: tensor `{name}` ends at data byte {end}, the file holds {data_len} data bytes (header declares {declared})"
        ),
        None => format!("the file holds {data_len} data bytes, the header declares {declared} (trailing bytes)"),
    }
}

pub(crate) fn malformed(e: safetensors::SafeTensorError) -> DumpError {
    DumpError::Malformed {
        reason: e.to_string(),
    }
}

/// A checked safetensors file: its tensors, its `__metadata__` and the
/// format options, every name checked against the name table
/// ([`crate::names`]). Shared by [`Dump::parse`] and the logits-less side of
/// `compare` ([`crate::compare`]).
#[derive(Clone)]
pub(crate) struct Header<'a> {
    /// The tensors (offsets and sizes checked).
    pub st: Source<'a>,
    /// `__metadata__`.
    pub meta: HashMap<String, String>,
    /// `format_version` and the version-2 options.
    pub format: crate::format::FormatOptions,
}

impl<'a> Header<'a> {
    /// Deserializes `bytes` (a whole safetensors file) and checks its header
    /// and names.
    ///
    /// # Errors
    /// [`DumpError::Malformed`], [`DumpError::Duplicate`],
    /// [`DumpError::BadMetadata`] (format options), [`DumpError::Name`].
    pub(crate) fn read(bytes: &'a [u8]) -> Result<Self, DumpError> {
        // Checks offsets, sizes (with overflow checks) and that the data
        // covers the file exactly: nothing below reads out of bounds.
        let st = SafeTensors::deserialize(bytes).map_err(|e| match e {
                _ if crate::header::first_repeated(bytes).is_some() => {
                    DumpError::Duplicate(crate::header::first_repeated(bytes).expect("just found"))
                }
                safetensors::SafeTensorError::MetadataIncompleteBuffer => DumpError::Malformed {
                    reason: describe_size_mismatch(bytes),
                },
                safetensors::SafeTensorError::InvalidHeaderLength => DumpError::Malformed {
                    reason: format!(
                        "truncated header: its length field declares {} bytes, the file holds {} after it",
                        u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes read by safetensors")),
                        bytes.len() - 8
                    ),
                },
                safetensors::SafeTensorError::TensorInvalidInfo
                | safetensors::SafeTensorError::ValidationOverflow
                | safetensors::SafeTensorError::MisalignedSlice => DumpError::Malformed {
                    reason: crate::header::describe_bad_size(bytes)
                        .unwrap_or_else(|| e.to_string()),
                },
                other => malformed(other),
            })?;
        let (_, header) = SafeTensors::read_metadata(bytes).map_err(malformed)?;
        let meta = header.metadata().clone().unwrap_or_default();
        if let Some(r) = crate::header::first_repeated(bytes) {
            return Err(DumpError::Duplicate(r));
        }
        let format = crate::format::FormatOptions::parse(&meta)?;
        crate::names::check_names(
            st.names(),
            meta.keys().map(String::as_str),
            format.version,
            crate::names::NAMES,
        )?;
        Ok(Header {
            st: Source::of_file(&st),
            meta,
            format,
        })
    }

    /// The header of tensors held in memory (no bytes copied): each
    /// `(name, dtype, shape, bytes)` as a dump would hold it, and the
    /// `__metadata__` strings; the same checks as [`Header::read`].
    ///
    /// # Errors
    /// [`DumpError::Duplicate`] for a name given twice,
    /// [`DumpError::Malformed`] for a byte length that does not match shape
    /// and dtype (overflow checked), and [`Header::read`]'s metadata and
    /// name errors.
    pub(crate) fn of_memory(
        tensors: &[(&str, StDtype, &[usize], &'a [u8])],
        meta: HashMap<String, String>,
    ) -> Result<Self, DumpError> {
        use crate::header::Repeated;
        let mut views = Vec::with_capacity(tensors.len());
        for (i, &(name, dtype, shape, data)) in tensors.iter().enumerate() {
            if tensors[..i].iter().any(|t| t.0 == name) {
                return Err(DumpError::Duplicate(Repeated::Tensor(name.to_string())));
            }
            let bytes = shape
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .and_then(|e| e.checked_mul(dtype.bitsize() / 8));
            let view = (bytes == Some(data.len()))
                .then(|| TensorView::new(dtype, shape.to_vec(), data).ok())
                .flatten()
                .ok_or_else(|| DumpError::Malformed {
                    reason: format!(
                        "tensor `{name}`: {} bytes do not match shape {shape:?} of {dtype:?}",
                        data.len()
                    ),
                })?;
            views.push((name.to_string(), view));
        }
        let st = Source { views };
        let format = crate::format::FormatOptions::parse(&meta)?;
        crate::names::check_names(
            st.names(),
            meta.keys().map(String::as_str),
            format.version,
            crate::names::NAMES,
        )?;
        Ok(Header { st, meta, format })
    }
}
