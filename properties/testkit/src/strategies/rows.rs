//! Row value generators: LLM-like rows of a target entropy, wide
//! Gaussians, subnormals, mixed rows, each value exact in its dtype.

use ndarray::Array2;

use logprobe_reference::spec::Dtype;
use logprobe_reference::splitmix::SplitMix64;

use super::*;

/// The deterministic stream `(seed, stream)` of a recipe's expansion:
/// [`SplitMix64::for_stream`] (the workspace's one RNG; proptest's RNG
/// never reaches a recipe).
pub fn rng_for(seed: u64, stream: u64) -> SplitMix64 {
    SplitMix64::for_stream(seed, stream)
}

/// An integer uniform in `lo..=hi` (`lo` when `hi < lo`).
pub(crate) fn int_in(rng: &mut SplitMix64, lo: usize, hi: usize) -> usize {
    lo + rng.below(hi.saturating_sub(lo) + 1)
}

/// Softmax entropy (nats) of `beta * b`, in f64 (for the generator's
/// calibration only; not an oracle).
pub(crate) fn entropy_f64(b: &[f64], beta: f64) -> f64 {
    let m = b.iter().fold(f64::NEG_INFINITY, |a, &x| a.max(beta * x));
    let (mut s, mut sx) = (0.0, 0.0);
    for &x in b {
        let d = beta * x - m;
        let e = d.exp();
        s += e;
        sx += e * d;
    }
    s.ln() - sx / s
}

/// LLM-like shifted logits (`<= 0`, max 0) of width `v` with entropy about
/// `entropy` nats: Zipf ranks over a random permutation plus noise, scaled
/// by bisection on the scale.
pub(crate) fn llm_like_shape(rng: &mut SplitMix64, v: usize, entropy: f64) -> Vec<f64> {
    let mut ranks: Vec<usize> = (1..=v).collect();
    for i in (1..v).rev() {
        let j = int_in(rng, 0, i);
        ranks.swap(i, j);
    }
    let mut b: Vec<f64> = ranks
        .iter()
        .map(|&r| -(r as f64).ln() + 0.25 * rng.normal())
        .collect();
    // The dominant token (rank 1) stays 1 nat (times the scale) above the rest.
    if let Some(top) = ranks.iter().position(|&r| r == 1) {
        let rest = (0..v)
            .filter(|&j| j != top)
            .map(|j| b[j])
            .fold(f64::NEG_INFINITY, f64::max);
        if rest.is_finite() {
            b[top] = rest + 1.0;
        }
    }
    let target = entropy.clamp(0.0, 0.95 * (v as f64).ln());
    // Entropy decreases in beta from ln V (beta = 0) towards 0.
    let (mut lo, mut hi) = (0.0f64, 256.0f64);
    for _ in 0..30 {
        let mid = 0.5 * (lo + hi);
        if entropy_f64(&b, mid) > target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let beta = 0.5 * (lo + hi);
    let m = b.iter().fold(f64::NEG_INFINITY, |a, &x| a.max(x));
    b.iter().map(|&x| beta * (x - m)).collect()
}

/// The concrete kinds [`RowKind::Mixed`] draws from.
pub(crate) fn mixed_kind(rng: &mut SplitMix64) -> RowKind {
    match rng.below(8) {
        0 | 1 => RowKind::LlmLike {
            entropy: rng.uniform_in(0.0, 5.0),
        },
        2 => RowKind::WideGaussian {
            sigma: rng.uniform_in(0.5, 30.0),
        },
        3 => RowKind::AllEqual,
        4 => RowKind::Ties {
            levels: 1 + rng.below(3) as u8,
        },
        5 => RowKind::OneHotish {
            gap: rng.uniform_in(5.0, 60.0),
        },
        6 => RowKind::NegInf {
            rate: rng.uniform_in(0.1, 0.9),
        },
        _ => RowKind::OneFinite,
    }
}

/// One row of logits (`[v]`, exact in `dtype`), the shape of `kind` plus
/// `offset`, rounded to `dtype` and clamped to its finite range (`-inf`
/// entries stay `-inf`).
pub fn row_values(
    rng: &mut SplitMix64,
    v: usize,
    dtype: Dtype,
    kind: RowKind,
    offset: Offset,
) -> Vec<f64> {
    let kind = if kind == RowKind::Mixed {
        mixed_kind(rng)
    } else {
        kind
    };
    let mut d: Vec<f64> = match kind {
        RowKind::LlmLike { entropy } => llm_like_shape(rng, v, entropy),
        RowKind::WideGaussian { sigma } => (0..v).map(|_| sigma * rng.normal()).collect(),
        RowKind::AllEqual => vec![0.0; v],
        RowKind::Ties { levels } => (0..v)
            .map(|_| -(rng.below(levels.max(1) as usize) as f64))
            .collect(),
        RowKind::OneHotish { gap } => {
            let hot = rng.below(v);
            (0..v)
                .map(|j| if j == hot { gap } else { rng.normal() })
                .collect()
        }
        RowKind::NegInf { rate } => {
            let mut d = llm_like_shape(rng, v, 2.0);
            for x in d.iter_mut() {
                // The argmax (0) stays finite.
                if *x < 0.0 && rng.chance(rate) {
                    *x = f64::NEG_INFINITY;
                }
            }
            d
        }
        RowKind::OneFinite => {
            let hot = rng.below(v);
            (0..v)
                .map(|j| if j == hot { 0.0 } else { f64::NEG_INFINITY })
                .collect()
        }
        RowKind::Subnormals => {
            let q = logprobe_reference::spec::pow2(dtype.min_subnormal_exp());
            return (0..v).map(|_| (rng.below(17) as f64 - 8.0) * q).collect();
        }
        RowKind::Mixed => unreachable!("resolved above"),
    };
    // Shift so the finite max is 0, then add the offset and round once.
    let m = d
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .fold(f64::NEG_INFINITY, f64::max);
    let off = offset.value(dtype);
    let lim = dtype.max_finite();
    for x in d.iter_mut() {
        if x.is_finite() {
            *x = dtype.round_f64(off + (*x - m)).clamp(-lim, lim);
        }
    }
    d
}

/// An LLM-like row (Zipf-shaped, a dominant token, entropy drawn from 0-5
/// nats by `seed`) of width `v`, exact in `dtype`, as f64 values. For
/// benches and fixtures.
pub fn llm_like_row(seed: u64, v: usize, dtype: Dtype) -> Vec<f64> {
    let mut rng = rng_for(seed, 0x11A);
    let entropy = rng.uniform_in(0.0, 5.0);
    row_values(
        &mut rng,
        v,
        dtype,
        RowKind::LlmLike { entropy },
        Offset::Zero,
    )
}

/// `n` LLM-like rows (see [`llm_like_row`]) as logits `[n, v]` in `dtype`.
pub fn llm_like_logits(seed: u64, n: usize, v: usize, dtype: Dtype) -> OwnedLogits {
    let mut x = Array2::<f64>::zeros((n, v));
    for (i, mut row) in x.rows_mut().into_iter().enumerate() {
        let r = llm_like_row(seed.wrapping_add(i as u64), v, dtype);
        row.iter_mut().zip(r).for_each(|(a, b)| *a = b);
    }
    OwnedLogits::from_f64(dtype, &x)
}
