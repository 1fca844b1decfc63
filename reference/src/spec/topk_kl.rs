//! Distillation KL over a teacher's top-k (docs/design.md, "The loss side"; issue 18):
//! the options and the checks of the teacher's log-probs. Shared by the
//! oracle, every kernel and the verifier (plain Rust).
//!
//! Per row, with the teacher's log-probs `a_k` (`teacher_topk_log_probs
//! [N, K]`, exact inputs) at `topk_ids [N, K]`, `t_k = e^{a_k}`, and the
//! student's log-probs `l_k = log p(id_k)` (the `topk_log_probs` of the
//! same row):
//!
//! - `forward_kl = sum_k t_k (a_k - l_k)`,
//! - `reverse_kl = sum_k p(id_k) (l_k - a_k)`,
//!
//! nats, `[N]`. With `renormalized`, `l_k` is replaced by the student's
//! log-probs renormalised over the K ids, `l'_k = l_k - ln sum_j p(id_j)`,
//! which is the log-softmax of `z'` restricted to the ids
//! (`(z_{id_k} - m) - ln sum_j e^{z_{id_j} - m}`, `m` their maximum: the
//! row's normaliser cancels). A teacher entry `a_k = -inf` is probability 0
//! and adds exactly 0 to `forward_kl` (and `+inf` to `reverse_kl` where the
//! student's `p(id_k) > 0`); a student `p(id_k) = 0` (a `-inf` logit) adds
//! exactly 0 to `reverse_kl` and `+inf` to `forward_kl` where `t_k > 0`.
//!
//! Over a partial support both can be negative (`t = 1/2` at one id where
//! `p = 0.9`: `forward_kl = 0.5 ln(0.5/0.9) < 0`); the renormalised reverse
//! KL is `>= -ln sum_k t_k >= 0`.
//!
//! The seed case is verl's `compute_forward_kl_topk` (chunked top-k
//! log-probs of the student against the teacher's stored top-k).

use super::{Dtype, SpecError};

/// Which of the two top-k KL terms (module docs): the part of
/// [`Family::TopkKl`](super::Family::TopkKl) an output is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KlDirection {
    /// `forward_kl = sum_k t_k (a_k - l_k)`.
    Forward,
    /// `reverse_kl = sum_k p_k (l_k - a_k)`.
    Reverse,
}

impl KlDirection {
    /// The output this term is.
    pub const fn output(self) -> super::Output {
        match self {
            KlDirection::Forward => super::Output::ForwardKl,
            KlDirection::Reverse => super::Output::ReverseKl,
        }
    }
}

/// Which top-k KL terms to compute and how (dump names `forward_kl`,
/// `reverse_kl`, meta `kl_renormalized`; the teacher's log-probs are
/// [`crate::spec::Problem::teacher_topk_log_probs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TopkKl {
    /// Compute `forward_kl [N]`.
    pub forward: bool,
    /// Compute `reverse_kl [N]`.
    pub reverse: bool,
    /// Renormalise the student's log-probs over the K ids (module docs).
    pub renormalized: bool,
    /// The dtype the teacher's log-probs were stored in: the rounding the
    /// mass check allows for ([`check_teacher_row`]).
    pub teacher_dtype: Dtype,
}

/// The checks of row `row` of the teacher's log-probs `a [K]` (exact, as
/// stored in `dtype`): every entry is a log-prob (`<= 0`, not NaN, not
/// `+inf`; `-inf` is a zero-probability entry), and the teacher's mass
/// `sum_k e^{a_k}` is no more than a sub-probability vector rounded to
/// `dtype` can give.
///
/// # Formula (the mass bound)
/// Each stored `a_k` is the rounding to `dtype` of a log-prob `l_k` with
/// `sum_k e^{l_k} <= 1`, so `|a_k - l_k| <= h_k = ulp_dtype(a_k) / 2` (the
/// ulp of `a_k`'s binade bounds that of `l_k`'s: `|l_k| <= |a_k|` lies in
/// the same or a lower binade, and a larger `|l_k|` rounds to the top of
/// `a_k`'s binade only from within half its ulp). Hence
/// `sum_k e^{a_k - h_k} <= sum_k e^{l_k} <= 1`; a row whose lower bound of
/// `sum_k e^{a_k - h_k}` (each `a_k - h_k` and CORE-MATH's correctly
/// rounded `exp` stepped one f64 below, each of the K additions likewise)
/// exceeds 1 is bad input. The teacher's own arithmetic before its
/// rounding is not allowed for: a teacher whose top-k covers nearly all of
/// its mass and whose log-probs are off by more than their storage
/// rounding (an f32 log-softmax over the full vocabulary, K = V) can be
/// refused.
///
/// # Errors
/// [`SpecError::BadTeacherLogProb`] (the first bad column),
/// [`SpecError::TeacherMassAboveOne`].
pub fn check_teacher_row(row: usize, a: &[f64], dtype: Dtype) -> Result<(), SpecError> {
    for (k, &value) in a.iter().enumerate() {
        if value.is_nan() || value > 0.0 {
            return Err(SpecError::BadTeacherLogProb { row, k, value });
        }
    }
    let lower = teacher_mass_lower(a, dtype);
    if lower > 1.0 {
        return Err(SpecError::TeacherMassAboveOne { row, lower });
    }
    Ok(())
}

