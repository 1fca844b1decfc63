//! Bugs in the forward values (and their gradients): NaN entropy at
//! `-inf`, half-precision accumulation, no max shift, the raw entropy
//! formula. Each recomputes the outputs its bug changes the way the shipped
//! bug computed them (f32 row helpers below), around [`CpuKernel::fused`](logprobe_kernels::CpuKernel::fused).

use ndarray::{s, Array2};

use logprobe_kernels::kernel::{ForwardOutput, Kernel};
use logprobe_reference::spec::{
    Cotangents, Dtype, EntropyLogits, Output, Problem, Shape, SoftcapDtype, TemperatureDtype,
};

use logprobe_verify::tolerance::{naive_entropy, naive_log_softmax};

use super::PlantedBug;

// ---------------------------------------------------------------------------
// Row helpers (the buggy recomputations run in f32, as the shipped bugs did).

/// The logits of row `row` divided by the temperature as the kernels take
/// it (`x / T` rounded to the accumulation dtype, or
/// `round_input(round_acc(x / T))` for `TemperatureDtype::Input`), `[V]`, `-inf` kept. Values are exact in
/// the accumulation dtype; the buggy recomputations below round every
/// operation to it (f64 arithmetic rounded once to f32 is f32 arithmetic).
pub(crate) fn row_z(p: &Problem<'_>, shape: &Shape, row: usize) -> Vec<f64> {
    let x = p.logits.row_f64(row);
    let t = shape.temperature;
    let acc = shape.dtype.accumulation();
    // The softcap first (the kernels' x': computed in the accumulation
    // dtype, or materialised in the logits').
    let cap = p.options.effective_softcap(acc).ok().flatten();
    x[..shape.vocab_size]
        .iter()
        .map(|&v| {
            let v = match (cap, p.options.softcap_dtype) {
                (None, _) => v,
                (Some(c), SoftcapDtype::Accumulation) => acc.softcapped_input(v, c),
                (Some(c), SoftcapDtype::Input) => shape.dtype.softcapped_input(v, c),
            };
            match p.options.temperature_dtype {
                TemperatureDtype::Accumulation => acc.round_f64(v / t),
                TemperatureDtype::Input => shape.dtype.scaled_input(v, t),
            }
        })
        .collect()
}

/// Which entries of row `row` the entropy is over.
pub(crate) fn entropy_set(p: &Problem<'_>, row: usize, j: usize) -> bool {
    match p.options.entropy {
        Some(EntropyLogits::Masked) => p.allowed(row, j),
        _ => true,
    }
}

/// Unshifted log-sum-exp over `set` in the accumulation dtype `acc`:
/// `ln(sum exp(z_j))`, and whether the sum overflowed or fell below the
/// normal range (the bug's trigger).
pub(crate) fn unshifted_lse(acc: Dtype, z: &[f64], set: impl Fn(usize) -> bool) -> (f64, bool) {
    let r = |x: f64| acc.round_f64(x);
    let mut s = 0.0f64;
    for (j, &v) in z.iter().enumerate() {
        if set(j) && v > f64::NEG_INFINITY {
            s = r(s + r(v.exp()));
        }
    }
    let min_normal = logprobe_reference::spec::pow2(acc.min_normal_exp());
    (r(s.ln()), !s.is_finite() || s < min_normal)
}

// ---------------------------------------------------------------------------

/// Entropy is NaN on rows with `-inf` entries (`p * log p` at `p = 0`), and
/// so is its gradient at those entries.
pub struct NanOnNegInf;

impl NanOnNegInf {
    /// Catalog name.
    pub const NAME: &'static str = "nan-on-neg-inf";

    /// The bug around [`CpuKernel::fused`](logprobe_kernels::CpuKernel::fused) (`chunk_size` ignored).
    pub fn new(_chunk_size: usize) -> NanOnNegInf {
        NanOnNegInf
    }
}

impl PlantedBug for NanOnNegInf {
    fn inner(&self) -> &dyn Kernel {
        &super::FUSED
    }

