//! The memory property of the CPU fused linear + cross-entropy kernel
//! (issue 45): its peak extra allocation, outputs excluded, is what its
//! chunk sizes imply (`[row_chunk, vocab_chunk]` logits and softcap
//! factors, a `[vocab_chunk, H]` weight-gradient update, `O(N)` per-row
//! state) and does not grow with `V`. Counted by a global allocator; this
//! binary runs ONE test, so nothing else allocates while a call is
//! measured.

use logprobe_kernels::linear::{FusedLinear, LinearLogits, LinearProblem};
use logprobe_reference::spec::Dtype;
use logprobe_testkit::memory::{allocator_installed, measure, CountingAllocator};
use ndarray::{Array1, Array2};

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

#[test]
fn peak_extra_memory_is_the_chunks_whatever_the_vocabulary() {
    let (n, h, rc, vc) = (16usize, 64usize, 4usize, 256usize);
    // The chunks' budget: logits and softcap factors, the weight-gradient
    // update and its bias part, per-row statistics; plus a constant.
    let budget = 4 * (2 * rc * vc + vc * h + vc) + 64 * n + 64 * 1024;
    let mut seen = Vec::new();
    for v in [2_000usize, 64_000] {
        let hidden = Array2::from_shape_fn((n, h), |(i, k)| ((i * 7 + k) as f32 * 0.01).sin());
        let weight =
            Array2::from_shape_fn((v, h), |(j, k)| ((j * 3 + k) as f32 * 0.003).cos() * 0.2);
        let tokens = Array1::from_shape_fn(n, |i| ((i * 977) % v) as i64);
        let cot: Vec<f64> = (0..n).map(|i| 1.0 - i as f64 / n as f64).collect();
        let p = LinearProblem {
            hidden: hidden.view(),
            weight: weight.view(),
            bias: None,
            dtype: Dtype::F32,
            tokens: tokens.view(),
            temperature: 0.7,
            softcap: Some(30.0),
            ignore_index: -100,
        };
        let k = FusedLinear::new(rc, vc, LinearLogits::Input);
        // The least of three calls: an allocation of another thread (the
        // test harness's) can only add to one; a V-sized one is in all.
        let (fwd, peak_f) = (0..3)
            .map(|_| measure(|| k.forward(&p).unwrap()))
            .min_by_key(|r| r.1)
            .unwrap();
        let outputs_f = 3 * n * 4 + 3 * 64;
        let (g, peak_b) = (0..3)
            .map(|_| measure(|| k.backward(&p, &cot).unwrap()))
            .min_by_key(|r| r.1)
            .unwrap();
        // The outputs: grad_hidden [N, H], grad_weight [V, H], grad_bias [V].
        let outputs_b = 4 * (n * h + v * h + v);
        let extra_f = peak_f.saturating_sub(outputs_f);
        let extra_b = peak_b.saturating_sub(outputs_b);
        assert!(
            extra_f <= budget,
            "forward at V = {v}: {extra_f} > {budget}"
        );
        assert!(
            extra_b <= budget,
            "backward at V = {v}: {extra_b} > {budget}"
        );
        assert!(fwd.lse.iter().all(|x| x.is_finite()) && g.grad_weight.nrows() == v);
        seen.push((v, extra_f, extra_b));
    }
    assert!(allocator_installed());
    // Independent of V: the same bytes at 2000 and 64000 columns.
    assert_eq!(seen[0].1, seen[1].1, "{seen:?}");
    assert_eq!(seen[0].2, seen[1].2, "{seen:?}");
    eprintln!("fused linear extra bytes (V, forward, backward): {seen:?}, budget {budget}");
}
