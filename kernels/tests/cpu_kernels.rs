//! Unit tests of the CPU kernels (fused, chunked, vocab-parallel) that need
//! no oracle: chunk-size and thread-count invariance bit for bit, in place
//! equal to out of place, empty batches, shard widths, and the declared
//! algorithm the tolerance model trusts. Agreement with the oracle (with
//! the real bounds) and bad input are in the properties gate:
//! `properties/tests/kernels_on_hand_picked_rows.rs` and `properties.rs`.

use half::bf16;
use ndarray::{array, Array1, Array2};

use logprobe_kernels::{CpuKernel, Kernel, KernelError};
use logprobe_reference::spec::{Cotangents, Dtype, Logits, LogitsMut, Output, Problem, SpecError};
use logprobe_reference::splitmix::SplitMix64;

fn kernels() -> Vec<Box<dyn Kernel>> {
    vec![
        Box::new(CpuKernel::fused()),
        Box::new(CpuKernel::chunked(1)),
        Box::new(CpuKernel::chunked(3)),
        Box::new(CpuKernel::chunked(64)),
    ]
}

#[test]
fn chunk_size_is_bit_invariant() {
    let mut rng = SplitMix64::new(11);
    let (n, v) = (13, 5000);
    let x = Array2::from_shape_fn((n, v), |_| (rng.normal() * 4.0) as f32);
    let tokens = Array1::from_shape_fn(n, |r| if r == 4 { -100 } else { (r * 371 % v) as i64 });
    let ids = Array2::from_shape_fn((n, 3), |(r, k)| ((r * 17 + k * 1999) % v) as i64);
    let mask = Array2::from_shape_fn((n, v), |(r, j)| {
        (r + j) % 7 != 0 || j == tokens[r].max(0) as usize
    });
    let g = Array1::from_shape_fn(n, |r| 1.0 - r as f64 * 0.25);
    let h = Array1::from_shape_fn(n, |r| 0.5 + r as f64);
    let gk = Array2::from_shape_fn((n, 3), |(r, k)| (r as f64 - k as f64) * 0.125);
    let cot = Cotangents::default()
        .with_column(Output::LogProbs, g.view())
        .with_column(Output::Entropy, h.view())
        .with(Output::TopkLogProbs, gk.view());
    for masked in [false, true] {
        let mut p = Problem::new(Logits::F32(x.view()));
        p.tokens = Some(tokens.view());
        p.topk_ids = Some(ids.view());
        p.options.temperature = 0.9;
        if masked {
            p.sampling_mask = Some(mask.view());
        }
        let reference = CpuKernel::fused().forward(&p, Dtype::F32).unwrap();
        let gref = CpuKernel::fused().backward(&p, &cot, Dtype::F32).unwrap();
        for cs in [1, 2, 5, 7, 13, 100] {
            let k = CpuKernel::chunked(cs);
            assert_eq!(
                k.forward(&p, Dtype::F32).unwrap(),
                reference,
                "chunk_size {cs}"
            );
            let gr = k.backward(&p, &cot, Dtype::F32).unwrap();
            assert!(
                gr.iter()
                    .zip(&gref)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "grad, chunk_size {cs}"
            );
        }
        // Thread count does not matter either.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        assert_eq!(
            pool.install(|| CpuKernel::fused().forward(&p, Dtype::F32))
                .unwrap(),
            reference
        );
    }
}

