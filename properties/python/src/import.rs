//! Tensors in from Python through DLPack (dlpark): torch tensors, numpy
//! arrays and any object with `__dlpack__`, read as the raw little-endian
//! bytes a dump holds. bf16 / f16 keep their bit patterns: nothing goes
//! through a float conversion. Compact CPU tensors are borrowed here and
//! read in place by the verifier (`logprobe_verify::tensors`: no copy);
//! strided ones are gathered into row-major order.

use dlpark::ffi::{DLDataTypeCode, DLDeviceType};
use dlpark::python::{dlpack_device, from_dlpack, ImportedDlpack};
use pyo3::prelude::*;
use safetensors::Dtype as StDtype;

use crate::BadInputError;

#[cfg(target_endian = "big")]
compile_error!(
    "logprobe's Python package reads DLPack tensors as little-endian (safetensors' byte order)"
);

/// One imported tensor: name, dtype and shape as a dump stores them, and
/// its bytes (borrowed from the producer, or gathered).
pub struct Imported {
    /// The keyword it was passed as (`logits`, `log_probs`, ...).
    pub name: String,
    /// Element dtype, as safetensors names it.
    pub dtype: StDtype,
    /// Shape.
    pub shape: Vec<usize>,
    storage: Storage,
}

enum Storage {
    /// Compact CPU data owned by the producer; the managed tensor keeps it
    /// alive and is released (deleter called) when this drops, attached.
    Borrowed {
        _managed: ImportedDlpack,
        ptr: *const u8,
        len: usize,
    },
    /// Gathered from a strided tensor.
    Owned(Vec<u8>),
}

impl Imported {
    /// The tensor's bytes, row-major, little-endian.
    pub fn bytes(&self) -> &[u8] {
        match &self.storage {
            // SAFETY: a compact CPU tensor of `len` bytes at `ptr`, kept alive
            // by `_managed` for as long as `self` (DLPack's contract).
            Storage::Borrowed { ptr, len, .. } if *len > 0 => unsafe {
                std::slice::from_raw_parts(*ptr, *len)
            },
            Storage::Borrowed { .. } => &[],
            Storage::Owned(v) => v,
        }
    }
}

/// The tensors that hold ids or flags; every other tensor of the format
/// holds floats (`logits`, the candidate outputs, the cotangents).
pub fn holds_floats(name: &str) -> bool {
    !matches!(name, "tokens" | "topk_ids" | "sampling_mask" | "row_mask")
}

fn bad(msg: String) -> PyErr {
    BadInputError::new_err(msg)
}

/// Parses `bfloat16` / `bf16` / `float16` / `f16`.
pub fn parse_dtype16(s: &str) -> PyResult<StDtype> {
    match s.trim() {
        "bfloat16" | "bf16" => Ok(StDtype::BF16),
        "float16" | "f16" | "half" => Ok(StDtype::F16),
        other => Err(pyo3::exceptions::PyValueError::new_err(format!(
            "dtype={other:?}: expected \"bfloat16\" or \"float16\" (the dtype whose bits a uint16 array holds)"
        ))),
    }
}

fn st_dtype(name: &str, code: DLDataTypeCode, bits: u8, lanes: u16) -> PyResult<StDtype> {
    let d = if lanes != 1 {
        None
    } else {
        match (code, bits) {
            (DLDataTypeCode::FLOAT, 64) => Some(StDtype::F64),
            (DLDataTypeCode::FLOAT, 32) => Some(StDtype::F32),
            (DLDataTypeCode::FLOAT, 16) => Some(StDtype::F16),
            (DLDataTypeCode::BFLOAT, 16) => Some(StDtype::BF16),
            (DLDataTypeCode::INT, 64) => Some(StDtype::I64),
            (DLDataTypeCode::INT, 32) => Some(StDtype::I32),
            (DLDataTypeCode::INT, 16) => Some(StDtype::I16),
            (DLDataTypeCode::INT, 8) => Some(StDtype::I8),
            (DLDataTypeCode::UINT, 64) => Some(StDtype::U64),
            (DLDataTypeCode::UINT, 32) => Some(StDtype::U32),
            (DLDataTypeCode::UINT, 16) => Some(StDtype::U16),
            (DLDataTypeCode::UINT, 8) => Some(StDtype::U8),
            (DLDataTypeCode::BOOL, 8) => Some(StDtype::BOOL),
            _ => None,
        }
    };
    d.ok_or_else(|| {
        bad(format!(
            "tensor `{name}` has DLPack dtype (code {}, bits {bits}, lanes {lanes}), which a dump cannot hold: \
             expected float64/32/16, bfloat16, an integer or bool",
            code.0
        ))
    })
}