    fn corrupt_forward(&self, p: &Problem<'_>, shape: &Shape, _: Dtype, fo: &mut ForwardOutput) {
        if let Some(h) = fo.values.get_mut(Output::Entropy) {
            for row in 0..shape.n {
                let x = p.logits.row_f64(row);
                // w_j = -inf: a -inf logit, or a masked entry under masked entropy.
                if (0..shape.vocab_size)
                    .any(|j| x[j] == f64::NEG_INFINITY || !entropy_set(p, row, j))
                {
                    h[[row, 0]] = f64::NAN;
                }
            }
        }
    }

    fn corrupt_backward(
        &self,
        p: &Problem<'_>,
        shape: &Shape,
        cot: &Cotangents<'_>,
        grad: &mut Array2<f64>,
    ) {
        let Some(h) = cot.column(Output::Entropy) else {
            return;
        };
        for row in 0..shape.n {
            if h[row] == 0.0 {
                continue;
            }
            let x = p.logits.row_f64(row);
            for j in 0..shape.vocab_size {
                if entropy_set(p, row, j) && x[j] == f64::NEG_INFINITY {
                    grad[[row, j]] = f64::NAN;
                }
            }
        }
    }
}

/// Sums accumulated in bf16 / f16 for bf16 / f16 logits (forward only).
pub struct Bf16Accumulation;

impl Bf16Accumulation {
    /// Catalog name.
    pub const NAME: &'static str = "bf16-accumulation";

    /// The bug around [`CpuKernel::fused`](logprobe_kernels::CpuKernel::fused) (`chunk_size` ignored).
    pub fn new(_chunk_size: usize) -> Bf16Accumulation {
        Bf16Accumulation
    }
}

impl PlantedBug for Bf16Accumulation {
    fn inner(&self) -> &dyn Kernel {
        &super::FUSED
    }

    fn corrupt_forward(&self, p: &Problem<'_>, shape: &Shape, out: Dtype, fo: &mut ForwardOutput) {
        if !matches!(shape.dtype, Dtype::Bf16 | Dtype::F16) {
            return;
        }
        for row in 0..shape.n {
            let x = p.logits.row_f64(row);
            let v = shape.vocab_size;
            let allowed = p.allowed_row_f64(row);
            let t = match p.options.temperature_dtype {
                TemperatureDtype::Accumulation => shape.temperature,
                TemperatureDtype::Input => 1.0,
            };
            let lp_row = naive_log_softmax(&allowed, t, shape.dtype);
            if let (Some(lp), true) = (fo.values.get_mut(Output::LogProbs), p.has_target(row)) {
                lp[[row, 0]] = out.round_f64(lp_row[p.tokens.unwrap()[row] as usize]);
            }
            if let Some(tk) = fo.values.get_mut(Output::TopkLogProbs) {
                for (k, &id) in p.topk_ids.unwrap().row(row).iter().enumerate() {
                    tk[[row, k]] = out.round_f64(lp_row[id as usize]);
                }
            }
            if let Some(h) = fo.values.get_mut(Output::Entropy) {
                let w: Vec<f64> = (0..v)
                    .map(|j| {
                        if entropy_set(p, row, j) {
                            x[j]
                        } else {
                            f64::NEG_INFINITY
                        }
                    })
                    .collect();
                h[[row, 0]] = out.round_f64(naive_entropy(&w, t, shape.dtype));
            }
        }
    }
}

/// No max shift: `exp(z)` overflows or underflows; on those rows the
/// outputs are recomputed unshifted and the gradient is NaN.
pub struct MissingMaxShift;

impl MissingMaxShift {
    /// Catalog name.
    pub const NAME: &'static str = "missing-max-shift";

    /// The bug around [`CpuKernel::fused`](logprobe_kernels::CpuKernel::fused) (`chunk_size` ignored).
    pub fn new(_chunk_size: usize) -> MissingMaxShift {
        MissingMaxShift
    }
}

impl PlantedBug for MissingMaxShift {
    fn inner(&self) -> &dyn Kernel {
        &super::FUSED
    }

