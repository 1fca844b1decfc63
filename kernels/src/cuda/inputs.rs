//! Host-side inputs of a CUDA call: per-call scalar parameters, input
//! checks the device cannot make, and logits / mask in the device layout.

use std::ops::Range;

use half::{bf16, f16};
use ndarray::ArrayView2;

use logprobe_reference::spec::{
    Dtype, Element, EntropyLogits, Logits, Problem, Shape, SpecError, TemperatureDtype,
};

use super::backend::{Arg, DeviceBuffer, Launcher};
use super::error::CudaError;
use super::memory::{AllocKind, MemoryTracker};
use crate::kernel::KernelError;

/// The scalar parameters every row kernel takes (see `cuda/common.cuh`:
/// `lp_z`, `lp_shift`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowParams {
    /// How z is formed from x: 0 `z = x`; 1/2/3 `z = round_{f32,bf16,f16}(x / T)`.
    pub zmode: i32,
    /// The temperature `lp_z` divides by (zmode != 0).
    pub temp_z: f32,
    /// The temperature `lp_shift` divides by (1 when zmode != 0).
    pub temp: f32,
    /// 1 when `temp == 1` (the division is skipped: it is exact).
    pub t_one: i32,
    /// 1 when the entropy needs its own (unmasked) statistics: a sampling
    /// mask is present and the entropy is over unmasked logits.
    pub two_sets: i32,
    /// The temperature the backward's gradient is finally divided by
    /// (`dz/dx = 1/T` in both temperature dtypes).
    pub grad_temp: f32,
    /// 1 when `grad_temp == 1` (the division is skipped: it is exact).
    pub grad_t_one: i32,
}

impl RowParams {
    /// No temperature (`T = 1`: `z = x`), no second entropy set: what
    /// [`RowParams::new`] gives a plain problem.
    pub const PLAIN: RowParams = RowParams {
        zmode: 0,
        temp_z: 1.0,
        temp: 1.0,
        t_one: 1,
        two_sets: 0,
        grad_temp: 1.0,
        grad_t_one: 1,
    };

    /// The parameters of `problem` (validated into `shape`).
    pub fn new(problem: &Problem<'_>, shape: &Shape) -> Self {
        let t = shape.temperature as f32;
        let two_sets = i32::from(
            problem.sampling_mask.is_some()
                && problem.options.entropy == Some(EntropyLogits::Unmasked),
        );
        match problem.options.temperature_dtype {
            TemperatureDtype::Input => {
                let zmode = match shape.dtype {
                    Dtype::Bf16 => 2,
                    Dtype::F16 => 3,
                    _ => 1,
                };
                RowParams {
                    zmode,
                    temp_z: t,
                    temp: 1.0,
                    t_one: 1,
                    two_sets,
                    grad_temp: t,
                    grad_t_one: i32::from(t == 1.0),
                }
            }
            TemperatureDtype::Accumulation => RowParams {
                zmode: 0,
                temp_z: 1.0,
                temp: t,
                t_one: i32::from(t == 1.0),
                two_sets,
                grad_temp: t,
                grad_t_one: i32::from(t == 1.0),
            },
        }
    }

    /// The same parameters for data whose z has already been formed (a
    /// widened chunk): `zmode = 0`.
    pub fn on_widened(&self) -> Self {
        RowParams {
            zmode: 0,
            temp_z: 1.0,
            ..*self
        }
    }

    /// `zmode, temp_z, temp, t_one` as kernel arguments.
    pub(crate) fn z_args(&self) -> [Arg; 4] {
        [
            Arg::I32(self.zmode),
            Arg::F32(self.temp_z),
            Arg::F32(self.temp),
            Arg::I32(self.t_one),
        ]
    }
}

/// Refuses what the CUDA kernels do not compute: f64 logits.
///
/// # Errors
/// [`KernelError::Unsupported`].
pub fn check_dtype(shape: &Shape, kernel: &str) -> Result<(), KernelError> {
    if shape.dtype == Dtype::F64 {
        return Err(KernelError::Unsupported {
            kernel: kernel.to_string(),
            what: "f64 logits",
        });
    }
    Ok(())
}

