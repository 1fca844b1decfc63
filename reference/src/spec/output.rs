//! The `Output` seam: one enum naming every judged output, and one
//! container ([`PerOutput`]) keyed by it. Oracle results, kernel results,
//! bounds, judgements, dump tensors and report rows are all held per output
//! in it, so code that treats outputs alike loops over [`Output::ALL`]
//! instead of naming each one; the facts that differ per output (name,
//! shape, when it is computed, when it is judged, its cotangent) are the
//! methods below, the only place that matches over every output.
//!
//! Every output is a tensor `[N, width]`: per-row scalars (`log_probs`,
//! `entropy`) have width 1, `topk_log_probs` width `K` (one column per id),
//! `grad_logits` width `V_total` (one column per logit, padding included).
//! An element is addressed by `(output, row, col)`.
//!
//! One output can be reduced over rows: the cross-entropy `loss` under
//! `reduction = sum | mean` is one value for the whole problem (dump shape
//! `[]`). [`Output::reduced`] says so; such an output is never judged per
//! row ([`Output::judged`] is false for every row), and its one value is the
//! element `(output, 0, 0)` of a one-row view: the verify engine judges it
//! once per file, after the rows, from the rows' per-row terms. The per-row
//! values an oracle or kernel gives for it (`[N, 1]`) are those terms
//! (`w_r * l_r`, an exact 0 on ignored rows), which under `none` are the
//! output itself.

//!
//! # One table
//!
//! [`for_each_output!`](crate::for_each_output) holds the one list of
//! outputs: variant, dump name, cotangent name, columns and [`Family`].
//! The enum, [`Output::ALL`], the names, the columns and the families are
//! generated from it here; a crate that needs an item per output expands
//! it with a callback macro of its own. Code that does one thing per output
//! matches on [`Output`] or [`Output::family`] without a catch-all arm
//! (`scripts/check-output-arms.sh` keeps it so), so a new output is a
//! compile error wherever it is not handled yet.

use ndarray::ArrayView2;

use super::cotangents::Cotangents;
use super::loss::Reduction;
use super::options::Options;
use super::policy::PolicyTerm;
use super::problem::{Problem, Shape};
use super::topk_kl::KlDirection;

