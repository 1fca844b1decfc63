//! Owned problem and cotangent data (what a recipe expands to), and the
//! cotangent recipe.

use half::{bf16, f16};
use ndarray::{Array1, Array2};

use logprobe_reference::spec::{
    Cotangents, Dtype, Logits, LogitsMut, Options, Output, PolicyTerm, Problem,
};
use logprobe_reference::splitmix::SplitMix64;

use super::*;

/// Logits owned in their dtype, `[N, V_total]`.
#[derive(Clone, Debug, PartialEq)]
pub enum OwnedLogits {
    /// binary64.
    F64(Array2<f64>),
    /// binary32.
    F32(Array2<f32>),
    /// bfloat16.
    Bf16(Array2<bf16>),
    /// binary16.
    F16(Array2<f16>),
}

impl OwnedLogits {
    /// Converts f64 values that are exactly representable in `dtype` (NaN and
    /// infinities included) into `dtype`; exact.
    pub fn from_f64(dtype: Dtype, x: &Array2<f64>) -> Self {
        match dtype {
            Dtype::F64 => OwnedLogits::F64(x.clone()),
            Dtype::F32 => OwnedLogits::F32(x.mapv(|v| v as f32)),
            Dtype::Bf16 => OwnedLogits::Bf16(x.mapv(|v| bf16::from_f32(v as f32))),
            Dtype::F16 => OwnedLogits::F16(x.mapv(f16::from_f64)),
        }
    }

    /// A borrowed view.
    pub fn view(&self) -> Logits<'_> {
        match self {
            OwnedLogits::F64(a) => Logits::F64(a.view()),
            OwnedLogits::F32(a) => Logits::F32(a.view()),
            OwnedLogits::Bf16(a) => Logits::Bf16(a.view()),
            OwnedLogits::F16(a) => Logits::F16(a.view()),
        }
    }

    /// A mutable view (for the in-place backward).
    pub fn view_mut(&mut self) -> LogitsMut<'_> {
        match self {
            OwnedLogits::F64(a) => LogitsMut::F64(a.view_mut()),
            OwnedLogits::F32(a) => LogitsMut::F32(a.view_mut()),
            OwnedLogits::Bf16(a) => LogitsMut::Bf16(a.view_mut()),
            OwnedLogits::F16(a) => LogitsMut::F16(a.view_mut()),
        }
    }

    /// The values as exact f64, `[N, V_total]`.
    pub fn to_f64(&self) -> Array2<f64> {
        match self {
            OwnedLogits::F64(a) => a.clone(),
            OwnedLogits::F32(a) => a.mapv(|v| v as f64),
            OwnedLogits::Bf16(a) => a.mapv(|v| v.to_f64()),
            OwnedLogits::F16(a) => a.mapv(|v| v.to_f64()),
        }
    }

    /// The dtype.
    pub fn dtype(&self) -> Dtype {
        self.view().dtype()
    }

    /// Whether both hold the same bits (NaN payloads included).
    pub fn bits_eq(&self, other: &OwnedLogits) -> bool {
        match (self, other) {
            (OwnedLogits::F64(a), OwnedLogits::F64(b)) => {
                a.shape() == b.shape() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            }
            (OwnedLogits::F32(a), OwnedLogits::F32(b)) => {
                a.shape() == b.shape() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            }
            (OwnedLogits::Bf16(a), OwnedLogits::Bf16(b)) => {
                a.shape() == b.shape() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            }
            (OwnedLogits::F16(a), OwnedLogits::F16(b)) => {
                a.shape() == b.shape() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            }
            _ => false,
        }
    }

    /// Size of the buffer in bytes.
    pub fn size_bytes(&self) -> usize {
        let (n, v) = self.view().dim();
        n * v * self.dtype().size_bytes()
    }
}