/// With `temperature_dtype = input`, `round_input(x / T)` of a finite real
/// logit may overflow (T < 1): bad input, as the oracle reports it
/// ([`Problem::validate_input_row`], the one definition). The same
/// arithmetic as the device's `lp_z` ([`Dtype::scaled_input`]: the f32
/// quotient, rounded again for 16-bit logits).
///
/// # Errors
/// [`Problem::validate_input_row`]'s: [`SpecError::NonFiniteLogit`] on
/// `logits / temperature`, [`SpecError::NoFiniteLogit`],
/// [`SpecError::TokenNegInf`].
pub fn check_scaled_logits(problem: &Problem<'_>, shape: &Shape) -> Result<(), SpecError> {
    if problem.options.temperature_dtype != TemperatureDtype::Input || shape.temperature >= 1.0 {
        return Ok(());
    }
    let t = shape.temperature;
    let mut z = vec![0.0; shape.vocab_size];
    for row in 0..shape.n {
        for (col, zj) in z.iter_mut().enumerate() {
            let x = problem.logits.get_f64(row, col);
            *zj = if x.is_finite() {
                shape.dtype.scaled_input(x, t)
            } else {
                x
            };
        }
        problem.validate_input_row(row, &z)?;
    }
    Ok(())
}

/// Columns `cols` of the logits, row-major and contiguous `[N, cols.len()]`,
/// as the device stores them: f32 values, or bf16/f16 bit patterns.
#[derive(Clone, Debug, PartialEq)]
pub enum HostLogits {
    /// f32 logits.
    F32(Vec<f32>),
    /// bf16 or f16 bit patterns.
    U16(Vec<u16>),
}

/// Copies columns `cols` of `logits` (f32, bf16 or f16) into the device
/// layout.
///
/// # Panics
/// Never for validated f32/bf16/f16 problems; f64 logits are refused
/// earlier by [`check_dtype`] and give an empty copy.
pub fn host_logits(logits: &Logits<'_>, cols: Range<usize>) -> HostLogits {
    fn copy<T: Copy, U>(v: &ArrayView2<'_, T>, cols: &Range<usize>, f: impl Fn(T) -> U) -> Vec<U> {
        let mut out = Vec::with_capacity(v.nrows() * cols.len());
        for row in v.rows() {
            out.extend(row.iter().skip(cols.start).take(cols.len()).map(|&x| f(x)));
        }
        out
    }
    match logits {
        Logits::F32(v) => HostLogits::F32(copy(v, &cols, |x: f32| x)),
        Logits::Bf16(v) => HostLogits::U16(copy(v, &cols, bf16::to_bits)),
        Logits::F16(v) => HostLogits::U16(copy(v, &cols, f16::to_bits)),
        Logits::F64(_) => HostLogits::F32(Vec::new()),
    }
}

/// Columns `cols` of the sampling mask as bytes (1 = allowed), `[N, cols.len()]`.
pub fn host_mask(mask: &ArrayView2<'_, bool>, cols: Range<usize>) -> Vec<u8> {
    let mut out = Vec::with_capacity(mask.nrows() * cols.len());
    for row in mask.rows() {
        out.extend(
            row.iter()
                .skip(cols.start)
                .take(cols.len())
                .map(|&b| u8::from(b)),
        );
    }
    out
}

/// Logits on the device, tagged with their dtype.
pub struct DeviceLogits {
    /// f32, bf16 or f16.
    pub dtype: Dtype,
    /// Row stride in elements.
    pub stride: usize,
    buf: DeviceLogitsBuf,
}

enum DeviceLogitsBuf {
    F32(DeviceBuffer<f32>),
    U16(DeviceBuffer<u16>),
}

impl DeviceLogits {
    /// Uploads `host` (`[rows, stride]`, dtype `dtype`) as an input.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn upload(
        rt: &dyn Launcher,
        tracker: &MemoryTracker,
        dtype: Dtype,
        stride: usize,
        host: &HostLogits,
    ) -> Result<Self, CudaError> {
        let buf = match host {
            HostLogits::F32(v) => DeviceLogitsBuf::F32(rt.upload(tracker, AllocKind::Input, v)?),
            HostLogits::U16(v) => DeviceLogitsBuf::U16(rt.upload(tracker, AllocKind::Input, v)?),
        };
        Ok(DeviceLogits { dtype, stride, buf })
    }

    /// Wraps a device buffer of f32 values.
    pub fn from_f32(buf: DeviceBuffer<f32>, stride: usize) -> Self {
        DeviceLogits {
            dtype: Dtype::F32,
            stride,
            buf: DeviceLogitsBuf::F32(buf),
        }
    }

    /// Wraps a device buffer of bf16 or f16 bit patterns.
    pub fn from_u16(buf: DeviceBuffer<u16>, dtype: Dtype, stride: usize) -> Self {
        DeviceLogits {
            dtype,
            stride,
            buf: DeviceLogitsBuf::U16(buf),
        }
    }

    /// Device address of row `row`.
    pub fn row_ptr(&self, row: usize) -> u64 {
        match &self.buf {
            DeviceLogitsBuf::F32(b) => b.ptr_at(row * self.stride),
            DeviceLogitsBuf::U16(b) => b.ptr_at(row * self.stride),
        }
    }

    /// Downloads `len` elements into the host logits' layout.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn download(&self, rt: &dyn Launcher, len: usize) -> Result<HostLogits, CudaError> {
        Ok(match &self.buf {
            DeviceLogitsBuf::F32(b) => HostLogits::F32(rt.download(b, len)?),
            DeviceLogitsBuf::U16(b) => HostLogits::U16(rt.download(b, len)?),
        })
    }
}

