//! Unit tests of the generators.

use super::rows::{entropy_f64, llm_like_shape};
use super::*;
use logprobe_reference::spec::{Dtype, EntropyLogits};

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

#[test]
fn samplers_are_deterministic_and_stay_in_their_space() {
    use logprobe_reference::splitmix::SplitMix64;
    let space = RecipeSpace {
        dtypes: vec![Dtype::Bf16, Dtype::F16],
        max_small_vocab: 100,
        max_rows: 6,
        ..RecipeSpace::default()
    };
    let edge = EdgeSpace::default();
    let mut kinds = std::collections::HashSet::new();
    for s in 0..400 {
        let r = space.sample(&mut SplitMix64::new(s));
        assert_eq!(r, space.sample(&mut SplitMix64::new(s)));
        assert!(space.dtypes.contains(&r.dtype), "{r:?}");
        if REAL_VOCAB_SIZES.contains(&r.vocab_size) {
            assert!((1..=2).contains(&r.n), "{r:?}");
        } else {
            assert!((1..=100).contains(&r.vocab_size) && r.n <= 6, "{r:?}");
        }
        assert!(r.padding <= 70 && r.topk <= 5, "{r:?}");
        assert!(
            r.entropy != Some(EntropyLogits::Masked) || r.mask_rate.is_some(),
            "{r:?}"
        );
        kinds.insert(std::mem::discriminant(&r.kind));
        let e = edge.sample(&mut SplitMix64::new(s));
        assert!(e.n == 0 || e.vocab_size <= 16, "{e:?}");
        assert!(e.n <= 5 && edge.base.dtypes.contains(&e.dtype), "{e:?}");
    }
    // Every row kind is drawn.
    assert_eq!(kinds.len(), 9);
}

#[test]
fn shrink_steps_are_simpler_and_end() {
    use logprobe_reference::splitmix::SplitMix64;
    let space = RecipeSpace::default();
    for s in 0..50 {
        let mut r = space.sample(&mut SplitMix64::new(s));
        // Always taking the first step reaches the plainest recipe.
        let mut steps = 0;
        while let Some(next) = space.shrink(&r).into_iter().next() {
            assert!(
                next.n <= r.n && next.vocab_size <= r.vocab_size,
                "{r:?} -> {next:?}"
            );
            assert!(
                next.padding <= r.padding && next.topk <= r.topk,
                "{r:?} -> {next:?}"
            );
            assert_ne!(next, r);
            r = next;
            steps += 1;
            assert!(steps < 1000, "{r:?}");
        }
        assert_eq!(
            (r.n, r.vocab_size, r.padding, r.topk, r.seed),
            (0, 1, 0, 0, 0),
            "{r:?}"
        );
        assert_eq!(r.kind, RowKind::LlmLike { entropy: 0.0 });
    }
}

/// The proptest wrapper: the runner's RNG only seeds the draw, and its
/// value tree shrinks a failure to the plainest recipe that still fails.
#[test]
fn drawn_strategy_shrinks_through_the_steps() {
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::{Config, TestRunner};
    let strategy = (problem_recipe(RecipeSpace::default()), cotangent_recipe());
    let draw = |seed| {
        let mut runner = TestRunner::new_with_rng(Config::default(), runner_rng(seed, 1));
        strategy.new_tree(&mut runner).unwrap()
    };
    assert_eq!(draw(5).current(), draw(5).current());
    // "Fails" while N >= 2 and V >= 3 (the loop of proptest's runner).
    let fails = |c: &(ProblemRecipe, CotangentRecipe)| c.0.n >= 2 && c.0.vocab_size >= 3;
    let mut found = 0;
    for seed in 0..40 {
        let mut tree = draw(seed);
        if !fails(&tree.current()) {
            continue;
        }
        found += 1;
        let mut last = tree.current();
        if tree.simplify() {
            for _ in 0..10_000 {
                if fails(&tree.current()) {
                    last = tree.current();
                    if !tree.simplify() {
                        break;
                    }
                } else if !tree.complicate() {
                    break;
                }
            }
        }
        let (r, c) = tree.current();
        assert_eq!(tree.current(), last);
        assert_eq!(
            (r.n, r.vocab_size, r.seed, r.padding, r.topk),
            (2, 3, 0, 0, 0),
            "{r:?}"
        );
        assert_eq!(r.kind, RowKind::LlmLike { entropy: 0.0 });
        // The tuple moved on to the cotangent recipe.
        assert_eq!(c.seed, 0, "{c:?}");
        assert!(!c.log_probs && !c.entropy && !c.topk, "{c:?}");
    }
    assert!(found > 5, "{found}");
}

#[test]
fn loss_space_draws_every_reduction_and_shrinks_to_the_plainest() {
    use logprobe_reference::spec::{MeanAllIgnored, Reduction};
    use logprobe_reference::splitmix::SplitMix64;
    let mut seen = Vec::new();
    for s in 0..60 {
        let mut l = LossSpace.sample(&mut SplitMix64::new(s));
        assert_eq!(l, LossSpace.sample(&mut SplitMix64::new(s)));
        assert!((0.0..=1.0).contains(&l.label_smoothing), "{l:?}");
        if !seen.contains(&l.reduction) {
            seen.push(l.reduction);
        }
        while let Some(next) = LossSpace.shrink(&l).into_iter().next() {
            l = next;
        }
        assert_eq!(
            (
                l.seed,
                l.reduction,
                l.label_smoothing,
                l.mean_all_ignored,
                l.weights
            ),
            (0, Reduction::None, 0.0, MeanAllIgnored::Nan, None)
        );
    }
    assert_eq!(seen.len(), 3);
}