/// The one table of outputs (module docs), in report order: expands
/// `$callback! { ... }` with one entry per output,
///
/// ```text
/// /// docs
/// Variant { name: "dump_name", cotangent: Some("grad_dump_name") | None,
///           columns: Columns::.., family: Family::.. },
/// ```
///
/// the paths written `$crate::spec::..`. A crate that needs an item per
/// output (a dispatch arm, a keyword, a table row) expands it with its own
/// callback instead of listing the outputs again.
///
/// ```
/// macro_rules! names {
///     ($($(#[$doc:meta])* $variant:ident { name: $name:literal, $($rest:tt)* },)*) => {
///         [$($name),*]
///     };
/// }
/// let names = logprobe_reference::for_each_output!(names);
/// assert_eq!(names.len(), logprobe_reference::spec::Output::COUNT);
/// assert_eq!(names[0], "log_probs");
/// ```
#[macro_export]
macro_rules! for_each_output {
    ($callback:ident) => {
        $callback! {
            /// `log_probs [N]` (stored `[N, 1]`): `log softmax(z')[token]`, nats.
            LogProbs {
                name: "log_probs",
                cotangent: Some("grad_log_probs"),
                columns: $crate::spec::Columns::One,
                family: $crate::spec::Family::LogSoftmax($crate::spec::RowStat::LogProb),
            },
            /// `entropy [N]` (stored `[N, 1]`): `-sum softmax(w) log softmax(w)`, nats.
            Entropy {
                name: "entropy",
                cotangent: Some("grad_entropy"),
                columns: $crate::spec::Columns::One,
                family: $crate::spec::Family::LogSoftmax($crate::spec::RowStat::Entropy),
            },
            /// `topk_log_probs [N, K]`: `log softmax(z')[topk_ids]`, nats (`-inf`
            /// for a masked id).
            TopkLogProbs {
                name: "topk_log_probs",
                cotangent: Some("grad_topk_log_probs"),
                columns: $crate::spec::Columns::TopK,
                family: $crate::spec::Family::TopK,
            },
            /// `grad_logits [N, V_total]`: the VJP of the cotangent-weighted
            /// forward outputs, nats per logit unit (padded columns 0).
            GradLogits {
                name: "grad_logits",
                cotangent: None,
                columns: $crate::spec::Columns::Vocabulary,
                family: $crate::spec::Family::Gradient,
            },
            /// `lse [N]` (stored `[N, 1]`): `logsumexp(z')` per row, nats.
            Lse {
                name: "lse",
                cotangent: Some("grad_lse"),
                columns: $crate::spec::Columns::One,
                family: $crate::spec::Family::Loss($crate::spec::LossTerm::Lse),
            },
            /// `z_loss [N]` (stored `[N, 1]`): `z_loss_coef * lse^2` per row
            /// (docs/design.md, "The loss side"; reduction `none`, every row).
            ZLoss {
                name: "z_loss",
                cotangent: Some("grad_z_loss"),
                columns: $crate::spec::Columns::One,
                family: $crate::spec::Family::Loss($crate::spec::LossTerm::ZLoss),
            },
            /// `loss`: the cross-entropy (docs/design.md, "The loss side";
            /// [`CrossEntropy`](crate::spec::CrossEntropy)), nats. Under `reduction = none`
            /// `[N]` (stored `[N, 1]`): `w_r * l_r`, exactly 0 on `ignore_index`
            /// rows; under `sum` / `mean` one value for the problem
            /// ([`Output::reduced`](crate::spec::Output::reduced)), the per-row values `[N, 1]` being the terms
            /// it reduces.
            Loss {
                name: "loss",
                cotangent: Some("grad_loss"),
                columns: $crate::spec::Columns::One,
                family: $crate::spec::Family::Loss($crate::spec::LossTerm::CrossEntropy),
            },
            /// `kl_k1 [N]` (stored `[N, 1]`): `d = log_prob - ref_log_probs`, nats
            /// (docs/design.md, "The loss side"; [`PolicyTerm`](crate::spec::PolicyTerm)).
            KlK1 {
                name: "kl_k1",
                cotangent: Some("grad_kl_k1"),
                columns: $crate::spec::Columns::One,
                family: $crate::spec::Family::Policy($crate::spec::PolicyTerm::K1),
            },
            /// `kl_k2 [N]`: `d^2 / 2`, nats squared.
            KlK2 {
                name: "kl_k2",
                cotangent: Some("grad_kl_k2"),
                columns: $crate::spec::Columns::One,
                family: $crate::spec::Family::Policy($crate::spec::PolicyTerm::K2),
            },
            /// `kl_k3 [N]`: `expm1(-d_c) + d_c` under the KL clamps, nats.
            KlK3 {
                name: "kl_k3",
                cotangent: Some("grad_kl_k3"),
                columns: $crate::spec::Columns::One,
                family: $crate::spec::Family::Policy($crate::spec::PolicyTerm::K3),
            },
            /// `kl_abs [N]`: `|d|`, nats.
            KlAbs {
                name: "kl_abs",
                cotangent: Some("grad_kl_abs"),
                columns: $crate::spec::Columns::One,
                family: $crate::spec::Family::Policy($crate::spec::PolicyTerm::Abs),
            },
            /// `ratio [N]`: `exp(clamp(log_prob - old_log_probs))`, dimensionless.
            Ratio {
                name: "ratio",
                cotangent: Some("grad_ratio"),
                columns: $crate::spec::Columns::One,
                family: $crate::spec::Family::Policy($crate::spec::PolicyTerm::Ratio),
            },
            /// `forward_kl [N]` (stored `[N, 1]`): `sum_k e^{a_k} (a_k - log
            /// p(id_k))` over the teacher's top-k (docs/design.md, "The loss side";
            /// [`TopkKl`](crate::spec::TopkKl)), nats.
            ForwardKl {
                name: "forward_kl",
                cotangent: Some("grad_forward_kl"),
                columns: $crate::spec::Columns::One,
                family: $crate::spec::Family::TopkKl($crate::spec::KlDirection::Forward),
            },
            /// `reverse_kl [N]` (stored `[N, 1]`): `sum_k p(id_k) (log p(id_k) -
            /// a_k)` over the same support, nats.
            ReverseKl {
                name: "reverse_kl",
                cotangent: Some("grad_reverse_kl"),
                columns: $crate::spec::Columns::One,
                family: $crate::spec::Family::TopkKl($crate::spec::KlDirection::Reverse),
            },
            /// `soft_cross_entropy [N]` (stored `[N, 1]`): the cross-entropy
            /// `H(p, q) = -sum_{j < V} p_j log q_j` against the teacher's
            /// probabilities `p = teacher_probs` (docs/design.md, "The loss
            /// side"; `q = softmax(z')`), nats; NeMo-RL's
            /// `DistributedCrossEntropy`, torchtune's `ForwardKLLoss` per token.
            SoftCrossEntropy {
                name: "soft_cross_entropy",
                cotangent: Some("grad_soft_cross_entropy"),
                columns: $crate::spec::Columns::One,
                family: $crate::spec::Family::Loss($crate::spec::LossTerm::SoftCrossEntropy),
            },
            /// `token_ranks [N]` (stored `[N, 1]`, integer or float):
            /// `#{j < V : log_prob_j >= log_prob_t}`, the rank of the token
            /// among the row's log-probs counting ties against it (vLLM's
            /// `token_ranks`: 1 for the argmax, `V` for a `-inf` log-prob).
            TokenRanks {
                name: "token_ranks",
                cotangent: None,
                columns: $crate::spec::Columns::One,
                family: $crate::spec::Family::LogSoftmax($crate::spec::RowStat::Rank),
            },
        }
    };
}

