//! The candle-composed baseline: log-softmax as candle users write it, in
//! the input dtype, then a gather.

use candle_core::{Device, Tensor, WithDType};
use ndarray::{s, Array1, Array2, ArrayView1, ArrayView2, Axis};

use logprobe_reference::spec::meta_key;

use logprobe_reference::spec::{
    Cotangents, Dtype, Element, Logits, Output, OutputSet, Problem, Shape,
};

use crate::kernel::{
    Algorithm, Capabilities, Feature, FeatureSet, ForwardOutput, Kernel, KernelError, Shift,
    Summation,
};

/// `log_softmax(logits)` over the last axis, composed from candle ops in the
/// input dtype, exactly as `candle_nn::ops::log_softmax` does it:
/// `d = x - max_keepdim(x)`, `d - ln(sum_keepdim(exp(d)))`.
///
/// Shapes: `logits [N, V]` -> `[N, V]`, same dtype and device (nats).
/// Every intermediate (`d`, `exp(d)`, the sum, its log) is rounded to the
/// input dtype; candle's CPU sums accumulate in that dtype too (see
/// [`candle_summation`]).
///
/// # Errors
/// candle's errors: a rank other than 2, an integer dtype, an empty row.
pub fn candle_log_softmax(logits: &Tensor) -> candle_core::Result<Tensor> {
    let max = logits.max_keepdim(1)?;
    let shifted = logits.broadcast_sub(&max)?;
    let ln_s = shifted.exp()?.sum_keepdim(1)?.log()?;
    shifted.broadcast_sub(&ln_s)
}

/// `logsumexp(logits)` per row, composed from candle ops in the input dtype:
/// `max + ln(sum(exp(x - max)))`, as candle users write it.
///
/// Shapes: `logits [N, V]` -> `[N]`, same dtype and device (nats).
///
/// # Errors
/// candle's errors: a rank other than 2, an integer dtype, an empty row.
pub fn candle_logsumexp(logits: &Tensor) -> candle_core::Result<Tensor> {
    let max = logits.max_keepdim(1)?;
    let ln_s = logits.broadcast_sub(&max)?.exp()?.sum_keepdim(1)?.log()?;
    max.broadcast_add(&ln_s)?.squeeze(1)
}

/// The summation model of candle-core 0.11.1's CPU `sum_keepdim` over the
/// last axis of a contiguous tensor, for `n` terms in `dtype` on this
/// machine (`ReduceSum::fold_impl` -> `VecOps::vec_reduce_sum`):
///
/// - bf16, f16, f64: the trait's default, one accumulator of the input
///   dtype adding the terms in order (`*res += x`, each add rounded to the
///   input dtype): [`Summation::sequential`].
/// - f32 with AVX2 (x86, detected at run time as candle does) or on
///   aarch64 (NEON): `vec_sum` keeps 32 lanes (4 x `__m256` / 8 x
///   `float32x4_t`), lane `i mod 32` summing `floor(n / 32)` terms in
///   order, merges them pairwise in `log2 32 = 5` levels (`vec_reduce`:
///   AVX2 2 levels across the 4 registers, then `lo + hi` and two
///   `_mm_hadd_ps`; NEON 3 levels across 8 registers, then `vaddvq_f32`'s
///   2), then adds the `n mod 32` remaining terms one by one to the result.
///   Declared as `leaf = floor(n / 32) + n mod 32`, `merges = 5`: a lane
///   term sees at most `floor(n/32) + 5 + n mod 32` additions, a remainder
///   term fewer. The test `candle_sums_in_the_declared_order` replays this
///   order and matches candle's sums bit for bit.
/// - f32 otherwise (no AVX2, other targets): `scalar_vec_sum`, sequential.
pub fn candle_summation(dtype: Dtype, n: usize) -> Summation {
    if dtype == Dtype::F32 && candle_f32_sum_is_32_lanes() {
        const LANES: usize = 32;
        Summation {
            leaf: (n / LANES + n % LANES).max(1),
            merges: 5,
        }
    } else {
        Summation::sequential(n)
    }
}

/// Whether candle's f32 `vec_sum` takes its 32-lane SIMD path here (its
/// own test: `is_x86_feature_detected!("avx2")` on x86, NEON on aarch64).
fn candle_f32_sum_is_32_lanes() -> bool {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        std::is_x86_feature_detected!("avx2")
    }
    #[cfg(target_arch = "aarch64")]
    {
        true
    }
    #[cfg(not(any(target_arch = "x86", target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// The candle-composed baseline as a [`Kernel`]: [`candle_log_softmax`] on
