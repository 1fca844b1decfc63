//! [`LogProbOp`]: a candle `CustomOp2` running a [`Kernel`] on CPU tensors.

use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CudaStorage, CustomOp2, DType, Device, Layout, Shape, Storage, Tensor,
};
use ndarray::{Array1, ArrayView1, ArrayView2, ShapeBuilder};

use logprobe_reference::spec::{Cotangents, Dtype, Logits, Options, Output, Problem, SpecError};

use crate::cpu::CpuKernel;
use crate::gradient::Gradient;
use crate::kernel::{Kernel, KernelError};

/// A candle [`CustomOp2`] computing per-token log-probs (and optionally the
/// entropy) of `logits [N, V_total]` at `tokens [N]` with a [`Kernel`] (our
/// fused kernel by default, [`LogProbOp::fused`]).
///
/// - Inputs: logits `[N, V_total]` in f32, bf16, f16 or f64, any strides
///   and offset (a narrowed, transposed or broadcast tensor is read in
///   place, never copied); tokens `[N]` in u32 or i64 (`ignore_index`, -100
///   by default, needs i64).
/// - Output, f32: `[N]` log-probs (nats) when `options.entropy` is `None`;
///   `[N, 2]` with column 0 the log-probs and column 1 the entropy (nats)
///   when it is `Some`. [`log_probs_and_entropy`] splits it. Values are the
///   kernel's outputs rounded to f32 (for f64 logits: rounded once from the
///   exact kernel output); `ignore_index` rows hold 0.
/// - Options (`temperature`, `vocab_size`, `ignore_index`, `entropy`) are
///   the kernel's ([`Options`]); no sampling mask.
/// - Backward (through `Tensor::apply_op2` and candle's autograd): grad
///   logits `[N, V_total]` in the logits' dtype, written in that dtype by
///   the kernel's VJP ([`Kernel::backward_gradient`]) for the output's cotangent (`[N]`, or `[N, 2]`
///   with the entropy's in column 1); no gradient for the tokens. A kernel
///   without a backward (the candle baseline) makes it an error.
///
/// # Errors
/// Bad input gives the spec's typed error ([`KernelError::Spec`]), wrapped
/// in a candle error from which [`kernel_error`] recovers it; so does a
/// kernel's [`KernelError::Unsupported`]. Logits or tokens of another dtype
/// give candle's `UnsupportedDTypeForOp`. CUDA tensors give candle's CUDA
/// error: this op has no CUDA path (the CUDA kernels are the separate
/// feature `cuda`).
#[derive(Clone)]
pub struct LogProbOp {
    kernel: Arc<dyn Kernel>,
    options: Options,
}

impl std::fmt::Debug for LogProbOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogProbOp")
            .field("kernel", &self.kernel.name())
            .field("options", &self.options)
            .finish()
    }
}

impl LogProbOp {
    /// The op's name for candle.
    pub const NAME: &'static str = "logprobe-log-prob";

    /// An op running `kernel` with `options`.
    pub fn new(kernel: Arc<dyn Kernel>, options: Options) -> Self {
        LogProbOp { kernel, options }
    }

    /// An op running our fused CPU kernel ([`CpuKernel::fused`]) with `options`.
    pub fn fused(options: Options) -> Self {
        Self::new(Arc::new(CpuKernel::fused()), options)
    }

    /// The kernel this op runs.
    pub fn kernel(&self) -> &dyn Kernel {
        self.kernel.as_ref()
    }

    /// The options passed to the kernel.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Columns of the output: 2 (log-prob, entropy) when entropy is
    /// requested, else 1 (the output is then `[N]`).
    pub fn output_columns(&self) -> usize {
        if self.options.entropy.is_some() {
            2
        } else {
            1
        }
    }

