//! The row-judging walk shared by `verify`, the property checks and fuzz:
//! every judged element of one row, output by output ([`Output::ALL`]
//! order), with what its bound needs ([`RowTargets`]). Each caller judges
//! the elements its own way (`verify` under four models, the properties
//! under a kernel's declared one), but which elements exist, which rows
//! are skipped and which bound applies ([`super::RowBounds::bound`]) are
//! decided here once.

use ndarray::ArrayView1;

use logprobe_reference::oracle::Exact;
use logprobe_reference::spec::{
    Cotangents, Dtype, Output, PerOutput, PolicyTerm, Problem, Reduction, TeacherForm,
};

use super::bounds::KlGradCotangents;
use super::bounds::PolicyGradCotangents;
use super::bounds::{GradCotangents, KlTarget};
use super::loss_grad::LossGradCotangents;

/// What the bounds of one row need besides its statistics: the vocabulary
/// entries its outputs are at, and the gradient's upstream cotangents.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RowTargets {
    /// Real vocabulary size `V`: grad columns `>= V` are padding (exactly 0).
    pub vocab_size: usize,
    /// The target token, when the row has a log-prob (tokens given, token
    /// not `ignore_index`).
    pub token: Option<usize>,
    /// The top-k ids `[K]` of the row (validated in range by the spec).
    pub topk_ids: Vec<usize>,
    /// Cotangent `g` of the log-prob (0 without one or on an `ignore_index` row).
    pub g: f64,
    /// Cotangent `h` of the entropy (0 without one).
    pub h: f64,
    /// `(id_k, G_k)` of the live top-k ids ([`GradCotangents::live_topk`]).
    pub live_topk: Vec<(usize, f64)>,
    /// The z-loss coefficient as the computation takes it (rounded to the
    /// accumulation dtype, [`logprobe_reference::spec::Options::effective_z_loss_coef`]);
    /// 0 without `z_loss`.
    pub z_loss_coef: f64,
    /// The row's teacher `[V]` of `soft_cross_entropy` (empty without
    /// `teacher_probs`), as `teacher_form` holds it.
    pub teacher_probs: Vec<f64>,
    /// Probabilities or log-probabilities (`options.teacher_form`).
    pub teacher_form: logprobe_reference::spec::TeacherForm,
    /// The row's cross-entropy `loss` (`None` when the problem has none).
    pub loss: Option<LossTarget>,
    /// The row's loss-side cotangents for the gradient bound (T19; `None`
    /// without `grad_lse`, `grad_z_loss` or `grad_loss`).
    pub loss_grad: Option<LossGradRow>,
    /// The row's teacher for `forward_kl` / `reverse_kl` (T23; `None`
    /// without `options.topk_kl`).
    pub topk_kl: Option<super::bounds::KlTarget>,
    /// The row's policy-term inputs (T20; `None` without `ref_log_probs`
    /// and `old_log_probs`).
    pub policy: Option<PolicyTarget>,
    /// The row's nonzero policy-term cotangents `(term, c)` for the
    /// gradient bound (T21; [`Problem::policy_cotangents`]: none on an
    /// `ignore_index` row).
    pub policy_grad: Vec<(PolicyTerm, f64)>,
    /// The row's top-k KL cotangents `(g_f, g_r)` for the gradient bound
    /// (T25; [`Problem::kl_cotangents`], `(0, 0)` without any).
    pub kl_grad: (f64, f64),
}

/// What the bounds of one row's policy terms need besides the row
/// statistics (TOLERANCE.md (T20)): the exact inputs and the clamps, as
/// the spec gives them for a row.
pub type PolicyTarget = logprobe_reference::spec::PolicyRow;

/// One row's loss-side cotangents, owned: [`LossGradCotangents`]'s
/// scalar terms (its `mask` `None` here) and the mask's row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LossGradRow {
    /// `a`, `zb`, `ell`, `mean_rows`, `eps`, `count`, `soft`, `soft_mass`
    /// (see that type); the teacher's row is [`RowTargets::teacher_probs`].
    pub terms: LossGradCotangents<'static>,
    /// Which entries `j < V` the sampling mask allows (`None`: all).
    pub allowed: Option<Vec<bool>>,
}

