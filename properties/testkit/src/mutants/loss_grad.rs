//! Bugs of the loss side's gradients (issue 17): the z-loss gradient
//! without its factor 2, a `mean`'s gradient divided by `N` instead of the
//! counted rows' weight `W`, and label smoothing differentiated on ignored
//! rows. Each overrides only [`PlantedBug::backward`] (the in-place
//! backward writes it over the logits); the forward is the wrapped
//! kernel's. Each is correct where its trigger is absent.

use ndarray::{Array1, Array2};

use logprobe_kernels::kernel::{Kernel, KernelError};
use logprobe_reference::spec::{
    Cotangents, Dtype, Logits, LossOptions, MeanDivisor, Output, Problem, Reduction,
};

use super::{PlantedBug, FUSED};

/// The z-loss gradient without its factor 2: `d(coef lse^2)/dz_j` taken as
/// `coef lse p_j` (the derivative of `lse^2` written `lse`), i.e. the
/// wrapped kernel with `grad_z_loss` halved (exact in f64). Trigger: a
/// nonzero `grad_z_loss` with `z_loss_coef > 0`.
pub struct ZLossGradMissingTwo;

impl ZLossGradMissingTwo {
    /// Catalog name.
    pub const NAME: &'static str = "z-loss-grad-missing-2";

    /// The bug around [`CpuKernel::fused`](logprobe_kernels::CpuKernel::fused) (`chunk_size` ignored).
    pub fn new(_chunk_size: usize) -> ZLossGradMissingTwo {
        ZLossGradMissingTwo
    }
}

impl PlantedBug for ZLossGradMissingTwo {
    fn inner(&self) -> &dyn Kernel {
        &FUSED
    }

    fn backward(
        &self,
        problem: &Problem<'_>,
        cotangents: &Cotangents<'_>,
        out: Dtype,
    ) -> Result<Array2<f64>, KernelError> {
        // The correct kernel's validation and typed errors first.
        let correct = FUSED.backward(problem, cotangents, out)?;
        let Some(b) = cotangents.column(Output::ZLoss) else {
            return Ok(correct);
        };
        let half = b.mapv(|b| b / 2.0);
        FUSED.backward(
            problem,
            &cotangents.with_column(Output::ZLoss, half.view()),
            out,
        )
    }
}

/// A `mean`'s gradient divided by the number of rows `N` instead of the
/// counted rows' weight `W` (ignored rows and weights forgotten in the
/// divisor; the forward's mean stays right): the wrapped kernel given the
/// divisor `N` ([`Cotangents::loss_divisor`]). Trigger: `grad_loss` under
/// `mean` with `W != N` (an ignored row, or a weight other than 1).
pub struct MeanGradOverN;

impl MeanGradOverN {
    /// Catalog name.
    pub const NAME: &'static str = "mean-grad-over-n";

    /// The bug around [`CpuKernel::fused`](logprobe_kernels::CpuKernel::fused) (`chunk_size` ignored).
    pub fn new(_chunk_size: usize) -> MeanGradOverN {
        MeanGradOverN
    }
}

impl PlantedBug for MeanGradOverN {
    fn inner(&self) -> &dyn Kernel {
        &FUSED
    }

    fn backward(
        &self,
        problem: &Problem<'_>,
        cotangents: &Cotangents<'_>,
        out: Dtype,
    ) -> Result<Array2<f64>, KernelError> {
        let correct = FUSED.backward(problem, cotangents, out)?;
        let mean = problem
            .options
            .loss
            .is_some_and(|l| l.reduction == Reduction::Mean);
        if !mean || cotangents.column(Output::Loss).is_none() {
            return Ok(correct);
        }
        // `N`: the whole problem's rows when these are a view of it.
        let rows = cotangents
            .loss_divisor
            .map_or(problem.logits.dim().0, MeanDivisor::rows);
        let Ok(n) = MeanDivisor::new(std::iter::repeat_n(1.0, rows)) else {
            return Ok(correct);
        };
        FUSED.backward(
            problem,
            &Cotangents {
                loss_divisor: Some(&n),
                ..*cotangents
            },
            out,
        )
    }
}

