//! Per-row error bounds (nats) of log-probs, entropy, top-k log-probs and
//! per-element bounds of grad logits. The derivation, with sources, is
//! `properties/TOLERANCE.md`; each step below names its equation there
//! (`(T1)` ...).
//!
//! One module per output family (issue 47): `log_softmax` (log-prob,
//! entropy), `topk`, `cross_entropy` (lse, z-loss, loss, softcap),
//! `topk_kl`, `policy`, and `grad` for grad logits' element bound
//! (which reads every family's cotangent). This file keeps the row's
//! constants ([`RowBounds`], `Consts`, `SetBounds`), the shared
//! primitives and the dispatch over [`Output::family`]
//! ([`RowBounds::bound`]); `build` the constructors, `sums` the
//! normaliser's pass-1 sums (T4) every family reads.

use logprobe_reference::oracle::{Interval, RowStats};
use logprobe_reference::spec::{
    pow2, Dtype, Family, LossTerm, Output, RowStat, Shift, TeacherForm,
};

use super::loss_grad::{LossGradCotangents, LossTerms, TeacherExpErr};
use super::model::{EntropyForm, Model, RowContext};
use super::statistical::{Statistical, StatisticalBounds};
use super::upward::{ExpM1Base, Hi, Lo};
use super::walk::RowTargets;
use super::{ErrorBound, NoBound};

mod build;
mod cross_entropy;
mod grad;
pub(crate) mod lanes;
pub(crate) mod linear;
mod log_softmax;
mod moments;
#[cfg(test)]
pub(super) use moments::without_moments;
pub(super) mod policy;
mod screen;
mod sums;
mod topk;
mod topk_kl;
pub use build::DetachedBounds;
use cross_entropy::softcap_consts;
pub use cross_entropy::{loss_bounds, loss_statistical_bounds, LossRowBound, LossSums};
use grad::GradShared;
pub(super) use grad::GradSharedRow;
pub use grad::{GradCotangents, GradRow};
pub(super) use log_softmax::EntropyPart;
use log_softmax::{
    entropy_all, entropy_errors, entropy_finish, entropy_shared, logsoftmax_sums, LambdaAffine,
    LsSums,
};
pub use policy::grad::PolicyGradCotangents;
use policy::grad::PolicyGradTerms;
pub use screen::GradScreen;
use sums::{group_entries, set_bounds, set_finish, set_sums, times, twins, Entries, SetSums};
use topk_kl::KlGradTerms;
pub use topk_kl::{KlGradCotangents, KlTarget};

/// Margin (nats) on the flush-to-zero test: an `exp` whose result may be
/// below the smallest normal of the accumulation dtype is allowed to return
/// anything in `[0, e^y (1 + eps_exp) + eta_sub]`.
const FLUSH_MARGIN: f64 = 0.01;

/// An upper bound of `max_{y >= 0} y sech^2(y)` (attained at `2 y tanh y
/// = 1`, `y = 0.7717`, value `0.44778...`; unit test
/// `sech2_y_max_bounds_the_maximum`): the most a relative error `delta` of
/// `y = x / c` moves `tanh(y)`, in absolute terms, is `delta / (1 - delta)`
/// times it (T18).
pub(crate) const SECH2_Y_MAX: f64 = 0.4478;

/// Error bounds of one row under one [`Model`], built once from the
/// oracle's [`RowStats`] and queried per output.
///
/// All quantities are evaluated with upward rounding ([`super::upward`])
/// at the far end of every enclosure.
#[derive(Clone, Debug)]
pub struct RowBounds<'a> {
    stats: &'a RowStats,
    c: Consts,
    /// Log-prob set (masked `z'`: `d`, `S`, `ln S`).
    p: Result<SetBounds, NoBound>,
    /// Entropy set (`w`: `e`, `S_w`, `ln S_w`, `R`).
    w: Result<SetBounds, NoBound>,
    /// Entropy error before the final rounding (form per the model).
    entropy_pre: Result<Hi, NoBound>,
    /// Error of the entropy value a gradient may use, rounding included
    /// (any form, and the autograd form `sum p (lp + 1)`).
    entropy_grad: Result<Hi, NoBound>,
    /// `e^(d_j.hi - ln S.lo)` (upward) of every entry `j < V`, when the
    /// shared walk evaluated them (every entry finite, no sampling mask:
    /// they are its `e^lw`, the same bits): what the gradient screen reads
    /// for `p^+` instead of one `exp` an element.
    ep: Option<std::sync::Arc<Vec<Hi>>>,
}

