//! The policy terms in the accumulation dtype (the formulas of
//! `logprobe_reference::spec::PolicyTerm`, docs/design.md, "The loss side"): the KL
//! estimators `kl_k1`, `kl_k2`, `kl_k3`, `kl_abs` against `ref_log_probs`
//! and the importance `ratio` against `old_log_probs`, from the row's
//! log-prob `lp^` in the accumulation dtype `A` (unrounded to the output).
//!
//! Operations (the tolerance model's (T20) counts them): the input `x`
//! rounded to `A`, `d^ = fl(lp^ - x^)`; `k1 = d^`, `k2 = fl(fl(d^ d^) / 2)`,
//! `abs = |d^|` (exact); `k3 = fl(expm1(-d_c) + d_c)` with `d_c` the clamp
//! of `d^` (exact: the clamps are values of `A`) and CORE-MATH's correctly
//! rounded `expm1` ([`Acc::expm1`]), then `min(k3, c_out)` (exact); `ratio =
//! exp(clamp(fl(lp^ - old^)))` with the kernel's own `exp` ([`Acc::exp`]).
//! Derivatives (the VJP's log-prob cotangent `sum c k'`): `1`, `d^`,
//! `sign(d^)`, `-expm1(-d_c)` (0 outside the clamps), the ratio itself
//! (0 outside its clamp).

use logprobe_reference::spec::{self, Cotangents, PolicyTerm, Problem};

use crate::row::Acc;

/// One row's policy inputs in `A`: `ref`, `old` (rounded to `A`) and the
/// clamps (values of `A`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PolicyRow<A> {
    /// `ref_log_probs[row]`.
    pub ref_lp: Option<A>,
    /// `old_log_probs[row]`.
    pub old_lp: Option<A>,
    /// `c_in`.
    pub kl_input: Option<A>,
    /// `c_out`.
    pub kl_output: Option<A>,
    /// `c_r`.
    pub ratio_log: Option<A>,
}

impl<A: Acc> PolicyRow<A> {
    /// Row `row` of a validated `problem` (`None` without policy inputs):
    /// the spec's [`spec::PolicyRow`] rounded to `A`.
    pub fn of(problem: &Problem<'_>, row: usize) -> Option<Self> {
        if problem.policy.is_empty() {
            return None;
        }
        let r = spec::PolicyRow::of(problem, row);
        Some(PolicyRow {
            ref_lp: r.ref_lp.map(A::from_f64),
            old_lp: r.old_lp.map(A::from_f64),
            kl_input: r.clamps.kl_input.map(A::from_f64),
            kl_output: r.clamps.kl_output.map(A::from_f64),
            ratio_log: r.clamps.ratio_log.map(A::from_f64),
        })
    }

    fn input(&self, term: PolicyTerm) -> Option<A> {
        if term.uses_old() {
            self.old_lp
        } else {
            self.ref_lp
        }
    }

    /// `term` at log-prob `lp` (module docs); `None` without its input.
    pub fn value(&self, term: PolicyTerm, lp: A) -> Option<A> {
        let d = lp - self.input(term)?;
        Some(match term {
            PolicyTerm::K1 => d,
            PolicyTerm::K2 => d * d / A::from_f64(2.0),
            PolicyTerm::Abs => abs(d),
            PolicyTerm::K3 => {
                let dc = clamp(d, self.kl_input);
                let k = (-dc).expm1() + dc;
                match self.kl_output {
                    Some(c) if k > c => c,
                    _ => k,
                }
            }
            PolicyTerm::Ratio => clamp(d, self.ratio_log).exp(),
        })
    }

    /// `k'(d)` at log-prob `lp` (module docs); `None` without its input.
    pub fn slope(&self, term: PolicyTerm, lp: A) -> Option<A> {
        let d = lp - self.input(term)?;
        let inside = |c: Option<A>| c.is_none_or(|c| -c <= d && d <= c);
        Some(match term {
            PolicyTerm::K1 => A::ONE,
            PolicyTerm::K2 => d,
            PolicyTerm::Abs => {
                if d > A::ZERO {
                    A::ONE
                } else if d < A::ZERO {
                    -A::ONE
                } else {
                    A::ZERO
                }
            }
            PolicyTerm::K3 => {
                let dc = clamp(d, self.kl_input);
                let m = (-dc).expm1();
                let k = m + dc;
                if inside(self.kl_input) && self.kl_output.is_none_or(|c| k <= c) {
                    -m
                } else {
                    A::ZERO
                }
            }
            PolicyTerm::Ratio => {
                if inside(self.ratio_log) {
                    clamp(d, self.ratio_log).exp()
                } else {
                    A::ZERO
                }
            }
        })
    }
}

/// One row's policy-term cotangents in `A`: the target column and `(term,
/// c)` pairs (nonzero), with the row's inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicySide<A> {
    /// The target column.
    pub target: usize,
    /// `(term, c)` per nonzero cotangent.
    pub terms: Vec<(PolicyTerm, A)>,
    /// The row's inputs.
    pub row: PolicyRow<A>,
}

impl<A: Acc> PolicySide<A> {
    /// Row `row`'s side (`None` without a nonzero policy cotangent or on an
    /// `ignore_index` row).
    pub fn of(problem: &Problem<'_>, cot: &Cotangents<'_>, row: usize) -> Option<Self> {
        let terms: Vec<(PolicyTerm, A)> = problem
            .policy_cotangents(cot, row)
            .into_iter()
            .map(|(t, c)| (t, A::from_f64(c)))
            .collect();
        if terms.is_empty() {
            return None;
        }
        Some(PolicySide {
            target: problem.tokens.map_or(0, |t| t[row]) as usize,
            terms,
            row: PolicyRow::of(problem, row)?,
        })
    }

    /// The log-prob cotangent `sum_i c_i k_i'(lp)` in term order.
    pub fn weight(&self, lp: A) -> A {
        self.terms.iter().fold(A::ZERO, |s, &(t, c)| {
            s + c * self.row.slope(t, lp).unwrap_or(A::ZERO)
        })
    }
}

fn abs<A: Acc>(x: A) -> A {
    if x < A::ZERO {
        -x
    } else {
        x
    }
}

fn clamp<A: Acc>(x: A, c: Option<A>) -> A {
    match c {
        Some(c) if x > c => c,
        Some(c) if x < -c => -c,
        _ => x,
    }
}