#[test]
fn in_place_backward_equals_out_of_place() {
    let mut rng = SplitMix64::new(3);
    let (n, v) = (5, 3000);
    let x = Array2::from_shape_fn((n, v), |_| (rng.normal() * 3.0) as f32);
    let tokens = array![1i64, -100, 2999, 0, 1500];
    let ids = Array2::from_shape_fn((n, 2), |(r, k)| ((r * 13 + k * 700) % v) as i64);
    let g = Array1::from_shape_fn(n, |r| 1.0 + r as f64);
    let h = Array1::from_shape_fn(n, |r| 0.25 * r as f64 - 0.5);
    let gk = Array2::from_shape_fn((n, 2), |(r, k)| 0.5 * (r + k) as f64);
    let cot = Cotangents::default()
        .with_column(Output::LogProbs, g.view())
        .with_column(Output::Entropy, h.view())
        .with(Output::TopkLogProbs, gk.view());
    let opts_t = [1.0, 0.6];
    for t in opts_t {
        for k in kernels() {
            let mut p = Problem::new(Logits::F32(x.view()));
            p.tokens = Some(tokens.view());
            p.topk_ids = Some(ids.view());
            p.options.temperature = t;
            p.options.vocab_size = Some(2999 + 1);
            let want = k.backward(&p, &cot, Dtype::F32).unwrap();
            let mut y = x.clone();
            k.backward_in_place(p.with_logits(LogitsMut::F32(y.view_mut())), &cot)
                .unwrap();
            assert!(
                y.iter()
                    .zip(&want)
                    .all(|(a, b)| (*a as f64).to_bits() == b.to_bits()),
                "{}",
                k.name()
            );
            // bf16 logits: in place rounds to bf16, like backward(out = bf16).
            let xb = x.mapv(bf16::from_f32);
            p.logits = Logits::Bf16(xb.view());
            let want = k.backward(&p, &cot, Dtype::Bf16).unwrap();
            let mut yb = xb.clone();
            k.backward_in_place(p.with_logits(LogitsMut::Bf16(yb.view_mut())), &cot)
                .unwrap();
            assert!(
                yb.iter().zip(&want).all(|(a, b)| a.to_f64() == *b),
                "{} bf16",
                k.name()
            );
        }
    }
}

#[test]
fn empty_batch_gives_empty_outputs() {
    let x = Array2::<f32>::zeros((0, 1 << 22));
    let t = Array1::<i64>::zeros(0);
    let mut p = Problem::new(Logits::F32(x.view()));
    p.tokens = Some(t.view());
    let g = Array1::<f64>::zeros(0);
    let cot = Cotangents::default().with_column(Output::LogProbs, g.view());
    for k in kernels() {
        let f = k.forward(&p, Dtype::F32).unwrap();
        assert_eq!(f.values[Output::LogProbs].dim(), (0, 1));
        assert_eq!(f.values[Output::Entropy].dim(), (0, 1));
        assert_eq!(
            k.backward(&p, &cot, Dtype::F32).unwrap().dim(),
            (0, 1 << 22)
        );
        assert_eq!(k.workspace_bytes(&p.validate_shapes().unwrap()), 0);
    }
}

#[test]
fn vocab_parallel_widths_must_cover_the_columns() {
    let x = Array2::<f32>::zeros((2, 8));
    let p = Problem::new(Logits::F32(x.view()));
    let bad = CpuKernel::vocab_parallel(vec![3, 3]);
    assert!(matches!(
        bad.forward(&p, Dtype::F32),
        Err(KernelError::Spec(SpecError::ShapeMismatch { .. }))
    ));
}

/// The declared algorithm is what the tolerance model trusts: blocks of
/// 2048 entries, 16 lanes summed in column order, lanes and blocks merged by
/// pairwise trees, one rescaling exp per block merge (kernels/src/row.rs).
/// At V = 152064: 75 blocks, leaf 128, 4 + 7 merges, 7 rescaling exps.
#[test]
fn declared_algorithm_counts_the_block_tree() {
    let shape = |v: usize, dtype: Dtype| logprobe_reference::spec::Shape {
        n: 4,
        vocab_size: v,
        v_total: v,
        k: 0,
        dtype,
        accumulation: dtype.accumulation(),
        temperature: 1.0,
    };
    // (V, leaf, merges, rescaling_exps)
    for (v, leaf, merges, rescale) in [
        (1, 1, 4, 0),
        (2048, 128, 4, 0),
        (2049, 128, 5, 1),
        (32000, 128, 8, 4),
        (152064, 128, 11, 7),
        (256000, 128, 11, 7),
    ] {
        for kernel in [&CpuKernel::fused() as &dyn Kernel, &CpuKernel::chunked(3)] {
            let a = kernel.algorithm(&shape(v, Dtype::Bf16));
            assert_eq!(a.accumulation, Dtype::F32, "{} V={v}", kernel.name());
            assert_eq!(a.summation.leaf, leaf, "{} V={v}", kernel.name());
            assert_eq!(a.summation.merges, merges, "{} V={v}", kernel.name());
            assert_eq!(a.rescaling_exps, rescale, "{} V={v}", kernel.name());
        }
    }
    assert_eq!(
        CpuKernel::fused()
            .algorithm(&shape(10, Dtype::F64))
            .accumulation,
        Dtype::F64
    );
}
