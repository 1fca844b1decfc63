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

use ndarray::{Array2, ArrayView1, ArrayView2, Axis};

use super::loss::Reduction;
use super::problem::{Cotangents, Problem, Shape};

/// One output of the problem (docs/design.md, "The math"; names as in the dump
/// format, `docs/dump-from-pytorch.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Output {
    /// `log_probs [N]` (stored `[N, 1]`): `log softmax(z')[token]`, nats.
    LogProbs,
    /// `entropy [N]` (stored `[N, 1]`): `-sum softmax(w) log softmax(w)`, nats.
    Entropy,
    /// `topk_log_probs [N, K]`: `log softmax(z')[topk_ids]`, nats (`-inf`
    /// for a masked id).
    TopkLogProbs,
    /// `grad_logits [N, V_total]`: the VJP of the cotangent-weighted
    /// forward outputs, nats per logit unit (padded columns 0).
    GradLogits,
    /// `lse [N]` (stored `[N, 1]`): `logsumexp(z')` per row, nats.
    Lse,
    /// `z_loss [N]` (stored `[N, 1]`): `z_loss_coef * lse^2` per row
    /// (docs/design.md, "The loss side"; reduction `none`, every row).
    ZLoss,
    /// `loss`: the cross-entropy (docs/design.md, "The loss side";
    /// [`crate::spec::CrossEntropy`]), nats. Under `reduction = none`
    /// `[N]` (stored `[N, 1]`): `w_r * l_r`, exactly 0 on `ignore_index`
    /// rows; under `sum` / `mean` one value for the problem
    /// ([`Output::reduced`]), the per-row values `[N, 1]` being the terms
    /// it reduces.
    Loss,
    /// `kl_k1 [N]` (stored `[N, 1]`): `d = log_prob - ref_log_probs`, nats
    /// (docs/design.md, "The loss side"; [`crate::spec::PolicyTerm`]).
    KlK1,
    /// `kl_k2 [N]`: `d^2 / 2`, nats squared.
    KlK2,
    /// `kl_k3 [N]`: `expm1(-d_c) + d_c` under the KL clamps, nats.
    KlK3,
    /// `kl_abs [N]`: `|d|`, nats.
    KlAbs,
    /// `ratio [N]`: `exp(clamp(log_prob - old_log_probs))`, dimensionless.
    Ratio,
    /// `forward_kl [N]` (stored `[N, 1]`): `sum_k e^{a_k} (a_k - log
    /// p(id_k))` over the teacher's top-k (docs/design.md, "The loss side";
    /// [`crate::spec::TopkKl`]), nats.
    ForwardKl,
    /// `reverse_kl [N]` (stored `[N, 1]`): `sum_k p(id_k) (log p(id_k) -
    /// a_k)` over the same support, nats.
    ReverseKl,
}

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

impl Output {
    /// How many outputs there are.
    pub const COUNT: usize = 14;

    /// Every output, in report order.
    pub const ALL: [Output; Output::COUNT] = [
        Output::LogProbs,
        Output::Entropy,
        Output::TopkLogProbs,
        Output::GradLogits,
        Output::Lse,
        Output::ZLoss,
        Output::Loss,
        Output::KlK1,
        Output::KlK2,
        Output::KlK3,
        Output::KlAbs,
        Output::Ratio,
        Output::ForwardKl,
        Output::ReverseKl,
    ];

    /// The outputs of a forward call (everything but gradients), in report
    /// order: [`Output::ALL`] without `grad_logits`.
    pub const FORWARD: [Output; Output::COUNT - 1] = {
        let mut forward = [Output::LogProbs; Output::COUNT - 1];
        let (mut i, mut j) = (0, 0);
        while i < Output::COUNT {
            if !matches!(Output::ALL[i], Output::GradLogits) {
                forward[j] = Output::ALL[i];
                j += 1;
            }
            i += 1;
        }
        forward
    };

