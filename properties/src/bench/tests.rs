//! Unit tests of the bench helpers.

use super::*;

#[test]
fn uneven_shards_sum_to_v_and_differ() {
    for (v, k) in [(152_064, 4), (10, 3), (5, 5), (7, 1), (100, 7)] {
        let w = uneven_shards(v, k);
        assert_eq!(w.len(), k, "{v} {k}");
        assert_eq!(w.iter().sum::<usize>(), v, "{v} {k}: {w:?}");
    }
    let w = uneven_shards(152_064, 4);
    assert!(w.windows(2).any(|p| p[0] != p[1]), "{w:?}");
}

#[test]
fn zero_sizes_are_config_errors() {
    let c = BenchConfig {
        n: 0,
        ..BenchConfig::default()
    };
    assert!(matches!(run(&c), Err(BenchError::Config(_))));
}