impl LossGradRow {
    /// Row `row`'s terms of a validated `problem` whose cotangents give
    /// any loss-side one. Under `mean` the divisor `W` and its row count
    /// are [`Cotangents::loss_divisor`]'s (a one-row view of a dump), else
    /// summed from `problem`'s rows (O(N)).
    pub fn new(problem: &Problem<'_>, row: usize, cot: &Cotangents<'_>) -> Option<LossGradRow> {
        if cot.column(Output::Lse).is_none()
            && cot.column(Output::ZLoss).is_none()
            && cot.column(Output::Loss).is_none()
            && cot.column(Output::SoftCrossEntropy).is_none()
        {
            return None;
        }
        let (_, v_total) = problem.logits.dim();
        let v = problem.options.vocab_size.unwrap_or(v_total);
        let acc = problem.accumulation();
        let coef = problem
            .options
            .effective_z_loss_coef(acc)
            .ok()
            .flatten()
            .unwrap_or(0.0);
        let ce = problem.cross_entropy();
        let mean = ce.is_some_and(|c| c.reduction == Reduction::Mean);
        let ell = match problem.loss_cotangent(cot, row) {
            None => 0.0,
            Some((g, w)) => {
                let gw = up(g.abs() * w.abs());
                if mean {
                    // W in f64 downward: the whole problem's when the
                    // cotangents carry it; else the weights are >= 0, each
                    // sum rounded down at most N ulps below (relative).
                    let w_lo = match cot.loss_divisor {
                        Some(d) => d.lower(),
                        None => {
                            let n = problem.logits.dim().0 as f64;
                            let w_sum: f64 = problem.loss_divisor_terms().map_or(0.0, |t| t.sum());
                            w_sum * (1.0 - (n + 1.0) * f64::EPSILON)
                        }
                    };
                    if w_lo > 0.0 {
                        up(gw / w_lo)
                    } else {
                        0.0
                    }
                } else {
                    gw
                }
            }
        };
        let terms = LossGradCotangents {
            a: cot.column(Output::Lse).map_or(0.0, |a| a[row]),
            zb: up(up(2.0 * coef.abs()) * cot.column(Output::ZLoss).map_or(0.0, |b| b[row]).abs()),
            ell,
            mean_rows: mean.then(|| {
                cot.loss_divisor
                    .map_or(problem.logits.dim().0, |d| d.rows())
            }),
            eps: ce
                .and_then(|c| c.effective_label_smoothing(acc).ok())
                .unwrap_or(0.0),
            count: (0..v).filter(|&j| problem.allowed(row, j)).count(),
            mask: None,
            soft: problem.soft_cross_entropy_cotangent(cot, row).abs(),
            soft_mass: 0.0,
            teacher: None,
            soft_log_probs: problem.options.teacher_form == TeacherForm::LogProbs,
            soft_a_inexact: 0.0,
            soft_count: 0,
        };
        let terms = match problem.teacher_probs {
            Some(p) => soft_teacher_terms(terms, p.row(row), v, problem.options.teacher_form),
            None => terms,
        };
        Some(LossGradRow {
            terms,
            allowed: problem
                .sampling_mask
                .map(|m| m.row(row).iter().take(v).copied().collect()),
        })
    }
}

