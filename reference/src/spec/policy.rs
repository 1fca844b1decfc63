//! Policy-gradient terms against given log-probs (docs/design.md, "The loss side"):
//! the KL estimators against a reference policy and the importance ratio
//! against the behaviour policy, their clamps, and their validation.
//! Shared by the oracle and every kernel (plain Rust).
//!
//! # Formula
//!
//! Per row with a target (token not `ignore_index`), `lp` the row's
//! `log_probs` value (`log softmax(z')[token]`, nats), `ref` / `old` the
//! row's exact inputs [`PolicyInputs::ref_log_probs`] /
//! [`PolicyInputs::old_log_probs`], `d = lp - ref`:
//!
//! - `kl_k1 = d`, `kl_k2 = d^2 / 2`, `kl_abs = |d|`;
//! - `kl_k3 = e^{-d_c} + d_c - 1`, evaluated as `expm1(-d_c) + d_c` (no
//!   cancellation near 0, where the naive form loses every digit), with
//!   `d_c = clamp(d, -c_in, c_in)` under `kl_input_clamp = c_in`, then
//!   `min(kl_k3, c_out)` under `kl_output_clamp = c_out` (`kl_k3 >= 0`, so
//!   the lower clamp `-c_out` never binds);
//! - `ratio = exp(r_c)`, `r_c = clamp(lp - old, -c_r, c_r)` under
//!   `ratio_log_clamp = c_r`.
//!
//! The clamps are verl's (`core_algos.kl_penalty(..., "low_var_kl")`:
//! `kl = clamp(ref - lp, -20, 20)`, `kld = exp(kl) - kl - 1`, `clamp(kld,
//! -10, 10)`, which is the form above since the input clamp is symmetric;
//! `compute_policy_loss`: `clamp(lp - old, -20, 20)` before `exp`); `k1`,
//! `k2` and `abs` are unclamped there and here. An `ignore_index` row has
//! no log-prob: its terms are 0 and not judged, their cotangents taken as 0.
//!
//! # Derivatives (the VJP)
//!
//! Each term depends on the logits only through `lp`, so its VJP is the
//! log-prob's with the cotangent `c k'(d)`: `k1' = 1`, `k2' = d`,
//! `kl_abs' = sign(d)` (0 at 0, as PyTorch's `abs`), `k3' = 1 - e^{-d_c} =
//! -expm1(-d_c)`, `ratio' = ratio`. A clamp passes the derivative where its
//! argument lies inside it, bounds included, and gives 0 outside (PyTorch's
//! `clamp` backward): `k3' = 0` where `|d| > c_in` or `k3 > c_out`,
//! `ratio' = 0` where `|lp - old| > c_r`.

use ndarray::ArrayView1;

use super::meta_key;
use super::{Dtype, Output, Problem, SpecError};

/// The exact per-row inputs of the policy terms, `[N]` each, f64 (every
/// f32/bf16/f16 value is exact in f64), nats. Absent = the terms that need
/// it are not computed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PolicyInputs<'a> {
    /// `ref_log_probs [N]`: the reference policy's log-prob of each row's
    /// token (needed by `kl_k1`, `kl_k2`, `kl_k3`, `kl_abs`).
    pub ref_log_probs: Option<ArrayView1<'a, f64>>,
    /// `old_log_probs [N]`: the behaviour policy's log-prob of each row's
    /// token (needed by `ratio`).
    pub old_log_probs: Option<ArrayView1<'a, f64>>,
}

impl<'a> PolicyInputs<'a> {
    /// Whether neither input is given.
    pub fn is_empty(&self) -> bool {
        self.ref_log_probs.is_none() && self.old_log_probs.is_none()
    }

    /// The same views at a shorter lifetime (field by field: a struct
    /// literal that mixes these with shorter-lived views needs it).
    pub fn shorten<'b>(&self) -> PolicyInputs<'b>
    where
        'a: 'b,
    {
        PolicyInputs {
            ref_log_probs: self.ref_log_probs,
            old_log_probs: self.old_log_probs,
        }
    }

    /// Rows `rows` of both inputs.
    pub fn slice_rows<'b>(&self, rows: std::ops::Range<usize>) -> PolicyInputs<'b>
    where
        'a: 'b,
    {
        let one =
            |g: Option<ArrayView1<'b, f64>>| g.map(|g| g.slice_move(ndarray::s![rows.clone()]));
        PolicyInputs {
            ref_log_probs: one(self.ref_log_probs),
            old_log_probs: one(self.old_log_probs),
        }
    }
}

/// The clamps real code applies (module docs; dump metadata
/// `kl_input_clamp`, `kl_output_clamp`, `ratio_log_clamp`), each `> 0` and
/// finite, rounded to the accumulation dtype as the temperature is (PyTorch
/// compares in the tensor's dtype). `None` = no clamp.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PolicyClamps {
    /// `c_in`: `d` clamped to `[-c_in, c_in]` before `kl_k3`.
    pub kl_input: Option<f64>,
    /// `c_out`: `kl_k3` clamped to `[-c_out, c_out]`.
    pub kl_output: Option<f64>,
    /// `c_r`: `lp - old` clamped to `[-c_r, c_r]` before the `exp` of `ratio`.
    pub ratio_log: Option<f64>,
}

impl PolicyClamps {
    /// Whether no clamp is set.
    pub fn is_empty(&self) -> bool {
        *self == PolicyClamps::default()
    }