/// Row-independent constants of a model (T1-T3).
#[derive(Clone, Debug)]
struct Consts {
    acc: Dtype,
    shift: Shift,
    u: Hi,
    /// `eps_exp = exp_ulps * 2u`: relative error of `exp` on normal results.
    eps_exp: Hi,
    /// `eta_sub = exp_ulps * 2^emin_sub`: absolute error of `exp` in the subnormal range.
    eta_sub: Hi,
    /// `eta = 2^emin_normal`: absolute loss of any flushed result.
    eta: Hi,
    log_ulps: Hi,
    /// `ln(2^emin_normal) + margin`: below this an `exp` result may flush.
    ln_min_normal: f64,
    /// Relative error of the division by `T`: 0 for powers of two, `gamma_2` otherwise.
    t_div: Hi,
    /// Roundings of the division by `T` (0 or 2).
    t_count: usize,
    temperature: f64,
    /// `Z = |max z|`.
    z: Hi,
    /// Shift error `|d^_j - d_j| <= a |d_j| + b` (T2).
    a: Hi,
    b: Hi,
    /// Same for the log-prob subtraction `x_t - lse` of raw kernels.
    a_lp: Hi,
    b_lp: Hi,
    /// `K_S = (1 + eps_exp)^(1+r) (1 + gamma_{n_S})`, `n_S = h + L + r`.
    k_s: Result<Hi, NoBound>,
    /// `K_B = (1 + eps_exp)^(1+r) (1 + gamma_{n_B})`, `n_B = h + L + 2r + 2`.
    k_b: Result<Hi, NoBound>,
    /// `K_P = (1 + eps_exp) (1 + gamma_{n_P})`, `n_P = h + L + r + 1`, and with one more rounding.
    k_p: Result<(Hi, Hi), NoBound>,
    /// `omega = (1 + gamma_{n_B}) / (1 - gamma_{n_S}) - 1` (raw entropy).
    omega: Result<Hi, NoBound>,
    n_s: usize,
    n_b: usize,
    n_p: usize,
    /// (T17) Depth `D_V` of the loss's smoothing sum over the row's
    /// `V` terms in the model's [`Model::loss_order`].
    loss_sum_depth: usize,
    /// (T18) Bound on `|z^_j - z_j|` from the kernel's own softcap (`x'`
    /// error over `T`; 0 without one or for a materialised `x'`).
    cap_z: Hi,
    /// (T18) Bound on `|f^_j - f_j|` for the gradient factor `f = 1 - t^2`
    /// (`None` without a softcap).
    cap_df: Option<Hi>,
    /// (T20) How `kl_k3` is evaluated.
    k3_form: super::model::K3Form,
    /// (S2) The statistical threshold's `c` (`None`: the sound bound).
    stat_c: Option<f64>,
}

/// Bounds of one logit set (T4-T6).
#[derive(Clone, Copy, Debug)]
struct SetBounds {
    ln_s: Interval,
    /// Relative error of the computed sum `S^`.
    theta_s: Hi,
    /// `-ln(1 - theta_S)`.
    nl_theta: Hi,
    /// Error of `ln S^` (nats).
    delta_ell: Hi,
    /// Error of the normaliser a log-prob subtracts: `delta_ell` (shifted)
    /// or of `lse = z_max + ln S` (raw).
    lse_err: Hi,
}