    /// Builds the kernel's [`Problem`] over the CPU storages of logits
    /// `[N, V_total]` and tokens `[N]` (read in place) and hands it to `f`.
    fn with_problem<R>(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        f: impl FnOnce(&Problem<'_>) -> candle_core::Result<R>,
    ) -> candle_core::Result<R> {
        let (n, v_total) = match *l1.dims() {
            [n, v] => (n, v),
            ref d => return Err(wrap(shape_error("logits", vec![usize::MAX, usize::MAX], d))),
        };
        if l2.dims() != [n] {
            return Err(wrap(shape_error("tokens", vec![n], l2.dims())));
        }
        let tokens: Vec<i64> = match s2 {
            CpuStorage::U32(d) => view1(d, l2, n)?.iter().map(|&t| i64::from(t)).collect(),
            CpuStorage::I64(d) => view1(d, l2, n)?.to_vec(),
            other => return Err(unsupported_dtype(other)),
        };
        let logits = match s1 {
            CpuStorage::F32(d) => Logits::F32(view2(d, l1, n, v_total)?),
            CpuStorage::BF16(d) => Logits::Bf16(view2(d, l1, n, v_total)?),
            CpuStorage::F16(d) => Logits::F16(view2(d, l1, n, v_total)?),
            CpuStorage::F64(d) => Logits::F64(view2(d, l1, n, v_total)?),
            other => return Err(unsupported_dtype(other)),
        };
        f(&Problem {
            tokens: Some(ArrayView1::from(&tokens[..])),
            options: self.options,
            ..Problem::new(logits)
        })
    }

    /// The forward on CPU storage: see the type's docs.
    fn run(&self, problem: &Problem<'_>) -> candle_core::Result<(CpuStorage, Shape)> {
        let n = problem.logits.dim().0;
        let out = self.kernel.forward(problem, Dtype::F32).map_err(wrap)?;
        let lp = out
            .values
            .per_row(Output::LogProbs)
            .ok_or_else(|| wrap(missing_output(self, "log_probs")))?;
        // Outputs are exact f32 values stored as f64: the casts are exact.
        if self.options.entropy.is_some() {
            let ent = out
                .values
                .per_row(Output::Entropy)
                .ok_or_else(|| wrap(missing_output(self, "entropy")))?;
            let data = lp
                .iter()
                .zip(ent.iter())
                .flat_map(|(&a, &b)| [a as f32, b as f32])
                .collect();
            Ok((CpuStorage::F32(data), Shape::from((n, 2))))
        } else {
            Ok((
                CpuStorage::F32(lp.iter().map(|&a| a as f32).collect()),
                Shape::from(n),
            ))
        }
    }
}

impl CustomOp2 for LogProbOp {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        self.with_problem(s1, l1, s2, l2, |p| self.run(p))
    }

    /// Not on our side: the CUDA kernels are feature `cuda`'s. Returns
    /// candle's CUDA error saying so.
    fn cuda_fwd(
        &self,
        _: &CudaStorage,
        _: &Layout,
        _: &CudaStorage,
        _: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        Err(candle_core::Error::Cuda(
            format!("{}: no CUDA implementation in this op (CPU tensors only; CUDA kernels are feature `cuda`)", Self::NAME)
                .into(),
        ))
    }

    /// Grad logits `[N, V_total]` in the logits' dtype, written in it by
    /// the kernel's VJP ([`Kernel::backward_gradient`]; no f64 `[N, V]`
    /// buffer with the CPU kernel): `grad_res` (`[N]`, or `[N, 2]` with the
    /// entropy's cotangent in column 1) widened exactly to f64; padded
    /// columns get 0; tokens get no gradient. CPU tensors only.
    fn bwd(
        &self,
        logits: &Tensor,
        tokens: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let g = grad_res
            .to_dtype(DType::F64)?
            .flatten_all()?
            .to_vec1::<f64>()?;
        let (glp, gent) = if self.output_columns() == 2 {
            let col = |c: usize| {
                g.iter()
                    .skip(c)
                    .step_by(2)
                    .copied()
                    .collect::<Array1<f64>>()
            };
            (col(0), Some(col(1)))
        } else {
            (Array1::from(g), None)
        };
        let cot = Cotangents::default()
            .with_column(Output::LogProbs, glp.view())
            .with_column(Output::Entropy, gent.as_ref().map(|h| h.view()));
        let (ls, ll) = logits.storage_and_layout();
        let (ts, tl) = tokens.storage_and_layout();
        let (Storage::Cpu(ls), Storage::Cpu(ts)) = (&*ls, &*ts) else {
            return Err(candle_core::Error::Cuda(
                format!("{}: backward runs on CPU tensors only", Self::NAME).into(),
            ));
        };
        let grad = self.with_problem(ls, ll, ts, tl, |p| {
            let out = p.logits.dtype();
            self.kernel.backward_gradient(p, &cot, out).map_err(wrap)
        })?;
        let dim = grad.dim();
        // Row-major `[N, V_total]` values, moved into the tensor as they are.
        fn vec_of<T: Clone>(a: ndarray::Array2<T>) -> Vec<T> {
            if a.is_standard_layout() {
                a.into_raw_vec_and_offset().0
            } else {
                a.iter().cloned().collect()
            }
        }
        let grad = match grad {
            Gradient::F64(g) => Tensor::from_vec(vec_of(g), dim, &Device::Cpu)?,
            Gradient::F32(g) => Tensor::from_vec(vec_of(g), dim, &Device::Cpu)?,
            Gradient::Bf16(g) => Tensor::from_vec(vec_of(g), dim, &Device::Cpu)?,
            Gradient::F16(g) => Tensor::from_vec(vec_of(g), dim, &Device::Cpu)?,
        };
        Ok((Some(grad), None))
    }
}