    /// The clamps as the computation takes them: each rounded to `acc` (f32
    /// or f64), as an exact f64.
    ///
    /// # Errors
    /// [`SpecError::BadClamp`] naming the first clamp (in field order) that
    /// is not finite and `> 0`, as given or rounded.
    pub fn effective(&self, acc: Dtype) -> Result<PolicyClamps, SpecError> {
        let one = |name: &'static str, c: Option<f64>| -> Result<Option<f64>, SpecError> {
            c.map(|c| {
                acc.round_positive(c)
                    .ok_or(SpecError::BadClamp { name, value: c })
            })
            .transpose()
        };
        Ok(PolicyClamps {
            kl_input: one(meta_key::KL_INPUT_CLAMP, self.kl_input)?,
            kl_output: one(meta_key::KL_OUTPUT_CLAMP, self.kl_output)?,
            ratio_log: one(meta_key::RATIO_LOG_CLAMP, self.ratio_log)?,
        })
    }
}

/// One row's policy inputs as the terms take them (the oracle's, the
/// kernels' and the bounds' view of a row): `ref_log_probs[row]`,
/// `old_log_probs[row]` (exact f64, nats) and the clamps rounded to the
/// accumulation dtype ([`PolicyClamps::effective`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PolicyRow {
    /// `ref_log_probs[row]`.
    pub ref_lp: Option<f64>,
    /// `old_log_probs[row]`.
    pub old_lp: Option<f64>,
    /// The clamps as the computation takes them (rounded to the
    /// accumulation dtype).
    pub clamps: PolicyClamps,
}

impl PolicyRow {
    /// Row `row` of a validated `problem` (clamps invalid there are refused
    /// by validation; taken as absent here). O(1).
    pub fn of(problem: &Problem<'_>, row: usize) -> PolicyRow {
        PolicyRow {
            ref_lp: problem.policy.ref_log_probs.map(|a| a[row]),
            old_lp: problem.policy.old_log_probs.map(|a| a[row]),
            clamps: problem
                .options
                .policy_clamps
                .effective(problem.accumulation())
                .unwrap_or_default(),
        }
    }

    /// `term`'s input (`old` for `ratio`, `ref` otherwise), `None` when
    /// absent.
    pub fn input(&self, term: PolicyTerm) -> Option<f64> {
        if term.uses_old() {
            self.old_lp
        } else {
            self.ref_lp
        }
    }
}

/// One policy term (module docs): which output it is, which input it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolicyTerm {
    /// `kl_k1 = d`.
    K1,
    /// `kl_k2 = d^2 / 2`.
    K2,
    /// `kl_k3 = expm1(-d_c) + d_c`, clamped.
    K3,
    /// `kl_abs = |d|`.
    Abs,
    /// `ratio = exp(clamp(lp - old))`.
    Ratio,
}

impl PolicyTerm {
    /// Every term, in [`Output::ALL`] order.
    pub const ALL: [PolicyTerm; 5] = [
        PolicyTerm::K1,
        PolicyTerm::K2,
        PolicyTerm::K3,
        PolicyTerm::Abs,
        PolicyTerm::Ratio,
    ];

    /// The output this term is.
    pub fn output(self) -> Output {
        match self {
            PolicyTerm::K1 => Output::KlK1,
            PolicyTerm::K2 => Output::KlK2,
            PolicyTerm::K3 => Output::KlK3,
            PolicyTerm::Abs => Output::KlAbs,
            PolicyTerm::Ratio => Output::Ratio,
        }
    }

    /// Whether the term is against `old_log_probs` (`ratio`) rather than
    /// `ref_log_probs` (the KL estimators).
    pub fn uses_old(self) -> bool {
        self == PolicyTerm::Ratio
    }

    /// Row `row`'s input of this term (`ref` or `old`), `None` when absent.
    pub fn input(self, policy: &PolicyInputs<'_>, row: usize) -> Option<f64> {
        let a = if self.uses_old() {
            policy.old_log_probs
        } else {
            policy.ref_log_probs
        };
        a.map(|a| a[row])
    }
}

/// Checks the policy inputs' shapes against `n` rows and their need for
/// `tokens` (O(1)).
///
/// # Errors
/// [`SpecError::ShapeMismatch`] (`ref_log_probs` / `old_log_probs` not
/// `[N]`), [`SpecError::MissingTensor`] (either without `tokens`).
pub(super) fn validate_shapes(
    policy: &PolicyInputs<'_>,
    n: usize,
    has_tokens: bool,
) -> Result<(), SpecError> {
    for (name, output, a) in [
        ("ref_log_probs", "kl_k1", policy.ref_log_probs),
        ("old_log_probs", "ratio", policy.old_log_probs),
    ] {
        if let Some(a) = a {
            if a.len() != n {
                return Err(SpecError::ShapeMismatch {
                    tensor: name,
                    expected: vec![n],
                    found: a.shape().to_vec(),
                });
            }
            if !has_tokens {
                return Err(SpecError::MissingTensor {
                    output,
                    tensor: "tokens",
                });
            }
        }
    }
    Ok(())
}

/// Checks row `row`'s policy inputs: each finite.
///
/// # Errors
/// [`SpecError::NonFinitePolicyInput`] naming the tensor and row.
pub(super) fn validate_row(policy: &PolicyInputs<'_>, row: usize) -> Result<(), SpecError> {
    for (tensor, a) in [
        ("ref_log_probs", policy.ref_log_probs),
        ("old_log_probs", policy.old_log_probs),
    ] {
        if let Some(a) = a {
            let value = a[row];
            if !value.is_finite() {
                return Err(SpecError::NonFinitePolicyInput { tensor, row, value });
            }
        }
    }
    Ok(())
}
