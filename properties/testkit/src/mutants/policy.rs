//! Bugs of the policy terms (issue 18): `kl_k3` computed naively as
//! `exp(-d) + d - 1` (cancels near `d = 0`), the importance ratio taken
//! the wrong way round (`exp(old - lp)`), the clamps left out, and `kl_k3`'s
//! gradient with the wrong sign of `d` ([`K3GradWrongSign`], a backward
//! bug, documented there). The first three change only
//! [`PlantedBug::corrupt_forward`]: it recomputes its terms
//! from the wrapped kernel's own log-probs in the accumulation dtype (a
//! second forward call in that dtype, whose log-probs are the unrounded
//! ones: f32 for f32 / bf16 / f16 logits, f64 for f64), as the correct
//! kernel's `logprobe_kernels::policy` does, and rounds them to the output
//! dtype; backward and memory are the wrapped kernel's.

use ndarray::{Array1, Array2};

use logprobe_kernels::kernel::{ForwardOutput, Kernel, KernelError};
use logprobe_reference::spec::{
    Cotangents, Dtype, Output, PolicyClamps, PolicyTerm, Problem, Shape,
};

use super::{PlantedBug, FUSED};

/// Which bug of the policy terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bug {
    K3Naive,
    RatioInverted,
    ClampMissing,
}

/// Recomputes the policy terms `bug` changes in `fo` (see the module docs).
fn corrupt(bug: Bug, p: &Problem<'_>, out: Dtype, fo: &mut ForwardOutput) {
    let acc = p.logits.dtype().accumulation();
    let Ok(acc_fo) = FUSED.forward(p, acc) else {
        return;
    };
    let Some(lps) = acc_fo.values.per_row(Output::LogProbs) else {
        return;
    };
    let clamps = p.options.policy_clamps.effective(acc).unwrap_or_default();
    let (n, _) = p.logits.dim();
    // One operation in the accumulation dtype.
    let r = |x: f64| acc.round_f64(x);
    for row in 0..n {
        if !p.has_target(row) {
            continue;
        }
        let lp = lps[row];
        for term in PolicyTerm::ALL {
            let Some(a) = fo.values.get_mut(term.output()) else {
                continue;
            };
            let Some(x) = term.input(&p.policy, row) else {
                continue;
            };
            let x = r(x);
            let v = match (bug, term) {
                (Bug::K3Naive, PolicyTerm::K3) => {
                    let d = clamp(r(lp - x), clamps.kl_input);
                    let k = r(r(r(exp(acc, -d)) + d) - 1.0);
                    clamps.kl_output.map_or(k, |c| k.min(c))
                }
                (Bug::RatioInverted, PolicyTerm::Ratio) => {
                    r(exp(acc, clamp(r(x - lp), clamps.ratio_log)))
                }
                (Bug::ClampMissing, PolicyTerm::K3) if clamps != PolicyClamps::default() => {
                    let d = r(lp - x);
                    r(r(expm1(acc, -d)) + d)
                }
                (Bug::ClampMissing, PolicyTerm::Ratio) if clamps.ratio_log.is_some() => {
                    r(exp(acc, r(lp - x)))
                }
                _ => continue,
            };
            a[[row, 0]] = out.round_f64(v);
        }
    }
}

fn clamp(x: f64, c: Option<f64>) -> f64 {
    match c {
        Some(c) => x.clamp(-c, c),
        None => x,
    }
}

/// `e^x` in the accumulation dtype (the platform's libm, within 1 ulp).
fn exp(acc: Dtype, x: f64) -> f64 {
    match acc {
        Dtype::F64 => x.exp(),
        _ => f64::from((x as f32).exp()),
    }
}

/// `e^x - 1` in the accumulation dtype.
fn expm1(acc: Dtype, x: f64) -> f64 {
    match acc {
        Dtype::F64 => x.exp_m1(),
        _ => f64::from((x as f32).exp_m1()),
    }
}

