//! The one kernel trait every algorithm implements (ours, candle's baseline,
//! planted mutants, CUDA), its declared numerical algorithm and capabilities.

use ndarray::Array2;

use logprobe_reference::spec::{
    Cotangents, CrossEntropy, Dtype, Output, PerOutput, Problem, ProblemMut, Shape, SpecError,
};

use crate::gradient::Gradient;

/// The algorithm vocabulary lives in the spec (read by the kernels and the
/// tolerance model alike); re-exported here for kernel code.
pub use logprobe_reference::spec::{ceil_log2, Algorithm, EntropyForm, Shift, Summation};

/// Errors of a kernel call.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KernelError {
    /// Bad input, as the spec defines it.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The kernel cannot compute what was asked (it says so instead of faking it).
    #[error("kernel {kernel} does not support {what}")]
    Unsupported {
        /// Kernel name.
        kernel: String,
        /// What is missing (`entropy`, `backward`, ...).
        what: &'static str,
    },
    /// A device (CUDA) failure.
    #[error("device error in {kernel}: {message}")]
    Device {
        /// Kernel name.
        kernel: String,
        /// The driver's message.
        message: String,
    },
}

pub use crate::capabilities::{Capabilities, Feature, FeatureSet};

/// Forward outputs in the requested dtype. Values are stored as f64 and are
/// exactly representable in `dtype`.
#[derive(Clone, Debug, PartialEq)]
pub struct ForwardOutput {
    /// Dtype the outputs were rounded to.
    pub dtype: Dtype,
    /// Every forward output the problem requests
    /// ([`Output::requested`](logprobe_reference::spec::Output::requested)),
    /// `[N, width]`: log-probs `[N, 1]` (nats; `ignore_index` rows hold 0),
    /// entropy `[N, 1]` (nats), top-k log-probs `[N, K]` (nats; `-inf` for
    /// masked ids), `lse [N, 1]` (nats), `z_loss [N, 1]`.
    pub values: PerOutput<Array2<f64>>,
}

impl ForwardOutput {
    /// Zero-filled outputs `[N, width]` for every output `problem`
    /// requests, to be filled row by row.
    pub fn zeros(problem: &Problem<'_>, shape: &Shape, dtype: Dtype) -> Self {
        ForwardOutput {
            dtype,
            values: PerOutput::for_requested(problem, |o| Array2::zeros((shape.n, o.width(shape)))),
        }
    }

    /// The outputs of `values` that are present (`[N, width]` each, values
    /// of `dtype`), the `None`s left out.
    pub fn from_values(
        dtype: Dtype,
        values: impl IntoIterator<Item = (Output, Option<Array2<f64>>)>,
    ) -> Self {
        ForwardOutput {
            dtype,
            values: values
                .into_iter()
                .filter_map(|(o, v)| Some((o, v?)))
                .collect(),
        }
    }
}

/// The cross-entropy `loss` of one call ([`Kernel::cross_entropy`]).
#[derive(Clone, Debug, PartialEq)]
pub struct CrossEntropyOutput {
    /// Dtype the values are rounded to.
    pub dtype: Dtype,
    /// `[N]` under `none`, `[1]` under `sum` / `mean` (nats; exact f64s
    /// holding values of `dtype`).
    pub values: Vec<f64>,
}

/// One log-prob / entropy / top-k algorithm with its VJP.
pub trait Kernel: Send + Sync {
    /// A short name for reports (`fused`, `chunked(chunk_size=64)`, ...).
    fn name(&self) -> String;

    /// What this kernel can compute.
    fn capabilities(&self) -> Capabilities;

    /// The numerical algorithm of a call with this shape.
    fn algorithm(&self, shape: &Shape) -> Algorithm;

    /// How this kernel evaluates the entropy, when it declares it; `None`
    /// (the default) lets the tolerance model assume [`EntropyForm::Any`].
    /// Declaring a form the kernel does not use makes its entropy bound
    /// unsound for it.
    fn entropy_form(&self) -> Option<EntropyForm> {
        None
    }