/// An owned problem, built from a [`ProblemRecipe`]; [`ProblemData::problem`]
/// borrows it as the spec's [`Problem`].
#[derive(Clone, Debug, PartialEq)]
pub struct ProblemData {
    /// Logits `[N, V_total]`.
    pub logits: OwnedLogits,
    /// Tokens `[N]`.
    pub tokens: Option<Array1<i64>>,
    /// Sampling mask `[N, V_total]` (`true` = allowed).
    pub sampling_mask: Option<Array2<bool>>,
    /// Top-k ids `[N, K]`.
    pub topk_ids: Option<Array2<i64>>,
    /// The teacher's log-probs `[N, K]` of the top-k KL (read when
    /// `options.topk_kl` is `Some`).
    pub teacher_topk_log_probs: Option<Array2<f64>>,
    /// The teacher's probabilities `[N, V_total]` of `soft_cross_entropy`.
    pub teacher_probs: Option<Array2<f64>>,
    /// Per-row weights `[N]` of the cross-entropy `loss` (read when
    /// `options.loss` is `Some`).
    pub loss_weights: Option<Array1<f64>>,
    /// `ref_log_probs [N]`, `old_log_probs [N]` of the policy terms.
    pub policy: [Option<Array1<f64>>; 2],
    /// Options.
    pub options: Options,
}

impl ProblemData {
    /// The borrowed problem.
    pub fn problem(&self) -> Problem<'_> {
        Problem {
            logits: self.logits.view(),
            tokens: self.tokens.as_ref().map(|t| t.view()),
            sampling_mask: self.sampling_mask.as_ref().map(|m| m.view()),
            topk_ids: self.topk_ids.as_ref().map(|k| k.view()),
            policy: logprobe_reference::spec::PolicyInputs {
                ref_log_probs: self.policy[0].as_ref().map(|a| a.view()),
                old_log_probs: self.policy[1].as_ref().map(|a| a.view()),
            },
            teacher_topk_log_probs: self.teacher_topk_log_probs.as_ref().map(|k| k.view()),
            teacher_probs: self.teacher_probs.as_ref().map(|k| k.view()),
            options: self.options,
            loss_weights: self.loss_weights.as_ref().map(|w| w.view()),
        }
    }

    /// Rows `N`.
    pub fn n(&self) -> usize {
        self.logits.view().dim().0
    }

    /// Real vocabulary size `V`.
    pub fn vocab_size(&self) -> usize {
        self.options
            .vocab_size
            .unwrap_or(self.logits.view().dim().1)
    }

    /// Columns `V_total`.
    pub fn v_total(&self) -> usize {
        self.logits.view().dim().1
    }
}

/// Owned cotangents (see the spec's [`Cotangents`]); values exactly
/// representable in f32 (every kernel may read them in f32).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CotangentData {
    /// Cotangent of log-probs `[N]`.
    pub grad_log_probs: Option<Array1<f64>>,
    /// Cotangent of entropy `[N]`.
    pub grad_entropy: Option<Array1<f64>>,
    /// Cotangent of top-k log-probs `[N, K]`.
    pub grad_topk_log_probs: Option<Array2<f64>>,
    /// Cotangent of `lse` `[N]`.
    pub grad_lse: Option<Array1<f64>>,
    /// Cotangent of `z_loss` `[N]`.
    pub grad_z_loss: Option<Array1<f64>>,
    /// Cotangent of the cross-entropy `loss`: `[N]` under `none`, `[1]`
    /// under `sum` / `mean`.
    pub grad_loss: Option<Array1<f64>>,
    /// Cotangents of the policy terms, `[N]` each, in
    /// [`PolicyTerm::ALL`] order (`kl_k1`, `kl_k2`, `kl_k3`, `kl_abs`,
    /// `ratio`).
    pub grad_policy: [Option<Array1<f64>>; 5],
    /// Cotangent of the top-k KL's `forward_kl` `[N]` (issue 18).
    pub grad_forward_kl: Option<Array1<f64>>,
    /// Cotangent of the top-k KL's `reverse_kl` `[N]` (issue 18).
    pub grad_reverse_kl: Option<Array1<f64>>,
    /// Cotangent of `soft_cross_entropy` `[N]` (issue 47).
    pub grad_soft_cross_entropy: Option<Array1<f64>>,
}