/// Applies `op` to `logits [N, V_total]` and `tokens [N]` (see
/// [`LogProbOp`]) and splits its output: log-probs `[N]` f32 (nats) and,
/// when the op's options request it, entropy `[N]` f32 (nats). Applied
/// with `apply_op2`, so gradients flow back to `logits` when it is tracked
/// (a `Var` or derived from one).
///
/// # Errors
/// Those of [`LogProbOp`]; candle's errors from the split.
pub fn log_probs_and_entropy(
    logits: &Tensor,
    tokens: &Tensor,
    op: &LogProbOp,
) -> candle_core::Result<(Tensor, Option<Tensor>)> {
    let out = logits.apply_op2(tokens, op.clone())?;
    if op.output_columns() == 2 {
        Ok((
            out.narrow(1, 0, 1)?.squeeze(1)?,
            Some(out.narrow(1, 1, 1)?.squeeze(1)?),
        ))
    } else {
        Ok((out, None))
    }
}

/// The [`KernelError`] inside a candle error raised by [`LogProbOp`]
/// (through candle's backtrace and context wrappers), if any.
pub fn kernel_error(e: &candle_core::Error) -> Option<&KernelError> {
    use candle_core::Error;
    match e {
        Error::WrappedContext { wrapped, .. } => wrapped.downcast_ref::<KernelError>(),
        Error::WithBacktrace { inner, .. }
        | Error::Context { inner, .. }
        | Error::WithPath { inner, .. } => kernel_error(inner),
        _ => None,
    }
}

/// A [`KernelError`] as a candle error that keeps it ([`kernel_error`]).
fn wrap(e: KernelError) -> candle_core::Error {
    candle_core::Error::WrappedContext {
        wrapped: Box::new(e),
        context: LogProbOp::NAME.to_string(),
    }
    .bt()
}

fn unsupported_dtype(s: &CpuStorage) -> candle_core::Error {
    candle_core::Error::UnsupportedDTypeForOp(s.dtype(), LogProbOp::NAME).bt()
}

fn shape_error(tensor: &'static str, expected: Vec<usize>, found: &[usize]) -> KernelError {
    KernelError::Spec(SpecError::ShapeMismatch {
        tensor,
        expected,
        found: found.to_vec(),
    })
}

fn missing_output(op: &LogProbOp, what: &'static str) -> KernelError {
    KernelError::Device {
        kernel: op.kernel.name(),
        message: format!("the kernel returned no {what}"),
    }
}

/// The `[n]` view of a rank-1 CPU tensor, in place (see [`view2`]).
fn view1<'a, T>(data: &'a [T], l: &Layout, n: usize) -> candle_core::Result<ArrayView1<'a, T>> {
    if n == 0 {
        return Ok(ArrayView1::from(&data[..0]));
    }
    let start = l.start_offset().min(data.len());
    ArrayView1::from_shape(n.strides(l.stride()[0]), &data[start..]).map_err(|e| {
        candle_core::Error::Msg(format!(
            "{}: tokens layout {l:?} does not fit its storage: {e}",
            LogProbOp::NAME
        ))
    })
}

/// The `[n, v]` view of a rank-2 CPU tensor, in place: candle's strides
/// (in elements, non-negative, 0 for broadcast axes) and start offset.
fn view2<'a, T>(
    data: &'a [T],
    l: &Layout,
    n: usize,
    v: usize,
) -> candle_core::Result<ArrayView2<'a, T>> {
    if n == 0 || v == 0 {
        // ndarray checks strides even for empty shapes: use standard ones.
        return ArrayView2::from_shape((n, v), &data[..0]).map_err(|e| {
            candle_core::Error::Msg(format!("{}: empty logits view: {e}", LogProbOp::NAME))
        });
    }
    let st = l.stride();
    let start = l.start_offset().min(data.len());
    ArrayView2::from_shape((n, v).strides((st[0], st[1])), &data[start..]).map_err(|e| {
        candle_core::Error::Msg(format!(
            "{}: logits layout {l:?} does not fit its storage: {e}",
            LogProbOp::NAME
        ))
    })
}
