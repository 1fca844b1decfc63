//! One row of the problem at one working precision: the exact inputs, the
//! enclosures of `d_j`, `exp(d_j)` and the row sums (`s = S - 1`, `s_w`,
//! `B = sum F_j |e_j|`, `sum F_j e_j^2`), the forward values and the row
//! statistics. Formulas: docs/design.md, "The math"; see the module docs of
//! [`crate::oracle`].
//!
//! Here: the row's exact inputs ([`Row`], built by [`prepare`]) and its
//! families' shift references ([`Top`]). In `softcap.rs` the softcap's
//! enclosures, in `entry.rs` one entry's `d_j` and `exp(d_j)`, in
//! `sums.rs` the row-sum pass, in `values.rs` the forward values and the
//! row statistics.

mod entry;
mod softcap;
mod sums;
mod values;

pub(crate) use entry::Entry;
pub(crate) use softcap::{softcap_enclosure, softcap_factor};
pub(crate) use sums::{pass, Cache, Sums};
pub(crate) use values::{one_plus, stats, values, RowValues};

use ndarray::{ArrayView1, Axis};
use rug::float::Round;
use rug::ops::AssignRound;
use rug::Float;

use crate::interval::MpfrInterval;
use crate::spec::{
    Element, EntropyLogits, Problem, Shape, SoftcapDtype, SpecError, TemperatureDtype,
};
use crate::with_logits;

/// Entries per parallel work item inside a row. Fixed (never derived from
/// the thread count), so every enclosure is the same whatever the threads.
pub(crate) const CHUNK: usize = 8192;

/// Extra bits of the row-sum accumulators over the working precision, so
/// that the summation's own rounding is negligible next to each term's.
pub(crate) const ACC_EXTRA: u32 = 64;

/// A softmax family: the entries it runs over and its maximum.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Family {
    /// `max_j v_j` over the family (finite).
    pub vmax: f64,
    /// The first index attaining it: its term (exactly 1) is the one left
    /// out of `s = S - 1`.
    pub argmax: usize,
}

/// A top-k id as the math sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum TopId {
    /// Disallowed by the sampling mask: log-prob `-inf`, a constant.
    Masked,
    /// Allowed (its logit may be `-inf`: log-prob `-inf`, still
    /// differentiated by the formula).
    Live(usize),
}

/// The softcap as the oracle takes it (docs/design.md, "The loss side").
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RowSoftcap {
    /// No softcap.
    None,
    /// `SoftcapDtype::Accumulation`: `x'_j = c tanh(x_j / c)` exactly, `v`
    /// holds the raw `x` and every shift encloses `x'` at the working
    /// precision ([`Top`], [`Entry::shift`]); gradient factor
    /// `sech^2(x_j / c)`.
    Exact(f64),
    /// `SoftcapDtype::Input`: `v` holds the materialised `x'`
    /// ([`crate::spec::Dtype::softcapped_input`]), exact; the gradient
    /// factor is `1 - t_j^2` with these materialised `t_j` (`[V]`).
    Input(Vec<f64>),
}

/// One row's exact inputs.
#[derive(Debug)]
pub(crate) struct Row<'a> {
    /// `v_j`: `x_j` (temperature in the accumulation) or
    /// `z_j = round_input(x_j / T)` (temperature in the input dtype), `[V]`,
    /// finite or `-inf`; with a softcap `x'_j` (input) or the raw `x_j`
    /// (exact softcap: then a `-inf` is the finite `x' = -c`).
    pub v: Vec<f64>,
    /// The softcap.
    pub softcap: RowSoftcap,
    /// Sampling-mask row (`true` = allowed), `[V_total]`.
    pub mask: Option<ArrayView1<'a, bool>>,
    /// Divisor of the shifted logits: `d_j = (v_j - v_max) / ts` (`T`, or 1
    /// when `v` already is `z`).
    pub ts: f64,
    /// Temperature `T` (divisor of every gradient).
    pub temperature: f64,
    /// Family of `p = softmax(z')` (allowed finite entries).
    pub p: Family,
    /// Family of the entropy's `q = softmax(w)`; `None` when not needed.
    pub q: Option<Family>,
    /// Whether `w` is masked (`q`'s entries are `p`'s).
    pub q_masked: bool,
    /// `q` exists and shares `p`'s maximum: one exp per entry serves both.
    pub shared: bool,
    /// Target column (None without tokens or on `ignore_index` rows).
    pub target: Option<usize>,
    /// Top-k ids `[K]`.
    pub topk: Vec<TopId>,
    /// The row's `loss_weights` entry (1 without weights).
    pub weight: f64,
    /// The row's policy-term inputs (`ref`, `old`, clamps).
    pub policy: super::policy::PolicyRow,
    /// The teacher's probabilities `p_j [V]` of `soft_cross_entropy` (empty
    /// without `teacher_probs`), as `teacher_form` holds them.
    pub teacher_probs: Vec<f64>,
    /// Probabilities, or log-probabilities (`p_j = exp(a_j)` exactly).
    pub teacher_form: crate::spec::TeacherForm,
    /// The teacher's log-probs `a_k [K]` of the top-k KL (empty without
    /// `options.topk_kl`).
    pub teacher: Vec<f64>,
}