impl CotangentData {
    /// The borrowed cotangents.
    pub fn view(&self) -> Cotangents<'_> {
        Cotangents::default()
            .with_column(
                Output::LogProbs,
                self.grad_log_probs.as_ref().map(|g| g.view()),
            )
            .with_column(
                Output::Entropy,
                self.grad_entropy.as_ref().map(|g| g.view()),
            )
            .with(
                Output::TopkLogProbs,
                self.grad_topk_log_probs.as_ref().map(|g| g.view()),
            )
            .with_column(Output::Lse, self.grad_lse.as_ref().map(|g| g.view()))
            .with_column(Output::ZLoss, self.grad_z_loss.as_ref().map(|g| g.view()))
            .with_column(Output::Loss, self.grad_loss.as_ref().map(|g| g.view()))
            .with_column(Output::KlK1, self.policy(PolicyTerm::K1))
            .with_column(Output::KlK2, self.policy(PolicyTerm::K2))
            .with_column(Output::KlK3, self.policy(PolicyTerm::K3))
            .with_column(Output::KlAbs, self.policy(PolicyTerm::Abs))
            .with_column(Output::Ratio, self.policy(PolicyTerm::Ratio))
            .with_column(
                Output::ForwardKl,
                self.grad_forward_kl.as_ref().map(|g| g.view()),
            )
            .with_column(
                Output::ReverseKl,
                self.grad_reverse_kl.as_ref().map(|g| g.view()),
            )
            .with_column(
                Output::SoftCrossEntropy,
                self.grad_soft_cross_entropy.as_ref().map(|g| g.view()),
            )
    }

    /// The cotangent `[N]` of a policy term, if given.
    pub fn policy(&self, term: PolicyTerm) -> Option<ndarray::ArrayView1<'_, f64>> {
        self.grad_policy[term_index(term)]
            .as_ref()
            .map(|g| g.view())
    }

    /// Whether no cotangent is present ([`Cotangents::is_empty`] of the
    /// view).
    pub fn is_empty(&self) -> bool {
        self.view().is_empty()
    }
}

/// One cotangent value: 0 or 1 with probability 1/10 each, else uniform
/// in `[-2, 2]` rounded to f32.
fn cotangent_value(rng: &mut SplitMix64) -> f64 {
    let u = rng.uniform();
    if u < 0.1 {
        0.0
    } else if u < 0.2 {
        1.0
    } else {
        Dtype::F32.round_f64(rng.uniform_in(-2.0, 2.0))
    }
}

/// The position of `term` in [`PolicyTerm::ALL`].
fn term_index(term: PolicyTerm) -> usize {
    PolicyTerm::ALL
        .iter()
        .position(|&t| t == term)
        .unwrap_or_default()
}

/// Which cotangents to give; expanded against a problem by
/// [`CotangentRecipe::expand`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CotangentRecipe {
    /// Seed of the values.
    pub seed: u64,
    /// Give a log-prob cotangent (when tokens exist).
    pub log_probs: bool,
    /// Give an entropy cotangent (when the entropy is computed).
    pub entropy: bool,
    /// Give a top-k cotangent (when ids exist).
    pub topk: bool,
    /// Give the loss side's cotangents (`grad_lse`, `grad_z_loss` and,
    /// with tokens, `grad_loss`, the problem asked for the cross-entropy
    /// `loss` by [`CotangentRecipe::ask`]; issue 17).
    pub loss: bool,
    /// Give policy-term cotangents (`grad_kl_k1` .. `grad_ratio`, issue
    /// 18) where the problem has tokens and the terms' inputs
    /// (`ref_log_probs`, `old_log_probs`): each term's with probability
    /// 1/2, at least one.
    pub policy: bool,
    /// Give the top-k KL's cotangents (`grad_forward_kl`,
    /// `grad_reverse_kl`, issue 18) where the problem computes the KL
    /// (a teacher at its top-k ids): each with probability 1/2, at least
    /// one.
    pub kl: bool,
}

