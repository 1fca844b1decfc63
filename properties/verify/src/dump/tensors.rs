//! The tensors left in the file and decoded row by row ([`FloatMatrix`],
//! [`MaskMatrix`], [`RowLogits`]), and the little-endian decoders.

use half::{bf16, f16};
use ndarray::Array2;
use safetensors::Dtype as StDtype;

use logprobe_reference::spec::{Dtype, Logits};

use super::*;

/// A float tensor `[rows, cols]` left in the file, decoded row by row.
#[derive(Clone, Copy, Debug)]
pub struct FloatMatrix<'a> {
    /// Element dtype.
    pub dtype: Dtype,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    pub(crate) data: &'a [u8],
    /// `Some(I64 | I32)`: the tensor holds integers (a count output,
    /// [`Output::is_count`](logprobe_reference::spec::Output::is_count)), decoded
    /// exactly; `dtype` is then the float they are judged in (f32, or f64
    /// past `2^24`).
    pub(crate) ints: Option<StDtype>,
}

impl<'a> FloatMatrix<'a> {
    /// The whole tensor `[rows, cols]` as exact f64 values.
    pub fn to_array(&self) -> Array2<f64> {
        Array2::from_shape_vec((self.rows, self.cols), self.decode(self.data))
            .expect("size checked by safetensors")
    }

    /// Row `r` as exact f64 values (`[cols]`). Panics if `r >= rows`.
    pub fn row_f64(&self, r: usize) -> Vec<f64> {
        let w = self
            .ints
            .map_or(self.dtype.size_bytes(), |d| d.bitsize() / 8);
        let bytes = &self.data[r * self.cols * w..(r + 1) * self.cols * w];
        self.decode(bytes)
    }

    fn decode(&self, bytes: &[u8]) -> Vec<f64> {
        match self.ints {
            // I64 / I32 only (checked where the matrix is built).
            Some(d) => decode_ids("count", d, bytes)
                .unwrap_or_default()
                .into_iter()
                .map(|x| x as f64)
                .collect(),
            None => decode_floats(self.dtype, bytes),
        }
    }

    /// Row `r` as logits `[1, cols]` of the same dtype. Panics if `r >= rows`.
    pub fn row_logits(&self, r: usize) -> RowLogits {
        let w = self.dtype.size_bytes();
        let b = &self.data[r * self.cols * w..(r + 1) * self.cols * w];
        fn arr<T>(v: Vec<T>) -> Array2<T> {
            let n = v.len();
            Array2::from_shape_vec((1, n), v).expect("one row")
        }
        match self.dtype {
            Dtype::F64 => RowLogits::F64(arr(b
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect())),
            Dtype::F32 => RowLogits::F32(arr(b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect())),
            Dtype::Bf16 => RowLogits::Bf16(arr(b
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes(c.try_into().unwrap()))
                .collect())),
            Dtype::F16 => RowLogits::F16(arr(b
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes(c.try_into().unwrap()))
                .collect())),
        }
    }
}

/// One row of logits `[1, V_total]`, owned, in its stored dtype.
#[derive(Clone, Debug)]
pub enum RowLogits {
    /// binary64.
    F64(Array2<f64>),
    /// binary32.
    F32(Array2<f32>),
    /// bfloat16.
    Bf16(Array2<bf16>),
    /// binary16.
    F16(Array2<f16>),
}

impl RowLogits {
    /// A view as the spec's [`Logits`].
    pub fn view(&self) -> Logits<'_> {
        match self {
            RowLogits::F64(a) => Logits::F64(a.view()),
            RowLogits::F32(a) => Logits::F32(a.view()),
            RowLogits::Bf16(a) => Logits::Bf16(a.view()),
            RowLogits::F16(a) => Logits::F16(a.view()),
        }
    }
}

/// A `sampling_mask [N, V]` left in the file (`bool` or `u8`, 1 = allowed).
#[derive(Clone, Copy, Debug)]
pub struct MaskMatrix<'a> {
    pub(crate) cols: usize,
    pub(crate) data: &'a [u8],
}

