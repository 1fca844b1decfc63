//! Unit tests of the block reduction.

use super::block::{lane_tree, leaf_baseline, LeafArgs, Scratch};
#[cfg(target_arch = "x86_64")]
use super::block::{leaf_avx2, leaf_avx512};
use super::*;

/// The block reduction one chunk at a time, exactly as the module docs
/// order it (the straightforward form the fast evaluation must match).
fn chunk_at_a_time(
    z: &[f32],
    mask: Option<&[bool]>,
    scale: Option<f32>,
    want_b: bool,
) -> Reduction<f32> {
    let n_pad = z.len().div_ceil(LANES) * LANES;
    let mut v = vec![f32::NEG_INFINITY; n_pad];
    v[..z.len()].copy_from_slice(z);
    let bad = v.iter().any(|&x| !(x < f32::INFINITY));
    if let Some(mk) = mask {
        for (x, &k) in v.iter_mut().zip(mk) {
            *x = if k { *x } else { f32::NEG_INFINITY };
        }
    }
    let mut mx = [f32::NEG_INFINITY; LANES];
    for c in v.chunks_exact(LANES) {
        for l in 0..LANES {
            mx[l] = if c[l] > mx[l] { c[l] } else { mx[l] };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &x in &mx {
        m = if x > m { x } else { m };
    }
    if !(m > f32::NEG_INFINITY) || bad {
        return Reduction {
            partial: Partial::EMPTY,
            bad,
        };
    }
    let argmax = v.iter().position(|&x| x == m).unwrap();
    let (mut sl, mut bl) = ([0f32; LANES], [0f32; LANES]);
    for (j, &x) in v.iter().enumerate() {
        let l = j % LANES;
        let d = shift(x, m, scale);
        let e = crate::exp::exp_f32(d);
        sl[l] += if j != argmax { e } else { 0.0 };
        if want_b {
            let t = e * (-d);
            bl[l] += if e > 0.0 { t } else { 0.0 };
        }
    }
    Reduction {
        partial: Partial {
            m,
            s: lane_tree(sl),
            b: lane_tree(bl),
        },
        bad,
    }
}

fn bits(r: Reduction<f32>) -> (u32, u32, u32, bool) {
    let p = r.partial;
    (p.m.to_bits(), p.s.to_bits(), p.b.to_bits(), r.bad)
}

/// A block, its mask, temperature and whether `B` is wanted.
type Block = (Vec<f32>, Option<Vec<bool>>, Option<f32>, bool);

/// Blocks that stress the evaluation: ragged lengths, ties at the max,
/// a zero max with both signs, `-inf`, NaN and `+inf`, masks, temperatures.
fn blocks() -> Vec<Block> {
    let mut rng = logprobe_reference::splitmix::SplitMix64::new(9);
    let mut next = move || rng.uniform() as f32;
    let mut out = Vec::new();
    for (k, &n) in [
        1usize,
        5,
        16,
        17,
        63,
        64,
        127,
        128,
        129,
        300,
        BLOCK - 5,
        BLOCK,
    ]
    .iter()
    .enumerate()
    {
        let mut z: Vec<f32> = (0..n).map(|_| (next() - 0.5) * 60.0).collect();
        let mut zero = z.clone();
        for (i, x) in zero.iter_mut().enumerate() {
            // Max exactly 0, first as -0 then +0 (the sign comes from the lane order).
            *x = if i % 7 == 3 {
                if i % 2 == 0 {
                    0.0
                } else {
                    -0.0
                }
            } else {
                -(x.abs())
            };
        }
        let mut inf = z.clone();
        for (i, x) in inf.iter_mut().enumerate() {
            if i % 3 == 1 {
                *x = f32::NEG_INFINITY;
            }
        }
        let mask: Vec<bool> = (0..n).map(|_| next() < 0.6).collect();
        let tie = z.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let last = z.len() - 1;
        z[last] = tie; // the max twice: the first one is the argmax
        out.push((z.clone(), None, None, true));
        out.push((z.clone(), None, Some(0.7), true));
        out.push((z.clone(), None, Some(1e-30), true));
        out.push((z.clone(), None, None, false));
        out.push((z.clone(), Some(mask.clone()), Some(1.3), true));
        out.push((zero, None, None, true));
        out.push((inf.clone(), None, None, true));
        out.push((vec![f32::NEG_INFINITY; n], None, None, true));
        let mut nan = z.clone();
        nan[(k * 37) % n] = f32::NAN;
        out.push((nan.clone(), None, None, true));
        out.push((nan.clone(), None, None, false));
        let mut masked_nan = nan;
        masked_nan[0] = f32::NAN;
        let mut mk = mask.clone();
        mk[0] = false;
        out.push((masked_nan, Some(mk), None, true));
        let mut pinf = inf;
        pinf[n / 2] = f32::INFINITY;
        out.push((pinf, None, None, true));
        let mut all_inf_nan = vec![f32::NEG_INFINITY; n];
        all_inf_nan[n - 1] = f32::NAN;
        out.push((all_inf_nan, None, None, true));
    }
    out
}

/// The fast block loop gives the bits of the chunk-at-a-time order, on
/// every CPU path (SSE2, AVX2, AVX-512) this machine has.
#[test]
fn every_cpu_path_gives_the_same_bits() {
    let mut sc = Scratch { z: [0.0; BLOCK] };
    for (z, mask, scale, want_b) in blocks() {
        let mask_view = mask.as_ref().map(|m| ArrayView1::from(&m[..]));
        let a = LeafArgs {
            src: &z[..],
            mask: mask_view,
            start: 0,
            n: z.len(),
            end: z.len(),
            scale,
            want_b,
        };
        let want = bits(chunk_at_a_time(&z, mask.as_deref(), scale, want_b));
        let what = format!(
            "n = {}, mask = {}, scale = {scale:?}",
            z.len(),
            mask.is_some()
        );
        assert_eq!(bits(leaf_baseline(&a, &mut sc)), want, "baseline, {what}");
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") {
                // SAFETY: feature detected above.
                assert_eq!(
                    bits(unsafe { leaf_avx2(&a, &mut sc) }),
                    want,
                    "avx2, {what}"
                );
            }
            if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw")
            {
                // SAFETY: feature detected above.
                assert_eq!(
                    bits(unsafe { leaf_avx512(&a, &mut sc) }),
                    want,
                    "avx512, {what}"
                );
            }
        }
    }
}

/// The vectorised bf16 widening is `bf16::to_f32` for every bf16 bit
/// pattern but NaNs, which keep their bits (`half` quiets a signalling
/// one; either way the row is bad input), ragged lengths included.
#[test]
fn widen_bf16_is_to_f32_for_every_bf16() {
    let xs: Vec<half::bf16> = (0..=u16::MAX).map(half::bf16::from_bits).collect();
    for len in [xs.len(), 17, 5] {
        let src = &xs[xs.len() - len..];
        let mut got = vec![0f32; len];
        elem::widen_bf16(src, &mut got);
        for (x, g) in src.iter().zip(&got) {
            let want = if x.is_nan() {
                (x.to_bits() as u32) << 16
            } else {
                x.to_f32().to_bits()
            };
            assert_eq!(g.to_bits(), want, "{:#06x}", x.to_bits());
        }
    }
}