impl SetBounds {
    /// Whether `self` and `o` are the same bounds bit for bit (then every
    /// per-entry term computed from them is too).
    fn same_bits(&self, o: &SetBounds) -> bool {
        let iv = |a: &Interval, b: &Interval| bits(a.lo, b.lo) && bits(a.hi, b.hi);
        iv(&self.ln_s, &o.ln_s)
            && bits(self.theta_s.0, o.theta_s.0)
            && bits(self.nl_theta.0, o.nl_theta.0)
            && bits(self.delta_ell.0, o.delta_ell.0)
            && bits(self.lse_err.0, o.lse_err.0)
    }
}

/// `a` and `b` have the same bits.
fn bits(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits()
}

/// `gamma_n = n u / (1 - n u)` (Higham, Lemma 3.1), or no bound when `n u >= 1`.
fn gamma(n: usize, u: f64) -> Result<Hi, NoBound> {
    let nu = n as f64 * u;
    if nu.is_nan() || nu >= 1.0 {
        return Err(NoBound::GammaUndefined { n, u });
    }
    Ok(Hi(nu) / (Lo(1.0) - Hi(nu)))
}

/// The `gamma_n` of an accumulation (summation) path: sound `gamma_n`, or
/// with `stat_c = Some(c)` the statistical `min(gamma_n, c sqrt(n) u)`
/// (`statistical.rs`, TOLERANCE.md "(S1)"). No bound when `n u >= 1` either way.
/// The statistical threshold's terms of one row (`statistical.rs`): `c`,
/// and (S2a) the floor of its accumulation terms over the row's
/// vocabulary (`0`: none).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct StatTerms {
    /// (S2)'s `c`.
    pub c: f64,
    /// (S2a)'s floor: a relative error the threshold of a sum over the
    /// row never goes below.
    pub floor: f64,
    /// (S2b)'s floor of the entropy family's sums (`B`, the probabilities'
    /// `sum p |lp|`): a relative error their threshold never goes below.
    pub floor_h: f64,
}

/// [`acc_gamma`] for a sum over the row's vocabulary (the normaliser `S`,
/// the entropy's `B`, the probabilities): the statistical
/// `min(gamma_n, max(c sqrt(n) u, floor))` (S2a).
fn vocab_gamma(
    n: usize,
    u: f64,
    stat: Option<StatTerms>,
    floor: fn(&StatTerms) -> f64,
) -> Result<Hi, NoBound> {
    let g = acc_gamma(n, u, stat.map(|s| s.c))?;
    Ok(match stat {
        Some(s) if floor(&s) > g.0 => {
            let sound = gamma(n, u)?;
            if floor(&s) < sound.0 {
                Hi(floor(&s))
            } else {
                sound
            }
        }
        _ => g,
    })
}

fn acc_gamma(n: usize, u: f64, stat_c: Option<f64>) -> Result<Hi, NoBound> {
    let g = gamma(n, u)?;
    Ok(match stat_c {
        Some(c) => {
            let s = Hi(c.max(0.0)) * Hi((n as f64).sqrt()) * Hi(u);
            if s.0 < g.0 {
                s
            } else {
                g
            }
        }
        None => g,
    })
}

/// Half an ulp of `dtype` at magnitude `y` (exact; monotone in `y`).
pub(super) fn half_ulp(dtype: Dtype, y: Hi) -> Hi {
    Hi(0.5 * dtype.ulp(y.0))
}

/// Upper bound of `e^lw (e^x - 1)` without overflow (`x >= 0`).
fn w_expm1(lw: Hi, x: Hi) -> Hi {
    if x.0 <= 1.0 {
        lw.exp() * x.exp_m1()
    } else {
        (lw + x).exp()
    }
}

/// `|d_j|` at the far end of its enclosure (`d_j <= 0`).
fn mag(d: &Interval) -> Hi {
    Hi(-d.lo)
}