impl CotangentRecipe {
    /// Cotangents for `data`: values in `[-2, 2]` rounded to f32, with exact
    /// zeros and ones mixed in, different per row. Cotangents the problem
    /// has no output for are left out; if that leaves none, the first
    /// available one (log-probs, entropy, top-k) is given, and none only
    /// when the problem computes nothing.
    pub fn expand(&self, data: &ProblemData) -> CotangentData {
        let n = data.n();
        let has_lp = data.tokens.is_some();
        let has_h = data.options.entropy.is_some();
        let has_k = data.topk_ids.is_some();
        let (mut lp, mut h, mut k) = (
            self.log_probs && has_lp,
            self.entropy && has_h,
            self.topk && has_k,
        );
        if !(lp || h || k) {
            if has_lp {
                lp = true;
            } else if has_h {
                h = true;
            } else if has_k {
                k = true;
            }
        }
        let mut rng = rng_for(self.seed, 0xC07A);
        let mut draw = move || cotangent_value(&mut rng);
        let grad_log_probs = lp.then(|| Array1::from_shape_fn(n, |_| draw()));
        let grad_entropy = h.then(|| Array1::from_shape_fn(n, |_| draw()));
        let kk = data.topk_ids.as_ref().map_or(0, |ids| ids.ncols());
        let grad_topk_log_probs = k.then(|| Array2::from_shape_fn((n, kk), |_| draw()));
        // The loss side, where [`CotangentRecipe::ask`] asked it.
        let side = self.loss;
        let grad_lse = (side && data.options.lse).then(|| Array1::from_shape_fn(n, |_| draw()));
        let grad_z_loss = (side && data.options.z_loss_coef.is_some())
            .then(|| Array1::from_shape_fn(n, |_| draw()));
        let grad_loss = match (side, data.options.loss, &data.tokens) {
            (true, Some(l), Some(_)) => Some(Array1::from_shape_fn(l.reduction.len(n), |_| draw())),
            _ => None,
        };
        let grad_policy = self.policy_cotangents(data);
        let [grad_forward_kl, grad_reverse_kl] = self.kl_cotangents(data);
        let grad_soft_cross_entropy = self.soft_cross_entropy_cotangent(data);
        CotangentData {
            grad_soft_cross_entropy,
            grad_log_probs,
            grad_entropy,
            grad_topk_log_probs,
            grad_lse,
            grad_z_loss,
            grad_loss,
            grad_policy,
            grad_forward_kl,
            grad_reverse_kl,
        }
    }

    /// The top-k KL's cotangents `[forward, reverse]` of
    /// [`CotangentRecipe::expand`], from a stream of their own (every
    /// other cotangent's value is unchanged by them): each with
    /// probability 1/2, else one of the two; values as the others'. The
    /// reverse KL's is 0 on a row whose teacher has a `-inf` entry: there
    /// the KL is infinite wherever the student has mass, and a nonzero
    /// cotangent is refused ([`logprobe_reference::spec::SpecError::KlGradientInfinite`],
    /// judged by the edge-case property's bad inputs instead).
    fn kl_cotangents(&self, data: &ProblemData) -> [Option<Array1<f64>>; 2] {
        let (true, Some(kl), Some(a)) = (
            self.kl,
            data.options.topk_kl,
            data.teacher_topk_log_probs.as_ref(),
        ) else {
            return [None, None];
        };
        let avail = [kl.forward, kl.reverse];
        if !(avail[0] || avail[1]) {
            return [None, None];
        }
        let mut rng = rng_for(self.seed, 0xC07A + 25);
        let mut pick = avail.map(|on| on && rng.chance(0.5));
        if !(pick[0] || pick[1]) {
            let one = if avail[0] && avail[1] {
                rng.below(2)
            } else {
                usize::from(avail[1])
            };
            pick[one] = true;
        }
        let n = data.n();
        let mut draw = |side: usize| {
            Array1::from_shape_fn(n, |row| {
                let v = cotangent_value(&mut rng);
                let infinite = side == 1 && a.row(row).iter().any(|&ak| ak == f64::NEG_INFINITY);
                if infinite {
                    0.0
                } else {
                    v
                }
            })
        };
        let f = pick[0].then(|| draw(0));
        let r = pick[1].then(|| draw(1));
        [f, r]
    }