/// (T28) `terms` with the teacher row `p`'s (`[>= V]`) mass (an upward
/// sum of the `p_j >= 0`, within `V` ulps relative above; `exp` of a
/// log-probability taken upward, within 4 ulps), its count of entries with
/// mass and, for log-probabilities, the largest `|a_j|` not an f32 value.
fn soft_teacher_terms(
    mut terms: LossGradCotangents<'static>,
    p: ndarray::ArrayView1<'_, f64>,
    v: usize,
    form: TeacherForm,
) -> LossGradCotangents<'static> {
    let (mut s, mut n, mut a_max) = (0.0f64, 0usize, 0.0f64);
    for &x in p.iter().take(v) {
        if form.is_zero(x) {
            continue;
        }
        n += 1;
        s += match form {
            TeacherForm::Probs => x,
            TeacherForm::LogProbs => {
                if f64::from(x as f32) != x {
                    a_max = a_max.max(x.abs());
                }
                x.exp() * (1.0 + 4.0 * f64::EPSILON)
            }
        };
    }
    terms.soft_mass = up(s * (1.0 + (v as f64 + 1.0) * f64::EPSILON));
    terms.soft_count = n;
    terms.soft_a_inexact = a_max;
    terms
}

/// `x` one f64 ulp up (an upward rounding of one operation's result).
fn up(x: f64) -> f64 {
    if x.is_finite() {
        x.next_up()
    } else {
        x
    }
}

/// What the bound of one row's cross-entropy `loss` needs besides the row
/// statistics (TOLERANCE.md (T17)).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LossTarget {
    /// `eps` as the computation takes it (rounded to the accumulation dtype).
    pub label_smoothing: f64,
    /// The row's `loss_weights` entry (1 without weights).
    pub weight: f64,
    /// Whether the row is counted (token not `ignore_index`).
    pub counted: bool,
    /// Which entries `j < V` the sampling mask allows (`None`: all).
    pub allowed: Option<Vec<bool>>,
    /// The row's [`super::LossSums`] when already computed (once for every
    /// model: [`LossTarget::with_sums`]); `None`: each bound computes them.
    pub sums: Option<super::LossSums>,
}

impl LossTarget {
    /// Fills [`LossTarget::sums`] from the row's statistics (when the
    /// smoothed bound needs them: label smoothing `> 0`, a counted row of
    /// weight `!= 0`).
    pub fn with_sums(&mut self, stats: &logprobe_reference::oracle::RowStats) {
        if self.label_smoothing > 0.0 && self.counted && self.weight != 0.0 {
            let allowed = &self.allowed;
            self.sums = Some(super::LossSums::of(stats, |j| {
                allowed.as_ref().is_none_or(|a| a[j])
            }));
        }
    }
}

impl RowTargets {
    /// Row `row` of a validated `problem` with `cotangents` (absent = 0).
    ///
    /// # Panics
    /// Never for a validated problem and `row < N` (ids are in range).
    pub fn new(problem: &Problem<'_>, row: usize, cotangents: &Cotangents<'_>) -> RowTargets {
        let (_, v_total) = problem.logits.dim();
        let vocab_size = problem.options.vocab_size.unwrap_or(v_total);
        let has_target = problem.has_target(row);
        let live_topk = match (problem.topk_ids, cotangents.get(Output::TopkLogProbs)) {
            // Ids masked by sampling_mask are constants (no gradient); one
            // with a -inf logit is still differentiated (oracle, PyTorch).
            (Some(ids), Some(gk)) => GradCotangents::live_topk(
                ids.row(row).iter().copied(),
                gk.row(row).iter().copied(),
                |id| id < vocab_size && problem.allowed(row, id),
            ),
            _ => Vec::new(),
        };
        RowTargets {
            vocab_size,
            token: problem
                .tokens
                .filter(|_| has_target)
                .map(|t| t[row] as usize),
            topk_ids: problem.topk_ids.map_or(Vec::new(), |ids| {
                ids.row(row).iter().map(|&id| id as usize).collect()
            }),
            g: match cotangents.column(Output::LogProbs) {
                Some(g) if has_target => g[row],
                _ => 0.0,
            },
            h: cotangents.column(Output::Entropy).map_or(0.0, |h| h[row]),
            live_topk,
            z_loss_coef: problem
                .options
                .effective_z_loss_coef(problem.accumulation())
                .ok()
                .flatten()
                .unwrap_or(0.0),
            teacher_probs: problem.teacher_probs.map_or(Vec::new(), |p| {
                p.row(row).iter().take(vocab_size).copied().collect()
            }),
            teacher_form: problem.options.teacher_form,
            loss: problem.cross_entropy().map(|ce| LossTarget {
                label_smoothing: ce
                    .effective_label_smoothing(problem.accumulation())
                    .unwrap_or(0.0),
                weight: problem.loss_weight(row),
                counted: has_target,
                allowed: problem
                    .sampling_mask
                    .map(|m| m.row(row).iter().take(vocab_size).copied().collect()),
                sums: None,
            }),
            loss_grad: LossGradRow::new(problem, row, cotangents),
            policy: (!problem.policy.is_empty()).then(|| PolicyTarget::of(problem, row)),
            policy_grad: problem.policy_cotangents(cotangents, row),
            kl_grad: problem.kl_cotangents(cotangents, row),
            topk_kl: match (problem.options.topk_kl, problem.teacher_topk_log_probs) {
                (Some(kl), Some(a)) => Some(KlTarget {
                    teacher: a.row(row).to_vec(),
                    renormalized: kl.renormalized,
                }),
                _ => None,
            },
        }
    }