    /// Position in [`Output::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The tensor name (dump format, reports): `log_probs`, `entropy`,
    /// `topk_log_probs`, `grad_logits`, `lse`, `z_loss`, `loss`.
    pub fn name(self) -> &'static str {
        match self {
            Output::LogProbs => "log_probs",
            Output::Entropy => "entropy",
            Output::TopkLogProbs => "topk_log_probs",
            Output::GradLogits => "grad_logits",
            Output::Lse => "lse",
            Output::ZLoss => "z_loss",
            Output::Loss => "loss",
            Output::KlK1 => "kl_k1",
            Output::KlK2 => "kl_k2",
            Output::KlK3 => "kl_k3",
            Output::KlAbs => "kl_abs",
            Output::Ratio => "ratio",
            Output::ForwardKl => "forward_kl",
            Output::ReverseKl => "reverse_kl",
        }
    }

    /// The tensor name of this output's upstream cotangent (`grad_<name>`),
    /// `None` for `grad_logits` (nothing is differentiated through it).
    pub fn cotangent_name(self) -> Option<&'static str> {
        match self {
            Output::LogProbs => Some("grad_log_probs"),
            Output::Entropy => Some("grad_entropy"),
            Output::TopkLogProbs => Some("grad_topk_log_probs"),
            Output::GradLogits => None,
            Output::Lse => Some("grad_lse"),
            Output::ZLoss => Some("grad_z_loss"),
            Output::Loss => Some("grad_loss"),
            Output::KlK1 => Some("grad_kl_k1"),
            Output::KlK2 => Some("grad_kl_k2"),
            Output::KlK3 => Some("grad_kl_k3"),
            Output::KlAbs => Some("grad_kl_abs"),
            Output::Ratio => Some("grad_ratio"),
            Output::ForwardKl => Some("grad_forward_kl"),
            Output::ReverseKl => Some("grad_reverse_kl"),
        }
    }

    /// Whether a forward call computes this output (all but `grad_logits`).
    pub fn is_forward(self) -> bool {
        Output::FORWARD.contains(&self)
    }

    /// What the second axis indexes.
    pub fn columns(self) -> Columns {
        match self {
            Output::LogProbs
            | Output::Entropy
            | Output::Lse
            | Output::ZLoss
            | Output::Loss
            | Output::KlK1
            | Output::KlK2
            | Output::KlK3
            | Output::KlAbs
            | Output::Ratio => Columns::One,
            Output::ForwardKl | Output::ReverseKl => Columns::One,
            Output::TopkLogProbs => Columns::TopK,
            Output::GradLogits => Columns::Vocabulary,
        }
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
    /// with `tokens`, the entropy with `options.entropy`, top-k log-probs
    /// with `topk_ids`, `lse` with `options.lse`, `z_loss` with
    /// `options.z_loss_coef`, `loss` with `options.loss` and `tokens`, the
    /// KL estimators with `ref_log_probs` and `tokens`, `ratio` with
    /// `old_log_probs` and `tokens`; never `grad_logits` (a backward call's
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
            _ => false,
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
            | Output::Ratio => problem.has_target(row),
            Output::Loss => !self.reduced(problem),
            Output::Entropy
            | Output::TopkLogProbs
            | Output::GradLogits
            | Output::Lse
            | Output::ZLoss
            | Output::ForwardKl
            | Output::ReverseKl => true,
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
    /// (`[1, 1]` for a [reduced](Output::reduced) `loss`).
    pub fn cotangent<'a>(self, cotangents: &Cotangents<'a>) -> Option<ArrayView2<'a, f64>> {
        let col = |g: Option<ArrayView1<'a, f64>>| g.map(|g| g.insert_axis(Axis(1)));
        match self {
            Output::LogProbs => col(cotangents.grad_log_probs),
            Output::Entropy => col(cotangents.grad_entropy),
            Output::TopkLogProbs => cotangents.grad_topk_log_probs,
            Output::GradLogits => None,
            Output::Lse => col(cotangents.grad_lse),
            Output::ZLoss => col(cotangents.grad_z_loss),
            Output::Loss => col(cotangents.grad_loss),
            Output::KlK1 => col(cotangents.grad_kl_k1),
            Output::KlK2 => col(cotangents.grad_kl_k2),
            Output::KlK3 => col(cotangents.grad_kl_k3),
            Output::KlAbs => col(cotangents.grad_kl_abs),
            Output::Ratio => col(cotangents.grad_ratio),
            Output::ForwardKl => col(cotangents.grad_forward_kl),
            Output::ReverseKl => col(cotangents.grad_reverse_kl),
        }
    }
}

impl std::fmt::Display for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl<'a> Cotangents<'a> {
    /// The cotangents held per output (`[N, width]` each, as
    /// [`Output::cotangent`] gives them back); `grad_logits` is ignored;
    /// no [`Cotangents::loss_divisor`].
    pub fn from_outputs(per: &'a PerOutput<Array2<f64>>) -> Cotangents<'a> {
        let one = |o: Output| per.get(o).map(|a| a.column(0));
        Cotangents {
            grad_log_probs: one(Output::LogProbs),
            grad_entropy: one(Output::Entropy),
            grad_topk_log_probs: per.get(Output::TopkLogProbs).map(|a| a.view()),
            grad_lse: one(Output::Lse),
            grad_z_loss: one(Output::ZLoss),
            grad_loss: one(Output::Loss),
            loss_divisor: None,
            grad_kl_k1: one(Output::KlK1),
            grad_kl_k2: one(Output::KlK2),
            grad_kl_k3: one(Output::KlK3),
            grad_kl_abs: one(Output::KlAbs),
            grad_ratio: one(Output::Ratio),
            grad_forward_kl: one(Output::ForwardKl),
            grad_reverse_kl: one(Output::ReverseKl),
        }
    }
}

/// One value (or none) per [`Output`]: the container every per-output
/// quantity is held in. Iteration follows [`Output::ALL`].
#[derive(Clone, Debug, PartialEq)]
pub struct PerOutput<T> {
    slots: [Option<T>; Output::COUNT],
}

impl<T> Default for PerOutput<T> {
    fn default() -> Self {
        PerOutput {
            slots: std::array::from_fn(|_| None),
        }
    }
}

impl<T> PerOutput<T> {
    /// Nothing for any output.
    pub fn new() -> Self {
        Self::default()
    }

