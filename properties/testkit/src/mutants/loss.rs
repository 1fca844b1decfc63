//! Bugs of cross-entropy `loss` kernels (issue 17's public reports): label
//! smoothing over ignored rows, a chunked mean multiplied by the chunk
//! count, an all-ignored mean dividing by zero. Each changes only
//! [`PlantedBug::corrupt_loss`]: forward, backward and their memory are the
//! wrapped kernel's.

use ndarray::Array1;

use logprobe_kernels::kernel::{CrossEntropyOutput, Kernel};
use logprobe_kernels::CpuKernel;
use logprobe_reference::spec::{CrossEntropy, Dtype, Logits, Problem, Reduction};

use super::{PlantedBug, FUSED};

/// pytorch/pytorch #73205: with `label_smoothing` `eps > 0`, the uniform
/// part of the loss `eps * mean_{j in A}(-log p_j)` is taken over every
/// row, ignored ones included, while the one-hot part `(1 - eps)(-log
/// p_t)` is masked: under `none` an ignored row holds `w_r eps u_r`
/// instead of 0; under `sum` the ignored rows' `w_r eps u_r` are added;
/// under `mean` the uniform part is averaged over all `N` rows (their
/// weights in its divisor too), the one-hot part over the counted rows.
/// Correct when `eps = 0` or no row is ignored (or every row is: the
/// declared value stays).
///
/// The per-row parts come from the wrapped kernel on the problem with
/// each ignored row given a live token (its first allowed finite entry):
/// `-log p_t` at `eps = 0`, `u_r` at `eps = 1`; the reduction is in f64,
/// rounded once to the output dtype.
pub struct LabelSmoothingCountsIgnored;

impl LabelSmoothingCountsIgnored {
    /// Catalog name.
    pub const NAME: &'static str = "label-smoothing-counts-ignored";

    /// The bug around [`CpuKernel::fused`] (`chunk_size` ignored).
    pub fn new(_chunk_size: usize) -> LabelSmoothingCountsIgnored {
        LabelSmoothingCountsIgnored
    }
}

impl PlantedBug for LabelSmoothingCountsIgnored {
    fn inner(&self) -> &dyn Kernel {
        &FUSED
    }

    fn corrupt_loss(&self, p: &Problem<'_>, ce: &CrossEntropy<'_>, lo: &mut CrossEntropyOutput) {
        let Some(tokens) = p.tokens else { return };
        let acc = p.logits.dtype().accumulation();
        let Ok(eps) = ce.effective_label_smoothing(acc) else {
            return;
        };
        let n = tokens.len();
        let ignored: Vec<usize> = (0..n).filter(|&r| !p.has_target(r)).collect();
        if eps == 0.0 || ignored.is_empty() || ignored.len() == n {
            return;
        }
        // Every row live: an ignored row's target is its first allowed finite entry.
        let mut live_tokens: Array1<i64> = tokens.to_owned();
        for &r in &ignored {
            let row = p.allowed_row_f64(r);
            let Some(j) = row.iter().position(|x| x.is_finite()) else {
                return;
            };
            live_tokens[r] = j as i64;
        }
        // Views reborrowed for this body (the problem keeps one lifetime).
        let live = Problem {
            logits: match &p.logits {
                Logits::F64(a) => Logits::F64(a.view()),
                Logits::F32(a) => Logits::F32(a.view()),
                Logits::Bf16(a) => Logits::Bf16(a.view()),
                Logits::F16(a) => Logits::F16(a.view()),
            },
            tokens: Some(live_tokens.view()),
            sampling_mask: p.sampling_mask.as_ref().map(|m| m.view()),
            topk_ids: None,
            teacher_topk_log_probs: None,
            teacher_probs: None,
            loss_weights: None,
            policy: Default::default(),
            options: p.options,
        };
        let per_row = |label_smoothing: f64| {
            let c = CrossEntropy {
                reduction: Reduction::None,
                label_smoothing,
                mean_all_ignored: ce.mean_all_ignored,
                loss_weights: None,
            };
            FUSED.cross_entropy(&live, &c, Dtype::F64).map(|o| o.values)
        };
        let (Ok(nll), Ok(uniform)) = (per_row(0.0), per_row(1.0)) else {
            return;
        };
        let w = |r: usize| ce.weight(r);
        let out = lo.dtype;
        let counted = |r: usize| p.has_target(r);
        let one_hot: f64 = (0..n)
            .filter(|&r| counted(r) && w(r) != 0.0)
            .map(|r| w(r) * (1.0 - eps) * nll[r])
            .sum();
        let smooth: f64 = (0..n)
            .filter(|&r| w(r) != 0.0)
            .map(|r| w(r) * eps * uniform[r])
            .sum();
        match ce.reduction {
            Reduction::None => {
                for &r in &ignored {
                    if w(r) != 0.0 {
                        lo.values[r] = out.round_f64(w(r) * eps * uniform[r]);
                    }
                }
            }
            Reduction::Sum => lo.values[0] = out.round_f64(one_hot + smooth),
            Reduction::Mean => {
                let counted_w: f64 = (0..n).filter(|&r| counted(r)).map(w).sum();
                let all_w: f64 = (0..n).map(w).sum();
                if counted_w > 0.0 {
                    lo.values[0] = out.round_f64(one_hot / counted_w + smooth / all_w);
                }
            }
        }
    }
}

