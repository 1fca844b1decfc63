//! The top-k KL to a teacher on the CPU kernels (the KL family): the
//! student's log-probs renormalised over the ids, both directions' values
//! and their slopes, in the accumulation dtype.

use crate::row::Acc;
use crate::stats::pairwise_sum;

/// The student's log-probs `lp [K]` (accumulation dtype) renormalised over
/// the K ids: `(lp_k - m) - ln_1p(sum_{j != argmax} e^{lp_j - m})`, `m` the
/// first largest `lp_j` (its own term is exactly 1); `-inf` stays `-inf`.
/// The sum is [`pairwise_sum`] over the K positions, so the order depends
/// on K alone. (The oracle's module `topk_kl` states the formula.)
pub fn renormalize<A: Acc>(lp: &[A]) -> Vec<A> {
    let mut arg = None;
    for (k, &x) in lp.iter().enumerate() {
        if x > A::NEG_INF && arg.is_none_or(|a: usize| x > lp[a]) {
            arg = Some(k);
        }
    }
    let Some(arg) = arg else {
        return lp.to_vec();
    };
    let m = lp[arg];
    let s = pairwise_sum(0..lp.len(), &|j| {
        if j == arg || !(lp[j] > A::NEG_INF) {
            A::ZERO
        } else {
            (lp[j] - m).exp_nonpos()
        }
    });
    let ell = s.ln_1p();
    lp.iter()
        .map(|&x| if x > A::NEG_INF { (x - m) - ell } else { x })
        .collect()
}

/// `(forward_kl, reverse_kl)` of one row in the accumulation dtype
/// (docs/design.md, "The loss side"; edge values as the spec's `TopkKl` docs):
/// `sum_k e^{a_k} (a_k - lp_k)` and `sum_k e^{lp_k} (lp_k - a_k)`, each
/// term one exp, one subtraction and one product, summed by
/// [`pairwise_sum`] over the K positions (the order depends on K alone, so
/// chunked, fused and vocab-parallel rows agree bit for bit). `lp [K]` the
/// student's top-k log-probs, `teacher [K]` the exact `a_k` (rounded to the
/// accumulation dtype on load; exact for f32/bf16/f16 teachers).
pub fn topk_kl<A: Acc>(lp: &[A], teacher: &[f64], renormalized: bool) -> (A, A) {
    let renorm;
    let lp = if renormalized {
        renorm = renormalize(lp);
        &renorm[..]
    } else {
        lp
    };
    let a: Vec<A> = teacher.iter().map(|&x| A::from_f64(x)).collect();
    let inf = -A::NEG_INF;
    let fwd = |k: usize| {
        if !(a[k] > A::NEG_INF) {
            A::ZERO
        } else if !(lp[k] > A::NEG_INF) {
            inf
        } else {
            a[k].exp_nonpos() * (a[k] - lp[k])
        }
    };
    let rev = |k: usize| {
        if !(lp[k] > A::NEG_INF) {
            A::ZERO
        } else if !(a[k] > A::NEG_INF) {
            inf
        } else {
            lp[k].exp_nonpos() * (lp[k] - a[k])
        }
    };
    (
        pairwise_sum(0..lp.len(), &fwd),
        pairwise_sum(0..lp.len(), &rev),
    )
}

/// The top-k KL's cotangents `w [K]` on the student's log-probs at the K
/// ids, in the accumulation dtype: the backward of [`topk_kl`] for the
/// upstream cotangents `g_f` (`forward_kl`) and `g_r` (`reverse_kl`), as
/// autograd forms it (docs/design.md, "The loss side"; the oracle's exact form is the
/// spec's `topk_kl` module docs). Per id the gathered cotangent `c_k =
/// -(g_f e^{a_k}) + ((g_r (l_k - a_k)) p_k + g_r p_k)` (`p_k = e^{l_k}`; a
/// teacher `-inf` adds no forward term, a student `-inf` no reverse term);
/// renormalised, `l_k` is [`renormalize`]'s and the renormalisation's
/// backward gives `w_k = c_k - q_k sum_i c_i` ([`pairwise_sum`], `q_k =
/// e^{l'_k}`: log_softmax's backward). The caller adds `w_k (1[j = id_k]
/// - p_j)` per element. A reverse cotangent where `a_k = -inf` meets a
/// live student is refused before ([`Problem::validate_cotangents`]).
pub fn topk_kl_slopes<A: Acc>(
    lp: &[A],
    teacher: &[f64],
    renormalized: bool,
    gf: A,
    gr: A,
) -> Vec<A> {
    let l = if renormalized {
        renormalize(lp)
    } else {
        lp.to_vec()
    };
    let mut c: Vec<A> = l
        .iter()
        .zip(teacher)
        .map(|(&lk, &a)| {
            let a = A::from_f64(a);
            let mut ck = A::ZERO;
            if gf != A::ZERO && a > A::NEG_INF {
                ck = ck - gf * a.exp_nonpos();
            }
            if gr != A::ZERO && lk > A::NEG_INF && a > A::NEG_INF {
                let p = lk.exp_nonpos();
                ck = ck + ((gr * (lk - a)) * p + gr * p);
            }
            ck
        })
        .collect();
    if renormalized {
        let sum = pairwise_sum(0..c.len(), &|k| c[k]);
        for (ck, &lk) in c.iter_mut().zip(&l) {
            if lk > A::NEG_INF {
                *ck = *ck - lk.exp_nonpos() * sum;
            }
        }
    }
    c
}