/// A lower bound of `sum_k e^{a_k - ulp_dtype(a_k) / 2}` (see
/// [`check_teacher_row`]); `a_k <= 0` or `-inf`.
pub fn teacher_mass_lower(a: &[f64], dtype: Dtype) -> f64 {
    let mut s = 0.0f64;
    for &x in a {
        if x == f64::NEG_INFINITY {
            continue;
        }
        let h = 0.5 * dtype.ulp(x);
        let e = core_math::exp((x - h).next_down()).next_down().max(0.0);
        s = (s + e).next_down().max(0.0);
    }
    s
}

/// The first repeated id of a top-k row: `(k, id)` of its second
/// occurrence. O(K log K).
pub fn first_duplicate(ids: impl Iterator<Item = i64>) -> Option<(usize, i64)> {
    let mut v: Vec<(i64, usize)> = ids.enumerate().map(|(k, id)| (id, k)).collect();
    v.sort_unstable();
    v.windows(2)
        .filter(|w| w[0].0 == w[1].0)
        .map(|w| (w[1].1, w[1].0))
        .min_by_key(|&(k, _)| k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn teacher_log_probs_must_be_log_probs() {
        let ok = [-(2.0f64.ln()), -(4.0f64.ln())];
        assert!(check_teacher_row(0, &ok, Dtype::F32).is_ok());
        assert_eq!(
            check_teacher_row(3, &[-1.0, 0.25], Dtype::F32),
            Err(SpecError::BadTeacherLogProb {
                row: 3,
                k: 1,
                value: 0.25
            })
        );
        assert!(matches!(
            check_teacher_row(0, &[f64::NAN], Dtype::F32),
            Err(SpecError::BadTeacherLogProb { k: 0, .. })
        ));
        assert!(matches!(
            check_teacher_row(0, &[f64::INFINITY], Dtype::F32),
            Err(SpecError::BadTeacherLogProb { k: 0, .. })
        ));
        // -inf is a zero-probability entry; 0 is probability one.
        assert!(check_teacher_row(0, &[0.0, f64::NEG_INFINITY], Dtype::Bf16).is_ok());
    }

    #[test]
    fn teacher_mass_is_refused_only_beyond_its_rounding() {
        // Two halves rounded to bf16: ln(1/2) = -0.693147... rounds to
        // -0.69140625 (bf16), whose e^a sum is 1.0035 > 1, within rounding.
        let a = Dtype::Bf16.round_f64(-(2.0f64.ln()));
        assert!(2.0 * a.exp() > 1.0);
        assert!(check_teacher_row(0, &[a, a], Dtype::Bf16).is_ok());
        // The same values declared as f64-exact are more than f64 rounding
        // can explain.
        assert!(matches!(
            check_teacher_row(0, &[a, a], Dtype::F64),
            Err(SpecError::TeacherMassAboveOne { row: 0, .. })
        ));
        // Clearly above one in any dtype.
        assert!(check_teacher_row(1, &[-0.1, -0.1], Dtype::Bf16).is_err());
    }

    #[test]
    fn duplicates_name_the_second_occurrence() {
        assert_eq!(
            first_duplicate([3i64, 1, 4, 1, 5].into_iter()),
            Some((3, 1))
        );
        assert_eq!(first_duplicate([5i64, 2, 5, 2].into_iter()), Some((2, 5)));
        assert_eq!(first_duplicate([1i64, 2, 3].into_iter()), None);
    }
}
