//! The algorithm vocabulary: how a kernel computes a row, as declared by
//! every kernel and read by the tolerance model (which turns it into error
//! bounds, `properties/TOLERANCE.md`). Plain data, no arithmetic beyond the
//! summation depths.

use super::dtype::Dtype;

/// How the row's shifted logits are formed (docs/design.md, "The bounds": offset
/// invariance).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shift {
    /// `(x_j - x_max) / T`: subtract the max first (one rounding), then scale.
    SubtractThenScale,
    /// `x_j / T - x_max / T`: scale first, then subtract (errors of `|x|/T`).
    ScaleThenSubtract,
    /// No max shift at all (`gather - logsumexp` on raw logits): errors scale
    /// with `|x|`, not `|x - x_max|`.
    Raw,
    /// Unknown: any form that is correct for the output judged
    /// (`properties/TOLERANCE.md`, (T2a)): every form above for log-probs
    /// and the outputs built on them, the two shifted forms for the
    /// entropy (its unshifted evaluation is a defect). What the tolerance
    /// model assumes for a foreign kernel that declares nothing; no
    /// kernel of this workspace declares it.
    Any,
}

impl Shift {
    /// The form's name on the command line and in reports:
    /// `subtract-then-scale`, `scale-then-subtract`, `raw`, `any`.
    pub const fn name(self) -> &'static str {
        match self {
            Shift::SubtractThenScale => "subtract-then-scale",
            Shift::ScaleThenSubtract => "scale-then-subtract",
            Shift::Raw => "raw",
            Shift::Any => "any",
        }
    }

    /// Every form, in [`Shift::name`] order.
    pub const ALL: [Shift; 4] = [
        Shift::SubtractThenScale,
        Shift::ScaleThenSubtract,
        Shift::Raw,
        Shift::Any,
    ];

    /// Whether log-probs subtract an unshifted `lse = z_max + ln S`
    /// (rounded at `|lse|`) under this form: `Raw`, and `Any`, which
    /// covers it (T6).
    pub const fn log_probs_raw(self) -> bool {
        matches!(self, Shift::Raw | Shift::Any)
    }
}

impl std::str::FromStr for Shift {
    type Err = String;
    /// Parses [`Shift::name`].
    fn from_str(s: &str) -> Result<Shift, String> {
        Shift::ALL
            .into_iter()
            .find(|f| f.name() == s.trim())
            .ok_or_else(|| {
                format!(
                    "unknown form `{s}`: expected subtract-then-scale, scale-then-subtract, raw or any"
                )
            })
    }
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
/// `V` and the shard layout); the tolerance model in `logprobe-verify`
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
    /// Max error of the kernel's `tanh` in ulps of the accumulation dtype
    /// at its result, for the softcap `x' = c tanh(x / c)` (used only when
    /// `Options::softcap` is set with `SoftcapDtype::Accumulation`; the
    /// tolerance model's (T18) takes `x / c` and `c t` as one rounding each,
    /// or a reciprocal multiply).
    pub tanh_ulps: f64,
}

/// How a kernel evaluates the entropy: the tolerance model's error analysis
/// differs per form (`properties/TOLERANCE.md`, T11 and T12). A kernel may
/// declare it (`logprobe_kernels::Kernel::entropy_form`).
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