impl Row<'_> {
    /// Allowed by the sampling mask.
    pub fn allowed(&self, j: usize) -> bool {
        self.mask.is_none_or(|m| m[j])
    }

    /// The exact softcap `c` (`RowSoftcap::Exact`), else `None`.
    pub fn cap(&self) -> Option<f64> {
        match self.softcap {
            RowSoftcap::Exact(c) => Some(c),
            _ => None,
        }
    }

    /// Whether entry `j`'s `z` is finite (under an exact softcap every
    /// entry is: `x' >= -c`).
    pub fn finite(&self, j: usize) -> bool {
        self.v[j] > f64::NEG_INFINITY || self.cap().is_some()
    }

    /// Entry of `p`'s family (allowed, finite).
    pub fn in_p(&self, j: usize) -> bool {
        self.finite(j) && self.allowed(j)
    }

    /// Entry of `q`'s family.
    pub fn in_q(&self, j: usize) -> bool {
        self.q.is_some() && self.finite(j) && (!self.q_masked || self.allowed(j))
    }

    /// The shift reference of a family whose max entry has `v = vmax`, at
    /// precision `prec` ([`Top::new`]).
    pub fn top(&self, vmax: f64, prec: u32) -> Top {
        Top::new(vmax, self.cap(), self.ts, prec)
    }
}

/// A family's shift reference at one precision: `a_j = (m - x'_j) / ts`
/// with `m` the family's max (exact without an exact softcap; else an
/// enclosure of `x'_max = c tanh(vmax / c)`).
#[derive(Debug)]
pub(crate) struct Top {
    /// The max's `v` (raw logit under an exact softcap).
    pub raw: f64,
    /// Enclosure of the max (a point without an exact softcap).
    pub m: MpfrInterval,
    /// The exact softcap `c`, if any.
    pub cap: Option<f64>,
    /// Divisor of the shift.
    pub ts: f64,
}

impl Top {
    /// The reference of max `vmax` (its enclosure at `prec` bits under an
    /// exact softcap `cap`), shifts divided by `ts`.
    pub fn new(vmax: f64, cap: Option<f64>, ts: f64, prec: u32) -> Self {
        let m = match cap {
            None => MpfrInterval::point(53, vmax),
            Some(c) => {
                let mut m = MpfrInterval::new(prec);
                let mut y = Float::new(prec);
                let mut d = Float::new(prec);
                softcap_enclosure(&mut m, &mut y, &mut d, vmax, c);
                m
            }
        };
        Top {
            raw: vmax,
            m,
            cap,
            ts,
        }
    }

    /// `m / ts` outward (the max's `z`, e.g. for `lse`).
    pub fn z_max(&self, prec: u32) -> MpfrInterval {
        let mut out = MpfrInterval::new(prec);
        out.lo.assign_round(&self.m.lo / self.ts, Round::Down);
        out.hi.assign_round(&self.m.hi / self.ts, Round::Up);
        out
    }
}

