//! Fused linear + cross-entropy problems (issue 45) for the gate and the
//! fuzzer: the inputs of one problem ([`LinearInputs`]), drawn from a
//! recipe ([`LinearRecipe`]), and a kernel's outputs on it as a verify dump
//! ([`linear_dump`]), judged in memory by verify ([`verify_linear`]):
//! TOLERANCE.md (T29), (T30).

use half::bf16;
use ndarray::{Array1, Array2};

use logprobe_kernels::linear::{LinearForward, LinearGrads, LinearLogits, LinearProblem};
use logprobe_reference::spec::Dtype;
use logprobe_reference::splitmix::SplitMix64;
use logprobe_verify::dump::{serialize_dump, Dump, DumpError, DumpTensor};
use logprobe_verify::tolerance::Order;
use logprobe_verify::verify::{verify_dump, FileReport, VerifyConfig};

/// The `ignore_index` of every drawn problem.
pub const IGNORE_INDEX: i64 = -100;

/// A drawn fused linear problem: shapes, dtype, scales, options.
#[derive(Clone, Debug, PartialEq)]
pub struct LinearRecipe {
    /// Seed of the values.
    pub seed: u64,
    /// Rows `N`.
    pub n: usize,
    /// Hidden size `H`.
    pub h: usize,
    /// Vocabulary `V` (rows of `lm_head_weight`).
    pub v: usize,
    /// bf16 inputs (else f32).
    pub bf16: bool,
    /// With `lm_head_bias`.
    pub bias: bool,
    /// Where the kernel keeps its logits (`lm_head_logits_dtype`).
    pub logits: LinearLogits,
    /// Temperature `T`.
    pub temperature: f64,
    /// Softcap of the raw logits.
    pub softcap: Option<f64>,
    /// `hidden` is uniform in `±hidden_scale`.
    pub hidden_scale: f64,
    /// `lm_head_weight` is uniform in `±weight_scale / sqrt(H)`, so a
    /// logit's spread is about `hidden_scale * weight_scale / 3`.
    pub weight_scale: f64,
    /// `lm_head_bias` is `bias_offset` plus a value uniform in `±bias_scale`.
    pub bias_scale: f64,
    /// A common offset of the bias (every logit shifted by it).
    pub bias_offset: f64,
    /// Each row's target is `IGNORE_INDEX` with this probability.
    pub ignore: f64,
}

/// One problem's values (f32 holding values of its dtype exactly) and its
/// log-prob cotangents.
#[derive(Clone, Debug)]
pub struct LinearInputs {
    /// The inputs' dtype (bf16 or f32).
    pub dtype: Dtype,
    /// `hidden [N, H]`.
    pub hidden: Array2<f32>,
    /// `lm_head_weight [V, H]`.
    pub weight: Array2<f32>,
    /// `lm_head_bias [V]`.
    pub bias: Option<Array1<f32>>,
    /// Targets `[N]` (`IGNORE_INDEX` on ignored rows).
    pub tokens: Array1<i64>,
    /// `grad_log_probs [N]`.
    pub cot: Vec<f64>,
    /// Temperature.
    pub temperature: f64,
    /// Softcap.
    pub softcap: Option<f64>,
    /// Where the kernel keeps its logits.
    pub logits: LinearLogits,
}

impl LinearRecipe {
    /// The recipe's values: uniform draws from its seed, rounded to its dtype.
    pub fn inputs(&self) -> LinearInputs {
        let mut rng = SplitMix64::for_stream(self.seed, 0x11_7EA2);
        let dtype = if self.bf16 { Dtype::Bf16 } else { Dtype::F32 };
        let mut u = |scale: f64| {
            let x = (scale * (2.0 * rng.uniform() - 1.0)) as f32;
            if self.bf16 {
                bf16::from_f32(x).to_f32()
            } else {
                x
            }
        };
        let w = self.weight_scale / (self.h.max(1) as f64).sqrt();
        let hidden = Array2::from_shape_fn((self.n, self.h), |_| u(self.hidden_scale));
        let weight = Array2::from_shape_fn((self.v, self.h), |_| u(w));
        let bias = Array1::from_shape_fn(self.v, |_| u(self.bias_scale) + self.bias_offset as f32);
        let bias = bias.mapv(|x| {
            if self.bf16 {
                bf16::from_f32(x).to_f32()
            } else {
                x
            }
        });
        let mut rng = SplitMix64::for_stream(self.seed, 0x11_7EA3);
        let tokens = Array1::from_shape_fn(self.n, |_| {
            if rng.uniform() < self.ignore {
                IGNORE_INDEX
            } else {
                rng.below(self.v.max(1)) as i64
            }
        });
        let cot = (0..self.n).map(|_| 2.0 * rng.uniform() - 1.0).collect();
        LinearInputs {
            dtype,
            hidden,
            weight,
            bias: self.bias.then_some(bias),
            tokens,
            cot,
            temperature: self.temperature,
            softcap: self.softcap,
            logits: self.logits,
        }
    }
}

