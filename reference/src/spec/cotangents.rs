//! [`Cotangents`]: the upstream cotangents of a VJP, one per output
//! ([`PerOutput`]) plus the `mean` loss's divisor, and the problem's checks
//! and per-row readings of them.

use ndarray::{Array2, ArrayView1, ArrayView2, Axis};

use super::error::SpecError;
use super::loss::{MeanDivisor, Reduction};
use super::output::{Columns, Family, LossTerm, Output, RowStat};
use super::per_output::PerOutput;
use super::policy::PolicyTerm;
use super::problem::{check_finite, shape_err, Problem, Shape};

/// Upstream cotangents (VJP inputs), all f64 (every f32/bf16/f16 value is
/// exact in f64). Absent = zero.
///
/// Held per output as `[N, width]` ([`Output::width`]): `grad_log_probs`,
/// `grad_entropy`, `grad_lse`, `grad_z_loss`, the policy terms' and the
/// top-k KLs' `[N, 1]`, `grad_topk_log_probs [N, K]`, `grad_loss [N, 1]`
/// under `reduction = none` and `[1, 1]` under `sum` / `mean` (the
/// scalar's cotangent; docs/design.md, "The loss side"). `grad_logits`
/// has none. Build one with [`Cotangents::with`] /
/// [`Cotangents::with_column`] from [`Cotangents::default`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Cotangents<'a> {
    /// The cotangent of each output that has one (never `grad_logits`).
    pub per_output: PerOutput<ArrayView2<'a, f64>>,
    /// Under `reduction = mean`: the divisor `W` of the whole problem
    /// these rows are part of (verify's one-row views of a dump), used by
    /// the VJP instead of the sum of this problem's own
    /// [`Problem::loss_divisor_terms`]; `None`: this problem is the whole
    /// one. Ignored under `none` / `sum` and without `grad_loss`.
    pub loss_divisor: Option<&'a MeanDivisor>,
}

impl<'a> Cotangents<'a> {
    /// The cotangents held per output (`[N, width]` each, as
    /// [`Cotangents::get`] gives them back); `grad_logits` is ignored; no
    /// [`Cotangents::loss_divisor`].
    pub fn from_outputs(per: &'a PerOutput<Array2<f64>>) -> Cotangents<'a> {
        Cotangents {
            per_output: PerOutput::from_fn(|o| {
                o.cotangent_name()?;
                per.get(o).map(|a| a.view())
            }),
            loss_divisor: None,
        }
    }

    /// These cotangents with `output`'s set to `g` (`[N, width]`, or
    /// `[1, 1]` for a reduced `loss`), or removed for `None`;
    /// `grad_logits` has no cotangent and is left out. The result lives
    /// as long as the shorter of the two borrows.
    pub fn with<'b>(
        self,
        output: Output,
        g: impl Into<Option<ArrayView2<'b, f64>>>,
    ) -> Cotangents<'b>
    where
        'a: 'b,
    {
        // ndarray's views are invariant in their lifetime: reborrow each.
        let mut out = Cotangents {
            per_output: self.per_output.map(|_, g| g.reborrow()),
            loss_divisor: self.loss_divisor,
        };
        match g.into() {
            Some(g) if output.cotangent_name().is_some() => {
                out.per_output.insert(output, g);
            }
            _ => {
                out.per_output.take(output);
            }
        }
        out
    }

