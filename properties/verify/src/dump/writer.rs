//! The writer: [`DumpTensor`] and [`serialize_dump`] (tests, generated
//! dumps, fuzz counterexamples).

use std::collections::HashMap;

use half::{bf16, f16};
use safetensors::Dtype as StDtype;

use logprobe_reference::spec::Dtype;

use super::*;

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
