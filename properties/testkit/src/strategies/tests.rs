//! Unit tests of the generators.

use super::rows::{entropy_f64, llm_like_shape};
use super::*;
use logprobe_reference::spec::Dtype;

#[test]
fn values_are_exact_in_their_dtype() {
    for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
        for (k, kind) in [
            RowKind::LlmLike { entropy: 3.0 },
            RowKind::WideGaussian { sigma: 20.0 },
            RowKind::Subnormals,
            RowKind::Mixed,
        ]
        .into_iter()
        .enumerate()
        {
            for off in [
                Offset::Zero,
                Offset::Value(1234.5),
                Offset::Extreme { negative: false },
                Offset::Extreme { negative: true },
            ] {
                let mut rng = rng_for(k as u64, 7);
                let row = row_values(&mut rng, 300, dtype, kind, off);
                for &x in &row {
                    assert!(
                        x == f64::NEG_INFINITY || (x.is_finite() && dtype.round_f64(x) == x),
                        "{dtype} {kind:?} {off:?} {x}"
                    );
                }
            }
        }
    }
}

#[test]
fn llm_like_rows_hit_their_entropy() {
    for target in [0.1, 1.0, 2.5, 4.9] {
        let mut rng = rng_for(3, 3);
        let d = llm_like_shape(&mut rng, 32000, target);
        let h = entropy_f64(&d, 1.0);
        assert!((h - target).abs() < 1e-3, "{target} {h}");
    }
}

#[test]
fn expansion_is_deterministic_and_valid() {
    let mut r = ProblemRecipe::plain(9, 7, 50);
    r.mask_rate = Some(0.9);
    r.padding = 3;
    r.topk = 2;
    r.ignore_rate = 0.25;
    r.kind = RowKind::Mixed;
    let a = r.expand();
    let b = r.expand();
    assert!(a.logits.bits_eq(&b.logits));
    assert_eq!(a.tokens, b.tokens);
    a.problem().validate().unwrap();
}

#[test]
fn chunk_sizes_cover_the_cases() {
    let c = chunk_sizes(10, 1);
    assert!(c.contains(&1) && c.contains(&10) && c.iter().any(|&x| x > 10) && c.contains(&3));
    assert_eq!(chunk_sizes(0, 1)[0], 1);
}

#[test]
fn shard_layouts_sum_to_v_total() {
    for s in 0..50 {
        let l = ShardLayout::generate(s, 1 + (s as usize % 6), 37, true);
        assert_eq!(l.widths.iter().sum::<usize>(), 37);
    }
    assert_eq!(even_shards(10, 4), vec![3, 3, 3, 1]);
}