/// The callback of [`for_each_output!`](crate::for_each_output) that
/// defines [`Output`] and its table facts.
macro_rules! define_outputs {
    ($(
        $(#[$doc:meta])*
        $variant:ident {
            name: $name:literal,
            cotangent: $cotangent:expr,
            columns: $columns:expr,
            family: $family:expr,
        },
    )*) => {
        /// One output of the problem (docs/design.md, "The math"; names as
        /// in the dump format, `docs/dump-from-pytorch.md`), from the table
        /// [`for_each_output!`](crate::for_each_output).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Output {
            $($(#[$doc])* $variant,)*
        }

        impl Output {
            /// Every output, in report order (the table's).
            pub const ALL: [Output; Output::COUNT] = [$(Output::$variant),*];

            /// How many outputs there are.
            pub const COUNT: usize = [$(Output::$variant),*].len();

            /// The tensor name (dump format, reports): `log_probs`,
            /// `entropy`, `topk_log_probs`, `grad_logits`, ...
            pub const fn name(self) -> &'static str {
                match self {
                    $(Output::$variant => $name,)*
                }
            }

            /// The tensor name of this output's upstream cotangent
            /// (`grad_<name>`), `None` for `grad_logits` (nothing is
            /// differentiated through it).
            pub const fn cotangent_name(self) -> Option<&'static str> {
                match self {
                    $(Output::$variant => $cotangent,)*
                }
            }

            /// What the second axis indexes.
            pub const fn columns(self) -> Columns {
                match self {
                    $(Output::$variant => $columns,)*
                }
            }

            /// The family this output belongs to, with its part in it.
            pub const fn family(self) -> Family {
                match self {
                    $(Output::$variant => $family,)*
                }
            }
        }
    };
}

for_each_output!(define_outputs);

/// What the second axis of an output indexes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Columns {
    /// One value per row (width 1; the dump stores `[N]`).
    One,
    /// One value per top-k id (width `K`).
    TopK,
    /// One value per logit column (width `V_total`).
    Vocabulary,
}

/// The families of outputs (docs/design.md, "The math" and "The loss
/// side"), each with the part an output is of it: what the oracle, the
/// kernels and the tolerance model dispatch on where outputs of a family
/// share their code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// `log_probs`, `entropy`: one statistic of the row's softmax.
    LogSoftmax(RowStat),
    /// `topk_log_probs`: the log-softmax at the top-k ids.
    TopK,
    /// `lse`, `z_loss`, the cross-entropy `loss`.
    Loss(LossTerm),
    /// `forward_kl`, `reverse_kl`: the top-k KL to a teacher
    /// ([`TopkKl`](super::TopkKl)).
    TopkKl(KlDirection),
    /// `kl_k1`, `kl_k2`, `kl_k3`, `kl_abs`, `ratio` ([`PolicyTerm`]).
    Policy(PolicyTerm),
    /// `grad_logits`: cross-cutting, the VJP of every family's
    /// cotangent-weighted outputs; its parts are the cotangents of
    /// [`Output::FORWARD`] (one term per family in the VJP).
    Gradient,
}

/// The part of [`Family::LogSoftmax`] an output is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowStat {
    /// `log_probs`.
    LogProb,
    /// `entropy`.
    Entropy,
    /// `token_ranks`: the token's rank among the log-probs (no gradient).
    Rank,
}