fn finite(x: Hi, what: &'static str) -> Result<Hi, NoBound> {
    if x.0.is_finite() {
        Ok(x)
    } else {
        Err(NoBound::NonFinite { what })
    }
}

impl Consts {
    fn new(model: &Model, n_terms: usize, ctx: &RowContext, stat: Option<StatTerms>) -> Consts {
        let stat_c = stat.map(|s| s.c);
        let acc = model.accumulation;
        let u_f = acc.unit_roundoff();
        let u = Hi(u_f);
        let alg = model.algorithm(n_terms);
        let (h, l, r) = (
            alg.summation.leaf.max(1),
            alg.summation.merges,
            alg.rescaling_exps,
        );
        let eps_exp = Hi(model.exp_ulps.max(0.0)) * Hi(2.0 * u_f);
        let t = ctx.temperature;
        let pow2_t = t > 0.0 && t.is_finite() && {
            let e = t.log2().round() as i32;
            (-60..=60).contains(&e) && pow2(e) == t
        };
        let (t_div, t_count) = if pow2_t {
            (Hi::ZERO, 0)
        } else {
            (gamma(2, u_f).unwrap_or(Hi(f64::NAN)), 2)
        };
        let z = Hi(ctx.z_max_abs.abs());
        let one_u = Hi::ONE + u;
        // (T2) shift errors.
        let (a, b) = match model.shift {
            Shift::SubtractThenScale => (one_u * (Hi::ONE + t_div) - Lo(1.0), Hi::ZERO),
            Shift::ScaleThenSubtract | Shift::Raw | Shift::Any => {
                (u + one_u * t_div, Hi(2.0) * one_u * t_div * z)
            }
        };
        // (T18) The kernel's own softcap perturbs every z_j by at most
        // cap_z: the shift's two operands by 2 cap_z, before its roundings.
        let (cap_z, cap_df) = softcap_consts(model, ctx, u_f);
        // (T29) A fused linear kernel's matmul perturbs every z_j too, and
        // the softcap's gradient factor it computes from its own x^.
        let cap_z = cap_z + linear::linear_z(model, ctx, stat_c);
        let cap_df = cap_df.map(|df| df + linear::linear_df(model, ctx, stat_c));
        let b = if cap_z.0 > 0.0 {
            b + (Hi::ONE + a) * Hi(2.0) * cap_z
        } else {
            b
        };
        let (a_lp, b_lp) = match model.shift {
            Shift::Raw if cap_z.0 > 0.0 => (t_div, t_div * z + Hi(2.0) * cap_z),
            Shift::Raw => (t_div, t_div * z),
            // (T2a) `Any`: scale-then-subtract's terms, which bound the
            // others' (`Raw`'s `t_div (z + 2 cap_z)` included).
            Shift::SubtractThenScale | Shift::ScaleThenSubtract | Shift::Any => (a, b),
        };
        let n_s = h + l + r;
        let n_b = h + l + 2 * r + 2;
        let n_p = h + l + r + 1;
        let exps = (Hi::ONE + eps_exp).powi(1 + r);
        // Accumulation terms: sound gamma_n, or the statistical threshold's
        // with (S2a)'s floor.
        let gamma = |n: usize, u: f64| vocab_gamma(n, u, stat, |s| s.floor);
        // The entropy family's sums: (S2b)'s floor too.
        let gamma_h = |n: usize, u: f64| vocab_gamma(n, u, stat, |s| s.floor.max(s.floor_h));
        let k_s = gamma(n_s, u_f).map(|g| exps * (Hi::ONE + g));
        let k_b = gamma_h(n_b, u_f).map(|g| exps * (Hi::ONE + g));
        let k_p = gamma_h(n_p, u_f).and_then(|g0| {
            let g1 = gamma_h(n_p + 1, u_f)?;
            Ok((
                (Hi::ONE + eps_exp) * (Hi::ONE + g0),
                (Hi::ONE + eps_exp) * (Hi::ONE + g1),
            ))
        });
        let omega = gamma_h(n_b, u_f).and_then(|gb| {
            let gs = gamma(n_s, u_f)?;
            Ok((Hi::ONE + gb) / (Lo(1.0) - gs) - Lo(1.0))
        });
        Consts {
            acc,
            shift: model.shift,
            u,
            eps_exp,
            eta_sub: Hi(model.exp_ulps.max(1.0)) * Hi(acc.ulp(0.0)),
            eta: Hi(pow2(acc.min_normal_exp())),
            log_ulps: Hi(model.log_ulps.max(0.0)),
            ln_min_normal: acc.min_normal_exp() as f64 * std::f64::consts::LN_2 + FLUSH_MARGIN,
            t_div,
            t_count,
            temperature: t,
            z,
            a,
            b,
            a_lp,
            b_lp,
            k_s,
            k_b,
            k_p,
            omega,
            n_s,
            n_b,
            n_p,
            loss_sum_depth: model.loss_order.summation(n_terms).depth(),
            cap_z,
            cap_df,
            k3_form: model.k3_form,
            stat_c,
        }
    }

