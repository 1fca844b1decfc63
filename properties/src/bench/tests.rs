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

#[test]
fn a_zero_measurement_meets_no_target() {
    let oracle = |fwd_cpu: f64| OracleResult {
        tier: "f64",
        logits: "f32",
        target: "bf16",
        v: 152_064,
        forward_ns_per_entry: 20.0,
        vjp_ns_per_entry: 40.0,
        forward_cpu_ns_per_entry: Some(fwd_cpu),
        vjp_cpu_ns_per_entry: Some(40.0),
        forward_fallback: 0.0,
        vjp_fallback: 0.0,
    };
    let forward_met = |fwd_cpu: f64| {
        targets(&[], &[], &[], &[oracle(fwd_cpu)])
            .into_iter()
            .find(|t| t.target.contains("forward"))
            .map(|t| t.met)
    };
    assert_eq!(forward_met(0.0), Some(None));
    assert_eq!(forward_met(f64::NAN), Some(None));
    assert_eq!(forward_met(20.0), Some(Some(true)));
    assert_eq!(forward_met(30.0), Some(Some(false)));
}

#[test]
fn the_thread_cpu_clock_advances_within_a_tick() {
    // Some work far shorter than a scheduler tick (~4 ms): the clock must
    // not read 0 (the bug of the schedstat clock it replaces).
    let Some(c0) = thread_cpu_s() else { return };
    let mut x = 1.0f64;
    let mut c1 = c0;
    for _ in 0..1000 {
        for i in 0..10_000 {
            x = std::hint::black_box(x * 1.000_000_1 + i as f64 * 1e-300);
        }
        c1 = thread_cpu_s().unwrap_or(c0);
        if c1 > c0 {
            break;
        }
    }
    assert!(c1 > c0, "thread CPU clock never advanced ({x})");
}