    /// `f(output)` for every output.
    pub fn from_fn(mut f: impl FnMut(Output) -> Option<T>) -> Self {
        PerOutput {
            slots: Output::ALL.map(&mut f),
        }
    }

    /// `make(output)` for every forward output `problem` requests
    /// ([`Output::requested`]).
    pub fn for_requested(problem: &Problem<'_>, mut make: impl FnMut(Output) -> T) -> Self {
        Self::from_fn(|o| o.requested(problem).then(|| make(o)))
    }

    /// The value of `output`, if any.
    pub fn get(&self, output: Output) -> Option<&T> {
        self.slots[output.index()].as_ref()
    }

    /// The value of `output`, mutably.
    pub fn get_mut(&mut self, output: Output) -> Option<&mut T> {
        self.slots[output.index()].as_mut()
    }

    /// Whether `output` has a value.
    pub fn contains(&self, output: Output) -> bool {
        self.slots[output.index()].is_some()
    }

    /// Sets `output`'s value, returning the previous one.
    pub fn insert(&mut self, output: Output, value: T) -> Option<T> {
        self.slots[output.index()].replace(value)
    }

    /// Removes and returns `output`'s value.
    pub fn take(&mut self, output: Output) -> Option<T> {
        self.slots[output.index()].take()
    }

    /// `output`'s value, inserting `make()` first when absent.
    pub fn get_or_insert_with(&mut self, output: Output, make: impl FnOnce() -> T) -> &mut T {
        self.slots[output.index()].get_or_insert_with(make)
    }

    /// The outputs with a value and their values, in [`Output::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (Output, &T)> {
        Output::ALL
            .into_iter()
            .zip(&self.slots)
            .filter_map(|(o, v)| v.as_ref().map(|v| (o, v)))
    }

    /// As [`PerOutput::iter`], mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (Output, &mut T)> {
        Output::ALL
            .into_iter()
            .zip(&mut self.slots)
            .filter_map(|(o, v)| v.as_mut().map(|v| (o, v)))
    }

    /// The outputs with a value.
    pub fn outputs(&self) -> impl Iterator<Item = Output> + '_ {
        self.iter().map(|(o, _)| o)
    }

    /// How many outputs have a value.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// Whether no output has a value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Each value mapped by `f(output, value)`.
    pub fn map<U>(self, mut f: impl FnMut(Output, T) -> U) -> PerOutput<U> {
        let mut slots = self.slots.into_iter();
        PerOutput {
            slots: Output::ALL.map(|o| slots.next().flatten().map(|v| f(o, v))),
        }
    }

    /// Borrows every value.
    pub fn as_ref(&self) -> PerOutput<&T> {
        PerOutput {
            slots: self.slots.each_ref().map(Option::as_ref),
        }
    }
}

impl<T> FromIterator<(Output, T)> for PerOutput<T> {
    fn from_iter<I: IntoIterator<Item = (Output, T)>>(iter: I) -> Self {
        let mut out = PerOutput::new();
        for (o, v) in iter {
            out.insert(o, v);
        }
        out
    }
}

impl<T> IntoIterator for PerOutput<T> {
    type Item = (Output, T);
    type IntoIter = std::iter::FilterMap<
        std::iter::Zip<
            std::array::IntoIter<Output, { Output::COUNT }>,
            std::array::IntoIter<Option<T>, { Output::COUNT }>,
        >,
        fn((Output, Option<T>)) -> Option<(Output, T)>,
    >;
    fn into_iter(self) -> Self::IntoIter {
        fn pair<T>((o, v): (Output, Option<T>)) -> Option<(Output, T)> {
            v.map(|v| (o, v))
        }
        Output::ALL
            .into_iter()
            .zip(self.slots)
            .filter_map(pair as fn(_) -> _)
    }
}

impl<T> std::ops::Index<Output> for PerOutput<T> {
    type Output = T;
    /// The value of `output`.
    ///
    /// # Panics
    /// When `output` has no value (use [`PerOutput::get`] where it may not).
    fn index(&self, output: Output) -> &T {
        match self.get(output) {
            Some(v) => v,
            None => panic!("no {output} here"),
        }
    }
}

impl<T> PerOutput<Array2<T>> {
    /// A per-row output (width 1) as `[N]`; `None` when absent.
    pub fn per_row(&self, output: Output) -> Option<ArrayView1<'_, T>> {
        self.get(output).map(|a| a.column(0))
    }
}