    /// Declared bound on extra memory of a forward or backward call with
    /// this shape, in bytes, outputs excluded (workspaces included).
    fn workspace_bytes(&self, shape: &Shape) -> usize;

    /// Log-probs, entropy and top-k log-probs, rounded to `out`.
    ///
    /// # Errors
    /// [`KernelError::Spec`] for bad input; [`KernelError::Unsupported`].
    fn forward(&self, problem: &Problem<'_>, out: Dtype) -> Result<ForwardOutput, KernelError>;

    /// Grad logits `[N, V_total]` (padded columns 0), rounded to `out`,
    /// stored as f64.
    ///
    /// # Errors
    /// [`KernelError::Spec`] (including [`SpecError::NoCotangent`]);
    /// [`KernelError::Unsupported`].
    fn backward(
        &self,
        problem: &Problem<'_>,
        cotangents: &Cotangents<'_>,
        out: Dtype,
    ) -> Result<Array2<f64>, KernelError>;

    /// Grad logits `[N, V_total]` in `out`'s own element type, each value
    /// rounded once to nearest ([`Gradient`]: 2 bytes per entry for bf16).
    /// The default converts [`Kernel::backward`]'s values, which are exact
    /// in `out`, so the conversion is exact; kernels that can write the
    /// dtype directly override it (the CPU kernel does).
    ///
    /// # Errors
    /// As [`Kernel::backward`].
    fn backward_gradient(
        &self,
        problem: &Problem<'_>,
        cotangents: &Cotangents<'_>,
        out: Dtype,
    ) -> Result<Gradient, KernelError> {
        let g = self.backward(problem, cotangents, out)?;
        Ok(Gradient::from_f64(&g, out))
    }

    /// Grad logits written over `problem.logits` (rounded to the logits'
    /// dtype); tokens, mask, ids and options as in [`Problem`]. On error
    /// the logits are unchanged.
    ///
    /// # Errors
    /// As [`Kernel::backward`].
    fn backward_in_place(
        &self,
        problem: ProblemMut<'_>,
        cotangents: &Cotangents<'_>,
    ) -> Result<(), KernelError> {
        let _ = (problem, cotangents);
        Err(KernelError::Unsupported {
            kernel: self.name(),
            what: "in-place backward",
        })
    }

    /// The summation of the cross-entropy loss's plain sums over `n`
    /// terms (TOLERANCE.md (T17)): a row's smoothing sum of log-probs
    /// (`n = V`), the reduction of `sum` / `mean` over the row terms and the
    /// `mean`'s weighted divisor (`n = N`). The default, one accumulator in
    /// order, is sound for any order; a kernel that sums otherwise declares
    /// it. Declaring a shallower sum than the kernel does makes its loss
    /// bound unsound for it.
    fn loss_summation(&self, n: usize) -> Summation {
        Summation::sequential(n)
    }

    /// The cross-entropy `loss` of `problem` under `ce` (docs/design.md, "The
    /// loss side"; [`CrossEntropy`]), rounded to `out`: `[N]` under `none`
    /// (ignored rows 0), one value under `sum` / `mean`, nats. The default
    /// refuses (`loss` not in [`Capabilities::outputs`]).
    ///
    /// # Errors
    /// As [`Kernel::forward`]; [`CrossEntropy::validate`]'s errors;
    /// [`SpecError::MissingTensor`] without `tokens`;
    /// [`KernelError::Unsupported`].
    fn cross_entropy(
        &self,
        problem: &Problem<'_>,
        ce: &CrossEntropy<'_>,
        out: Dtype,
    ) -> Result<CrossEntropyOutput, KernelError> {
        let _ = (problem, ce, out);
        Err(KernelError::Unsupported {
            kernel: self.name(),
            what: "cross-entropy loss",
        })
    }
}
