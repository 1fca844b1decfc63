//! A softcap bug of the unsloth-zoo PR #593 kind (a softcap formula got
//! wrong in a fused cross-entropy kernel): the backward forgets the
//! softcap's chain rule `dx'/dx = 1 - tanh^2(x / c)` and returns the
//! gradient with respect to the softcapped logits `x'`. The forward is
//! [`CpuKernel::fused`](logprobe_kernels::CpuKernel::fused)'s; the backward
//! runs it on the materialised `x'` (bit for bit the correct kernel's `z`)
//! without the softcap.

use ndarray::Array2;

use logprobe_kernels::kernel::{Kernel, KernelError};
use logprobe_reference::spec::{
    Cotangents, Dtype, Element, Logits, Problem, SoftcapDtype, TemperatureDtype,
};

use super::{PlantedBug, FUSED};

/// Backward without the softcap's `1 - tanh^2` factor.
pub struct SoftcapGradMissingTanh;

impl SoftcapGradMissingTanh {
    /// Catalog name.
    pub const NAME: &'static str = "softcap-grad-missing-tanh";

    /// The bug around [`CpuKernel::fused`](logprobe_kernels::CpuKernel::fused) (`chunk_size` ignored).
    pub fn new(_chunk_size: usize) -> SoftcapGradMissingTanh {
        SoftcapGradMissingTanh
    }
}

/// `x'` of `logits` as the correct kernel forms it: materialised in the
/// logits' dtype (`SoftcapDtype::Input`) or computed in the accumulation
/// dtype (`Dtype::softcapped_input` of the accumulation dtype is the
/// kernel's `fl(c tanh(fl(x / c)))`, CORE-MATH's tanh), `[N, V_total]`.
fn materialised<T: Element>(lv: &ndarray::ArrayView2<'_, T>, dtype: Dtype, c: f64) -> Array2<f64> {
    lv.mapv(|x| dtype.softcapped_input(x.to_f64(), c))
}

impl PlantedBug for SoftcapGradMissingTanh {
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
        let dtype = problem.logits.dtype();
        let Some(c) = problem.options.effective_softcap(dtype.accumulation())? else {
            return Ok(correct);
        };
        let (into, in_input) = match problem.options.softcap_dtype {
            SoftcapDtype::Input => (dtype, true),
            SoftcapDtype::Accumulation => (dtype.accumulation(), false),
        };
        let xs: Array2<f64> =
            logprobe_reference::with_logits!(problem.logits, lv => materialised(&lv, into, c));
        let mut options = problem.options;
        options.softcap = None;
        // The materialised values, in a dtype that holds them exactly: the
        // logits' own (input: so that a materialised `z = x' / T` rounds
        // as the correct kernel's), or the accumulation dtype.
        let (f32s, f64s, b16, h16);
        let logits = match (in_input, dtype) {
            (_, Dtype::F64) => {
                f64s = xs;
                Logits::F64(f64s.view())
            }
            (false, _) | (true, Dtype::F32) => {
                f32s = xs.mapv(|v| v as f32);
                Logits::F32(f32s.view())
            }
            (true, Dtype::Bf16) => {
                b16 = xs.mapv(half::bf16::from_f64);
                Logits::Bf16(b16.view())
            }
            (true, Dtype::F16) => {
                h16 = xs.mapv(half::f16::from_f64);
                Logits::F16(h16.view())
            }
        };
        debug_assert!(
            in_input || problem.options.temperature_dtype == TemperatureDtype::Accumulation
        );
        let q = Problem {
            logits,
            tokens: problem.tokens,
            sampling_mask: problem.sampling_mask,
            topk_ids: problem.topk_ids,
            teacher_topk_log_probs: problem.teacher_topk_log_probs,
            teacher_probs: problem.teacher_probs,
            loss_weights: problem.loss_weights,
            policy: problem.policy.shorten(),
            options,
        };
        FUSED.backward(&q, cotangents, out)
    }
}