    /// [`Cotangents::with`] for a per-row output's `[N]` (`[1]` for a
    /// reduced `loss`), held as `[N, 1]`.
    pub fn with_column<'b>(
        self,
        output: Output,
        g: impl Into<Option<ArrayView1<'b, f64>>>,
    ) -> Cotangents<'b>
    where
        'a: 'b,
    {
        self.with(output, g.into().map(|g| g.insert_axis(Axis(1))))
    }

    /// The cotangent of `output`, `[N, width]`; `None` when not given.
    pub fn get(&self, output: Output) -> Option<ArrayView2<'a, f64>> {
        self.per_output.get(output).copied()
    }

    /// The cotangent of a per-row output (width 1) as `[N]` (`[1]` for a
    /// reduced `loss`); `None` when not given.
    pub fn column(&self, output: Output) -> Option<ArrayView1<'a, f64>> {
        self.get(output).map(|g| g.index_axis_move(Axis(1), 0))
    }

    /// The cotangents of rows `rows` of an `[N, ..]` problem whose loss
    /// has `reduction` ([`Reduction::None`] without a loss): every per-row
    /// tensor sliced; `grad_loss` sliced under `none` (`[N]`), kept under
    /// `sum` / `mean` (the scalar's `[1]`: right for `sum`; a `mean`'s row
    /// slice divides by its own rows' `W` unless
    /// [`Cotangents::loss_divisor`] holds the whole problem's, kept here).
    pub fn slice_rows(&self, rows: std::ops::Range<usize>, reduction: Reduction) -> Cotangents<'a> {
        // A reduced loss's cotangent is the scalar's, for every row.
        let scalar = reduction != Reduction::None;
        Cotangents {
            per_output: self.per_output.map(|o, g| {
                if o == Output::Loss && scalar {
                    g
                } else {
                    g.slice_move(ndarray::s![rows.clone(), ..])
                }
            }),
            loss_divisor: self.loss_divisor,
        }
    }

    /// The cotangent `[N]` of a policy term, if given.
    pub fn policy(&self, term: PolicyTerm) -> Option<ArrayView1<'a, f64>> {
        self.column(term.output())
    }

    /// Whether no cotangent is given.
    pub fn is_empty(&self) -> bool {
        self.per_output.is_empty()
    }
}

