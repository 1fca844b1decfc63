//! Per-row error bounds (nats) of log-probs, entropy, top-k log-probs and
//! per-element bounds of grad logits. The derivation, with sources, is
//! `properties/TOLERANCE.md`; each step below names its equation there
//! (`(T1)` ...).

use logprobe_reference::oracle::{Interval, RowStats};
use logprobe_reference::spec::{pow2, Dtype, Family, LossTerm, Output, RowStat, Shift};

use super::loss_grad::{LossGradCotangents, LossTerms};
use super::model::{EntropyForm, Model, RowContext};
use super::policy_grad::{PolicyGradCotangents, PolicyGradTerms};
use super::statistical::{Statistical, StatisticalBounds};
use super::upward::{ExpM1Base, Hi, Lo};
use super::walk::RowTargets;
use super::{ErrorBound, NoBound};

pub(crate) mod lanes;
mod moments;
#[cfg(test)]
pub(super) use moments::without_moments;
mod screen;
mod topk_kl;
pub use screen::GradScreen;
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

/// Upstream cotangents of one row for [`RowBounds::grad`]: `g` (log-prob),
/// `h` (entropy), `G_k` (top-k, with their ids).
#[derive(Clone, Copy, Debug, Default)]
pub struct GradCotangents<'c> {
    /// Cotangent `g` of the log-prob (0 for `ignore_index` rows).
    pub g: f64,
    /// Cotangent `h` of the entropy.
    pub h: f64,
    /// Target token `t` (`None`: no log-prob term).
    pub token: Option<usize>,
    /// `(id_k, G_k)` pairs of the live top-k ids: every id *not* masked by
    /// `sampling_mask`, including one whose logit is `-inf` or whose
    /// probability underflows (its log-prob is `-inf` but, as in the oracle
    /// and PyTorch's log_softmax backward, it is still differentiated:
    /// `G_k (1 - p_id) / T` at the id, `-G_k p_j / T` elsewhere). Ids masked
    /// by `sampling_mask` are constants and should be left out (see
    /// [`GradCotangents::live_topk`]); an id left in is counted as live,
    /// which only widens the bound (sound either way). The statistics alone
    /// cannot tell the two apart: both have `d_id = -inf`.
    pub topk: &'c [(usize, f64)],
    /// The loss-side cotangents (`grad_lse`, `grad_z_loss`, `grad_loss`;
    /// T19), `None` without any.
    pub loss: Option<LossGradCotangents<'c>>,
    /// The policy terms' cotangents (`grad_kl_k1` .. `grad_ratio`; T21),
    /// `None` without a nonzero one on this row.
    pub policy: Option<PolicyGradCotangents<'c>>,
    /// The top-k KL's cotangents (`grad_forward_kl`, `grad_reverse_kl`;
    /// T25), `None` without a nonzero one on this row.
    pub kl: Option<KlGradCotangents<'c>>,
}

impl GradCotangents<'_> {
    /// The `(id_k, G_k)` pairs of one row's live top-k ids, for
    /// [`GradCotangents::topk`]: `ids` `[K]` and `grad` `[K]` zipped, the ids
    /// for which `allowed(id)` is false (masked by `sampling_mask`) dropped.
    /// A negative id (a caller's bad input) is kept, as `usize::MAX`, so it
    /// still counts in the bound's cotangent sum.
    pub fn live_topk(
        ids: impl IntoIterator<Item = i64>,
        grad: impl IntoIterator<Item = f64>,
        allowed: impl Fn(usize) -> bool,
    ) -> Vec<(usize, f64)> {
        ids.into_iter()
            .zip(grad)
            .map(|(id, g)| (usize::try_from(id).unwrap_or(usize::MAX), g))
            .filter(|&(id, _)| id == usize::MAX || allowed(id))
            .collect()
    }
}

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
    /// (T18) Bound on `|z^_j - z_j|` from the kernel's own softcap (`x'`
    /// error over `T`; 0 without one or for a materialised `x'`).
    cap_z: Hi,
    /// (T18) Bound on `|f^_j - f_j|` for the gradient factor `f = 1 - t^2`
    /// (`None` without a softcap).
    cap_df: Option<Hi>,
    /// (T20) How `kl_k3` is evaluated.
    k3_form: super::model::K3Form,
}