impl LinearInputs {
    /// The kernel's view.
    pub fn problem(&self) -> LinearProblem<'_> {
        LinearProblem {
            hidden: self.hidden.view(),
            weight: self.weight.view(),
            bias: self.bias.as_ref().map(|b| b.view()),
            dtype: self.dtype,
            tokens: self.tokens.view(),
            temperature: self.temperature,
            softcap: self.softcap,
            ignore_index: IGNORE_INDEX,
        }
    }
}

fn f64s(a: &[f32]) -> Vec<f64> {
    a.iter().map(|&v| f64::from(v)).collect()
}

fn floats2(dtype: Dtype, a: &Array2<f32>) -> DumpTensor {
    let v: Vec<f64> = a.iter().map(|&x| f64::from(x)).collect();
    DumpTensor::floats(dtype, &[a.nrows(), a.ncols()], &v)
}

/// The bytes of a verify dump (format version 2) of `x` with the kernel's
/// forward outputs (`log_probs`, `entropy`, `lse`, f32) and, when given,
/// its gradients for `grad_log_probs` (`grad_hidden`,
/// `grad_lm_head_weight`, `grad_lm_head_bias`, in the inputs' dtype), plus
/// `extra` metadata pairs (the fuzzer's provenance keys).
///
/// # Errors
/// [`DumpError`] when a tensor cannot be serialised (a bug).
pub fn linear_dump(
    x: &LinearInputs,
    fwd: &LinearForward,
    grads: Option<&LinearGrads>,
    extra: &[(&str, &str)],
) -> Result<Vec<u8>, DumpError> {
    let (n, dt) = (x.tokens.len(), x.dtype);
    let mut t: Vec<(&str, DumpTensor)> = vec![
        ("hidden", floats2(dt, &x.hidden)),
        ("lm_head_weight", floats2(dt, &x.weight)),
        (
            "tokens",
            DumpTensor::i64s(&[n], x.tokens.as_slice().unwrap_or(&[])),
        ),
        (
            "log_probs",
            DumpTensor::floats(Dtype::F32, &[n], &f64s(&fwd.log_probs)),
        ),
        (
            "entropy",
            DumpTensor::floats(Dtype::F32, &[n], &f64s(&fwd.entropy)),
        ),
        ("lse", DumpTensor::floats(Dtype::F32, &[n], &f64s(&fwd.lse))),
    ];
    if let Some(b) = &x.bias {
        t.push((
            "lm_head_bias",
            DumpTensor::floats(dt, &[b.len()], &f64s(&b.to_vec())),
        ));
    }
    if let Some(g) = grads {
        t.push((
            "grad_log_probs",
            DumpTensor::floats(Dtype::F64, &[n], &x.cot),
        ));
        t.push(("grad_hidden", floats2(dt, &g.grad_hidden)));
        t.push(("grad_lm_head_weight", floats2(dt, &g.grad_weight)));
        if x.bias.is_some() {
            t.push((
                "grad_lm_head_bias",
                DumpTensor::floats(dt, &[g.grad_bias.len()], &f64s(&g.grad_bias)),
            ));
        }
    }
    let temperature = x.temperature.to_string();
    let cap = x.softcap.map(|v| v.to_string());
    let ignore = IGNORE_INDEX.to_string();
    let mut meta = vec![
        ("format_version", "2"),
        ("temperature", temperature.as_str()),
        ("ignore_index", ignore.as_str()),
    ];
    if let Some(cap) = &cap {
        meta.push(("softcap", cap.as_str()));
    }
    if x.logits == LinearLogits::Accumulation {
        meta.push(("lm_head_logits_dtype", "accumulation"));
    }
    meta.extend_from_slice(extra);
    serialize_dump(&t, &meta)
}

/// Verify's report on a dump's bytes under `model` (the dump's own
/// declarations otherwise).
///
/// # Errors
/// [`DumpError`]: the dump is not valid input.
pub fn verify_bytes(bytes: &[u8], name: &str, model: Order) -> Result<FileReport, DumpError> {
    let dump = Dump::parse(bytes)?;
    let config = VerifyConfig {
        model,
        ..VerifyConfig::default()
    };
    verify_dump(&dump, std::path::Path::new(name), &config)
}

/// Verify's report on a kernel's outputs on `x` (see [`linear_dump`]),
/// under `model` (our kernels: `sequential`).
///
/// # Errors
/// [`DumpError`]: the outputs do not make a valid dump (a NaN, say).
pub fn verify_linear(
    x: &LinearInputs,
    fwd: &LinearForward,
    grads: Option<&LinearGrads>,
    model: Order,
) -> Result<FileReport, DumpError> {
    verify_bytes(&linear_dump(x, fwd, grads, &[])?, "fused_linear", model)
}