/// Imports `obj` (an object with `__dlpack__`, on the CPU) as tensor `name`.
/// `dtype16` reinterprets a uint16 / int16 tensor's bits as bf16 or f16;
/// `explicit` (the caller named this tensor) makes it an error on any other
/// dtype.
///
/// # Errors
/// [`BadInputError`] for a tensor off the CPU, a dtype a dump cannot hold,
/// a uint16 float tensor without `dtype16`, a malformed descriptor.
pub fn import(
    name: &str,
    obj: &Bound<'_, PyAny>,
    dtype16: Option<StDtype>,
    explicit: bool,
) -> PyResult<Imported> {
    if obj.hasattr("__dlpack_device__")? {
        let dev = dlpack_device(obj.as_borrowed())?;
        if !matches!(dev.device_type, DLDeviceType::CPU | DLDeviceType::CUDAHOST) {
            return Err(bad(format!(
                "tensor `{name}` is on DLPack device type {} (not the CPU): copy it to the host first \
                 (logprobe.verify copies torch tensors itself)",
                dev.device_type.0
            )));
        }
    }
    let py = obj.py();
    let managed = match from_dlpack(obj.as_borrowed(), None, None) {
        Ok(m) => m,
        // A producer older than DLPack 1.0's `__dlpack__(max_version=...)`
        // (numpy < 2.1, torch < 2.3): its legacy capsule.
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyTypeError>(py) => {
            let capsule = obj
                .call_method0("__dlpack__")
                .map_err(|e| bad(format!("tensor `{name}`: DLPack import failed: {e}")))?;
            from_dlpack(capsule.as_borrowed(), None, None)
                .map_err(|e| bad(format!("tensor `{name}`: DLPack import failed: {e}")))?
        }
        Err(e) => return Err(bad(format!("tensor `{name}`: DLPack import failed: {e}"))),
    };
    let (dtype, shape, layout) = describe(name, &managed, dtype16, explicit)?;
    let storage = match layout {
        Layout::Compact { ptr, len } => Storage::Borrowed {
            _managed: managed,
            ptr,
            len,
        },
        Layout::Gathered(v) => Storage::Owned(v),
    };
    Ok(Imported {
        name: name.to_string(),
        dtype,
        shape,
        storage,
    })
}

enum Layout {
    Compact { ptr: *const u8, len: usize },
    Gathered(Vec<u8>),
}

/// Dtype, shape and data of an imported tensor (checked).
fn describe(
    name: &str,
    managed: &ImportedDlpack,
    dtype16: Option<StDtype>,
    explicit: bool,
) -> PyResult<(StDtype, Vec<usize>, Layout)> {
    let t = managed
        .validate()
        .map_err(|e| bad(format!("tensor `{name}`: invalid DLPack tensor: {e}")))?;
    if !matches!(
        t.device().device_type,
        DLDeviceType::CPU | DLDeviceType::CUDAHOST
    ) {
        return Err(bad(format!(
            "tensor `{name}` is on DLPack device type {} (not the CPU): copy it to the host first",
            t.device().device_type.0
        )));
    }
    let dl = t.dtype();
    let mut dtype = st_dtype(name, dl.code, dl.bits, dl.lanes)?;
    match dtype16 {
        Some(d16) if matches!(dtype, StDtype::U16 | StDtype::I16) => dtype = d16,
        Some(d16) if explicit && dtype != d16 => {
            return Err(bad(format!(
                "tensor `{name}` has dtype {dtype:?}: dtype={:?} reinterprets the bits of uint16 (or int16) arrays only",
                if d16 == StDtype::BF16 { "bfloat16" } else { "float16" }
            )))
        }
        _ => {}
    }
    if holds_floats(name) && matches!(dtype, StDtype::U16 | StDtype::I16) {
        return Err(bad(format!(
            "tensor `{name}` is {}: pass dtype=\"bfloat16\" (or \"float16\") to read its bits as 16-bit floats",
            if dtype == StDtype::U16 { "uint16" } else { "int16" }
        )));
    }
    let shape: Vec<usize> = t
        .shape()
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<_, _>>()
        .map_err(|_| {
            bad(format!(
                "tensor `{name}` has a negative dimension: {:?}",
                t.shape()
            ))
        })?;
    let esize = usize::from(dl.bits / 8);
    // Checked: a shape whose element count overflows is bad input, not a
    // wrapped count (a zero dimension makes any shape empty).
    let n = if shape.contains(&0) {
        0
    } else {
        shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .and_then(|n| n.checked_mul(esize).map(|_| n))
            .ok_or_else(|| {
                bad(format!(
                    "tensor `{name}` has shape {shape:?}: its element count overflows"
                ))
            })?
    };
    let compact = t
        .is_compact()
        .map_err(|e| bad(format!("tensor `{name}`: {e}")))?;
    let layout = if n == 0 {
        Layout::Gathered(Vec::new())
    } else if compact {
        // SAFETY: a validated, compact CPU tensor of num_bytes() bytes.
        let bytes = unsafe { t.cpu_bytes() }.map_err(|e| bad(format!("tensor `{name}`: {e}")))?;
        Layout::Compact {
            ptr: bytes.as_ptr(),
            len: bytes.len(),
        }
    } else {
        let strides = t
            .strides_or_compact()
            .map_err(|e| bad(format!("tensor `{name}`: {e}")))?
            .into_owned();
        // SAFETY: the producer's offset pointer; every element offset
        // below lies within the tensor's extent as its strides describe it.
        let base =
            unsafe { t.offset_bytes_ptr() }.map_err(|e| bad(format!("tensor `{name}`: {e}")))?;
        let mut out = Vec::with_capacity(n * esize);
        let mut idx = vec![0usize; shape.len()];
        for _ in 0..n {
            let off: isize = idx
                .iter()
                .zip(&strides)
                .map(|(&i, &s)| i as isize * s as isize)
                .sum::<isize>()
                * esize as isize;
            // SAFETY: see above.
            out.extend_from_slice(unsafe { std::slice::from_raw_parts(base.offset(off), esize) });
            for d in (0..shape.len()).rev() {
                idx[d] += 1;
                if idx[d] < shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        Layout::Gathered(out)
    };
    Ok((dtype, shape, layout))
}