/// (T18) The softcap's error terms of a model: `(cap_z, cap_df)` (see
/// [`Consts`]). `x'^ = fl(c fl_tanh(fl(x / c)))` with `x / c` one
/// division or a multiply by a rounded `1 / c` (relative `gamma_2`),
/// `tanh` within `k_t` ulps, one product: with `y = x / c` exact,
/// `e_T = gamma_2 / (1 - gamma_2) SECH2_Y_MAX + 2 k_t u + k_t eta_sub`
/// bounds `|t^ - tanh(y)|` and `|x'^ - x'| <= c (e_T (1 + u) + u)`; the
/// factor `fl(1 - fl(t^ t^))` errs by at most
/// `e_T (2 + e_T) + u (1 + e_T)^2 + u (1 + e_T (2 + e_T) + u (1 + e_T)^2)`
/// (`|t| <= 1`, `f <= 1`). A materialised `x'` has `e_T = 0`.
fn softcap_consts(model: &Model, ctx: &RowContext, u_f: f64) -> (Hi, Option<Hi>) {
    let Some(s) = ctx.softcap else {
        return (Hi::ZERO, None);
    };
    let u = Hi(u_f);
    let e_t = if s.computed {
        let g2 = gamma(2, u_f).unwrap_or(Hi(f64::INFINITY));
        let kt = Hi(model.tanh_ulps.max(0.0));
        g2 / (Lo(1.0) - g2) * Hi(SECH2_Y_MAX)
            + Hi(2.0) * kt * u
            + kt * Hi(model.accumulation.ulp(0.0))
    } else {
        Hi::ZERO
    };
    let cap_x = if s.computed {
        Hi(s.c) * (e_t * (Hi::ONE + u) + u)
    } else {
        Hi::ZERO
    };
    let cap_z = cap_x / Lo(ctx.temperature);
    let sq = (Hi::ONE + e_t) * (Hi::ONE + e_t);
    let spread = e_t * (Hi(2.0) + e_t);
    let df = spread + u * sq + u * (Hi::ONE + spread + u * sq);
    (cap_z, Some(df))
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
    fn new(model: &Model, n_terms: usize, ctx: &RowContext, stat_c: Option<f64>) -> Consts {
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
            Shift::ScaleThenSubtract | Shift::Raw => {
                (u + one_u * t_div, Hi(2.0) * one_u * t_div * z)
            }
        };
        // (T18) The kernel's own softcap perturbs every z_j by at most
        // cap_z: the shift's two operands by 2 cap_z, before its roundings.
        let (cap_z, cap_df) = softcap_consts(model, ctx, u_f);
        let b = if cap_z.0 > 0.0 {
            b + (Hi::ONE + a) * Hi(2.0) * cap_z
        } else {
            b
        };
        let (a_lp, b_lp) = match model.shift {
            Shift::Raw if cap_z.0 > 0.0 => (t_div, t_div * z + Hi(2.0) * cap_z),
            Shift::Raw => (t_div, t_div * z),
            _ => (a, b),
        };
        let n_s = h + l + r;
        let n_b = h + l + 2 * r + 2;
        let n_p = h + l + r + 1;
        let exps = (Hi::ONE + eps_exp).powi(1 + r);
        // Accumulation terms: sound gamma_n, or the statistical threshold's.
        let gamma = |n: usize, u: f64| acc_gamma(n, u, stat_c);
        let k_s = gamma(n_s, u_f).map(|g| exps * (Hi::ONE + g));
        let k_b = gamma(n_b, u_f).map(|g| exps * (Hi::ONE + g));
        let k_p = gamma(n_p, u_f).and_then(|g0| {
            let g1 = gamma(n_p + 1, u_f)?;
            Ok((
                (Hi::ONE + eps_exp) * (Hi::ONE + g0),
                (Hi::ONE + eps_exp) * (Hi::ONE + g1),
            ))
        });
        let omega = gamma(n_b, u_f).and_then(|gb| {
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
            cap_z,
            cap_df,
            k3_form: model.k3_form,
        }
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

impl<'a> RowBounds<'a> {
    /// [`RowBounds::new`] for several models of one row at once, with the
    /// same bounds: see [`RowBounds::new_shared`] (no statistical
    /// threshold, no grouping).
    pub fn new_all<const M: usize>(
        models: &[Model; M],
        stats: &'a RowStats,
        ctx: &RowContext,
    ) -> [RowBounds<'a>; M] {
        Self::new_shared(models, None, stats, ctx, None).0
    }

    /// The bounds of several models of one row, and optionally the
    /// statistical threshold of one more ([`Statistical::row_bounds`]),
    /// sharing their per-entry work. The terms that do not depend on the
    /// summation order (`e^lw`, `e^alpha - 1`, the fused entropy sums) are
    /// evaluated once for all models, the log-softmax entropy sums (T12,
    /// T13) of every model in one walk (per model only `e^lambda - 1`
    /// remains per entry), and the log-prob set's sums are those of the
    /// entropy set when the two sets are equal (no sampling mask).
    /// `e^(lw + lambda)` is bounded as `e^lw (1 + (e^lambda - 1))`
    /// (upward), which can differ from [`RowBounds::new`] in the last bits.
    ///
    /// `keys` `[V]` (optional) name each entry's logit (e.g. the raw bits
    /// of a bf16 logit and its mask bit, `< 2^17`): entries with the same
    /// key whose `d_j` and `e_j` are equal (checked) form one group, whose
    /// terms are evaluated once and multiplied by the group's size
    /// (upward); any key `>= 2^17`, mismatch or too many groups falls back
    /// to entry by entry. Models whose shift errors differ fall back to
    /// [`RowBounds::new`] one by one. Never panics.
    pub fn new_shared<const M: usize>(
        models: &[Model; M],
        statistical: Option<&Statistical>,
        stats: &'a RowStats,
        ctx: &RowContext,
        keys: Option<&[u32]>,
    ) -> ([RowBounds<'a>; M], Option<StatisticalBounds<'a>>) {
        let n = stats.d.len().max(stats.e.len());
        let mut all: Vec<(Model, Option<f64>)> = models.iter().map(|m| (*m, None)).collect();
        if let Some(s) = statistical {
            all.push((s.model, Some(s.row_c(n))));
        }
        let cs: Vec<Consts> = all
            .iter()
            .map(|(m, c)| Consts::new(m, n, ctx, *c))
            .collect();
        let rbs: Vec<RowBounds<'a>> = if cs.iter().all(|c| c.same_shift(&cs[0])) && !cs.is_empty() {
            Self::shared(&all, cs, stats, keys)
        } else {
            all.iter()
                .map(|(m, c)| RowBounds::build(m, stats, ctx, *c))
                .collect()
        };
        let mut rbs = rbs.into_iter();
        let out: [RowBounds<'a>; M] = std::array::from_fn(|_| rbs.next().expect("M bounds"));
        (out, rbs.next().map(StatisticalBounds::from_bounds))
    }

    /// The shared walk of [`RowBounds::new_shared`] (all `cs` with the
    /// same shift errors).
    fn shared(
        all: &[(Model, Option<f64>)],
        cs: Vec<Consts>,
        stats: &'a RowStats,
        keys: Option<&[u32]>,
    ) -> Vec<RowBounds<'a>> {
        let c0 = &cs[0];
        let groups = keys.and_then(|k| group_entries(k, &stats.d, &stats.e));
        let entries = match &groups {
            Some(g) => Entries::Groups(g),
            None => Entries::All(stats.e.len()),
        };
        let mut shared = entropy_shared(c0, stats, entries);
        let same_sets = stats.ln_s == stats.ln_s_w && stats.d == stats.e;
        let sp = if same_sets {
            shared.set
        } else {
            let entries = match &groups {
                Some(g) => Entries::Groups(g),
                None => Entries::All(stats.d.len()),
            };
            set_sums(c0, &stats.d, stats.ln_s, entries)
        };
        let p: Vec<Result<SetBounds, NoBound>> = cs
            .iter()
            .zip(all)
            .map(|(c, (m, _))| set_finish(c, m, sp, stats.ln_s))
            .collect();
        let w: Vec<Result<SetBounds, NoBound>> = cs
            .iter()
            .zip(all)
            .map(|(c, (m, _))| set_finish(c, m, shared.set, stats.ln_s_w))
            .collect();
        // A model equal to an earlier one (verify's chosen `lanes=8` is
        // also its reference `lanes=8`) has the same sums: walked once.
        let twin = twins(&cs, |c| format!("{:?}", c));
        let uniq: Vec<usize> = (0..cs.len()).filter(|&i| twin[i] == i).collect();
        let ls_uniq = logsoftmax_sums(
            &uniq.iter().map(|&i| cs[i].clone()).collect::<Vec<_>>(),
            &uniq.iter().map(|&i| w[i].clone()).collect::<Vec<_>>(),
            stats,
            &shared,
            entries,
        );
        let ls: Vec<LsSums> = twin
            .iter()
            .map(|t| ls_uniq[uniq.iter().position(|u| u == t).expect("a unique model")])
            .collect();
        // Entry by entry over finite entries with equal sets: `ew` is each
        // entry's `p^+` (GradShared::new's exp, the same operands).
        // (The sums above were `ew`'s last reader: moved, not copied.)
        let ep =
            (matches!(entries, Entries::All(_)) && same_sets && shared.ew.len() == stats.d.len())
                .then(|| std::sync::Arc::new(std::mem::take(&mut shared.ew)));
        let mut out = Vec::with_capacity(cs.len());
        for (i, (c, p)) in cs.into_iter().zip(p).enumerate() {
            let (entropy_pre, entropy_grad) = match &w[i] {
                Ok(ws) => entropy_finish(&c, &all[i].0, stats, ws, &shared, &ls[i]),
                Err(e) => (Err(e.clone()), Err(e.clone())),
            };
            out.push(RowBounds {
                stats,
                c,
                p,
                w: w[i].clone(),
                entropy_pre,
                entropy_grad,
                ep: ep.clone(),
            });
        }
        out
    }

    /// Bounds of the row described by `stats` (the oracle's
    /// [`logprobe_reference::oracle::Oracle::row_stats`]) under `model`.
    ///
    /// `V` for the summation presets is `stats.d.len()` (`p` and `q` are
    /// not read: they may be empty). Never panics: a
    /// model that certifies nothing (`n u >= 1`, `theta_S >= 1`, non-finite
    /// statistics) yields [`ErrorBound::None`] from the queries.
    pub fn new(model: &Model, stats: &'a RowStats, ctx: &RowContext) -> RowBounds<'a> {
        Self::build(model, stats, ctx, None)
    }

    /// What [`RowBounds::new`] computed (the O(V) part: `S`, `ln S`,
    /// entropy and gradient terms), without the borrow of the row's
    /// statistics, so a cache can keep it next to them and hand it to
    /// every kernel judged under the same model ([`DetachedBounds::attach`]).
    pub fn detach(self) -> DetachedBounds {
        DetachedBounds {
            stats: self.stats as *const RowStats as usize,
            fingerprint: stats_fingerprint(self.stats),
            c: self.c,
            p: self.p,
            w: self.w,
            entropy_pre: self.entropy_pre,
            entropy_grad: self.entropy_grad,
        }
    }
}

/// A row's [`RowBounds`] without its borrowed statistics
/// ([`RowBounds::detach`]): the same bounds, bit for bit, once attached
/// again to the very [`RowStats`] they were built from.
#[derive(Clone, Debug)]
pub struct DetachedBounds {
    /// Address of the statistics they were built from (identity only).
    stats: usize,
    /// Their shape and normalisers' bits ([`stats_fingerprint`]): an
    /// address reused by another row's statistics does not attach.
    fingerprint: [u64; 6],
    c: Consts,
    p: Result<SetBounds, NoBound>,
    w: Result<SetBounds, NoBound>,
    entropy_pre: Result<Hi, NoBound>,
    entropy_grad: Result<Hi, NoBound>,
}

/// `[V]` lengths of `d` and `e` and the bits of `ln_s` and `ln_s_w`: what
/// tells two rows' statistics apart in [`DetachedBounds::attach`].
fn stats_fingerprint(stats: &RowStats) -> [u64; 6] {
    [
        stats.d.len() as u64,
        stats.e.len() as u64,
        stats.ln_s.lo.to_bits(),
        stats.ln_s.hi.to_bits(),
        stats.ln_s_w.lo.to_bits(),
        stats.ln_s_w.hi.to_bits(),
    ]
}

impl DetachedBounds {
    /// The bounds again, over `stats`; `None` unless `stats` is the same
    /// object (same address, same shape and normalisers) they were built
    /// from, so they cannot be attached to another row.
    pub fn attach<'a>(&self, stats: &'a RowStats) -> Option<RowBounds<'a>> {
        let same = stats as *const RowStats as usize == self.stats
            && stats_fingerprint(stats) == self.fingerprint;
        same.then(|| RowBounds {
            stats,
            c: self.c.clone(),
            p: self.p.clone(),
            w: self.w.clone(),
            entropy_pre: self.entropy_pre.clone(),
            entropy_grad: self.entropy_grad.clone(),
            ep: None,
        })
    }
}

impl<'a> RowBounds<'a> {
    /// [`RowBounds::new`] with the accumulation terms' `gamma_n` replaced
    /// by `min(gamma_n, c sqrt(n) u)`: the statistical threshold of
    /// [`super::Statistical`], which exposes only the forward outputs (no
    /// statistical tier for gradients: (T14) reads the entropy's terms).
    pub(super) fn build(
        model: &Model,
        stats: &'a RowStats,
        ctx: &RowContext,
        stat_c: Option<f64>,
    ) -> RowBounds<'a> {
        let c = Consts::new(model, stats.d.len().max(stats.e.len()), ctx, stat_c);
        let p = set_bounds(&c, model, &stats.d, stats.ln_s);
        let w = set_bounds(&c, model, &stats.e, stats.ln_s_w);
        let (entropy_pre, entropy_grad) = match &w {
            Ok(ws) => entropy_errors(&c, model, stats, ws),
            Err(e) => (Err(e.clone()), Err(e.clone())),
        };
        RowBounds {
            stats,
            c,
            p,
            w,
            entropy_pre,
            entropy_grad,
            ep: None,
        }
    }

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
            Family::LogSoftmax(RowStat::LogProb) => self.log_prob(out),
            Family::LogSoftmax(RowStat::Entropy) => self.entropy(out),
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
            Family::Loss(LossTerm::Lse) => self.lse(out),
            Family::Loss(LossTerm::ZLoss) => self.z_loss(targets.z_loss_coef, out),
            Family::Loss(LossTerm::CrossEntropy) => self.loss(targets, out),
            Family::Policy(term) => super::policy::bound(self, term, targets, out),
            Family::TopkKl(dir) => {
                self.topk_kl(dir, &targets.topk_ids, targets.topk_kl.as_ref(), out)
            }
        }
    }

    /// (T20) The log-prob as the policy terms see it: its exact enclosure
    /// `d_t - ln S` and the error of the kernel's accumulation-dtype value
    /// (T7 with the accumulation rounding of T8), with the model's
    /// constants.
    pub(super) fn policy_base(&self) -> Result<super::policy::Base, NoBound> {
        let set = self.p.as_ref().map_err(Clone::clone)?;
        let d_t = self.stats.d_t.ok_or(NoBound::MissingStatistic {
            what: "d_t (no target)",
        })?;
        let d_abs = mag(&d_t);
        let pre = self.c.lp_err_pre(set, d_abs);
        let v_abs = d_abs + Hi(set.ln_s.hi);
        Ok(super::policy::Base {
            lp: Interval {
                lo: (d_t.lo - set.ln_s.hi).next_down(),
                hi: (d_t.hi - set.ln_s.lo).next_up(),
            },
            lp_err: pre + half_ulp(self.c.acc, v_abs + pre),
            acc: self.c.acc,
            eps_exp: self.c.eps_exp,
            eta: self.c.eta + self.c.eta_sub,
            k3_form: self.c.k3_form,
        })
    }

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

    /// Bound (nats) on `|loss^ - loss|` of this row's cross-entropy term
    /// `w l` under `reduction = none` for a candidate in `out` (T17:
    /// [`RowBounds::loss_row`] through [`loss_bounds`] for one row): 0 on
    /// a row not counted or of weight 0 (exactly 0) and for an exact
    /// `+inf`.
    pub fn loss(&self, targets: &RowTargets, out: Dtype) -> ErrorBound {
        let Some(l) = &targets.loss else {
            return ErrorBound::None {
                reason: NoBound::MissingStatistic {
                    what: "loss options",
                },
            };
        };
        loss_bounds(
            &[self.loss_row_of(l)],
            &[l.counted],
            Some(&[l.weight]),
            logprobe_reference::spec::Reduction::None,
            1.0,
            self.c.acc,
            out,
        )
        .pop()
        .expect("one row, one bound")
    }

    /// [`RowBounds::loss_row`] for the row `l` describes: a zero bound
    /// (exactly 0) on a row not counted or of weight 0.
    ///
    /// # Errors
    /// Those of [`RowBounds::loss_row`].
    pub fn loss_row_of(&self, l: &super::LossTarget) -> Result<LossRowBound, NoBound> {
        if !(l.counted && l.weight != 0.0) {
            return Ok(LossRowBound {
                err: 0.0,
                mag: 0.0,
                infinite: false,
            });
        }
        match &l.sums {
            Some(s) => self.loss_row_with(l.label_smoothing, s),
            None => self.loss_row(l.label_smoothing, |j| {
                l.allowed.as_ref().is_none_or(|a| a[j])
            }),
        }
    }

    /// Error (nats) of `lse = m / T + ell` in the accumulation dtype,
    /// before its own rounding (T15): `t_T Z + delta_ell`, and the
    /// magnitude bound `Z + ln S` of the value.
    fn lse_pre(&self) -> Result<(Hi, Hi), NoBound> {
        let set = self.p.as_ref().map_err(Clone::clone)?;
        let mut pre = self.c.t_div * self.c.z + set.delta_ell;
        if self.c.cap_z.0 > 0.0 {
            // (T18) the computed x'_max is off by T cap_z, scaled by 1/T.
            pre = pre + (Hi::ONE + self.c.t_div) * self.c.cap_z;
        }
        Ok((pre, self.c.z + Hi(set.ln_s.hi)))
    }

    /// Bound (nats) on `|lse^ - lse|` for a candidate in `out` (T15, then
    /// the final roundings T8).
    pub fn lse(&self, out: Dtype) -> ErrorBound {
        match self.lse_pre() {
            Ok((pre, v_abs)) => self.c.finish(pre, v_abs, out, "lse"),
            Err(reason) => ErrorBound::None { reason },
        }
    }

    /// Bound on `|z_loss^ - z_loss|` for `z_loss = coef * lse^2` (`coef`
    /// as the computation takes it) and a candidate in `out` (T16): from
    /// the accumulation-dtype `lse^` with error `E_L` (T15 and its rounding),
    /// `coef (E_L (2 L + E_L) + gamma_2 (L + E_L)^2)` with `L = Z + ln S`,
    /// then half an ulp of `out` when it is narrower than the accumulation.
    pub fn z_loss(&self, coef: f64, out: Dtype) -> ErrorBound {
        let (pre, l) = match self.lse_pre() {
            Ok(v) => v,
            Err(reason) => return ErrorBound::None { reason },
        };
        let g2 = match gamma(2, self.c.u.0) {
            Ok(g) => g,
            Err(reason) => return ErrorBound::None { reason },
        };
        let e_l = pre + half_ulp(self.c.acc, l + pre);
        let c = Hi(coef.abs());
        let big = l + e_l;
        let a = c * (e_l * (Hi(2.0) * l + e_l) + g2 * big * big);
        let mut total = a;
        if out.precision() < self.c.acc.precision() {
            total = total + half_ulp(out, c * big * big + a);
        }
        // Past f64's range (f64 logits near 1e154 and beyond: `c lse^2`
        // overflows) the bound saturates at the largest f64: no tighter
        // than needed for the correct infinity (error 0, Exact::error) and
        // never looser than the derivation, so no value it would fail passes.
        if total.0 == f64::INFINITY {
            return ErrorBound::Abs(f64::MAX);
        }
        match finite(total, "z_loss") {
            Ok(t) => ErrorBound::Abs(t.0),
            Err(reason) => ErrorBound::None { reason },
        }
    }

    /// Bound (nats) on `|log_prob^ - log_prob|` for a candidate in `out`
    /// (T7-T8): `A = a |d_t| + b + delta_ell` (raw kernels:
    /// `t_T (Z + |d_t|) + err(lse)`), then the final roundings.
    pub fn log_prob(&self, out: Dtype) -> ErrorBound {
        match self.stats.d_t {
            Some(d_t) => self.shifted_log_prob(&d_t, out, "log_prob"),
            None => ErrorBound::None {
                reason: NoBound::MissingStatistic {
                    what: "d_t (no target)",
                },
            },
        }
    }

    /// Bound (nats) on the top-k log-prob of vocabulary id `id`: as
    /// [`RowBounds::log_prob`] with `d_id`; exactly 0 for an id with
    /// `d_id = -inf` (masked, or an allowed `-inf` logit: the value is `-inf`).
    pub fn topk(&self, id: usize, out: Dtype) -> ErrorBound {
        match self.stats.d.get(id) {
            Some(d) if d.hi == f64::NEG_INFINITY => ErrorBound::Abs(0.0),
            Some(d) => self.shifted_log_prob(d, out, "topk_log_prob"),
            None => ErrorBound::None {
                reason: NoBound::MissingStatistic {
                    what: "d of a top-k id (out of range)",
                },
            },
        }
    }

    fn shifted_log_prob(&self, d: &Interval, out: Dtype, what: &'static str) -> ErrorBound {
        let set = match &self.p {
            Ok(s) => s,
            Err(e) => return ErrorBound::None { reason: e.clone() },
        };
        let d_abs = mag(d);
        let pre = self.c.lp_err_pre(set, d_abs);
        self.c.finish(pre, d_abs + Hi(set.ln_s.hi), out, what)
    }

    /// Bound (nats) on `|entropy^ - entropy|` for a candidate in `out`
    /// (T11-T13 per the model's [`EntropyForm`], then the final roundings).
    pub fn entropy(&self, out: Dtype) -> ErrorBound {
        match (&self.w, &self.entropy_pre) {
            (Ok(ws), Ok(pre)) => {
                self.c
                    .finish(*pre, Hi(ws.ln_s.hi) + Hi(self.stats.r.hi), out, "entropy")
            }
            (Err(e), _) | (_, Err(e)) => ErrorBound::None { reason: e.clone() },
        }
    }

    /// Bound on `|dx^_j - dx_j|` for element `j < V` of grad logits (T14),
    /// in the gradient's units, for the cotangents `cot`, rounded to `out`.
    /// Padded columns (`j >= V`) are exactly 0 and are not covered here.
    pub fn grad(&self, j: usize, cot: &GradCotangents<'_>, out: Dtype) -> ErrorBound {
        let cc = CotConsts::new(cot);
        let mg = self.grad_consts(cot, &cc);
        match self.grad_elem(j, cot, out, &GradShared::new(self.stats, j, cot), &mg, &cc) {
            Ok(b) => b,
            Err(reason) => ErrorBound::None { reason },
        }
    }

    /// [`RowBounds::grad`] of element `j` under every bound in `all` (one
    /// row's bounds, e.g. [`RowBounds::new_shared`]'s), sharing the
    /// model-independent work: the probabilities' `e^lw` and the
    /// cotangents' sums are evaluated once. Equal to `grad` bit for bit;
    /// bounds built on other statistics are computed one by one. For many
    /// elements of one row, [`RowBounds::grad_row`] once and
    /// [`RowBounds::grad_many_with`] per element do the row's part once.
    pub fn grad_many<const M: usize>(
        all: &[RowBounds<'_>; M],
        j: usize,
        cot: &GradCotangents<'_>,
        out: Dtype,
    ) -> [ErrorBound; M] {
        Self::grad_many_with(all, &Self::grad_row(all, cot), j, cot, out)
    }

    /// The row constants of the gradient bound (T14) under every bound in
    /// `all` for the row's cotangents `cot`: the cotangent sum `G`, the
    /// terms' count, the cotangents' rounding test, `1/T`, `gamma_m` and
    /// the floor, for [`RowBounds::grad_many_with`].
    pub fn grad_row<const M: usize>(
        all: &[RowBounds<'_>; M],
        cot: &GradCotangents<'_>,
    ) -> GradRow<M> {
        let cot_consts = CotConsts::new(cot);
        let models = all.each_ref().map(|rb| rb.grad_consts(cot, &cot_consts));
        let keys: Vec<(String, *const RowStats)> = all
            .iter()
            .zip(&models)
            .map(|(rb, mg)| (rb.twin_key(mg), rb.stats as *const RowStats))
            .collect();
        let t = twins(&keys, |k| k.clone());
        GradRow {
            models,
            cot: cot_consts,
            twin: std::array::from_fn(|i| t[i]),
        }
    }

    /// What an element's gradient bound (T14) reads of `self` and its row
    /// constants `mg`, as text: two bounds on the same statistics with the
    /// same key give every element the same bound, bit for bit (`f64`'s
    /// `Debug` form is its shortest round-trip decimal, sign of zero
    /// included, so equal keys mean equal values).
    fn twin_key(&self, mg: &ModelGrad) -> String {
        format!(
            "{:?} {:?} {:?} {:?} {:?} {:?}",
            self.c, self.p, self.w, self.entropy_pre, self.entropy_grad, mg
        )
    }

    /// [`RowBounds::grad_many`] with the row constants `row` of
    /// [`RowBounds::grad_row`] for the same `all` and `cot` (bit for bit
    /// the same bounds).
    pub fn grad_many_with<const M: usize>(
        all: &[RowBounds<'_>; M],
        row: &GradRow<M>,
        j: usize,
        cot: &GradCotangents<'_>,
        out: Dtype,
    ) -> [ErrorBound; M] {
        let Some(first) = all.first() else {
            return std::array::from_fn(|_| unreachable!("M = 0"));
        };
        let sh = GradShared::new(first.stats, j, cot);
        let mut bounds: [ErrorBound; M] = std::array::from_fn(|_| ErrorBound::Abs(0.0));
        for i in 0..M {
            // A twin of an earlier bound ([`RowBounds::grad_row`]) gives the same bits.
            let t = row.twin[i];
            if t < i {
                bounds[i] = bounds[t].clone();
                continue;
            }
            let rb = &all[i];
            let r = if std::ptr::eq(rb.stats, first.stats) {
                rb.grad_elem(j, cot, out, &sh, &row.models[i], &row.cot)
            } else {
                let sh = GradShared::new(rb.stats, j, cot);
                rb.grad_elem(j, cot, out, &sh, &row.models[i], &row.cot)
            };
            bounds[i] = match r {
                Ok(b) => b,
                Err(reason) => ErrorBound::None { reason },
            };
        }
        bounds
    }

    /// This model's row constants of (T14) for `cot`.
    fn grad_consts(&self, cot: &GradCotangents<'_>, cc: &CotConsts) -> ModelGrad {
        let c = &self.c;
        // A cotangent not representable in the accumulation dtype is rounded
        // into it first (our kernels do): one more rounding on every path.
        let widened = std::iter::once(cot.g)
            .chain(std::iter::once(cot.h))
            .chain(cot.topk.iter().map(|&(_, gk)| gk))
            .any(|x| c.acc.round_f64(x) != x);
        let base = cc.n0 + 2 + c.t_count + widened as usize;
        let inv_t = Hi::ONE / Lo(c.temperature);
        let floor_of = |m: usize| Hi((m + 2) as f64) * c.eta * Hi::ONE.max(inv_t);
        ModelGrad {
            base,
            inv_t,
            gm: std::array::from_fn(|i| gamma(base + i, c.u.0)),
            floor: std::array::from_fn(|i| floor_of(base + i)),
            h_hi: self
                .w
                .as_ref()
                .map(|set| Hi(set.ln_s.hi) + Hi(self.stats.r.hi))
                .unwrap_or(Hi::ZERO),
            pw_same: matches!((&self.p, &self.w), (Ok(p), Ok(w)) if p.same_bits(w)),
            policy: cot.policy.as_ref().map(|pg| {
                self.policy_base()
                    .and_then(|b| PolicyGradTerms::new(&b, c.u, pg))
            }),
            kl: cot.kl.as_ref().map(|kg| self.kl_grad_terms(kg)),
        }
    }

    /// The bound of element `j` (T14) from the row constants `mg`, `cc`
    /// and the element's model-independent terms `sh`.
    fn grad_elem(
        &self,
        j: usize,
        cot: &GradCotangents<'_>,
        out: Dtype,
        sh: &GradShared,
        mg: &ModelGrad,
        cc: &CotConsts,
    ) -> Result<ErrorBound, NoBound> {
        let c = &self.c;
        let st = self.stats;
        let (Some(dj), Some(ej)) = (st.d.get(j), st.e.get(j)) else {
            return Err(NoBound::MissingStatistic {
                what: "d_j / e_j (column out of range)",
            });
        };
        let h = Hi(cot.h.abs());
        // Top-k terms of every id the caller passes: live ids, including
        // those with `d_id = -inf` (T14: `G_k (1 - 0) / T` at the id).
        let mut g_sum = cc.g_sum;
        let mut ind = sh.ind;
        // Terms beyond the row's `n0`: the indicators at `j`, the h-terms.
        let mut n_extra = sh.n_extra;
        // (T19): the loss side's two weights join G (and the target's the
        // indicator at t), two more terms (three at t).
        let loss = match &cot.loss {
            Some(l) => {
                let (pre, big_l) = self.lse_pre()?;
                let e_l = pre + half_ulp(c.acc, big_l + pre);
                let lt = LossTerms::new(l, c.u, e_l, big_l)?;
                g_sum = g_sum + lt.t_weight + lt.p_weight;
                n_extra += 2;
                if cot.token == Some(j) {
                    ind = ind + lt.t_weight;
                    n_extra += 1;
                }
                Some((l, lt))
            }
            None => None,
        };
        // (T21): the policy terms' log-prob cotangent `w^`, one more source
        // at the target: in G, and in the indicator at t.
        let policy = match &mg.policy {
            Some(pt) => {
                let pt = pt.clone()?;
                g_sum = g_sum + pt.weight;
                n_extra += 1;
                if cot.token == Some(j) {
                    ind = ind + pt.weight;
                    n_extra += 1;
                }
                Some(pt)
            }
            None => None,
        };
        // (T25): the top-k KL's cotangents `w^_k`, one more source at each
        // id: in G (K terms), and in the indicator at an id.
        let kl = match &mg.kl {
            Some(kt) => {
                let kt = kt.clone()?;
                g_sum = g_sum + kt.weight;
                n_extra += kt.per_id.len();
                for &(id, w, _) in &kt.per_id {
                    if id == j {
                        ind = ind + w;
                        n_extra += 1;
                    }
                }
                Some(kt)
            }
            None => None,
        };
        // p-terms: |g^| p_j rho_j (T10).
        let (mut p_hi, mut p_dev) = (Hi::ZERO, Hi::ZERO);
        // `(lambda_j, p_dev)` of the p-term, for the h-term when its set
        // and entry are the same bits (no sampling mask): same results.
        let mut p_terms: Option<(Hi, Hi)> = None;
        if (g_sum.0 > 0.0 || policy.is_some() || kl.is_some()) && dj.hi > f64::NEG_INFINITY {
            let set = self.p.as_ref().map_err(Clone::clone)?;
            let (lw, arg, lam) = self.prob_arg(set, dj);
            p_hi = sh.ep;
            p_dev = c.prob_dev_with(lw, sh.ep, arg);
            p_terms = Some((lam, p_dev));
        }
        // h-terms: |h| (q_dev (|c| + dc) + q dc) with c_j = e_j + R.
        let (mut q_hi, mut q_dev, mut c_abs, mut dc, mut lpw_abs) =
            (Hi::ZERO, Hi::ZERO, Hi::ZERO, Hi::ZERO, Hi::ZERO);
        let mut h_hi = Hi::ZERO;
        if h.0 > 0.0 && ej.hi > f64::NEG_INFINITY {
            let set = self.w.as_ref().map_err(Clone::clone)?;
            let dh = *self.entropy_grad.as_ref().map_err(Clone::clone)?;
            let same =
                mg.pw_same && bits(dj.lo, ej.lo) && bits(dj.hi, ej.hi) && bits(sh.ep.0, sh.eq.0);
            let lam = match p_terms {
                Some((lam, dev)) if same => {
                    q_dev = dev;
                    lam
                }
                _ => {
                    let (lw, arg, lam) = self.prob_arg(set, ej);
                    q_dev = c.prob_dev_with(lw, sh.eq, arg);
                    lam
                }
            };
            q_hi = sh.eq;
            let c_hi = Hi(ej.hi) + Hi(st.r.hi);
            let c_lo = Lo(ej.lo) + Lo(st.r.lo);
            c_abs = c_hi.max(c_lo.neg());
            dc = lam + dh;
            lpw_abs = mag(ej) + Hi(set.ln_s.hi);
            h_hi = mg.h_hi;
            n_extra += 2;
        }
        let main = g_sum * p_dev + h * (q_dev * (c_abs + dc) + q_hi * dc);
        // Rounding of the combination: gamma_m over the elementary terms'
        // magnitudes, m = n0 + n_extra + 2 + (0 or 2 for /T) + widened.
        let (gm, floor) = match (mg.gm.get(n_extra), mg.floor.get(n_extra)) {
            (Some(gm), Some(&floor)) => (gm.clone()?, floor),
            _ => {
                let m = mg.base + n_extra;
                let gm = gamma(m, c.u.0)?;
                (gm, Hi((m + 2) as f64) * c.eta * Hi::ONE.max(mg.inv_t))
            }
        };
        let mags =
            ind + g_sum * (p_hi + p_dev) + h * (q_hi + q_dev) * (lpw_abs + h_hi + Hi(2.0) + dc);
        let inv_t = mg.inv_t;
        let pre = (main + gm * mags) * inv_t + floor;
        let mut pre = finite(pre, "grad_logits")?;
        // |dx'_j| (the gradient with respect to x'), bounding |dx_j| too.
        let mut v_abs = (ind + g_sum * p_hi + h * q_hi * c_abs) * inv_t;
        if let Some((l, lt)) = &loss {
            let (e, u_hi) = lt.extra(l, j, cot.token, p_hi + p_dev, g_sum);
            pre = finite(pre + e * inv_t, "grad_logits")?;
            v_abs = v_abs + u_hi * inv_t;
        }
        if let Some(pt) = &policy {
            // |w^ - w| |1[j = t] - p_j|, p_j <= p_hi (T21).
            pre = finite(pre + pt.extra(j, cot.token, p_hi) * inv_t, "grad_logits")?;
        }
        if let Some(kt) = &kl {
            // sum_k |w^_k - w_k| |1[j = id_k] - p_j| (T25).
            pre = finite(pre + kt.extra(j, p_hi) * inv_t, "grad_logits")?;
        }
        if let Some(df) = c.cap_df {
            // (T18) dx^ = fl(dx'^ f^) with f = 1 - t^2 <= 1:
            // E' (1 + df) + |dx'| df + u (|dx'| + E') (1 + df).
            let f_hi = Hi::ONE + df;
            pre = finite(
                pre * f_hi + v_abs * df + c.u * (v_abs + pre) * f_hi,
                "grad_logits",
            )?;
        }
        let mut total = pre;
        if out.precision() < c.acc.precision() {
            total = total + half_ulp(out, v_abs + pre);
        }
        Ok(ErrorBound::Abs(finite(total, "grad_logits")?.0))
    }

    /// `(ln p_j upper, arg_j, lambda_j)`: the exponent of the relative
    /// error of a computed probability, the larger of its two evaluation
    /// forms (T10): `exp(lp^_j)` (`lambda_j`, T9) and `e^_j / S^`
    /// (`alpha_j - ln(1 - theta_S) + 2u`).
    fn prob_arg(&self, set: &SetBounds, d: &Interval) -> (Hi, Hi, Hi) {
        let c = &self.c;
        let d_abs = mag(d);
        let lw = Hi(d.hi) - Lo(set.ln_s.lo);
        let alpha = c.a * d_abs + c.b;
        let via_div = alpha + set.nl_theta + Hi(2.0) * c.u;
        let lam = c.lambda(set, d_abs);
        (lw, lam.max(via_div), lam)
    }
}

/// `gamma_m` and floors precomputed per model: `m = base + n_extra` for
/// `n_extra < GRAD_M` (others computed when met).
const GRAD_M: usize = 8;

/// The row constants of the gradient bound (T14) of `M` models for one
/// row's cotangents ([`RowBounds::grad_row`]).
#[derive(Clone, Debug)]
pub struct GradRow<const M: usize> {
    cot: CotConsts,
    models: [ModelGrad; M],
    /// Per bound: the first bound of the row that gives every element the
    /// same gradient bound ([`RowBounds::twin_key`]; itself when none
    /// before it does).
    twin: [usize; M],
}

/// The model-independent row constants of (T14): `G = |g| + sum |G_k|`
/// (in the cotangents' order, upward) and `n0`, the terms counted on every
/// element (`g` when nonzero, each nonzero `G_k`).
#[derive(Clone, Copy, Debug)]
struct CotConsts {
    g_sum: Hi,
    n0: usize,
}

impl CotConsts {
    fn new(cot: &GradCotangents<'_>) -> CotConsts {
        let mut g_sum = Hi(cot.g.abs());
        let mut n0 = usize::from(cot.g != 0.0);
        for &(_, gk) in cot.topk {
            if gk == 0.0 {
                continue;
            }
            g_sum = g_sum + Hi(gk.abs());
            n0 += 1;
        }
        CotConsts { g_sum, n0 }
    }
}

/// One model's row constants of (T14).
#[derive(Clone, Debug)]
struct ModelGrad {
    /// `m` of an element with no indicator term and no h-term.
    base: usize,
    /// `1 / T`, upward.
    inv_t: Hi,
    /// `gamma_{base + i}`.
    gm: [Result<Hi, NoBound>; GRAD_M],
    /// `(base + i + 2) eta max(1, 1/T)`.
    floor: [Hi; GRAD_M],
    /// `ln S_w + R` (upper; 0 without an entropy set bound).
    h_hi: Hi,
    /// The two sets' bounds are the same bits (no sampling mask).
    pw_same: bool,
    /// (T21) The policy terms' log-prob cotangent: its magnitude and error
    /// (`None` without policy cotangents).
    policy: Option<Result<PolicyGradTerms, NoBound>>,
    /// (T25) The top-k KL's cotangents at the ids: magnitudes and errors
    /// (`None` without KL cotangents).
    kl: Option<Result<KlGradTerms, NoBound>>,
}

/// What the gradient bound of element `j` shares across the models of
/// one row: `e^lw` of `p_j` and `q_j` (`lw = d_j - ln S` at the far ends
/// of the enclosures: the same under every model), each evaluated only
/// when a cotangent needs it, and the indicator terms at `j`.
struct GradShared {
    /// `e^(d_j.hi - ln S.lo)` (upward; 0 when unused).
    ep: Hi,
    /// `e^(e_j.hi - ln S_w.lo)` (upward; 0 when unused).
    eq: Hi,
    /// `|g| 1[j = t] + sum_k |G_k| 1[j = id_k]` (upward, in that order).
    ind: Hi,
    /// The indicator terms at `j` (each counted once more in `m`).
    n_extra: usize,
}

/// The part of [`GradShared`] that is the row's, not the element's.
#[derive(Clone, Copy, Debug)]
pub(super) struct GradSharedRow {
    /// A cotangent other than `h` reads `p_j`.
    g_used: bool,
    /// `h != 0`: the entropy's cotangent reads `q_j`.
    h_used: bool,
    /// `ln S.lo` and `ln S_w.lo` are the same bits.
    same_ln: bool,
}

impl GradSharedRow {
    pub(super) fn new(st: &RowStats, cot: &GradCotangents<'_>) -> GradSharedRow {
        GradSharedRow {
            g_used: cot.g != 0.0
                || cot.topk.iter().any(|&(_, gk)| gk != 0.0)
                || cot.loss.is_some()
                || cot.policy.is_some()
                || cot.kl.is_some(),
            h_used: cot.h != 0.0,
            same_ln: bits(st.ln_s.lo, st.ln_s_w.lo),
        }
    }
}

impl GradShared {
    fn new(st: &RowStats, j: usize, cot: &GradCotangents<'_>) -> GradShared {
        Self::with_row(st, j, cot, None, &GradSharedRow::new(st, cot))
    }

    /// [`GradShared::new`] with the row's part computed once (`row`:
    /// [`GradSharedRow::new`] of the same `st` and `cot`), `p_j`'s exp read
    /// from `ep` ([`RowBounds`]'s, the same bits) when given.
    #[inline(always)]
    fn with_row(
        st: &RowStats,
        j: usize,
        cot: &GradCotangents<'_>,
        ep: Option<&[Hi]>,
        row: &GradSharedRow,
    ) -> GradShared {
        let e = |used: bool, x: Option<&Interval>, ln_s: Interval| match x {
            Some(x) if used && x.hi > f64::NEG_INFINITY => (Hi(x.hi) - Lo(ln_s.lo)).exp(),
            _ => Hi::ZERO,
        };
        let GradSharedRow {
            g_used,
            h_used,
            same_ln,
        } = *row;
        let ind_t = cot.token == Some(j) && cot.g != 0.0;
        let mut ind_k = Hi::ZERO;
        let mut n_extra = usize::from(ind_t);
        for &(id, gk) in cot.topk {
            if gk != 0.0 && id == j {
                ind_k = ind_k + Hi(gk.abs());
                n_extra += 1;
            }
        }
        let ep = match ep.and_then(|ep| ep.get(j)) {
            Some(&ep) if g_used && st.d.get(j).is_some_and(|d| d.hi > f64::NEG_INFINITY) => ep,
            _ => e(g_used, st.d.get(j), st.ln_s),
        };
        // Without a sampling mask `q_j`'s exponent is `p_j`'s, bit for bit:
        // one exp.
        let same = g_used
            && matches!((st.d.get(j), st.e.get(j)), (Some(d), Some(e)) if bits(d.hi, e.hi))
            && same_ln;
        let eq = if same && h_used {
            ep
        } else {
            e(h_used, st.e.get(j), st.ln_s_w)
        };
        GradShared {
            ep,
            eq,
            ind: if ind_t {
                Hi(cot.g.abs()) + ind_k
            } else {
                ind_k
            },
            n_extra,
        }
    }
}

/// The per-entry sums of pass 1 (T4): `E1 = sum e^lw (e^alpha - 1)`, the
/// flush term `F`, the number of finite terms. They depend on the model
/// only through `a`, `b` and the flush threshold ([`Consts::same_shift`]).
#[derive(Clone, Copy, Debug)]
struct SetSums {
    e1: Hi,
    fl: Hi,
    n_fin: usize,
}

fn set_sums(c: &Consts, ds: &[Interval], ln_s: Interval, entries: Entries<'_>) -> SetSums {
    if let Entries::All(_) = entries {
        // The same sums as the entropy set's (`entropy_all`), bit for bit.
        return entropy_all(c, ds, ln_s.lo).set;
    }
    let (mut e1, mut fl, mut n_fin) = (Hi::ZERO, Hi::ZERO, 0usize);
    for (j, k) in entries.iter() {
        let d = &ds[j];
        if d.hi == f64::NEG_INFINITY {
            continue; // exp(-inf) = 0 exactly: the term adds nothing.
        }
        n_fin += k as usize;
        let lw = Hi(d.hi) - Lo(ln_s.lo);
        let alpha = c.a * mag(d) + c.b;
        e1 = e1 + times(k, w_expm1(lw, alpha));
        if (Hi(d.hi) + alpha).0 < c.ln_min_normal {
            fl = fl + times(k, (lw + alpha).exp());
        }
    }
    SetSums { e1, fl, n_fin }
}

/// The entries a per-entry sum visits: all of `0..V`, one by one, or
/// groups `(representative, size)` of entries with equal statistics.
#[derive(Clone, Copy, Debug)]
enum Entries<'g> {
    All(usize),
    Groups(&'g [(u32, u32)]),
}

impl<'g> Entries<'g> {
    /// `(j, count)`: entry `j` stands for `count` equal terms.
    fn iter(self) -> impl Iterator<Item = (usize, u32)> + 'g {
        let (n, g) = match self {
            Entries::All(n) => (n, &[][..]),
            Entries::Groups(g) => (0, g),
        };
        (0..n)
            .map(|j| (j, 1))
            .chain(g.iter().map(|&(j, k)| (j as usize, k)))
    }
}

/// `k t` rounded up (`t` itself for `k = 1`: the entry-by-entry sums are
/// those of [`RowBounds::new`]).
fn times(k: u32, t: Hi) -> Hi {
    if k == 1 {
        t
    } else {
        Hi(f64::from(k)) * t
    }
}

/// Per item, the index of the first item with the same `key` (its own
/// index when none before it has).
fn twins<T, K: PartialEq>(items: &[T], key: impl Fn(&T) -> K) -> Vec<usize> {
    let keys: Vec<K> = items.iter().map(key).collect();
    (0..keys.len())
        .map(|i| (0..i).find(|&k| keys[k] == keys[i]).unwrap_or(i))
        .collect()
}

/// Keys below this are grouped (`2^17`: a 16-bit logit and a mask bit).
const KEY_SPACE: usize = 1 << 17;

thread_local! {
    /// Per key, its group's index + 1 (0: none); reset after each use.
    static GROUP_OF: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Groups of the entries `0..V` with equal `keys[j]`, each `(first j,
/// size)`, when every member's `d_j` and `e_j` equal its first's and there
/// are at most `V / 4` groups; `None` otherwise (sum entry by entry).
fn group_entries(keys: &[u32], d: &[Interval], e: &[Interval]) -> Option<Vec<(u32, u32)>> {
    let v = d.len();
    if keys.len() != v || e.len() != v || v < 64 || u32::try_from(v).is_err() {
        return None;
    }
    GROUP_OF.with(|t| {
        let mut table = t.borrow_mut();
        table.resize(KEY_SPACE, 0);
        let mut groups: Vec<(u32, u32)> = Vec::new();
        let mut ok = true;
        for (j, &key) in keys.iter().enumerate() {
            let Some(slot) = table.get_mut(key as usize) else {
                ok = false;
                break;
            };
            if *slot == 0 {
                groups.push((j as u32, 1));
                *slot = groups.len() as u32;
                if groups.len() > v / 4 {
                    ok = false;
                    break;
                }
            } else {
                let g = &mut groups[*slot as usize - 1];
                let r = g.0 as usize;
                if d[j] != d[r] || e[j] != e[r] {
                    ok = false;
                    break;
                }
                g.1 += 1;
            }
        }
        for &(j, _) in &groups {
            table[keys[j as usize] as usize] = 0;
        }
        ok.then_some(groups)
    })
}

/// Pass 1 over one logit set (T4-T6): `theta_S`, `delta_ell`, `err(lse)`.
fn set_bounds(
    c: &Consts,
    model: &Model,
    ds: &[Interval],
    ln_s: Interval,
) -> Result<SetBounds, NoBound> {
    set_finish(
        c,
        model,
        set_sums(c, ds, ln_s, Entries::All(ds.len())),
        ln_s,
    )
}

/// [`set_bounds`] from its per-entry sums.
fn set_finish(
    c: &Consts,
    model: &Model,
    sums: SetSums,
    ln_s: Interval,
) -> Result<SetBounds, NoBound> {
    let k_s = c.k_s.clone()?;
    let SetSums { e1, fl, n_fin } = sums;
    let n = Hi(n_fin as f64);
    // (T4) theta_S = (K_S - 1) + K_S (E1 + F) + floor_S (S >= 1: the argmax term is e^0).
    let floor_s = n * Hi((c.n_s + 2) as f64) * c.eta + n * c.eta_sub * k_s;
    let theta_s = finite((k_s - Lo(1.0)) + k_s * (e1 + fl) + floor_s, "theta_S")?;
    if theta_s.0.is_nan() || theta_s.0 >= 1.0 {
        return Err(NoBound::SumUnbounded { theta: theta_s.0 });
    }
    // (T5) delta_ell = -ln(1 - theta_S) + log_ulps ulp_acc(ln S + -ln(1 - theta_S)).
    let nl_theta = theta_s.neg_ln_1m();
    let delta_ell = nl_theta + c.log_ulps * Hi(c.acc.ulp((Hi(ln_s.hi) + nl_theta).0));
    // (T6) raw kernels subtract lse = z_max + ln S, rounded.
    let lse_err = match model.shift {
        Shift::Raw => {
            let lse_abs = (Hi::ONE + c.t_div) * c.z + Hi(ln_s.hi) + delta_ell;
            c.t_div * c.z + delta_ell + half_ulp(c.acc, lse_abs)
        }
        _ => delta_ell,
    };
    Ok(SetBounds {
        ln_s,
        theta_s,
        nl_theta,
        delta_ell: finite(delta_ell, "delta_ell")?,
        lse_err: finite(lse_err, "lse")?,
    })
}

/// The model-independent per-entry sums over `w` (T4 for the entropy set,
/// T11), and `e^lw` of every finite entry for the log-softmax walk.
struct EntropyShared {
    set: SetSums,
    e2: Hi,
    fl2: Hi,
    sd: Hi,
    /// `e^lw_j` (upward) of the finite entries (or groups), in order.
    ew: Vec<Hi>,
}

fn entropy_shared(c: &Consts, st: &RowStats, entries: Entries<'_>) -> EntropyShared {
    match entries {
        Entries::All(_) => entropy_shared_all(c, st),
        Entries::Groups(_) => entropy_shared_groups(c, st, entries),
    }
}

/// One lane's share of [`EntropyShared`]'s sums over every entry
/// ([`entropy_shared_all`]): the entries `j` with `j % 4` its lane.
#[derive(Clone, Copy, Debug)]
pub(super) struct EntropyPart {
    pub e1: Hi,
    pub fl: Hi,
    pub e2: Hi,
    pub fl2: Hi,
    pub sd: Hi,
}

impl EntropyPart {
    const ZERO: EntropyPart = EntropyPart {
        e1: Hi::ZERO,
        fl: Hi::ZERO,
        e2: Hi::ZERO,
        fl2: Hi::ZERO,
        sd: Hi::ZERO,
    };
}

/// [`entropy_shared`] entry by entry (no groups): `e^lw_j` of every
/// finite entry first (one libm `exp` each), then the sums in four
/// partial sums, entry `j` into part `j % 4`, added as `(p0 + p1) + (p2 +
/// p3)` (upward: any order bounds the sum from above). The parts come
/// from [`lanes::entropy4`] (four entries a vector, the same bits) when
/// the CPU has the lanes; `expm1(alpha_j)` from [`ExpM1Base::exp_m1`] at
/// the base `b` (T3's `alpha_j = a |d_j| + b >= b`).
fn entropy_shared_all(c: &Consts, st: &RowStats) -> EntropyShared {
    entropy_all(c, &st.e, st.ln_s_w.lo)
}

/// [`entropy_shared_all`] over the shifts `es` `[V]` of a set with `ln S
/// >= ln_s_lo` (also [`set_sums`]' `E1`, `F` of any set, entry by entry).
fn entropy_all(c: &Consts, es: &[Interval], ln_s_lo: f64) -> EntropyShared {
    let ew: Vec<Hi> = es
        .iter()
        .filter(|e| e.hi != f64::NEG_INFINITY)
        .map(|e| (Hi(e.hi) - Lo(ln_s_lo)).exp())
        .collect();
    let base = ExpM1Base::new(c.b);
    let mut parts = [EntropyPart::ZERO; 4];
    let (from, i) = lanes::entropy4(c, es, ln_s_lo, &ew, &base, &mut parts).unwrap_or((0, 0));
    entropy_parts(c, es, ln_s_lo, &ew, &base, from, i, &mut parts);
    let sum =
        |f: fn(&EntropyPart) -> Hi| (f(&parts[0]) + f(&parts[1])) + (f(&parts[2]) + f(&parts[3]));
    EntropyShared {
        set: SetSums {
            e1: sum(|p| p.e1),
            fl: sum(|p| p.fl),
            n_fin: ew.len(),
        },
        e2: sum(|p| p.e2),
        fl2: sum(|p| p.fl2),
        sd: sum(|p| p.sd),
        ew,
    }
}

/// The entries `j >= from` of [`entropy_all`] into `parts`, `i`
/// the index in `ew` of the first finite one.
#[allow(clippy::too_many_arguments)]
fn entropy_parts(
    c: &Consts,
    es: &[Interval],
    ln_s_lo: f64,
    ew: &[Hi],
    base: &ExpM1Base,
    from: usize,
    mut i: usize,
    parts: &mut [EntropyPart; 4],
) {
    let ln_s_lo = Lo(ln_s_lo);
    for (j, e) in es.iter().enumerate().skip(from) {
        if e.hi == f64::NEG_INFINITY {
            continue;
        }
        let elw = ew[i];
        i += 1;
        let d_abs = mag(e);
        let lw = Hi(e.hi) - ln_s_lo;
        let alpha = c.a * d_abs + c.b;
        // w_expm1(lw, alpha), with e^lw computed once.
        let wm = if alpha.0 <= 1.0 {
            elw * base.exp_m1(alpha)
        } else {
            (lw + alpha).exp()
        };
        let p = &mut parts[j % 4];
        p.e1 = p.e1 + wm;
        p.e2 = p.e2 + d_abs * wm;
        p.sd = p.sd + d_abs;
        if (Hi(e.hi) + alpha).0 < c.ln_min_normal {
            let we = (lw + alpha).exp();
            p.fl = p.fl + we;
            p.fl2 = p.fl2 + d_abs * we;
        }
    }
}

/// [`entropy_shared`] over groups of equal entries, one term a group
/// times its size.
fn entropy_shared_groups(c: &Consts, st: &RowStats, entries: Entries<'_>) -> EntropyShared {
    let ln_s = st.ln_s_w;
    let (mut e1, mut fl, mut e2, mut fl2, mut sd) =
        (Hi::ZERO, Hi::ZERO, Hi::ZERO, Hi::ZERO, Hi::ZERO);
    let mut ew = Vec::with_capacity(st.e.len());
    let mut n_fin = 0usize;
    for (j, k) in entries.iter() {
        let e = &st.e[j];
        if e.hi == f64::NEG_INFINITY {
            continue;
        }
        n_fin += k as usize;
        let d_abs = mag(e);
        let lw = Hi(e.hi) - Lo(ln_s.lo);
        let alpha = c.a * d_abs + c.b;
        let elw = lw.exp();
        ew.push(elw);
        // w_expm1(lw, alpha), with e^lw computed once.
        let wm = if alpha.0 <= 1.0 {
            elw * alpha.exp_m1()
        } else {
            (lw + alpha).exp()
        };
        e1 = e1 + times(k, wm);
        e2 = e2 + times(k, d_abs * wm);
        sd = sd + times(k, d_abs);
        if (Hi(e.hi) + alpha).0 < c.ln_min_normal {
            let we = (lw + alpha).exp();
            fl = fl + times(k, we);
            fl2 = fl2 + times(k, d_abs * we);
        }
    }
    EntropyShared {
        set: SetSums { e1, fl, n_fin },
        e2,
        fl2,
        sd,
        ew,
    }
}

/// The log-softmax entropy sums (T12, T13) of one model.
#[derive(Clone, Copy, Debug)]
struct LsSums {
    s_dem: Hi,
    s_em: Hi,
    s_lam: Hi,
    fl_d: Hi,
    fl_1: Hi,
    sdl: Hi,
}

impl LsSums {
    const ZERO: LsSums = LsSums {
        s_dem: Hi::ZERO,
        s_em: Hi::ZERO,
        s_lam: Hi::ZERO,
        fl_d: Hi::ZERO,
        fl_1: Hi::ZERO,
        sdl: Hi::ZERO,
    };
}

/// A model's `lambda_j` on set `w` (T9) as `k |d_j| + b`, for the
/// entropy walks: `lambda_j = (a_lp |d_j| + b_lp + lse_err)(1 + u) + u
/// (|d_j| + ln S)` ([`Consts::lambda`]) is affine in `|d_j|` with nonnegative coefficients, so
/// `k >= a_lp (1 + u) + u` and `b >= (b_lp + lse_err)(1 + u) + u ln S`,
/// each rounded up once a row, give an upper bound in two upward
/// operations an entry (never below [`Consts::lambda`]'s real value).
#[derive(Clone, Copy, Debug)]
struct LambdaAffine {
    k: Hi,
    b: Hi,
}

impl LambdaAffine {
    fn new(c: &Consts, w: &SetBounds) -> LambdaAffine {
        let one_u = Hi::ONE + c.u;
        LambdaAffine {
            k: c.a_lp * one_u + c.u,
            b: (c.b_lp + w.lse_err) * one_u + c.u * Hi(w.ln_s.hi),
        }
    }

    /// `lambda_j` of an entry with `|d_j| <= d_abs`, rounded up.
    #[inline]
    fn at(&self, d_abs: Hi) -> Hi {
        self.k * d_abs + self.b
    }

    /// The base for [`ExpM1Base::exp_m1`]: `b`, which every [`Self::at`]
    /// is at least (the upward operations are monotone, `|d| >= 0`).
    fn base(&self) -> ExpM1Base {
        ExpM1Base::new(self.b)
    }
}

/// One walk over `w` for every model's [`LsSums`] (models without a
/// bound for `w` get zeros, unused). Entry by entry (no groups): the
/// plain entries through the row's moments ([`moments`], (T12m)), the
/// others one by one, four models at a time in one vector's lanes where
/// the CPU has them ([`lanes::sums4`], the same bits).
fn logsoftmax_sums(
    cs: &[Consts],
    ws: &[Result<SetBounds, NoBound>],
    st: &RowStats,
    sh: &EntropyShared,
    entries: Entries<'_>,
) -> Vec<LsSums> {
    let ell = Hi(st.ln_s_w.hi);
    let affs: Vec<Option<(LambdaAffine, ExpM1Base)>> = cs
        .iter()
        .zip(ws)
        .map(|(c, w)| {
            let a = LambdaAffine::new(c, w.as_ref().ok()?);
            Some((a, a.base()))
        })
        .collect();
    let Entries::All(_) = entries else {
        let mut out = vec![LsSums::ZERO; cs.len()];
        let mut i = 0usize;
        for (j, k) in entries.iter() {
            let e = &st.e[j];
            if e.hi == f64::NEG_INFINITY {
                continue;
            }
            let elw = sh.ew[i];
            i += 1;
            for ((c, o), aff) in cs.iter().zip(out.iter_mut()).zip(&affs) {
                if let Some((aff, base)) = aff {
                    entry_terms(o, c, aff, base, st, e, elw, k);
                }
            }
        }
        return out;
    };
    // Each model's cut of its own ([`moments::PlainCut::of`]), one walk of
    // the row a distinct cut: a model's sums do not depend on the models
    // it is built with (the same bits as built alone).
    let cuts: Vec<Option<moments::PlainCut>> = affs
        .iter()
        .zip(cs)
        .map(|(a, c)| a.map(|(a, b)| moments::PlainCut::of(&(a, b, c.ln_min_normal), ell.0)))
        .collect();
    // (cut, its moments, its exceptions `(j, i)`)
    type Walk = (moments::PlainCut, moments::Moments, Vec<(usize, usize)>);
    let mut walks: Vec<Walk> = Vec::new();
    for cut in cuts.iter().flatten() {
        if !walks.iter().any(|w| w.0.same(cut)) {
            let mut exc = Vec::new();
            let mo = moments::moments(st, &sh.ew, *cut, &mut exc);
            walks.push((*cut, mo, exc));
        }
    }
    let walk_of = |i: usize| {
        let cut = cuts[i].as_ref()?;
        walks.iter().find(|w| w.0.same(cut))
    };
    let per = entries_one_by_one(cs, ws, &affs, st, &sh.ew, |i| {
        walk_of(i).map_or(&[][..], |w| &w.2[..])
    });
    let mut out = vec![LsSums::ZERO; cs.len()];
    for (i, (o, x)) in out.iter_mut().zip(per).enumerate() {
        let (Some((aff, base)), Some((_, mo, exc))) = (&affs[i], walk_of(i)) else {
            continue;
        };
        *o = if mo.is_empty() {
            x
        } else if exc.is_empty() {
            mo.sums(aff, base, ell)
        } else {
            let m = mo.sums(aff, base, ell);
            // Plain entries add exactly 0 to the flush sums.
            LsSums {
                s_dem: m.s_dem + x.s_dem,
                s_em: m.s_em + x.s_em,
                s_lam: m.s_lam + x.s_lam,
                fl_d: x.fl_d,
                fl_1: x.fl_1,
                sdl: m.sdl + x.sdl,
            }
        };
    }
    out
}

/// Each model's (with a bound for `w`) [`LsSums`] over the finite
/// entries `at(model)` (`(j, i)`: column `j`, `ew[i]` its `e^lw`), entry by
/// entry: four models a vector where the CPU has the lanes and the models
/// of a chunk share their list ([`lanes::sums4`], the same bits as one by
/// one). Zeros for the other models.
fn entries_one_by_one<'x>(
    cs: &[Consts],
    ws: &[Result<SetBounds, NoBound>],
    affs: &[Option<(LambdaAffine, ExpM1Base)>],
    st: &RowStats,
    ew: &[Hi],
    at: impl Fn(usize) -> &'x [(usize, usize)],
) -> Vec<LsSums> {
    let mut per = vec![LsSums::ZERO; cs.len()];
    let idx: Vec<usize> = (0..cs.len())
        .filter(|&i| affs[i].is_some() && !at(i).is_empty())
        .collect();
    // Chunks of up to four models with the same list.
    let mut chunks: Vec<Vec<usize>> = Vec::new();
    for &i in &idx {
        match chunks
            .iter_mut()
            .find(|c| c.len() < 4 && std::ptr::eq(at(c[0]), at(i)))
        {
            Some(c) => c.push(i),
            None => chunks.push(vec![i]),
        }
    }
    for chunk in chunks {
        let list = at(chunk[0]);
        let c4: Vec<&Consts> = chunk.iter().map(|&i| &cs[i]).collect();
        let w4: Vec<SetBounds> = chunk
            .iter()
            .filter_map(|&i| ws[i].as_ref().ok().copied())
            .collect();
        if let Some(l) = lanes::sums4(&c4, &w4, st, ew, list) {
            for (&i, s) in chunk.iter().zip(l) {
                per[i] = s;
            }
            continue;
        }
        for &(j, i) in list {
            for &m in &chunk {
                if let Some((aff, base)) = &affs[m] {
                    entry_terms(&mut per[m], &cs[m], aff, base, st, &st.e[j], ew[i], 1);
                }
            }
        }
    }
    per
}

/// Adds entry `e`'s terms (it stands for `k` equal ones; `elw` its
/// `e^lw`) to one model's [`LsSums`] `o`: the entry-by-entry walk of
/// (T12), (T13).
#[allow(clippy::too_many_arguments)]
#[inline]
fn entry_terms(
    o: &mut LsSums,
    c: &Consts,
    aff: &LambdaAffine,
    base: &ExpM1Base,
    st: &RowStats,
    e: &Interval,
    elw: Hi,
    k: u32,
) {
    let ell = Hi(st.ln_s_w.hi);
    let d_abs = mag(e);
    let lw = Hi(e.hi) - Lo(st.ln_s_w.lo);
    let dl = d_abs + ell;
    let lam = aff.at(d_abs);
    let (wl, wel) = if lam.0 <= 1.0 {
        let em = base.exp_m1(lam);
        (elw * em, elw * (Hi::ONE + em))
    } else {
        ((lw + lam).exp(), (lw + lam).exp())
    };
    o.s_dem = o.s_dem + times(k, dl * wl);
    o.s_em = o.s_em + times(k, wl);
    o.s_lam = o.s_lam + times(k, wel * lam);
    o.sdl = if k == 1 {
        o.sdl + (dl + lam)
    } else {
        o.sdl + times(k, dl + lam)
    };
    if (lw + lam).0 < c.ln_min_normal {
        o.fl_d = o.fl_d + times(k, dl * wel);
        o.fl_1 = o.fl_1 + times(k, wel);
    }
}

/// Entropy errors (T11-T13): the one the model's form needs before the
/// final rounding, and the one a gradient may see. One model's case of
/// the shared walks ([`entropy_shared`], [`logsoftmax_sums`]): the same
/// bits as that model's bounds built together with others.
fn entropy_errors(
    c: &Consts,
    model: &Model,
    st: &RowStats,
    ws: &SetBounds,
) -> (Result<Hi, NoBound>, Result<Hi, NoBound>) {
    let entries = Entries::All(st.e.len());
    let sh = entropy_shared(c, st, entries);
    let ls = logsoftmax_sums(std::slice::from_ref(c), &[Ok(*ws)], st, &sh, entries);
    entropy_finish(c, model, st, ws, &sh, &ls[0])
}

/// [`entropy_errors`] from the shared and per-model sums.
fn entropy_finish(
    c: &Consts,
    model: &Model,
    st: &RowStats,
    ws: &SetBounds,
    sh: &EntropyShared,
    ls: &LsSums,
) -> (Result<Hi, NoBound>, Result<Hi, NoBound>) {
    let r_hi = Hi(st.r.hi);
    let ell = Hi(ws.ln_s.hi);
    let h_hi = r_hi + ell;
    let SetSums { e1, fl, n_fin } = sh.set;
    let (e2, fl2, sd) = (sh.e2, sh.fl2, sh.sd);
    let LsSums {
        s_dem,
        s_em,
        s_lam,
        fl_d,
        fl_1,
        sdl,
    } = *ls;
    let n = Hi(n_fin as f64);
    // (T11) fused: Delta R_B, then E_R = [R (2u + u^2 + theta) + Delta R_B (1+u)^2] / (1 - theta).
    let fused = c.k_b.clone().and_then(|k_b| {
        let kb1 = k_b * (Hi::ONE + c.a);
        let floor_b =
            n * Hi((c.n_b + 3) as f64) * c.eta + c.eta_sub * k_b * ((Hi::ONE + c.a) * sd + n * c.b);
        let dr_b =
            kb1 * (e2 + fl2) + (kb1 - Lo(1.0)) * r_hi + k_b * c.b * (Hi::ONE + e1 + fl) + floor_b;
        let u2 = (Hi::ONE + c.u) * (Hi::ONE + c.u);
        let e_r = (r_hi * ((u2 - Lo(1.0)) + ws.theta_s) + dr_b * u2) / (Lo(1.0) - ws.theta_s);
        let pre = match c.shift {
            Shift::Raw => {
                let omega = c.omega.clone()?;
                let mu_abs = c.z * (Hi::ONE + omega) + r_hi + e_r;
                ws.lse_err + c.z * omega + e_r + half_ulp(c.acc, mu_abs)
            }
            _ => ws.delta_ell + e_r,
        };
        finite(pre, "entropy (fused form)")
    });
    // (T12) log-softmax form, and (T13) its `lp + 1` variant for gradients.
    let logsoftmax = c.k_p.clone().and_then(|(k_p, k_p1)| {
        let floor = |k: usize, extra: Hi| {
            n * Hi((c.n_p + k) as f64) * c.eta + c.eta_sub * k_p1 * (sdl + extra)
        };
        let dh = k_p * (s_dem + fl_d) + (k_p - Lo(1.0)) * h_hi + k_p * s_lam + floor(3, Hi::ZERO);
        let dh1 = k_p1 * (s_dem + s_em + fl_d + fl_1)
            + (k_p1 - Lo(1.0)) * (h_hi + Hi::ONE)
            + k_p1 * s_lam
            + floor(4, n);
        Ok((
            finite(dh, "entropy (log-softmax form)")?,
            finite(dh1, "entropy (autograd form)")?,
        ))
    });
    let pre = match model.entropy_form {
        EntropyForm::Fused => fused.clone(),
        EntropyForm::LogSoftmax => logsoftmax.clone().map(|(dh, _)| dh),
        EntropyForm::Any => fused.clone().and_then(|f| Ok(f.max(logsoftmax.clone()?.0))),
    };
    let any = fused.and_then(|f| {
        let (dh, dh1) = logsoftmax?;
        let a = f.max(dh);
        Ok((a + half_ulp(c.acc, h_hi + a)).max(dh1))
    });
    (pre, any)
}

/// The per-entry sums the smoothed row-loss bound (T17) needs, the same
/// for every summation model: one O(V) pass per row
/// ([`LossSums::of`]), then each model's bound is O(1)
/// ([`RowBounds::loss_row_with`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LossSums {
    /// `|A|`: the allowed entries `j < V`.
    pub count: usize,
    /// Upper bound (nats) of `sum_{j in A} |d_j|`.
    pub sum_abs_d: f64,
    /// An allowed entry is `-inf` (the smoothed loss is `+inf`).
    pub infinite: bool,
}