/// the real vocabulary `[N, V]` (copied into a CPU `Tensor` of the input
/// dtype), then `gather` at the tokens (and at `topk_ids`); results rounded
/// from the input dtype to the requested dtype.
///
/// What it computes: log-probs and top-k log-probs, for any dtype,
/// including padded vocabularies (the real columns are what the copy takes,
/// as `narrow` would). What it lacks, refused with
/// [`KernelError::Unsupported`]: entropy (so `options.entropy` must be
/// `None`; the default options ask for it), sampling masks, temperatures
/// other than 1 (candle's `x / T` is `affine(1/T)`, not a division), and any
/// gradient (backward, in-place backward).
///
/// `ignore_index` rows hold 0 (their gather reads column 0, then is
/// discarded). Bad input gives the spec's typed errors (the problem is
/// validated before candle sees it).
///
/// Numerical algorithm ([`Kernel::algorithm`]): accumulation in the input
/// dtype (candle sums bf16 / f16 in bf16 / f16), summation order
/// [`candle_summation`], exp and ln within 1 ulp of the input dtype (f32 and
/// f64: the platform libm's `expf` / `exp`, `logf` / `log`; bf16 / f16: those
/// of f32, rounded once to the input dtype), max subtracted before any scaling
/// (two passes, so no rescaling exps).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CandleComposed;

impl CandleComposed {
    /// Name in reports.
    pub const NAME: &'static str = "candle-composed";

    fn unsupported(what: &'static str) -> KernelError {
        KernelError::Unsupported {
            kernel: Self::NAME.to_string(),
            what,
        }
    }

    fn device(e: candle_core::Error) -> KernelError {
        KernelError::Device {
            kernel: Self::NAME.to_string(),
            message: e.to_string(),
        }
    }
}

impl Kernel for CandleComposed {
    fn name(&self) -> String {
        Self::NAME.to_string()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            outputs: OutputSet::of(&[Output::LogProbs, Output::TopkLogProbs]),
            features: FeatureSet::of(&[Feature::PaddedVocab, Feature::F64Input]),
        }
    }

    fn algorithm(&self, shape: &Shape) -> Algorithm {
        Algorithm {
            accumulation: shape.dtype,
            exp_ulps: 1.0,
            log_ulps: 1.0,
            summation: candle_summation(shape.dtype, shape.vocab_size),
            rescaling_exps: 0,
            shift: Shift::SubtractThenScale,
            // No softcap (refused with `Unsupported`).
            tanh_ulps: f64::INFINITY,
        }
    }

    /// Three `[N, V]` tensors of the input dtype live at once (the copy of
    /// the logits, `x - max`, then `exp(x - max)` or the log-softmax), plus
    /// `[N, 1]` and `[N, K]` index and gather buffers: `3 N V b + N (K + 1)
    /// (16 + 2 b) + 4 N b + 4096` bytes with `b` the input element size.
    fn workspace_bytes(&self, shape: &Shape) -> usize {
        let b = shape.dtype.size_bytes();
        let (n, v, k) = (shape.n, shape.vocab_size, shape.k);
        3 * n * v * b + n * (k + 1) * (16 + 2 * b) + 4 * n * b + 4096
    }

    fn forward(&self, problem: &Problem<'_>, out: Dtype) -> Result<ForwardOutput, KernelError> {
        let shape = problem.validate_shapes()?;
        if problem.options.entropy.is_some() {
            return Err(Self::unsupported("entropy"));
        }
        if problem.sampling_mask.is_some() {
            return Err(Self::unsupported("sampling_mask"));
        }
        if problem.options.lse || problem.options.z_loss_coef.is_some() {
            return Err(Self::unsupported("lse / z_loss"));
        }
        if problem.options.topk_kl.is_some() {
            return Err(Self::unsupported("top-k KL"));
        }
        if problem.options.loss.is_some() {
            return Err(Self::unsupported("cross-entropy loss"));
        }
        if !problem.policy.is_empty() {
            return Err(Self::unsupported(
                "policy terms (ref_log_probs / old_log_probs)",
            ));
        }
        if problem.options.softcap.is_some() {
            return Err(Self::unsupported(meta_key::SOFTCAP));
        }
        if shape.temperature != 1.0 {
            return Err(Self::unsupported("temperature other than 1"));
        }
        self.capabilities().check_requested(problem, Self::NAME)?;
        for row in 0..shape.n {
            problem.validate_row(&shape, row)?;
        }
        let (log_probs, topk_log_probs) = match problem.logits {
            Logits::F64(x) => composed_forward(x, problem, &shape, out)?,
            Logits::F32(x) => composed_forward(x, problem, &shape, out)?,
            Logits::Bf16(x) => composed_forward(x, problem, &shape, out)?,
            Logits::F16(x) => composed_forward(x, problem, &shape, out)?,
        };
        Ok(ForwardOutput::from_values(
            out,
            [
                (Output::LogProbs, log_probs.map(|a| a.insert_axis(Axis(1)))),
                (Output::TopkLogProbs, topk_log_probs),
            ],
        ))
    }

    fn backward(
        &self,
        _problem: &Problem<'_>,
        _cotangents: &Cotangents<'_>,
        _out: Dtype,
    ) -> Result<Array2<f64>, KernelError> {
        Err(Self::unsupported("backward"))
    }
}