/// Builds row `row` (validated already by [`Problem::validate_row`]);
/// `entropy` chooses the entropy's logits (`None`: no entropy family).
///
/// # Errors
/// With `TemperatureDtype::Input`, where `round_input(x / T)` overflows:
/// `+inf` is [`SpecError::NonFiniteLogit`]; a `-inf` target is
/// [`SpecError::TokenNegInf`]; no allowed finite `z` is
/// [`SpecError::NoFiniteLogit`].
pub(crate) fn prepare<'a>(
    problem: &Problem<'a>,
    shape: &Shape,
    row: usize,
    entropy: Option<EntropyLogits>,
) -> Result<Row<'a>, SpecError> {
    let vsz = shape.vocab_size;
    let temperature = shape.temperature;
    let mut v: Vec<f64> = with_logits!(problem.logits, lv => lv.row(row).iter().take(vsz).map(|x| x.to_f64()).collect());
    let mask = problem
        .sampling_mask
        .map(|m| m.index_axis_move(Axis(0), row));
    // The softcap first (docs/design.md: before the temperature); validated already.
    let softcap = match problem.options.effective_softcap(shape.accumulation)? {
        None => RowSoftcap::None,
        Some(c) => match problem.options.softcap_dtype {
            SoftcapDtype::Accumulation => RowSoftcap::Exact(c),
            SoftcapDtype::Input => {
                let t: Vec<f64> = v
                    .iter()
                    .map(|&x| shape.dtype.softcap_tanh_input(x, c))
                    .collect();
                for x in v.iter_mut() {
                    *x = shape.dtype.softcapped_input(*x, c);
                }
                problem.validate_softcapped_row(row, &v)?;
                RowSoftcap::Input(t)
            }
        },
    };
    let capped = matches!(softcap, RowSoftcap::Exact(_));
    let ts = match problem.options.temperature_dtype {
        TemperatureDtype::Accumulation => temperature,
        TemperatureDtype::Input => {
            for x in v.iter_mut() {
                *x = shape.dtype.scaled_input(*x, temperature);
            }
            problem.validate_input_row(row, &v)?;
            1.0
        }
    };
    let allowed = |j: usize| mask.is_none_or(|m| m[j]);
    let p = family(&v, capped, allowed).ok_or(SpecError::NoFiniteLogit {
        tensor: "logits / temperature",
        row,
        which: if mask.is_some() {
            "allowed by sampling_mask"
        } else {
            "any"
        },
    })?;
    // A target with v = -inf was rejected by `validate_row` (raw logits)
    // or `validate_input_row` (materialised z).
    let target = match problem.tokens {
        Some(t) if problem.has_target(row) => Some(t[row] as usize),
        _ => None,
    };
    let (q, q_masked) = match entropy {
        None => (None, false),
        Some(EntropyLogits::Masked) => (Some(p), true),
        Some(EntropyLogits::Unmasked) if mask.is_none() => (Some(p), false),
        Some(EntropyLogits::Unmasked) => {
            let all = family(&v, capped, |_| true).expect("p's entry is finite");
            (Some(if all.vmax == p.vmax { p } else { all }), false)
        }
    };
    let shared = q.is_some_and(|q| q.vmax == p.vmax);
    let topk = problem.topk_ids.map_or(Vec::new(), |ids| {
        ids.row(row)
            .iter()
            .map(|&id| {
                if allowed(id as usize) {
                    TopId::Live(id as usize)
                } else {
                    TopId::Masked
                }
            })
            .collect()
    });
    Ok(Row {
        v,
        softcap,
        mask,
        ts,
        temperature,
        p,
        q,
        q_masked,
        shared,
        target,
        topk,
        weight: problem.loss_weight(row),
        policy: super::policy::PolicyRow::of(problem, row),
        teacher_form: problem.options.teacher_form,
        teacher_probs: problem
            .teacher_probs
            .map_or_else(Vec::new, |p| p.row(row).iter().take(vsz).copied().collect()),
        teacher: match (problem.options.topk_kl, problem.teacher_topk_log_probs) {
            (Some(_), Some(a)) => a.row(row).to_vec(),
            _ => Vec::new(),
        },
    })
}

/// The family over `member` entries with finite `z` (every entry under an
/// exact softcap, where `x' = c tanh(x / c)` is increasing in `x`, so the
/// raw max is the max; a family of `-inf` raw logits has `vmax = -inf`).
fn family(v: &[f64], capped: bool, member: impl Fn(usize) -> bool) -> Option<Family> {
    let mut best: Option<Family> = None;
    for (j, &x) in v.iter().enumerate() {
        if (capped || x > f64::NEG_INFINITY) && member(j) && best.is_none_or(|b| x > b.vmax) {
            best = Some(Family { vmax: x, argmax: j });
        }
    }
    best
}