    /// The cotangents as the gradient bound takes them.
    pub fn grad_cotangents(&self) -> GradCotangents<'_> {
        GradCotangents {
            g: self.g,
            h: self.h,
            token: self.token,
            topk: &self.live_topk,
            loss: self.loss_grad.as_ref().map(|l| LossGradCotangents {
                mask: l.allowed.as_deref().map(ArrayView1::from),
                teacher: (l.terms.soft != 0.0).then(|| ArrayView1::from(&self.teacher_probs[..])),
                ..l.terms
            }),
            policy: match (&self.policy, self.policy_grad.is_empty()) {
                (Some(inputs), false) => Some(PolicyGradCotangents {
                    terms: &self.policy_grad,
                    inputs: *inputs,
                }),
                _ => None,
            },
            kl: match (&self.topk_kl, self.kl_grad) {
                (_, (0.0, 0.0)) | (None, _) => None,
                (Some(kl), (gf, gr)) => Some(KlGradCotangents {
                    gf,
                    gr,
                    ids: &self.topk_ids,
                    kl,
                }),
            },
        }
    }
}

/// One element of a row to judge: column `col` of `output`.
#[derive(Clone, Copy, Debug)]
pub struct Element<'a> {
    /// The output.
    pub output: Output,
    /// The column (0 for per-row outputs, `k` for top-k, the vocabulary
    /// index for grad logits).
    pub col: usize,
    /// The oracle's exact value.
    pub exact: &'a Exact,
    /// The candidate value (exact f64 of a value of `dtype`).
    pub candidate: f64,
    /// The candidate's dtype (its ulps and final rounding).
    pub dtype: Dtype,
}

/// Walks the judged elements of one row: for every output present in both
/// `exact` and `candidates` (each the row's values `[width]`; a candidate
/// with its dtype), in [`Output::ALL`] order, every column, skipping the
/// outputs `judged` rejects for this row ([`Output::judged`]). `visit` sees
/// each element; its first error stops the walk and is returned.
///
/// # Errors
/// The first error of `visit`.
///
/// # Panics
/// When a candidate row is longer than its exact row (callers check
/// shapes first).
pub fn walk_row<E>(
    exact: &PerOutput<ArrayView1<'_, Exact>>,
    candidates: &PerOutput<(Dtype, ArrayView1<'_, f64>)>,
    judged: impl Fn(Output) -> bool,
    mut visit: impl FnMut(Element<'_>) -> Result<(), E>,
) -> Result<(), E> {
    for (output, (dtype, values)) in candidates.iter() {
        let Some(exact) = exact.get(output) else {
            continue;
        };
        if !judged(output) {
            continue;
        }
        for (col, &candidate) in values.iter().enumerate() {
            visit(Element {
                output,
                col,
                exact: &exact[col],
                candidate,
                dtype: *dtype,
            })?;
        }
    }
    Ok(())
}