/// Label smoothing differentiated on ignored rows (the gradient side of
/// pytorch/pytorch #73205): an `ignore_index` row's target term is masked
/// but its smoothing term `eps mean_{j in A}(-log p_j)` is not, so the row
/// gets `ell eps (p_j - [j in A] / |A|) / T` (`ell = g w`, `/ W` under
/// `mean`) instead of 0. The extra rows come from the wrapped kernel on
/// the problem with `eps = 1`, the ignored rows given a live token (their
/// target has weight `1 - eps = 0`), weights kept on them and 0 on the
/// counted rows, the cotangent `g eps`; added to the correct gradient and
/// rounded once to the output dtype. Trigger: `grad_loss` with `eps > 0`
/// and an ignored row of nonzero weight.
pub struct SmoothingGradOnIgnored;

impl SmoothingGradOnIgnored {
    /// Catalog name.
    pub const NAME: &'static str = "smoothing-grad-on-ignored";

    /// The bug around [`CpuKernel::fused`](logprobe_kernels::CpuKernel::fused) (`chunk_size` ignored).
    pub fn new(_chunk_size: usize) -> SmoothingGradOnIgnored {
        SmoothingGradOnIgnored
    }
}

impl PlantedBug for SmoothingGradOnIgnored {
    fn inner(&self) -> &dyn Kernel {
        &FUSED
    }

    fn backward(
        &self,
        p: &Problem<'_>,
        cotangents: &Cotangents<'_>,
        out: Dtype,
    ) -> Result<Array2<f64>, KernelError> {
        let correct = FUSED.backward(p, cotangents, out)?;
        let (Some(g), Some(lo), Some(tokens)) =
            (cotangents.column(Output::Loss), p.options.loss, p.tokens)
        else {
            return Ok(correct);
        };
        let acc = p.logits.dtype().accumulation();
        let eps = acc.round_f64(lo.label_smoothing);
        let n = tokens.len();
        let ignored: Vec<usize> = (0..n).filter(|&r| !p.has_target(r)).collect();
        if eps == 0.0 || ignored.is_empty() {
            return Ok(correct);
        }
        // The ignored rows live (their first allowed finite entry), alone weighted.
        let mut live_tokens: Array1<i64> = tokens.to_owned();
        for &r in &ignored {
            let Some(j) = p.allowed_row_f64(r).iter().position(|x| x.is_finite()) else {
                return Ok(correct);
            };
            live_tokens[r] = j as i64;
        }
        let weights = Array1::from_shape_fn(n, |r| {
            if p.has_target(r) {
                0.0
            } else {
                p.loss_weights.map_or(1.0, |w| w[r])
            }
        });
        let g_eps = g.mapv(|g| g * eps);
        // A mean keeps the true problem's divisor `W`.
        let divisor = match cotangents.loss_divisor {
            Some(d) => Some(d.clone()),
            None => p
                .loss_divisor_terms()
                .and_then(|t| MeanDivisor::new(t).ok()),
        };
        if divisor.as_ref().is_some_and(MeanDivisor::is_zero) {
            // Every row ignored: the mean's gradient is 0 either way.
            return Ok(correct);
        }
        let mut options = p.options;
        options.topk_kl = None;
        options.loss = Some(LossOptions {
            label_smoothing: 1.0,
            ..lo
        });
        let extra = {
            let q = Problem {
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
                loss_weights: Some(weights.view()),
                policy: Default::default(),
                options,
            };
            let cot = Cotangents {
                loss_divisor: divisor.as_ref(),
                ..Cotangents::default().with_column(Output::Loss, g_eps.view())
            };
            match FUSED.backward(&q, &cot, Dtype::F64) {
                Ok(x) => x,
                Err(_) => return Ok(correct),
            }
        };
        Ok((&correct + &extra).mapv(|v| out.round_f64(v)))
    }
}