impl Problem<'_> {
    /// Checks `cotangents` against this problem's shapes and outputs, in
    /// [`Output::ALL`] order: each given cotangent's output must be
    /// computed ([`Problem::cotangent_allowed`]), of shape `[N, width]`
    /// (the dump's `[N]` for a per-row output; `[1]` for a reduced `loss`)
    /// and finite; then a reverse KL's cotangent must not meet an infinite
    /// gradient.
    ///
    /// # Errors
    /// [`SpecError::ShapeMismatch`], [`SpecError::NoCotangent`] (none given,
    /// or one for an output that is not computed), [`SpecError::MissingTensor`],
    /// [`SpecError::NonFiniteCotangent`], [`SpecError::KlGradientInfinite`],
    /// [`SpecError::SoftCrossEntropyGradientInfinite`].
    pub fn validate_cotangents(
        &self,
        shape: &Shape,
        cot: &Cotangents<'_>,
    ) -> Result<(), SpecError> {
        if cot.is_empty() {
            return Err(SpecError::NoCotangent {
                what:
                    "no cotangent of log_probs, entropy, topk_log_probs, lse, z_loss, loss, soft_cross_entropy, a policy term or a top-k KL given",
            });
        }
        for (o, g) in cot.per_output.iter() {
            let name = self.cotangent_allowed(o)?;
            let (expected, found) = match o.columns() {
                Columns::One => {
                    let len = if o.reduced(self) { 1 } else { shape.n };
                    // A per-row cotangent is `[N]` in the dump and the API.
                    let found = match g.shape() {
                        &[rows, 1] => vec![rows],
                        other => other.to_vec(),
                    };
                    (vec![len], found)
                }
                Columns::TopK | Columns::Vocabulary => {
                    (vec![shape.n, o.width(shape)], g.shape().to_vec())
                }
            };
            if found != expected {
                return Err(shape_err(name, expected, &found));
            }
            check_finite(name, g.iter())?;
        }
        if let (Some(g), Some(ids), Some(a)) = (
            cot.column(Output::ReverseKl),
            self.topk_ids,
            self.teacher_topk_log_probs,
        ) {
            // An infinite reverse KL (a teacher zero where the student has
            // mass: a finite logit, or any under a softcap) has an infinite
            // gradient. Ids out of range are left to `validate`.
            for (row, &cotangent) in g.iter().enumerate().filter(|(_, &c)| c != 0.0) {
                for (k, (&id, &ak)) in ids.row(row).iter().zip(a.row(row)).enumerate() {
                    let live = usize::try_from(id).is_ok_and(|c| {
                        c < shape.vocab_size
                            && (self.options.softcap.is_some()
                                || self.logits.get_f64(row, c) != f64::NEG_INFINITY)
                    });
                    if ak == f64::NEG_INFINITY && live {
                        return Err(SpecError::KlGradientInfinite {
                            row,
                            k,
                            id,
                            cotangent,
                        });
                    }
                }
            }
        }
        self.validate_soft_cross_entropy_cotangent(shape, cot)
    }

    /// A nonzero `grad_soft_cross_entropy` must not meet an infinite soft
    /// cross-entropy: teacher mass `p_j > 0` where the student's `q_j` is 0
    /// (a masked entry, or a `-inf` logit without a softcap).
    fn validate_soft_cross_entropy_cotangent(
        &self,
        shape: &Shape,
        cot: &Cotangents<'_>,
    ) -> Result<(), SpecError> {
        let (Some(g), Some(p)) = (cot.column(Output::SoftCrossEntropy), self.teacher_probs) else {
            return Ok(());
        };
        for (row, &cotangent) in g.iter().enumerate().filter(|(_, &c)| c != 0.0) {
            let dead = |c: usize| {
                !self.allowed(row, c)
                    || (self.options.softcap.is_none()
                        && self.logits.get_f64(row, c) == f64::NEG_INFINITY)
            };
            let tp = p.row(row);
            let form = self.options.teacher_form;
            if let Some(col) =
                (0..shape.vocab_size.min(tp.len())).find(|&c| !form.is_zero(tp[c]) && dead(c))
            {
                return Err(SpecError::SoftCrossEntropyGradientInfinite {
                    row,
                    col,
                    cotangent,
                });
            }
        }
        Ok(())
    }

    /// Row `row`'s soft cross-entropy cotangent `c` (0 without
    /// `grad_soft_cross_entropy` or `teacher_probs`): `d (c H) / d z'_j =
    /// c ((sum p) q_j - p_j)` (docs/design.md, "The loss side"). Call after
    /// [`Problem::validate_cotangents`]; `row < N`.
    pub fn soft_cross_entropy_cotangent(&self, cot: &Cotangents<'_>, row: usize) -> f64 {
        match (cot.column(Output::SoftCrossEntropy), self.teacher_probs) {
            (Some(g), Some(_)) => g[row],
            _ => 0.0,
        }
    }

    /// Row `row`'s top-k KL cotangents `(forward, reverse)` (0 where not
    /// given): `d (g_f forward_kl + g_r reverse_kl) / d z` is the VJP's KL
    /// term (docs/design.md, "The loss side"; [`crate::spec::TopkKl`]'s module docs).
    /// Call after [`Problem::validate_cotangents`]; `row < N`.
    pub fn kl_cotangents(&self, cot: &Cotangents<'_>, row: usize) -> (f64, f64) {
        if self.options.topk_kl.is_none() {
            return (0.0, 0.0);
        }
        let at = |o| cot.column(o).map_or(0.0, |g| g[row]);
        (at(Output::ForwardKl), at(Output::ReverseKl))
    }

    /// Row `row`'s nonzero policy-term cotangents `(term, c)` (module
    /// `policy`: each adds `c k'(d)` to the log-prob's cotangent); none on
    /// a row without a target (`ignore_index`). Call after
    /// [`Problem::validate_cotangents`]; `row < N`.
    pub fn policy_cotangents(&self, cot: &Cotangents<'_>, row: usize) -> Vec<(PolicyTerm, f64)> {
        if !self.has_target(row) {
            return Vec::new();
        }
        PolicyTerm::ALL
            .into_iter()
            .filter_map(|t| {
                let c = cot.policy(t)?[row];
                (c != 0.0).then_some((t, c))
            })
            .collect()
    }

    /// Row `row`'s factors of the cross-entropy loss's cotangent in a VJP:
    /// `Some((g, w))` with `g` the upstream cotangent of the row's term
    /// (`grad_loss[row]` under `reduction = none`, the scalar's
    /// `grad_loss[0]` under `sum` / `mean`) and `w` its weight
    /// ([`CrossEntropy::weight`](super::CrossEntropy::weight)), so that
    /// `d (cotangent . loss) / d l_row = g w` (`none`, `sum`) or `g w / W`
    /// (`mean`, `W` the sum of [`Problem::loss_divisor_terms`], or
    /// [`Cotangents::loss_divisor`]); `None` without `grad_loss`
    /// or `options.loss`, on an `ignore_index` row, or when `g w` is 0
    /// (docs/design.md, "The loss side": ignored rows and the all-ignored mean get
    /// gradient 0). Call after [`Problem::validate_cotangents`]; `row < N`.
    pub fn loss_cotangent(&self, cot: &Cotangents<'_>, row: usize) -> Option<(f64, f64)> {
        let (g, loss) = (cot.column(Output::Loss)?, self.options.loss?);
        if !self.has_target(row) {
            return None;
        }
        let g = match loss.reduction {
            Reduction::None => g[row],
            Reduction::Sum | Reduction::Mean => g[0],
        };
        let w = self.loss_weights.map_or(1.0, |w| w[row]);
        (g != 0.0 && w != 0.0).then_some((g, w))
    }

    /// The cotangent name of `output` when this problem computes it (a
    /// cotangent of it may be given), else the error
    /// [`Problem::validate_cotangents`] reports.
    ///
    /// # Errors
    /// [`SpecError::MissingTensor`] (an input the output needs is absent),
    /// [`SpecError::NoCotangent`] (its option is off; `grad_logits`).
    pub fn cotangent_allowed(&self, output: Output) -> Result<&'static str, SpecError> {
        let name = output.cotangent_name().unwrap_or("grad_logits");
        let no = |what| Err(SpecError::NoCotangent { what });
        let missing = |tensor| {
            Err(SpecError::MissingTensor {
                output: name,
                tensor,
            })
        };
        let needs_tokens = || match self.tokens {
            Some(_) => Ok(name),
            None => missing("tokens"),
        };
        match output.family() {
            Family::LogSoftmax(RowStat::LogProb) => needs_tokens(),
            Family::LogSoftmax(RowStat::Entropy) => match self.options.entropy {
                Some(_) => Ok(name),
                None => no("grad_entropy given but options.entropy is None"),
            },
            Family::TopK => match self.topk_ids {
                Some(_) => Ok(name),
                None => missing("topk_ids"),
            },
            Family::Gradient => no("grad_logits has no cotangent"),
            // The family's other statistics (counts): the output table
            // gives them no cotangent.
            Family::LogSoftmax(_) => no("the output table gives this output no cotangent"),
            Family::Loss(LossTerm::SoftCrossEntropy) => match self.teacher_probs {
                Some(_) => Ok(name),
                None => missing("teacher_probs"),
            },
            Family::Loss(LossTerm::Lse) => match self.options.lse {
                true => Ok(name),
                false => no("grad_lse given but options.lse is false"),
            },
            Family::Loss(LossTerm::ZLoss) => match self.options.z_loss_coef {
                Some(_) => Ok(name),
                None => no("grad_z_loss given but options.z_loss_coef is None"),
            },
            Family::Loss(LossTerm::CrossEntropy) => match self.options.loss {
                Some(_) => needs_tokens(),
                None => no("grad_loss given but options.loss is None"),
            },
            Family::Policy(term) => {
                let (input, present) = if term.uses_old() {
                    ("old_log_probs", self.policy.old_log_probs.is_some())
                } else {
                    ("ref_log_probs", self.policy.ref_log_probs.is_some())
                };
                if present {
                    needs_tokens()
                } else {
                    missing(input)
                }
            }
            Family::TopkKl(_) => match self.options.topk_kl {
                Some(_) => Ok(name),
                None => no("grad_forward_kl / grad_reverse_kl given but options.topk_kl is None"),
            },
        }
    }
}
