//! (T29) The matmul stage of a fused linear + loss kernel (issue 45): the
//! kernel's logits `x^_j = fl(h . W_j + b_j)` (then, optionally, rounded
//! to the matmul's dtype) differ from the exact `x_j` by at most one
//! bound `delta_x` for the whole row, an input perturbation that enters
//! the row's constants as (T18)'s softcap error does (`cap_z`).

use super::super::model::{LinearContext, Model, RowContext};
use super::super::upward::{Hi, Lo};
use super::acc_gamma;

/// (T29) `delta_x`: a bound on `|x^_j - x^o_j|` for every `j` of the real
/// vocabulary, where `x^o` are the oracle's logits (within
/// `oracle_err` of the exact ones):
///
/// `M + r(X + B + M) + r(X + M + r(X + B + M)) + oracle_err`,
/// `M = gamma_{H+1}(2u) A + (H + 2) eta`, `r(y) = ulp_l(y) / 2`,
///
/// with `A = max_j (sum_k |h_k W_jk| + |b_j|)`, `X = max_j |x_j|`, `u` the
/// model's accumulation unit roundoff taken twice (tensor cores may
/// truncate: one ulp per addition, Fasi et al. 2021), the bias one more
/// term of the sum, `eta` half the accumulation dtype's smallest
/// subnormal (a product that underflows), `B = max_j |b_j|`, and `r` half
/// an ulp of the dtype the kernel rounds its logits to at that magnitude
/// (the subnormal spacing included; 0 when it keeps them in the
/// accumulation dtype): once after the matmul and once after adding the
/// bias in that dtype (Liger's `logits + bias` in bf16), which also
/// bounds a bias added before the one rounding.
/// Under the statistical threshold (`stat_c`), `gamma` is (S1)'s
/// `min(gamma_n, c sqrt(n) u)`. Infinite when no bound exists (`n u >= 1`).
pub(crate) fn linear_x(model: &Model, lin: &LinearContext, stat_c: Option<f64>) -> Hi {
    let s = &lin.stats;
    let u2 = 2.0 * model.accumulation.unit_roundoff();
    let g = match acc_gamma(s.hidden_size + 1, u2, stat_c) {
        Ok(g) => g,
        Err(_) => return Hi(f64::INFINITY),
    };
    let eta = Hi((s.hidden_size + 2) as f64) * Hi(0.5 * model.accumulation.ulp(0.0));
    let mm = g * Hi(s.abs_sum_max) + eta;
    let round = match lin.logits_dtype {
        Some(d) if d.precision() < model.accumulation.precision() => {
            let r = |y: Hi| Hi(0.5 * d.ulp(y.0));
            let (x, b) = (Hi(s.logit_abs_max), Hi(s.bias_abs_max));
            let first = r(x + b + mm);
            if s.bias_abs_max > 0.0 {
                first + r(x + mm + first)
            } else {
                first
            }
        }
        _ => Hi::ZERO,
    };
    mm + round + Hi(s.oracle_err)
}

/// (T29) `delta_x / T`: the perturbation of every `z_j` (the softcap, when
/// the kernel applies one, is 1-Lipschitz and keeps it; the temperature
/// divides it).
pub(crate) fn linear_z(model: &Model, ctx: &RowContext, stat_c: Option<f64>) -> Hi {
    match &ctx.linear {
        Some(lin) => linear_x(model, lin, stat_c) / Lo(ctx.temperature),
        None => Hi::ZERO,
    }
}

/// `max_y |d/dy (1 - tanh^2 y)| = max 2 tanh(y) sech^2(y) = 4 / (3 sqrt 3)
/// = 0.76980...` (at `tanh y = 1 / sqrt 3`), rounded up.
const DSECH2_MAX: f64 = 0.7699;

/// (T29) The error the matmul adds to a softcap's gradient factor `f =
/// 1 - tanh^2(x / c)`: the kernel evaluates it at its own `x^`, within
/// `delta_x` of `x`, so `|f(x^) - f(x)| <= DSECH2_MAX delta_x / c`
/// (`T18`'s `df` gains it). 0 without a softcap or a matmul.
pub(crate) fn linear_df(model: &Model, ctx: &RowContext, stat_c: Option<f64>) -> Hi {
    match (&ctx.linear, &ctx.softcap) {
        (Some(lin), Some(cap)) => Hi(DSECH2_MAX) * linear_x(model, lin, stat_c) / Lo(cap.c),
        _ => Hi::ZERO,
    }
}
