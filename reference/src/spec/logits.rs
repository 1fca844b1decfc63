//! The logits of a problem, borrowed in one of the four dtypes
//! ([`Logits`], [`LogitsMut`]), and [`with_logits!`](crate::with_logits),
//! which dispatches over their element type.

use half::{bf16, f16};
use ndarray::{ArrayView2, ArrayViewMut2};

use super::dtype::{Dtype, Element};

/// Logits `[N, V_total]` in one of the four dtypes, borrowed. Only the first
/// `vocab_size` columns are real vocabulary; the rest are padding.
#[derive(Clone, Copy, Debug)]
pub enum Logits<'a> {
    /// binary64 logits.
    F64(ArrayView2<'a, f64>),
    /// binary32 logits.
    F32(ArrayView2<'a, f32>),
    /// bfloat16 logits.
    Bf16(ArrayView2<'a, bf16>),
    /// binary16 logits.
    F16(ArrayView2<'a, f16>),
}

/// Mutable logits `[N, V_total]`, for the in-place backward.
#[derive(Debug)]
pub enum LogitsMut<'a> {
    /// binary64 logits.
    F64(ArrayViewMut2<'a, f64>),
    /// binary32 logits.
    F32(ArrayViewMut2<'a, f32>),
    /// bfloat16 logits.
    Bf16(ArrayViewMut2<'a, bf16>),
    /// binary16 logits.
    F16(ArrayViewMut2<'a, f16>),
}

/// Dispatches `$body` over the element type of a [`Logits`]: `$v` is bound to
/// the typed `ArrayView2<T>`.
#[macro_export]
macro_rules! with_logits {
    ($logits:expr, $v:ident => $body:expr) => {
        match $logits {
            $crate::spec::Logits::F64($v) => $body,
            $crate::spec::Logits::F32($v) => $body,
            $crate::spec::Logits::Bf16($v) => $body,
            $crate::spec::Logits::F16($v) => $body,
        }
    };
}

impl<'a> Logits<'a> {
    /// The dtype of the logits.
    pub fn dtype(&self) -> Dtype {
        match self {
            Logits::F64(_) => Dtype::F64,
            Logits::F32(_) => Dtype::F32,
            Logits::Bf16(_) => Dtype::Bf16,
            Logits::F16(_) => Dtype::F16,
        }
    }

    /// `(N, V_total)`.
    pub fn dim(&self) -> (usize, usize) {
        with_logits!(self, v => v.dim())
    }

    /// Element `[row, col]` as the exactly equal f64. Panics if out of bounds
    /// (indices come from validated shapes).
    pub fn get_f64(&self, row: usize, col: usize) -> f64 {
        with_logits!(self, v => v[[row, col]].to_f64())
    }

    /// Row `row` converted exactly to f64 (`[V_total]`).
    pub fn row_f64(&self, row: usize) -> Vec<f64> {
        with_logits!(self, v => v.row(row).iter().map(|x| x.to_f64()).collect())
    }

    /// Rows `range` as a view of the same dtype.
    pub fn slice_rows(&self, range: std::ops::Range<usize>) -> Logits<'a> {
        use ndarray::s;
        match *self {
            Logits::F64(v) => Logits::F64(v.slice_move(s![range, ..])),
            Logits::F32(v) => Logits::F32(v.slice_move(s![range, ..])),
            Logits::Bf16(v) => Logits::Bf16(v.slice_move(s![range, ..])),
            Logits::F16(v) => Logits::F16(v.slice_move(s![range, ..])),
        }
    }

    /// Columns `range` as a view of the same dtype (a vocabulary shard).
    pub fn slice_cols(&self, range: std::ops::Range<usize>) -> Logits<'a> {
        use ndarray::s;
        match *self {
            Logits::F64(v) => Logits::F64(v.slice_move(s![.., range])),
            Logits::F32(v) => Logits::F32(v.slice_move(s![.., range])),
            Logits::Bf16(v) => Logits::Bf16(v.slice_move(s![.., range])),
            Logits::F16(v) => Logits::F16(v.slice_move(s![.., range])),
        }
    }
}

impl<'a> LogitsMut<'a> {
    /// A shorter-lived mutable view of the same buffer.
    pub fn reborrow(&mut self) -> LogitsMut<'_> {
        match self {
            LogitsMut::F64(v) => LogitsMut::F64(v.view_mut()),
            LogitsMut::F32(v) => LogitsMut::F32(v.view_mut()),
            LogitsMut::Bf16(v) => LogitsMut::Bf16(v.view_mut()),
            LogitsMut::F16(v) => LogitsMut::F16(v.view_mut()),
        }
    }
    /// A read-only view of the same buffer.
    pub fn view(&self) -> Logits<'_> {
        match self {
            LogitsMut::F64(v) => Logits::F64(v.view()),
            LogitsMut::F32(v) => Logits::F32(v.view()),
            LogitsMut::Bf16(v) => Logits::Bf16(v.view()),
            LogitsMut::F16(v) => Logits::F16(v.view()),
        }
    }
}
