//! The writer: [`DumpTensor`] and [`serialize_dump`] (tests, generated
//! dumps, fuzz counterexamples).

use std::collections::HashMap;

use half::{bf16, f16};
use safetensors::Dtype as StDtype;

use logprobe_reference::spec::Dtype;

use super::*;
use crate::keys::{Key, MetaValue};

/// An owned tensor for writing dumps ([`serialize_dump`]): dtype, shape and
/// little-endian bytes.
#[derive(Clone, Debug)]
pub struct DumpTensor {
    /// safetensors dtype.
    pub dtype: StDtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Little-endian bytes, `prod(shape) * size(dtype)` of them.
    pub data: Vec<u8>,
}

impl DumpTensor {
    /// A float tensor of `dtype` from exact f64 values (each rounded to
    /// `dtype` correctly; exact when the value is representable).
    pub fn floats(dtype: Dtype, shape: &[usize], values: &[f64]) -> Self {
        let mut data = Vec::with_capacity(values.len() * dtype.size_bytes());
        for &x in values {
            match dtype {
                Dtype::F64 => data.extend(x.to_le_bytes()),
                Dtype::F32 => data.extend((x as f32).to_le_bytes()),
                Dtype::Bf16 => data
                    .extend(<bf16 as logprobe_reference::spec::Element>::from_f64(x).to_le_bytes()),
                Dtype::F16 => data
                    .extend(<f16 as logprobe_reference::spec::Element>::from_f64(x).to_le_bytes()),
            }
        }
        let dtype = match dtype {
            Dtype::F64 => StDtype::F64,
            Dtype::F32 => StDtype::F32,
            Dtype::Bf16 => StDtype::BF16,
            Dtype::F16 => StDtype::F16,
        };
        DumpTensor {
            dtype,
            shape: shape.to_vec(),
            data,
        }
    }

    /// An `I64` tensor.
    pub fn i64s(shape: &[usize], values: &[i64]) -> Self {
        DumpTensor {
            dtype: StDtype::I64,
            shape: shape.to_vec(),
            data: values.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    /// A `BOOL` tensor.
    pub fn bools(shape: &[usize], values: &[bool]) -> Self {
        DumpTensor {
            dtype: StDtype::BOOL,
            shape: shape.to_vec(),
            data: values.iter().map(|&b| b as u8).collect(),
        }
    }
}

impl safetensors::View for &DumpTensor {
    fn dtype(&self) -> StDtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        (&self.data).into()
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Serializes named tensors and metadata into the bytes of a dump (the
/// safetensors layout `safetensors.torch.save_file` writes).
///
/// # Errors
/// [`DumpError::Malformed`] when a tensor's byte length does not match its
/// shape and dtype.
pub fn serialize_dump(
    tensors: &[(&str, DumpTensor)],
    metadata: &[(&str, &str)],
) -> Result<Vec<u8>, DumpError> {
    let meta: HashMap<String, String> = metadata
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for (name, t) in tensors {
        let elems = t.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if elems.and_then(|e| e.checked_mul(t.dtype.bitsize() / 8)) != Some(t.data.len()) {
            return Err(DumpError::Malformed {
                reason: format!(
                    "tensor `{name}`: {} bytes do not match shape {:?} of {:?}",
                    t.data.len(),
                    t.shape,
                    t.dtype
                ),
            });
        }
    }
    safetensors::serialize(tensors.iter().map(|(k, t)| (*k, t)), Some(meta)).map_err(malformed)
}

/// The `__metadata__` of a dump being written, in insertion order, each
/// value written by its typed key ([`crate::keys`]): no key is spelt twice.
#[derive(Clone, Debug, Default)]
pub struct Metadata(Vec<(&'static str, String)>);

impl Metadata {
    /// No keys.
    pub fn new() -> Self {
        Metadata::default()
    }

    /// Sets `key` to `value` (written by [`MetaValue::write_value`]).
    pub fn set<T: MetaValue>(&mut self, key: Key<T>, value: &T) -> &mut Self {
        self.0.push(key.pair(value));
        self
    }

    /// Sets `key` to `text`, a value already written (e.g. a temperature
    /// kept as the text it was drawn as).
    ///
    /// # Errors
    /// [`DumpError::BadMetadata`] when `text` does not parse as the key's type.
    pub fn set_text<T: MetaValue>(
        &mut self,
        key: Key<T>,
        text: &str,
    ) -> Result<&mut Self, DumpError> {
        key.parse(text)?;
        self.0.push((key.name, text.to_string()));
        Ok(self)
    }

    /// Appends every pair of `other`.
    pub fn extend(&mut self, other: &Metadata) -> &mut Self {
        self.0.extend(other.0.iter().cloned());
        self
    }

    /// The `(key, text)` pairs, in insertion order.
    pub fn pairs(&self) -> Vec<(&'static str, &str)> {
        self.0.iter().map(|(k, v)| (*k, v.as_str())).collect()
    }
}

/// Serializes named tensors and typed metadata into the bytes of a dump:
/// [`serialize_dump`] with [`Metadata`].
///
/// # Errors
/// As [`serialize_dump`].
pub fn write_dump(
    tensors: &[(&str, DumpTensor)],
    metadata: &Metadata,
) -> Result<Vec<u8>, DumpError> {
    serialize_dump(tensors, &metadata.pairs())
}