    /// The soft cross-entropy's cotangent of [`CotangentRecipe::expand`]
    /// with [`CotangentRecipe::loss`] and a teacher, from a stream of its
    /// own (every other cotangent's value is unchanged by it), values as
    /// the others'; 0 on a row whose teacher has mass where the student
    /// has none: there `H = +inf`, and a nonzero cotangent is refused
    /// ([`logprobe_reference::spec::SpecError::SoftCrossEntropyGradientInfinite`],
    /// judged by the edge-case property's bad inputs instead).
    fn soft_cross_entropy_cotangent(&self, data: &ProblemData) -> Option<Array1<f64>> {
        let p = data.teacher_probs.as_ref().filter(|_| self.loss)?;
        let problem = data.problem();
        let v = problem
            .options
            .vocab_size
            .unwrap_or(p.ncols())
            .min(p.ncols());
        let capped = problem.options.softcap.is_some();
        let mut rng = rng_for(self.seed, 0xC07A + 47);
        Some(Array1::from_shape_fn(data.n(), |row| {
            let c = cotangent_value(&mut rng);
            let dead = |j: usize| {
                !problem.allowed(row, j)
                    || (!capped && problem.logits.get_f64(row, j) == f64::NEG_INFINITY)
            };
            let form = problem.options.teacher_form;
            if (0..v).any(|j| !form.is_zero(p[[row, j]]) && dead(j)) {
                0.0
            } else {
                c
            }
        }))
    }

    /// The policy terms' cotangents of [`CotangentRecipe::expand`], from a
    /// stream of their own (the other cotangents' values are unchanged by
    /// them): which terms (each with probability 1/2, else one drawn
    /// among those with an input), and values as the others' (`[-2, 2]`
    /// rounded to f32, zeros and ones mixed in).
    fn policy_cotangents(&self, data: &ProblemData) -> [Option<Array1<f64>>; 5] {
        let mut out: [Option<Array1<f64>>; 5] = Default::default();
        if !self.policy || data.tokens.is_none() {
            return out;
        }
        let n = data.n();
        let mut rng = rng_for(self.seed, 0xC07A + 18);
        let avail: Vec<PolicyTerm> = PolicyTerm::ALL
            .into_iter()
            .filter(|t| data.policy[usize::from(t.uses_old())].is_some())
            .collect();
        if avail.is_empty() {
            return out;
        }
        let mut pick: Vec<PolicyTerm> = avail.iter().copied().filter(|_| rng.chance(0.5)).collect();
        if pick.is_empty() {
            pick.push(avail[rng.below(avail.len())]);
        }
        for t in pick {
            out[term_index(t)] = Some(Array1::from_shape_fn(n, |_| cotangent_value(&mut rng)));
        }
        out
    }

    /// With [`CotangentRecipe::loss`] and tokens: asks `data` for the
    /// cross-entropy `loss` of `loss` ([`LossData::ask`]), so that
    /// [`CotangentRecipe::expand`] gives `grad_loss` (every expanded
    /// problem computes `lse` and `z_loss` already, [`Z_LOSS_COEF`]);
    /// otherwise `data` is unchanged. Call before `expand` and before the
    /// oracle case (the forward computes the loss's terms too).
    pub fn ask(&self, data: &mut ProblemData, loss: &LossData) {
        if self.loss && data.tokens.is_some() {
            loss.ask(data);
        }
    }

    /// A key naming what [`CotangentRecipe::ask`] adds to a problem (empty
    /// without the loss side), for the oracle caches.
    pub fn ask_key(&self) -> String {
        if self.loss {
            format!(" loss-side {}", self.seed)
        } else {
            String::new()
        }
    }
}