    /// The `gamma_n` of a family's own accumulation path (the soft
    /// cross-entropy's sum over `V`, the top-k KLs' sums over the ids):
    /// sound, or (S2)'s `min(gamma_n, c sqrt(n) u)` under the statistical
    /// threshold (S5).
    fn acc_gamma(&self, n: usize) -> Result<Hi, NoBound> {
        acc_gamma(n, self.u.0, self.stat_c)
    }

    /// Error of a log-prob-like `d_j - lse` before its own rounding (T7).
    fn lp_err_pre(&self, set: &SetBounds, d_abs: Hi) -> Hi {
        self.a_lp * d_abs + self.b_lp + set.lse_err
    }

    /// Error of a rounded entry of a log-softmax buffer, `lambda_j` (T9).
    fn lambda(&self, set: &SetBounds, d_abs: Hi) -> Hi {
        let lp_abs = d_abs + Hi(set.ln_s.hi);
        self.lp_err_pre(set, d_abs) * (Hi::ONE + self.u) + self.u * lp_abs
    }

    /// `sum_j lambda_j` over `n` entries with `sum_j |d_j| <= sum_abs`:
    /// `lambda` is affine in `|d|` with nonnegative coefficients, so the
    /// sum is `lambda` of the summed magnitudes with its constant terms
    /// taken `n` times (upward rounding throughout: an upper bound).
    /// (T27l) `theta_j`: the relative error of a kernel's `p^_j =
    /// exp(fl(a_j))` from a teacher log-probability `a_j`, normal results:
    /// `(1 + eps_exp) e^{delta_j} - 1`, `delta_j = u |a_j|` when `a_j` is
    /// not a value of the accumulation dtype (0 when it is).
    pub(super) fn teacher_theta(&self, a: f64) -> Hi {
        let delta = if self.acc.round_f64(a) == a {
            Hi::ZERO
        } else {
            self.u * Hi(a.abs())
        };
        (Hi::ONE + self.eps_exp) * delta.exp() - Lo(1.0)
    }

    fn lambda_sum(&self, set: &SetBounds, sum_abs: Hi, n: Hi) -> Hi {
        let lp_abs = sum_abs + n * Hi(set.ln_s.hi);
        let pre = self.a_lp * sum_abs + n * (self.b_lp + set.lse_err);
        pre * (Hi::ONE + self.u) + self.u * lp_abs
    }

    /// The final roundings (T8): `A + 1/2 ulp_acc(|v| + A)`, then
    /// `+ 1/2 ulp_out(|v| + A + 1/2 ulp_acc)` when `out` is narrower than
    /// the accumulation dtype.
    fn finish(&self, pre: Hi, v_abs: Hi, out: Dtype, what: &'static str) -> ErrorBound {
        let y1 = v_abs + pre;
        if !y1.0.is_finite() {
            return ErrorBound::None {
                reason: NoBound::NonFinite { what },
            };
        }
        let r1 = half_ulp(self.acc, y1);
        let mut total = pre + r1;
        if out.precision() < self.acc.precision() {
            total = total + half_ulp(out, y1 + r1);
        }
        match finite(total, what) {
            Ok(t) => ErrorBound::Abs(t.0),
            Err(reason) => ErrorBound::None { reason },
        }
    }