/// Kernel-name suffix of a logits dtype (`f32`, `bf16`, `f16`).
pub fn dtype_suffix(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::Bf16 => "bf16",
        Dtype::F16 => "f16",
        _ => "f32",
    }
}

/// Rounds device f32 results to the output dtype (f64 values, exact in `out`).
pub fn round_outputs(values: &[f32], out: Dtype) -> Vec<f64> {
    values.iter().map(|&v| out.round_f64(v as f64)).collect()
}

/// Writes downloaded device logits (gradients, rounded on the device to the
/// logits' dtype) back over `logits`.
pub fn write_back<T: Element>(
    dst: &mut ndarray::ArrayViewMut2<'_, T>,
    values: impl Iterator<Item = T>,
) {
    for (d, v) in dst.iter_mut().zip(values) {
        *d = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use logprobe_reference::spec::Options;
    use ndarray::array;

    #[test]
    fn row_params_follow_temperature_dtype_and_mask() {
        let x = array![[1.0f32, 2.0]];
        let m = array![[true, false]];
        let mut p = Problem::new(Logits::F32(x.view()));
        let shape = p.validate().unwrap();
        assert_eq!(RowParams::new(&p, &shape), RowParams::PLAIN);
        p.options = Options {
            temperature: 0.7,
            ..Options::default()
        };
        p.sampling_mask = Some(m.view());
        let shape = p.validate().unwrap();
        let r = RowParams::new(&p, &shape);
        assert_eq!((r.zmode, r.temp, r.t_one, r.two_sets), (0, 0.7f32, 0, 1));
        p.options.entropy = Some(EntropyLogits::Masked);
        assert_eq!(RowParams::new(&p, &shape).two_sets, 0);
        p.options.temperature_dtype = TemperatureDtype::Input;
        let r = RowParams::new(&p, &shape);
        assert_eq!((r.zmode, r.temp_z, r.temp, r.t_one), (1, 0.7f32, 1.0, 1));
        // The gradient is with respect to x: divided by T in both dtypes.
        assert_eq!((r.grad_temp, r.grad_t_one), (0.7f32, 0));
        assert_eq!(r.on_widened().grad_temp, 0.7f32);
        assert_eq!(r.on_widened().zmode, 0);
        let xb = x.mapv(bf16::from_f32);
        let pb = Problem {
            logits: Logits::Bf16(xb.view()),
            ..p
        };
        assert_eq!(RowParams::new(&pb, &pb.validate().unwrap()).zmode, 2);
    }

    #[test]
    fn scaled_logits_that_overflow_are_bad_input() {
        let x = array![[f16::from_f32(60000.0), f16::from_f32(1.0)]];
        let mut p = Problem::new(Logits::F16(x.view()));
        p.options.temperature = 0.5;
        let shape = p.validate().unwrap();
        assert!(
            check_scaled_logits(&p, &shape).is_ok(),
            "accumulation: z is never rounded"
        );
        p.options.temperature_dtype = TemperatureDtype::Input;
        let shape = p.validate().unwrap();
        assert_eq!(
            check_scaled_logits(&p, &shape),
            Err(SpecError::NonFiniteLogit {
                tensor: "logits / temperature",
                row: 0,
                col: 0,
                value: f64::INFINITY
            })
        );
    }

    #[test]
    fn host_layout_is_contiguous_columns() {
        let x = array![[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]];
        assert_eq!(
            host_logits(&Logits::F32(x.view()), 1..3),
            HostLogits::F32(vec![2.0, 3.0, 5.0, 6.0])
        );
        let xt = x.t();
        assert_eq!(
            host_logits(&Logits::F32(xt), 0..2),
            HostLogits::F32(vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0])
        );
        let b = x.mapv(bf16::from_f32);
        assert_eq!(
            host_logits(&Logits::Bf16(b.view()), 2..3),
            HostLogits::U16(vec![0x4040, 0x40c0])
        );
        let m = array![[true, false, true]];
        assert_eq!(host_mask(&m.view(), 0..3), vec![1, 0, 1]);
        assert_eq!(round_outputs(&[1.0 + f32::EPSILON], Dtype::Bf16), vec![1.0]);
    }
}