macro_rules! policy_bug {
    ($(#[$doc:meta])* $ty:ident, $name:literal, $bug:expr) => {
        unit_bug!($(#[$doc])* $ty, $name);

        impl PlantedBug for $ty {
            fn inner(&self) -> &dyn Kernel {
                &FUSED
            }

            fn corrupt_forward(
                &self,
                problem: &Problem<'_>,
                _shape: &Shape,
                out: Dtype,
                fo: &mut ForwardOutput,
            ) {
                corrupt($bug, problem, out, fo);
            }
        }
    };
}

policy_bug!(
    /// `kl_k3 = fl(fl(fl(exp(-d)) + d) - 1)`: the textbook form, which
    /// cancels near `d = 0` (every digit lost at `|d| ~ 1e-4` in f32);
    /// clamps as declared.
    K3Naive,
    "k3-naive",
    Bug::K3Naive
);

policy_bug!(
    /// `ratio = exp(clamp(old - lp))`: the importance ratio inverted (the
    /// behaviour policy over the current one). Correct only where `lp =
    /// old`.
    RatioInverted,
    "ratio-inverted",
    Bug::RatioInverted
);

policy_bug!(
    /// The clamps left out: `kl_k3 = expm1(-d) + d` unclamped and `ratio =
    /// exp(lp - old)` unclamped, though the problem declares
    /// `kl_input_clamp` / `kl_output_clamp` / `ratio_log_clamp`. Correct
    /// wherever no clamp binds.
    ClampMissing,
    "clamp-missing",
    Bug::ClampMissing
);

/// `kl_k3`'s derivative taken as `1 - e^{d}` instead of `1 - e^{-d}`
/// (the sign of `d = lp - ref` confused with verl's `kl = ref - lp`,
/// which `low_var_kl` exponentiates): the VJP's log-prob cotangent gets
/// `c (1 - e^{d_c})` (0 outside the clamps, as declared). The wrapped
/// kernel's backward with that cotangent added to `grad_log_probs` (both
/// rounded to the accumulation dtype, one rounded sum, as a kernel folds
/// its sources) and `grad_kl_k3` dropped, from the kernel's own log-prob
/// in the accumulation dtype (a forward call in that dtype). Trigger: a
/// nonzero `grad_kl_k3` on a row with `d` inside the clamps and not
/// tiny (the two slopes agree to first order only in `|d|`).
pub struct K3GradWrongSign;

impl K3GradWrongSign {
    /// Catalog name.
    pub const NAME: &'static str = "k3-grad-wrong-sign";

    /// The bug around [`logprobe_kernels::CpuKernel::fused`]
    /// (`chunk_size` ignored).
    pub fn new(_chunk_size: usize) -> K3GradWrongSign {
        K3GradWrongSign
    }
}

impl PlantedBug for K3GradWrongSign {
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
        let Some(c3) = cotangents.column(Output::KlK3) else {
            return Ok(correct);
        };
        let acc = problem.logits.dtype().accumulation();
        // Only the log-probs are read: the other outputs left out.
        let mut lp_problem = *problem;
        lp_problem.options.entropy = None;
        lp_problem.options.topk_kl = None;
        lp_problem.topk_ids = None;
        lp_problem.teacher_topk_log_probs = None;
        let Ok(fo) = FUSED.forward(&lp_problem, acc) else {
            return Ok(correct);
        };
        let Some(lps) = fo.values.per_row(Output::LogProbs) else {
            return Ok(correct);
        };
        let clamps = problem
            .options
            .policy_clamps
            .effective(acc)
            .unwrap_or_default();
        let r = |x: f64| acc.round_f64(x);
        let n = problem.logits.dim().0;
        let mut g: Array1<f64> = cotangents
            .column(Output::LogProbs)
            .map_or_else(|| Array1::zeros(n), |g| g.mapv(r));
        for row in 0..n {
            let Some(x) = PolicyTerm::K3.input(&problem.policy, row) else {
                continue;
            };
            if !problem.has_target(row) || c3[row] == 0.0 {
                continue;
            }
            let d = r(lps[row] - r(x));
            let dc = clamp(d, clamps.kl_input);
            let inside = clamps.kl_input.is_none_or(|c| -c <= d && d <= c);
            let k = r(r(expm1(acc, -dc)) + dc);
            let below = clamps.kl_output.is_none_or(|c| k <= c);
            // The bug: -expm1(d_c) = 1 - e^{d_c} for -expm1(-d_c).
            let slope = if inside && below {
                -r(expm1(acc, dc))
            } else {
                0.0
            };
            g[row] = r(g[row] + r(r(c3[row]) * slope));
        }
        FUSED.backward(
            problem,
            &cotangents
                .with_column(Output::LogProbs, g.view())
                .with_column(Output::KlK3, None),
            out,
        )
    }
}