type Outputs = (Option<Array1<f64>>, Option<Array2<f64>>);

/// The candle computation on validated input of element type `T`.
fn composed_forward<T: Element + WithDType>(
    x: ArrayView2<'_, T>,
    problem: &Problem<'_>,
    shape: &Shape,
    out: Dtype,
) -> Result<Outputs, KernelError> {
    let (n, v) = (shape.n, shape.vocab_size);
    let want_lp = problem.tokens.is_some();
    let want_topk = problem.topk_ids.is_some();
    if n == 0 || !(want_lp || want_topk) {
        // Nothing V-sized is built for empty problems.
        let lp = want_lp.then(|| Array1::zeros(n));
        let tk = want_topk.then(|| Array2::zeros((n, shape.k)));
        return Ok((lp, tk));
    }
    let dev = Device::Cpu;
    let data: Vec<T> = x.slice(s![.., ..v]).iter().copied().collect();
    let logits = Tensor::from_vec(data, (n, v), &dev).map_err(CandleComposed::device)?;
    let log_softmax = candle_log_softmax(&logits).map_err(CandleComposed::device)?;
    drop(logits);
    let round = |t: T| out.round_f64(Element::to_f64(t));

    let log_probs = match problem.tokens {
        Some(tokens) => {
            let picked = gather_rows::<T>(&log_softmax, target_columns(problem, tokens), n, 1)?;
            Some(Array1::from_iter((0..n).map(|row| {
                if problem.has_target(row) {
                    round(picked[row])
                } else {
                    0.0
                }
            })))
        }
        None => None,
    };
    let topk = match problem.topk_ids {
        Some(ids) if shape.k > 0 => {
            let picked = gather_rows::<T>(&log_softmax, ids.iter().copied().collect(), n, shape.k)?;
            Some(Array2::from_shape_fn((n, shape.k), |(r, c)| {
                round(picked[r * shape.k + c])
            }))
        }
        Some(_) => Some(Array2::zeros((n, 0))),
        None => None,
    };
    Ok((log_probs, topk))
}

/// Gather columns: tokens, with `ignore_index` rows sent to column 0.
fn target_columns(problem: &Problem<'_>, tokens: ArrayView1<'_, i64>) -> Vec<i64> {
    (0..tokens.len())
        .map(|row| {
            if problem.has_target(row) {
                tokens[row]
            } else {
                0
            }
        })
        .collect()
}

