//! The one kernel trait every algorithm implements (ours, candle's baseline,
//! planted mutants, CUDA), its declared numerical algorithm and capabilities.

use ndarray::{Array1, Array2, ArrayView1, ArrayView2};

use logprobe_reference::spec::{Cotangents, Dtype, LogitsMut, Options, Problem, Shape, SpecError};

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

/// How the row's shifted logits are formed (DESIGN: offset invariance).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shift {
    /// `(x_j - x_max) / T`: subtract the max first (one rounding), then scale.
    SubtractThenScale,
    /// `x_j / T - x_max / T`: scale first, then subtract (errors of `|x|/T`).
    ScaleThenSubtract,
    /// No max shift at all (`gather - logsumexp` on raw logits): errors scale
    /// with `|x|`, not `|x - x_max|`.
    Raw,
}

/// Summation model of the row reductions: every sum is a leaf sum of at most
/// `leaf` terms added in order, then `merges` levels of pairwise merges along
/// any path (a tree of `b` blocks: `ceil(log2 b)`; sequential merge: `b - 1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Summation {
    /// Leaf depth `h`: terms summed in order in one accumulator.
    pub leaf: usize,
    /// Merge levels `L` on the longest path from a leaf to the root.
    pub merges: usize,
}

impl Summation {
    /// One accumulator over `n` terms in order: `h = n`, `L = 0` (sound for any order).
    pub fn sequential(n: usize) -> Self {
        Summation {
            leaf: n.max(1),
            merges: 0,
        }
    }
    /// `lanes` accumulators each summing `ceil(n / lanes)` terms in order,
    /// then the lanes merged pairwise: `L = ceil(log2 lanes)`.
    pub fn lanes(n: usize, lanes: usize) -> Self {
        let lanes = lanes.max(1);
        Summation {
            leaf: n.div_ceil(lanes).max(1),
            merges: ceil_log2(lanes),
        }
    }
    /// Blocks of `block` terms summed in order, block sums merged by a
    /// balanced pairwise tree.
    pub fn tree(n: usize, block: usize) -> Self {
        let block = block.max(1);
        Summation {
            leaf: block.min(n.max(1)),
            merges: ceil_log2(n.div_ceil(block).max(1)),
        }
    }
    /// Total depth `h + L` (an upper bound on the additions any term sees).
    pub fn depth(&self) -> usize {
        self.leaf + self.merges
    }
}

/// `ceil(log2 b)` for `b >= 1`.
pub fn ceil_log2(b: usize) -> usize {
    if b <= 1 {
        0
    } else {
        (usize::BITS - (b - 1).leading_zeros()) as usize
    }
}

/// The numerical algorithm a kernel declares for one call (it may depend on
/// `V` and the shard layout); the tolerance model in `logprobe-properties`
/// turns it into error bounds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Algorithm {
    /// Accumulation dtype (unit roundoff `u`).
    pub accumulation: Dtype,
    /// Max error of the kernel's `exp` in ulps of the accumulation dtype.
    pub exp_ulps: f64,
    /// Max error of the kernel's `ln` / `ln_1p` in ulps of the accumulation dtype.
    pub log_ulps: f64,
    /// Summation model of `S`, `sum e*x` and the gradient's statistics.
    pub summation: Summation,
    /// Rescaling exps along any merge path: 0 for a two-pass kernel (max
    /// first, then one exp per term), `merges` for online (rescaled) merges.
    pub rescaling_exps: usize,
    /// How logits are shifted and scaled.
    pub shift: Shift,
}

/// How a kernel evaluates the entropy: the tolerance model's error analysis
/// differs per form (`properties/TOLERANCE.md`, T11 and T12). A kernel may
/// declare it with [`Kernel::entropy_form`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum EntropyForm {
    /// `H = ln S + B / S` with `B = sum_j e^{d_j} |d_j|` accumulated next to
    /// `S` (fused and online kernels; also `ln S - sum_j p_j d_j` with
    /// `p_j = e_j / S`).
    Fused,
    /// `H = -sum_j exp(lp_j) lp_j` over a log-softmax buffer
    /// `lp_j = d_j - ln S` (PyTorch's composed ops). Its normaliser error
    /// enters every `p_j`, so it carries `~(1 + H) delta_ell`.
    LogSoftmax,
    /// Unknown form: the tolerance model takes the larger of the two bounds
    /// (sound for both; on near-uniform rows about `1 + H` times looser than
    /// `Fused`).
    #[default]
    Any,
}

/// What a kernel can compute; anything else it refuses with
/// [`KernelError::Unsupported`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// Entropy (over unmasked logits).
    pub entropy: bool,
    /// Entropy over masked logits.
    pub masked_entropy: bool,
    /// Top-k log-probs.
    pub topk: bool,
    /// Backward (VJP) into a new buffer.
    pub backward: bool,
    /// Backward in place over the logits.
    pub in_place_backward: bool,
    /// Sampling masks.
    pub sampling_mask: bool,
    /// Temperatures other than 1 and `TemperatureDtype::Input`.
    pub temperature: bool,
    /// `vocab_size` smaller than the column count (padded vocabulary).
    pub padded_vocab: bool,
    /// f64 logits (f32, bf16 and f16 are always accepted).
    pub f64_input: bool,
}

/// Forward outputs in the requested dtype. Values are stored as f64 and are
/// exactly representable in `dtype`.
#[derive(Clone, Debug, PartialEq)]
pub struct ForwardOutput {
    /// Dtype the outputs were rounded to.
    pub dtype: Dtype,
    /// Log-probs `[N]` (nats) when tokens were given; `ignore_index` rows hold 0.
    pub log_probs: Option<Array1<f64>>,
    /// Entropy `[N]` (nats) when requested.
    pub entropy: Option<Array1<f64>>,
    /// Top-k log-probs `[N, K]` (nats; `-inf` for masked ids) when ids were given.
    pub topk_log_probs: Option<Array2<f64>>,
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

    /// Grad logits written over `logits` (rounded to the logits' dtype).
    /// Tokens, mask, ids and options as in [`Problem`]. On error the logits
    /// are unchanged.
    ///
    /// # Errors
    /// As [`Kernel::backward`].
    fn backward_in_place(
        &self,
        logits: LogitsMut<'_>,
        tokens: Option<ArrayView1<'_, i64>>,
        sampling_mask: Option<ArrayView2<'_, bool>>,
        topk_ids: Option<ArrayView2<'_, i64>>,
        options: &Options,
        cotangents: &Cotangents<'_>,
    ) -> Result<(), KernelError> {
        let _ = (logits, tokens, sampling_mask, topk_ids, options, cotangents);
        Err(KernelError::Unsupported {
            kernel: self.name(),
            what: "in-place backward",
        })
    }
}