    fn corrupt_forward(&self, p: &Problem<'_>, shape: &Shape, out: Dtype, fo: &mut ForwardOutput) {
        let acc = shape.dtype.accumulation();
        let r = |x: f64| acc.round_f64(x);
        for row in 0..shape.n {
            let z = row_z(p, shape, row);
            let (lse, hit) = unshifted_lse(acc, &z, |j| p.allowed(row, j));
            if hit {
                if let (Some(lp), true) = (fo.values.get_mut(Output::LogProbs), p.has_target(row)) {
                    lp[[row, 0]] = out.round_f64(r(z[p.tokens.unwrap()[row] as usize] - lse));
                }
                if let Some(tk) = fo.values.get_mut(Output::TopkLogProbs) {
                    for (k, &id) in p.topk_ids.unwrap().row(row).iter().enumerate() {
                        let zi = if p.allowed(row, id as usize) {
                            z[id as usize]
                        } else {
                            f64::NEG_INFINITY
                        };
                        tk[[row, k]] = out.round_f64(r(zi - lse));
                    }
                }
            }
            let (lse_w, hit_w) = unshifted_lse(acc, &z, |j| entropy_set(p, row, j));
            if let (Some(h), true) = (fo.values.get_mut(Output::Entropy), hit_w) {
                let s = r(lse_w.exp());
                let mut spz = 0.0f64;
                for (j, &v) in z.iter().enumerate() {
                    if entropy_set(p, row, j) && v > f64::NEG_INFINITY {
                        spz = r(spz + r(r(v.exp()) * v));
                    }
                }
                h[[row, 0]] = out.round_f64(r(lse_w - r(spz / s)));
            }
        }
    }

    fn corrupt_backward(
        &self,
        p: &Problem<'_>,
        shape: &Shape,
        _: &Cotangents<'_>,
        grad: &mut Array2<f64>,
    ) {
        for row in 0..shape.n {
            let z = row_z(p, shape, row);
            if unshifted_lse(shape.dtype.accumulation(), &z, |j| p.allowed(row, j)).1 {
                grad.row_mut(row)
                    .slice_mut(s![..shape.vocab_size])
                    .fill(f64::NAN);
            }
        }
    }
}

/// Entropy as `lse - sum(p * z)` on raw logits, in f32 (forward only).
pub struct RawEntropyFormula;

impl RawEntropyFormula {
    /// Catalog name.
    pub const NAME: &'static str = "raw-entropy-formula";

    /// The bug around [`CpuKernel::fused`](logprobe_kernels::CpuKernel::fused) (`chunk_size` ignored).
    pub fn new(_chunk_size: usize) -> RawEntropyFormula {
        RawEntropyFormula
    }
}

impl PlantedBug for RawEntropyFormula {
    fn inner(&self) -> &dyn Kernel {
        &super::FUSED
    }

    fn corrupt_forward(&self, p: &Problem<'_>, shape: &Shape, out: Dtype, fo: &mut ForwardOutput) {
        let Some(h) = fo.values.get_mut(Output::Entropy) else {
            return;
        };
        let acc = shape.dtype.accumulation();
        let r = |x: f64| acc.round_f64(x);
        for row in 0..shape.n {
            let z = row_z(p, shape, row);
            let set = |j: usize| entropy_set(p, row, j) && z[j] > f64::NEG_INFINITY;
            let m = (0..z.len())
                .filter(|&j| set(j))
                .map(|j| z[j])
                .fold(f64::NEG_INFINITY, f64::max);
            let s = (0..z.len())
                .filter(|&j| set(j))
                .fold(0.0, |s, j| r(s + r(r(z[j] - m).exp())));
            let lse = r(m + r(s.ln()));
            let spz = (0..z.len())
                .filter(|&j| set(j))
                .fold(0.0, |a, j| r(a + r(r(r(r(z[j] - m).exp()) / s) * z[j])));
            h[[row, 0]] = out.round_f64(r(lse - spz));
        }
    }
}