impl LossSums {
    /// The sums over the allowed entries (`allowed(j)`, `j < V`) of a
    /// row's statistics `d [V]`.
    pub fn of(stats: &RowStats, allowed: impl Fn(usize) -> bool) -> LossSums {
        let mut out = LossSums::default();
        let mut sum = Hi::ZERO;
        for (j, d) in stats.d.iter().enumerate() {
            if !allowed(j) {
                continue;
            }
            if d.hi == f64::NEG_INFINITY {
                out.infinite = true;
                return out;
            }
            sum = sum + mag(d);
            out.count += 1;
        }
        out.sum_abs_d = sum.0;
        out
    }
}

/// One row's cross-entropy loss in the accumulation dtype, as the
/// reduction bound ([`loss_bounds`]) takes it (T17).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossRowBound {
    /// Bound (nats) on `|l^ - l|` of the accumulation-dtype row loss
    /// (every rounding included, the last one too).
    pub err: f64,
    /// Upper bound (nats) on `|l|`.
    pub mag: f64,
    /// The exact row loss is `+inf` (a `-inf` logit among the smoothed
    /// entries with `eps > 0`): only `+inf` is right.
    pub infinite: bool,
}

impl RowBounds<'_> {
    /// Bound of the cross-entropy row loss
    /// `l = (1 - eps)(-lp_t) + eps mean_{j in A}(-lp_j)` in the accumulation
    /// dtype (TOLERANCE.md (T17)): each `lp_j` a rounded log-softmax entry
    /// with error `lambda_j` (T9), their sum over the row by a pairwise sum
    /// of depth `pairwise_depth(V)` ([`logprobe_kernels::pairwise_depth`]),
    /// one division by `|A|`, then `1 - eps`, two products and an addition
    /// (`gamma_4`). `eps` as the computation takes it (rounded to the
    /// accumulation dtype); `allowed(j)`: entry `j < V` allowed by the
    /// sampling mask.
    ///
    /// # Errors
    /// [`NoBound`] when the model certifies nothing for this row or it has
    /// no target.
    pub fn loss_row(
        &self,
        eps: f64,
        allowed: impl Fn(usize) -> bool,
    ) -> Result<LossRowBound, NoBound> {
        let sums = if eps == 0.0 {
            LossSums::default()
        } else {
            LossSums::of(self.stats, allowed)
        };
        self.loss_row_with(eps, &sums)
    }

    /// [`RowBounds::loss_row`] from the row's [`LossSums`] (computed once
    /// for every model; unused when `eps = 0`).
    ///
    /// # Errors
    /// As [`RowBounds::loss_row`].
    pub fn loss_row_with(&self, eps: f64, sums: &LossSums) -> Result<LossRowBound, NoBound> {
        let set = self.p.as_ref().map_err(Clone::clone)?;
        let d_t = self.stats.d_t.ok_or(NoBound::MissingStatistic {
            what: "d_t (no target)",
        })?;
        let ln_s = Hi(set.ln_s.hi);
        let lam = |d: &Interval| self.c.lambda(set, mag(d));
        let nll_err = lam(&d_t);
        let nll_abs = mag(&d_t) + ln_s;
        if eps == 0.0 {
            return Ok(LossRowBound {
                err: finite(nll_err, "loss")?.0,
                mag: nll_abs.0,
                infinite: false,
            });
        }
        let v = self.stats.d.len();
        if sums.infinite {
            return Ok(LossRowBound {
                err: 0.0,
                mag: f64::INFINITY,
                infinite: true,
            });
        }
        let count = sums.count;
        let (sum_d, n_a) = (Hi(sums.sum_abs_d), Hi(count as f64));
        let s_err = self.c.lambda_sum(set, sum_d, n_a);
        let s_abs = sum_d + n_a * ln_s;
        let u = self.c.u;
        let g_sum = gamma(logprobe_kernels::pairwise_depth(v), u.0)?;
        let e_s = s_err + g_sum * (s_abs + s_err);
        let n = Lo(count.max(1) as f64);
        let mean_abs = s_abs / n;
        let e_m = (e_s / n) * (Hi::ONE + u) + u * (mean_abs + e_s / n);
        let g4 = gamma(4, u.0)?;
        let one_minus = Hi(1.0 - eps) + Hi(f64::EPSILON);
        let err = one_minus * nll_err + Hi(eps) * e_m + g4 * (nll_abs + nll_err + mean_abs + e_m);
        Ok(LossRowBound {
            err: finite(err, "loss")?.0,
            mag: (nll_abs + mean_abs).0,
            infinite: false,
        })
    }
}