/// The part of [`Family::Loss`] an output is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LossTerm {
    /// `lse`.
    Lse,
    /// `z_loss`.
    ZLoss,
    /// The cross-entropy `loss`.
    CrossEntropy,
    /// `soft_cross_entropy`: the cross-entropy against a teacher's
    /// probabilities.
    SoftCrossEntropy,
}

impl Output {
    /// The outputs of a forward call (everything but gradients), in report
    /// order: [`Output::ALL`] without `grad_logits`.
    pub const FORWARD: [Output; Output::COUNT - 1] = {
        let mut forward = [Output::LogProbs; Output::COUNT - 1];
        let (mut i, mut j) = (0, 0);
        while i < Output::COUNT {
            if !matches!(Output::ALL[i].family(), Family::Gradient) {
                forward[j] = Output::ALL[i];
                j += 1;
            }
            i += 1;
        }
        forward
    };

    /// Position in [`Output::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Whether this output's values are counts (integers, whatever the
    /// output dtype: `token_ranks`) rather than values of the output dtype.
    pub fn is_count(self) -> bool {
        matches!(self.family(), Family::LogSoftmax(RowStat::Rank))
    }

    /// Whether a forward call computes this output (all but `grad_logits`).
    pub fn is_forward(self) -> bool {
        Output::FORWARD.contains(&self)
    }

    /// The width of this output for a problem of shape `shape`: 1, `K` or
    /// `V_total`.
    pub fn width(self, shape: &Shape) -> usize {
        match self.columns() {
            Columns::One => 1,
            Columns::TopK => shape.k,
            Columns::Vocabulary => shape.v_total,
        }
    }

    /// Whether a forward call on `problem` computes this output: log-probs
    /// with `tokens`, the entropy with `options.entropy`, `token_ranks`
    /// with `options.token_ranks` and `tokens`, top-k log-probs
    /// with `topk_ids`, `lse` with `options.lse`, `z_loss` with
    /// `options.z_loss_coef`, `loss` with `options.loss` and `tokens`, the
    /// KL estimators with `ref_log_probs` and `tokens`, `ratio` with
    /// `old_log_probs` and `tokens`, `soft_cross_entropy` with
    /// `teacher_probs`; never `grad_logits` (a backward call's
    /// output).
    pub fn requested(self, problem: &Problem<'_>) -> bool {
        match self {
            Output::LogProbs => problem.tokens.is_some(),
            Output::Entropy => problem.options.entropy.is_some(),
            Output::TopkLogProbs => problem.topk_ids.is_some(),
            Output::GradLogits => false,
            Output::Lse => problem.options.lse,
            Output::ZLoss => problem.options.z_loss_coef.is_some(),
            Output::Loss => problem.options.loss.is_some() && problem.tokens.is_some(),
            Output::KlK1 | Output::KlK2 | Output::KlK3 | Output::KlAbs => {
                problem.policy.ref_log_probs.is_some() && problem.tokens.is_some()
            }
            Output::Ratio => problem.policy.old_log_probs.is_some() && problem.tokens.is_some(),
            Output::ForwardKl => problem.options.topk_kl.is_some_and(|k| k.forward),
            Output::ReverseKl => problem.options.topk_kl.is_some_and(|k| k.reverse),
            Output::TokenRanks => problem.options.token_ranks && problem.tokens.is_some(),
            Output::SoftCrossEntropy => problem.teacher_probs.is_some(),
        }
    }

    /// Sets the option flag by which a forward call computes this output,
    /// for the outputs such a flag alone requests (`lse`, `token_ranks`;
    /// [`Output::requested`]). The others are requested by their inputs
    /// or by options that carry values (the entropy's form, `z_loss`'s
    /// coefficient, the loss's reduction), which the caller sets; for them
    /// this does nothing.
    pub fn request(self, options: &mut Options) {
        match self {
            Output::Lse => options.lse = true,
            Output::TokenRanks => options.token_ranks = true,
            Output::LogProbs
            | Output::Entropy
            | Output::TopkLogProbs
            | Output::GradLogits
            | Output::ZLoss
            | Output::Loss
            | Output::KlK1
            | Output::KlK2
            | Output::KlK3
            | Output::KlAbs
            | Output::Ratio
            | Output::ForwardKl
            | Output::ReverseKl
            | Output::SoftCrossEntropy => {}
        }
    }