/// NVIDIA-NeMo/Automodel #3803: a chunked loss whose `mean` is multiplied
/// by the number of row chunks `ceil(N / chunk_size)` (each chunk's share
/// normalised as if it were the whole batch). Correct under `none` and
/// `sum`, with one chunk, and where the mean is 0 or NaN.
pub struct ChunkedMeanTimesChunks {
    inner: CpuKernel,
    chunk_size: usize,
}

impl ChunkedMeanTimesChunks {
    /// Catalog name.
    pub const NAME: &'static str = "chunked-mean-times-chunks";

    /// The bug around [`CpuKernel::chunked`] with `chunk_size` rows per chunk.
    pub fn new(chunk_size: usize) -> ChunkedMeanTimesChunks {
        ChunkedMeanTimesChunks {
            inner: CpuKernel::chunked(chunk_size),
            chunk_size,
        }
    }
}

impl PlantedBug for ChunkedMeanTimesChunks {
    fn inner(&self) -> &dyn Kernel {
        &self.inner
    }

    fn chunk_size(&self) -> Option<usize> {
        Some(self.chunk_size)
    }

    fn corrupt_loss(&self, p: &Problem<'_>, ce: &CrossEntropy<'_>, lo: &mut CrossEntropyOutput) {
        let n = p.logits.dim().0;
        let chunks = n.div_ceil(self.chunk_size.max(1));
        if ce.reduction == Reduction::Mean && chunks > 1 {
            lo.values[0] = lo.dtype.round_f64(lo.values[0] * chunks as f64);
        }
    }
}

/// linkedin/Liger-Kernel #177: the `mean` divides by the counted rows'
/// total weight even when it is 0 (every row ignored, or every counted row
/// of weight 0), giving `0 / 0 = NaN` where `mean_all_ignored = zero` is
/// declared. Correct everywhere else (also where NaN is declared).
pub struct AllIgnoredMeanNan;

impl AllIgnoredMeanNan {
    /// Catalog name.
    pub const NAME: &'static str = "all-ignored-mean-nan";

    /// The bug around [`CpuKernel::fused`] (`chunk_size` ignored).
    pub fn new(_chunk_size: usize) -> AllIgnoredMeanNan {
        AllIgnoredMeanNan
    }
}

impl PlantedBug for AllIgnoredMeanNan {
    fn inner(&self) -> &dyn Kernel {
        &FUSED
    }

    fn corrupt_loss(&self, p: &Problem<'_>, ce: &CrossEntropy<'_>, lo: &mut CrossEntropyOutput) {
        let n = p.logits.dim().0;
        let divisor_zero = (0..n).all(|r| !p.has_target(r) || ce.weight(r) == 0.0);
        if ce.reduction == Reduction::Mean && divisor_zero {
            lo.values[0] = f64::NAN;
        }
    }
}