/// Bounds (nats) of the cross-entropy `loss` for a candidate in `out`
/// (TOLERANCE.md (T17)): `[N]` under `none`, one under `sum` / `mean`.
/// `rows[r]` is row `r`'s [`LossRowBound`] (ignored for rows
/// not `counted`), `weights` the `loss_weights` (1 without), `divisor_lo` a
/// lower bound of the exact `mean` divisor (the oracle's
/// [`logprobe_reference::oracle::OracleLoss::divisor`]), `acc` the
/// accumulation dtype. A row of weight `w != 1` adds `gamma_2` (its weight
/// rounded to `acc`, the product); the reduction is a pairwise sum over
/// `N` rows (`gamma_D`, `D = pairwise_depth(N)`), the `mean`'s weighted
/// divisor another, then one division; the final roundings as (T8). An
/// exact `+inf` (or the all-ignored mean's declared value) has bound 0:
/// only that value is right.
pub fn loss_bounds(
    rows: &[Result<LossRowBound, NoBound>],
    counted: &[bool],
    weights: Option<&[f64]>,
    reduction: logprobe_reference::spec::Reduction,
    divisor_lo: f64,
    acc: Dtype,
    out: Dtype,
) -> Vec<ErrorBound> {
    use logprobe_reference::spec::Reduction;
    let u = acc.unit_roundoff();
    let none = |reason: NoBound| ErrorBound::None { reason };
    let finish = |pre: Hi, m: Hi| -> ErrorBound {
        let y1 = pre + m;
        let r1 = half_ulp(acc, y1);
        let mut total = pre + r1;
        if out.precision() < acc.precision() {
            total = total + half_ulp(out, y1 + r1);
        }
        match finite(total, "loss") {
            Ok(t) => ErrorBound::Abs(t.0),
            Err(reason) => none(reason),
        }
    };
    let g2 = gamma(2, u);
    // Per row: Ok(Some((err, mag))) finite, Ok(None) exactly +inf.
    let terms: Vec<Result<Option<(Hi, Hi)>, NoBound>> = (0..rows.len())
        .map(|r| {
            let w = weights.map_or(1.0, |w| w[r]);
            if !counted[r] || w == 0.0 {
                return Ok(Some((Hi::ZERO, Hi::ZERO)));
            }
            let b = rows[r].clone()?;
            if b.infinite {
                return Ok(None);
            }
            let (e, m) = (Hi(b.err), Hi(b.mag));
            if w == 1.0 {
                Ok(Some((e, m)))
            } else {
                let g2 = g2.clone()?;
                let w = Hi(w);
                Ok(Some((w * (e + g2 * (m + e)), w * m)))
            }
        })
        .collect();
    match reduction {
        Reduction::None => terms
            .into_iter()
            .map(|t| match t {
                Ok(Some((e, m))) if e.0 == 0.0 && m.0 == 0.0 => ErrorBound::Abs(0.0),
                Ok(Some((e, m))) => finish(e, m),
                Ok(None) => ErrorBound::Abs(0.0),
                Err(reason) => none(reason),
            })
            .collect(),
        Reduction::Sum | Reduction::Mean => {
            let (mut e_sum, mut m_sum, mut inf) = (Hi::ZERO, Hi::ZERO, false);
            for t in terms {
                match t {
                    Ok(Some((e, m))) => {
                        e_sum = e_sum + e;
                        m_sum = m_sum + m;
                    }
                    Ok(None) => inf = true,
                    Err(reason) => return vec![none(reason)],
                }
            }
            let n_counted = counted.iter().filter(|&&c| c).count();
            let all_ignored =
                reduction == Reduction::Mean && (divisor_lo.is_nan() || divisor_lo <= 0.0);
            if inf || all_ignored {
                return vec![ErrorBound::Abs(0.0)];
            }
            if n_counted == 0 {
                return vec![ErrorBound::Abs(0.0)];
            }
            let g_rows = match gamma(logprobe_kernels::pairwise_depth(rows.len()), u) {
                Ok(g) => g,
                Err(reason) => return vec![none(reason)],
            };
            let e_s = e_sum + g_rows * (m_sum + e_sum);
            if reduction == Reduction::Sum {
                return vec![finish(e_s, m_sum)];
            }
            // S^ / D^ with D^ = D (1 + theta), |theta| <= delta_D:
            // |S^/D^ - S/D| <= (E_S + |S| delta_D) / (D (1 - delta_D)).
            let delta_d = if weights.is_some() { g_rows } else { Hi::ZERO };
            if delta_d.0 >= 1.0 {
                return vec![none(NoBound::NonFinite {
                    what: "loss divisor",
                })];
            }
            let e_q = (e_s + m_sum * delta_d) / Lo(divisor_lo) / (Lo(1.0) - delta_d);
            vec![finish(e_q, m_sum / Lo(divisor_lo))]
        }
    }
}