    /// Whether this output is one value for the whole problem rather than
    /// one per row: `loss` under `reduction = sum | mean` (module docs).
    pub fn reduced(self, problem: &Problem<'_>) -> bool {
        match self {
            Output::Loss => problem
                .options
                .loss
                .is_some_and(|l| l.reduction != Reduction::None),
            Output::LogProbs
            | Output::Entropy
            | Output::TopkLogProbs
            | Output::GradLogits
            | Output::Lse
            | Output::ZLoss
            | Output::KlK1
            | Output::KlK2
            | Output::KlK3
            | Output::KlAbs
            | Output::Ratio
            | Output::ForwardKl
            | Output::ReverseKl
            | Output::SoftCrossEntropy
            | Output::TokenRanks => false,
        }
    }

    /// Whether row `row`'s values of this output are judged: every row but
    /// the log-prob of an `ignore_index` row ([`Problem::has_target`]),
    /// whose value is defined as 0 and not checked (dump format), and a
    /// [reduced](Output::reduced) output's (judged once for the problem).
    /// An `ignore_index` row's `loss` under `none` is judged: it must be 0.
    /// The policy terms follow the log-prob (no value on `ignore_index` rows).
    pub fn judged(self, problem: &Problem<'_>, row: usize) -> bool {
        match self {
            Output::LogProbs
            | Output::KlK1
            | Output::KlK2
            | Output::KlK3
            | Output::KlAbs
            | Output::Ratio
            | Output::TokenRanks => problem.has_target(row),
            Output::Loss => !self.reduced(problem),
            Output::Entropy
            | Output::TopkLogProbs
            | Output::GradLogits
            | Output::Lse
            | Output::ZLoss
            | Output::ForwardKl
            | Output::ReverseKl
            | Output::SoftCrossEntropy => true,
        }
    }

    /// The element `(row, col)` as reports name it: `log_probs[3]` for a
    /// per-row output, `topk_log_probs[3, 1]`, `grad_logits[3, 17]`.
    pub fn element(self, row: usize, col: usize) -> String {
        match self.columns() {
            Columns::One => format!("{}[{row}]", self.name()),
            Columns::TopK | Columns::Vocabulary => format!("{}[{row}, {col}]", self.name()),
        }
    }

    /// This output's upstream cotangent in `cotangents`, as `[N, width]`
    /// (`[1, 1]` for a [reduced](Output::reduced) `loss`; `None` for
    /// `grad_logits`).
    pub fn cotangent<'a>(self, cotangents: &Cotangents<'a>) -> Option<ArrayView2<'a, f64>> {
        cotangents.get(self)
    }
}

impl std::fmt::Display for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The log-prob family's grouped arms (`Family::LogSoftmax(_)` after
    /// the log-prob and the entropy: `Problem::cotangent_allowed`, the
    /// relative rule's `CarefulRow::values` and `floor`, verify's
    /// `nothing_checked_reason`) treat every other statistic of the family
    /// as a count: no cotangent, exact, judged on rows with a target. A
    /// statistic that is not one fails here, so that those arms are
    /// revisited (ARCHITECTURE.md, "Where a new output plugs in").
    #[test]
    fn the_log_prob_familys_other_statistics_are_counts() {
        for o in Output::ALL {
            if let Family::LogSoftmax(s) = o.family() {
                let grouped = !matches!(s, RowStat::LogProb | RowStat::Entropy);
                assert_eq!(
                    grouped,
                    o.is_count(),
                    "{o}: revisit the Family::LogSoftmax(_) arms"
                );
                if grouped {
                    assert!(o.cotangent_name().is_none(), "{o} has a cotangent");
                }
            }
        }
    }

    /// `Output::request` sets the flag [`Output::requested`] reads, for
    /// the outputs such a flag alone asks for.
    #[test]
    fn a_requested_flag_requests_its_output() {
        use crate::spec::Logits;
        use ndarray::{arr1, arr2};
        let x = arr2(&[[0.0f32, 1.0]]);
        let t = arr1(&[1i64]);
        for o in [Output::Lse, Output::TokenRanks] {
            let mut p = Problem::new(Logits::F32(x.view()));
            p.tokens = Some(t.view());
            assert!(!o.requested(&p), "{o}");
            o.request(&mut p.options);
            assert!(o.requested(&p), "{o}");
        }
    }
}