    /// Relative-error deviation of an `exp`-derived probability: upper bound
    /// of `|p^_j - p_j|` when `p^_j = p_j e^{+-arg} (1 +- eps_exp)` (T10),
    /// flush and subnormal errors included.
    ///
    /// `elw = e^lw` (upward) is given: one `exp` per element serves every
    /// model of the row ([`RowBounds::grad_many`]).
    fn prob_dev_with(&self, lw: Hi, elw: Hi, arg: Hi) -> Hi {
        let wm = if arg.0 <= 1.0 {
            elw * arg.exp_m1()
        } else {
            (lw + arg).exp()
        };
        let mut dev = wm * (Hi::ONE + self.eps_exp) + elw * self.eps_exp + self.eta_sub;
        if (lw + arg).0 < self.ln_min_normal {
            dev = dev + elw;
        }
        dev
    }
}

impl Consts {
    /// Whether the per-entry terms of pass 1 and of the fused entropy
    /// (T4, T11) are the same under `self` and `o` (same shift errors and
    /// flush threshold: e.g. `verify`'s four presets in one dtype).
    fn same_shift(&self, o: &Consts) -> bool {
        self.a == o.a && self.b == o.b && self.ln_min_normal == o.ln_min_normal
    }
}

impl RowBounds<'_> {
    /// Relative error bound `theta_S` of the computed log-prob normaliser
    /// `S^` (for reports and tests).
    ///
    /// # Errors
    /// [`NoBound`] when the model certifies nothing for this row.
    pub fn theta_s(&self) -> Result<f64, NoBound> {
        self.p.as_ref().map(|s| s.theta_s.0).map_err(Clone::clone)
    }

    /// The bound of column `col` of `output` in this row, for a candidate
    /// in `out`: the one place a bound is chosen per output. Log-probs
    /// [`RowBounds::log_prob`], entropy [`RowBounds::entropy`], top-k
    /// log-probs [`RowBounds::topk`] of the id `targets.topk_ids[col]`, grad
    /// logits [`RowBounds::grad`] with the row's cotangents (exactly 0 on
    /// padded columns `col >= V`).
    pub fn bound(
        &self,
        output: Output,
        col: usize,
        targets: &RowTargets,
        out: Dtype,
    ) -> ErrorBound {
        match output.family() {
            Family::LogSoftmax(stat) => self.row_stat(stat, targets, out),
            Family::TopK => match targets.topk_ids.get(col) {
                Some(&id) => self.topk(id, out),
                None => ErrorBound::None {
                    reason: NoBound::MissingStatistic {
                        what: "top-k id of this column",
                    },
                },
            },
            Family::Gradient if col >= targets.vocab_size => ErrorBound::Abs(0.0),
            Family::Gradient => self.grad(col, &targets.grad_cotangents(), out),
            Family::Loss(term) => self.loss_family(term, targets, out),
            Family::Policy(term) => policy::bound(self, term, targets, out),
            Family::TopkKl(dir) => {
                self.topk_kl(dir, &targets.topk_ids, targets.topk_kl.as_ref(), out)
            }
        }
    }
}

impl RowBounds<'_> {
    /// (T8) The final roundings of a value computed in the accumulation
    /// dtype with error `pre` before its last rounding, `|v| <= v_abs`.
    pub(super) fn finish_value(
        &self,
        pre: Hi,
        v_abs: Hi,
        out: Dtype,
        what: &'static str,
    ) -> ErrorBound {
        self.c.finish(pre, v_abs, out, what)
    }
}