impl MaskMatrix<'_> {
    /// Row `r` as `[1, V]` bools (`bool` or `u8`: 1 = allowed, 0 = not).
    ///
    /// # Errors
    /// [`DumpError::BadMaskValue`] for a byte other than 0 or 1.
    pub fn row(&self, r: usize) -> Result<Array2<bool>, DumpError> {
        let bytes = &self.data[r * self.cols..(r + 1) * self.cols];
        let mut out = Vec::with_capacity(self.cols);
        for (col, &b) in bytes.iter().enumerate() {
            if b > 1 {
                return Err(DumpError::BadMaskValue {
                    row: r,
                    col,
                    value: b,
                });
            }
            out.push(b != 0);
        }
        Ok(Array2::from_shape_vec((1, self.cols), out).expect("row length equals cols"))
    }
}

pub(crate) fn st_float(d: StDtype) -> Option<Dtype> {
    match d {
        StDtype::F64 => Some(Dtype::F64),
        StDtype::F32 => Some(Dtype::F32),
        StDtype::BF16 => Some(Dtype::Bf16),
        StDtype::F16 => Some(Dtype::F16),
        _ => None,
    }
}

/// Decodes little-endian floats of `dtype` to exact f64 values.
pub(crate) fn decode_floats(dtype: Dtype, b: &[u8]) -> Vec<f64> {
    match dtype {
        Dtype::F64 => b
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        Dtype::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        Dtype::Bf16 => b
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes(c.try_into().unwrap()).to_f64())
            .collect(),
        Dtype::F16 => b
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes(c.try_into().unwrap()).to_f64())
            .collect(),
    }
}

/// Decodes `b` (little-endian `dtype` values) into `out` (exact f64),
/// as [`decode_floats`] without allocating. Panics if the lengths differ.
pub(crate) fn decode_floats_into(dtype: Dtype, b: &[u8], out: &mut [f64]) {
    let w = dtype.size_bytes();
    assert_eq!(b.len(), out.len() * w, "decode_floats_into: lengths differ");
    match dtype {
        Dtype::F64 => {
            for (o, c) in out.iter_mut().zip(b.chunks_exact(8)) {
                *o = f64::from_le_bytes(c.try_into().unwrap());
            }
        }
        Dtype::F32 => {
            for (o, c) in out.iter_mut().zip(b.chunks_exact(4)) {
                *o = f64::from(f32::from_le_bytes(c.try_into().unwrap()));
            }
        }
        Dtype::Bf16 => {
            for (o, c) in out.iter_mut().zip(b.chunks_exact(2)) {
                // bf16 is f32's top half: exact.
                let bits = u32::from(u16::from_le_bytes(c.try_into().unwrap())) << 16;
                *o = f64::from(f32::from_bits(bits));
            }
        }
        Dtype::F16 => {
            for (o, c) in out.iter_mut().zip(b.chunks_exact(2)) {
                *o = f16::from_le_bytes(c.try_into().unwrap()).to_f64();
            }
        }
    }
}

pub(crate) fn decode_ids(
    tensor: &'static str,
    d: StDtype,
    b: &[u8],
) -> Result<Vec<i64>, DumpError> {
    Ok(match d {
        StDtype::I64 => b
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        StDtype::I32 => b
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
            .collect(),
        StDtype::U32 => b
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as i64)
            .collect(),
        StDtype::I16 => b
            .chunks_exact(2)
            .map(|c| i16::from_le_bytes(c.try_into().unwrap()) as i64)
            .collect(),
        StDtype::U16 => b
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes(c.try_into().unwrap()) as i64)
            .collect(),
        StDtype::I8 => b.iter().map(|&c| c as i8 as i64).collect(),
        StDtype::U8 => b.iter().map(|&c| c as i64).collect(),
        StDtype::U64 => b
            .chunks_exact(8)
            .enumerate()
            .map(|(index, c)| {
                let value = u64::from_le_bytes(c.try_into().unwrap());
                i64::try_from(value).map_err(|_| DumpError::IdOverflow {
                    tensor,
                    index,
                    value,
                })
            })
            .collect::<Result<_, _>>()?,
        other => {
            return Err(DumpError::BadDtype {
                tensor,
                found: format!("{other:?}"),
                expected: "an integer dtype (I64, I32, I16, I8, U64, U32, U16, U8)",
            })
        }
    })
}