/// `log_softmax.gather(ids [n, k], 1)` flattened row-major, in `T`.
fn gather_rows<T: WithDType>(
    log_softmax: &Tensor,
    ids: Vec<i64>,
    n: usize,
    k: usize,
) -> Result<Vec<T>, KernelError> {
    let ids = Tensor::from_vec(ids, (n, k), &Device::Cpu).map_err(CandleComposed::device)?;
    log_softmax
        .gather(&ids, 1)
        .and_then(|g| g.flatten_all())
        .and_then(|g| g.to_vec1::<T>())
        .map_err(CandleComposed::device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use logprobe_reference::spec::{Options, SpecError};
    use ndarray::array;

    fn lp_options() -> Options {
        Options {
            entropy: None,
            ..Options::default()
        }
    }

    #[test]
    fn uniform_row_gives_minus_ln_v() {
        let x = Array2::<f32>::from_elem((2, 8), 3.5);
        let t = array![0i64, 7];
        let p = Problem {
            tokens: Some(t.view()),
            options: lp_options(),
            ..Problem::new(Logits::F32(x.view()))
        };
        let f = CandleComposed.forward(&p, Dtype::F32).unwrap();
        let lp = f.values.per_row(Output::LogProbs).unwrap();
        assert_eq!(lp[0], Dtype::F32.round_f64(-(8f64).ln()));
        assert_eq!(lp[1], lp[0]);
    }

    #[test]
    fn lacking_pieces_are_refused_not_faked() {
        let x = array![[0.0f32, 1.0]];
        let t = array![1i64];
        let mut p = Problem {
            tokens: Some(t.view()),
            ..Problem::new(Logits::F32(x.view()))
        };
        assert!(matches!(
            CandleComposed.forward(&p, Dtype::F32),
            Err(KernelError::Unsupported {
                what: "entropy",
                ..
            })
        ));
        p.options.entropy = None;
        p.options.temperature = 2.0;
        assert!(matches!(
            CandleComposed.forward(&p, Dtype::F32),
            Err(KernelError::Unsupported { .. })
        ));
        p.options.temperature = 1.0;
        let m = array![[true, true]];
        p.sampling_mask = Some(m.view());
        assert!(matches!(
            CandleComposed.forward(&p, Dtype::F32),
            Err(KernelError::Unsupported {
                what: "sampling_mask",
                ..
            })
        ));
        p.sampling_mask = None;
        let g = array![1.0];
        let cot = Cotangents::default().with_column(Output::LogProbs, g.view());
        assert!(matches!(
            CandleComposed.backward(&p, &cot, Dtype::F32),
            Err(KernelError::Unsupported { .. })
        ));
    }

    #[test]
    fn bad_input_gives_typed_errors() {
        // The composed forward's error on one row of f32 logits and its target.
        let forward_error = |x: ndarray::Array2<f32>, token: i64| {
            let t = array![token];
            let p = Problem {
                tokens: Some(t.view()),
                options: lp_options(),
                ..Problem::new(Logits::F32(x.view()))
            };
            CandleComposed.forward(&p, Dtype::F32).err()
        };
        assert!(matches!(
            forward_error(array![[0.0f32, f32::NAN]], 0),
            Some(KernelError::Spec(SpecError::NonFiniteLogit {
                row: 0,
                col: 1,
                ..
            }))
        ));
        assert!(matches!(
            forward_error(array![[0.0f32, 1.0]], 2),
            Some(KernelError::Spec(SpecError::TokenOutOfRange {
                row: 0,
                token: 2,
                ..
            }))
        ));
    }

    #[test]
    fn ignore_index_padding_and_topk() {
        // Column 2 is padding (a huge logit that must not count).
        let x = array![[0.0f32, 0.0, 80.0], [1.0, 1.0, 80.0]];
        let t = array![-100i64, 1];
        let ids = array![[1i64, 0], [0, 1]];
        let mut o = lp_options();
        o.vocab_size = Some(2);
        let p = Problem {
            tokens: Some(t.view()),
            topk_ids: Some(ids.view()),
            options: o,
            ..Problem::new(Logits::F32(x.view()))
        };
        let f = CandleComposed.forward(&p, Dtype::F32).unwrap();
        let ln_half = Dtype::F32.round_f64(-(2f64).ln());
        assert_eq!(
            f.values.per_row(Output::LogProbs).unwrap(),
            array![0.0, ln_half]
        );
        assert_eq!(
            f.values[Output::TopkLogProbs],
            Array2::from_elem((2, 2), ln_half)
        );
    }

    #[test]
    fn empty_problem_builds_nothing() {
        let x = Array2::<f32>::zeros((0, 1 << 20));
        let t = Array1::<i64>::zeros(0);
        let p = Problem {
            tokens: Some(t.view()),
            options: lp_options(),
            ..Problem::new(Logits::F32(x.view()))
        };
        let f = CandleComposed.forward(&p, Dtype::Bf16).unwrap();
        assert_eq!(f.values[Output::LogProbs].dim(), (0, 1));
    }

    #[test]
    fn summation_model_counts_every_addition() {
        let s = candle_summation(Dtype::Bf16, 152_064);
        assert_eq!(s, Summation::sequential(152_064));
        let f = candle_summation(Dtype::F32, 100);
        // 32 lanes: 3 terms each, 5 merge levels, 4 trailing terms; or sequential.
        assert!(
            f == Summation {
                leaf: 3 + 4,
                merges: 5
            } || f == Summation::sequential(100)
        );
    }
}
