//! Unit tests of the CPU kernels (fused, chunked) against the MPFR oracle on
//! small hand-picked rows, plus bit-invariance, in-place and bad-input checks.
//! The full property suite lives in `logprobe-properties`.
//!
//! Tolerances here are deliberately simple and tight (the real, sound model
//! is the properties crate's): a value `v` may be off by
//! `TOL_U * u_acc * (1 + |v|)` plus one ulp of the output dtype (its final
//! rounding after the accumulation's), a gradient element by
//! `TOL_U * u_acc * (sum of |cotangents|) / T` plus one output ulp. On these
//! rows every kernel measures within `2 u_acc (1 + |v|) + 1 ulp_out`
//! (checked by running with `TOL_U = 2`); `TOL_U = 4` leaves a factor 2.
//! Dropping one block's argmax term in a merge (a one-ulp-of-S bug on
//! 20000-entry rows) fails `long_rows_use_the_tree_and_match_oracle`.

use half::{bf16, f16};
use ndarray::{array, Array1, Array2};

use logprobe_kernels::{CpuKernel, Kernel, KernelError};
use logprobe_reference::oracle::Oracle;
use logprobe_reference::spec::{
    Cotangents, Dtype, Element, EntropyLogits, Logits, LogitsMut, Problem, SpecError,
    TemperatureDtype,
};

const TOL_U: f64 = 4.0;

fn kernels() -> Vec<Box<dyn Kernel>> {
    vec![
        Box::new(CpuKernel::fused()),
        Box::new(CpuKernel::chunked(1)),
        Box::new(CpuKernel::chunked(3)),
        Box::new(CpuKernel::chunked(64)),
    ]
}

/// splitmix64: deterministic test data without a rand dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let (a, b) = (self.uniform().max(1e-300), self.uniform());
        (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
    }
}

fn tol(v: f64, acc: Dtype, out: Dtype) -> f64 {
    TOL_U * acc.unit_roundoff() * (1.0 + v.abs()) + out.ulp(v)
}

/// Compares every forward output of every kernel with the oracle.
fn check_forward(problem: &Problem<'_>, out: Dtype) {
    check_forward_with(problem, out, &kernels());
}

fn check_forward_with(problem: &Problem<'_>, out: Dtype, kernels: &[Box<dyn Kernel>]) {
    let acc = problem.logits.dtype().accumulation();
    let exact = Oracle::default().forward(problem, out).expect("oracle");
    for k in kernels {
        let f = k
            .forward(problem, out)
            .unwrap_or_else(|e| panic!("{}: {e}", k.name()));
        assert_eq!(f.dtype, out);
        if let (Some(got), Some(ex)) = (&f.log_probs, &exact.log_probs) {
            for (r, e) in ex.iter().enumerate() {
                if let Some(e) = e {
                    let err = e.error(got[r]);
                    assert!(
                        err <= tol(e.rounded, acc, out),
                        "{} log_prob[{r}] = {} vs {:?}",
                        k.name(),
                        got[r],
                        e
                    );
                    assert_eq!(got[r], out.round_f64(got[r]), "not representable in {out}");
                } else {
                    assert_eq!(got[r], 0.0, "ignore_index rows hold 0");
                }
            }
        } else {
            assert_eq!(f.log_probs.is_some(), exact.log_probs.is_some());
        }
        if let (Some(got), Some(ex)) = (&f.entropy, &exact.entropy) {
            for (r, e) in ex.iter().enumerate() {
                let err = e.error(got[r]);
                assert!(
                    err <= tol(e.rounded, acc, out),
                    "{} entropy[{r}] = {} vs {:?}",
                    k.name(),
                    got[r],
                    e
                );
                assert!(got[r] >= 0.0);
            }
        } else {
            assert_eq!(f.entropy.is_some(), exact.entropy.is_some());
        }
        if let (Some(got), Some(ex)) = (&f.topk_log_probs, &exact.topk_log_probs) {
            for ((r, c), e) in ex.indexed_iter() {
                let err = e.error(got[[r, c]]);
                assert!(
                    err <= tol(e.rounded, acc, out),
                    "{} topk[{r},{c}] = {} vs {:?}",
                    k.name(),
                    got[[r, c]],
                    e
                );
            }
        } else {
            assert_eq!(f.topk_log_probs.is_some(), exact.topk_log_probs.is_some());
        }
    }
}

/// Compares every kernel's backward with the oracle VJP, per element within
/// `TOL_U u (sum of |cotangents|) / T + ulp_out`.
fn check_backward(problem: &Problem<'_>, cot: &Cotangents<'_>, out: Dtype) {
    check_backward_with(problem, cot, out, &kernels());
}

fn check_backward_with(
    problem: &Problem<'_>,
    cot: &Cotangents<'_>,
    out: Dtype,
    kernels: &[Box<dyn Kernel>],
) {
    let acc = problem.logits.dtype().accumulation();
    let exact = Oracle::default()
        .vjp(problem, cot, out)
        .expect("oracle vjp");
    let shape = problem.validate_shapes().unwrap();
    for k in kernels {
        let g = k
            .backward(problem, cot, out)
            .unwrap_or_else(|e| panic!("{}: {e}", k.name()));
        assert_eq!(g.dim(), (shape.n, shape.v_total));
        for r in 0..shape.n {
            let mag = cot.grad_log_probs.map_or(0.0, |g| g[r].abs())
                + cot.grad_entropy.map_or(0.0, |h| h[r].abs())
                + cot
                    .grad_topk_log_probs
                    .map_or(0.0, |gk| gk.row(r).iter().map(|x| x.abs()).sum());
            for j in 0..shape.v_total {
                let e = &exact[[r, j]];
                let err = e.error(g[[r, j]]);
                let t = TOL_U * acc.unit_roundoff() * mag / shape.temperature + out.ulp(e.rounded);
                assert!(
                    err <= t,
                    "{} grad[{r},{j}] = {:e} vs {:?} (tol {t:e})",
                    k.name(),
                    g[[r, j]],
                    e
                );
                if e.rounded == 0.0 && e.decided && e.enclosure.lo == 0.0 && e.enclosure.hi == 0.0 {
                    assert_eq!(
                        g[[r, j]].to_bits(),
                        0.0f64.to_bits(),
                        "{} grad[{r},{j}] must be +0",
                        k.name()
                    );
                }
            }
        }
    }
}

fn hand_rows() -> Array2<f64> {
    let ninf = f64::NEG_INFINITY;
    array![
        [0.0, 1.0, 2.0, 3.0, -1.5, 0.25],
        [1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
        [ninf, 2.0, ninf, -3.0, 0.5, ninf],
        [40.0, -40.0, 0.0, 39.5, 12.0, -7.25],
        [-5.0, -5.0, -4.0, -4.0, ninf, -60.0],
    ]
}

fn cast<T: Element>(x: &Array2<f64>) -> Array2<T> {
    x.mapv(T::from_f64)
}

#[test]
fn forward_matches_oracle_on_hand_picked_rows() {
    let x = hand_rows();
    let tokens = array![3i64, 0, 1, -100, 2];
    let ids = array![[3i64, 0], [5, 5], [0, 4], [0, 3], [1, 2]];
    let xf32 = cast::<f32>(&x);
    let xbf = cast::<bf16>(&x);
    let xf16 = cast::<f16>(&x);
    for logits in [
        Logits::F64(x.view()),
        Logits::F32(xf32.view()),
        Logits::Bf16(xbf.view()),
        Logits::F16(xf16.view()),
    ] {
        for out in [Dtype::F64, Dtype::F32, Dtype::Bf16, Dtype::F16] {
            let mut p = Problem::new(logits);
            p.tokens = Some(tokens.view());
            p.topk_ids = Some(ids.view());
            check_forward(&p, out);
            p.options.temperature = 0.7;
            check_forward(&p, out);
            p.options.temperature_dtype = TemperatureDtype::Input;
            check_forward(&p, out);
        }
    }
}

#[test]
fn masks_padding_and_entropy_choices_match_oracle() {
    let x = hand_rows();
    let xf = cast::<f32>(&x);
    let mask = array![
        [true, false, true, true, false, true],
        [false, false, false, true, false, false], // one allowed token
        [true, true, false, true, true, true],
        [false, true, true, true, true, true],
        [true, true, true, false, true, true],
    ];
    let tokens = array![3i64, 3, 1, 2, -100];
    let ids = array![[1i64, 3], [0, 3], [1, 2], [0, 1], [3, 0]];
    for ent in [
        None,
        Some(EntropyLogits::Unmasked),
        Some(EntropyLogits::Masked),
    ] {
        let mut p = Problem::new(Logits::F32(xf.view()));
        p.tokens = Some(tokens.view());
        p.sampling_mask = Some(mask.view());
        p.topk_ids = Some(ids.view());
        p.options.entropy = ent;
        check_forward(&p, Dtype::F32);
        p.options.temperature = 2.5;
        check_forward(&p, Dtype::F64);
    }
    // Padded vocabulary: only the first 4 columns are real; the padding holds NaN.
    let mut xp = xf.clone();
    xp.column_mut(4).fill(f32::NAN);
    xp.column_mut(5).fill(f32::INFINITY);
    let mut p = Problem::new(Logits::F32(xp.view()));
    let tokens = array![3i64, 0, 1, 2, 0];
    p.tokens = Some(tokens.view());
    p.options.vocab_size = Some(4);
    check_forward(&p, Dtype::F32);
}

#[test]
fn extreme_offsets_stay_accurate() {
    // f32 logits around 1e30 (spacing 7.6e22) and f16 near 65504.
    let base = 1.0e30f32;
    let row: Vec<f32> = (0..7)
        .map(|i| f32::from_bits(base.to_bits() + i * 3))
        .collect();
    let x = Array2::from_shape_vec((1, 7), row).unwrap();
    let tokens = array![2i64];
    let mut p = Problem::new(Logits::F32(x.view()));
    p.tokens = Some(tokens.view());
    // |d| reaches 1.4e24: the shift's own rounding (u |d|) dominates; the
    // exact answer is -inf-like, compare within the scaled tolerance.
    let exact = Oracle::default().forward(&p, Dtype::F32).unwrap();
    for k in kernels() {
        let f = k.forward(&p, Dtype::F32).unwrap();
        let e = exact.log_probs.as_ref().unwrap()[0].unwrap();
        assert!(
            e.error(f.log_probs.as_ref().unwrap()[0]) <= 4.0 * Dtype::F32.ulp(e.rounded),
            "{}",
            k.name()
        );
        let h = exact.entropy.as_ref().unwrap()[0];
        assert!(h.error(f.entropy.as_ref().unwrap()[0]) <= 4.0 * Dtype::F32.ulp(h.rounded) + 1e-6);
    }
    let xh = array![[
        f16::from_f64(65504.0),
        f16::from_f64(65472.0),
        f16::from_f64(-65504.0),
        f16::from_f64(65504.0)
    ]];
    let t = array![1i64];
    let mut p = Problem::new(Logits::F16(xh.view()));
    p.tokens = Some(t.view());
    check_forward(&p, Dtype::F32);
}

#[test]
fn long_rows_use_the_tree_and_match_oracle() {
    // 3 rows x 20000 entries: 10 blocks, merges on every level.
    let mut rng = Rng(7);
    let (n, v) = (3, 20_000);
    let x = Array2::from_shape_fn((n, v), |(r, _)| {
        (rng.normal() * (1.0 + 3.0 * r as f64)) as f32
    });
    let tokens = array![5i64, 19_999, 12_345];
    let ids = array![[0i64, 2048], [4095, 4096], [10_000, 1]];
    let mut p = Problem::new(Logits::F32(x.view()));
    p.tokens = Some(tokens.view());
    p.topk_ids = Some(ids.view());
    check_forward(&p, Dtype::F32);
    let xb = x.mapv(bf16::from_f32);
    p.logits = Logits::Bf16(xb.view());
    check_forward(&p, Dtype::Bf16);
}

#[test]
fn chunk_size_is_bit_invariant() {
    let mut rng = Rng(11);
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
    let cot = Cotangents {
        grad_log_probs: Some(g.view()),
        grad_entropy: Some(h.view()),
        grad_topk_log_probs: Some(gk.view()),
    };
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
fn grads_match_oracle_vjp() {
    let x = hand_rows();
    let xf = cast::<f32>(&x);
    let xb = cast::<bf16>(&x);
    let tokens = array![3i64, 0, 1, -100, 2];
    let ids = array![[3i64, 0], [5, 5], [0, 4], [0, 3], [1, 2]];
    let mask = array![
        [true, false, true, true, false, true],
        [true; 6],
        [true, true, false, true, true, true],
        [false, true, true, true, true, true],
        [true, true, true, false, true, true],
    ];
    let g = array![1.0, -0.5, 2.0, 3.0, 0.75];
    let h = array![0.5, 1.0, -1.25, 0.0, 2.0];
    let gk = array![
        [0.25, -1.0],
        [0.5, 0.5],
        [1.0, 1.0],
        [-0.5, 0.125],
        [2.0, -2.0]
    ];
    let cots = [
        Cotangents {
            grad_log_probs: Some(g.view()),
            ..Default::default()
        },
        Cotangents {
            grad_entropy: Some(h.view()),
            ..Default::default()
        },
        Cotangents {
            grad_topk_log_probs: Some(gk.view()),
            ..Default::default()
        },
        Cotangents {
            grad_log_probs: Some(g.view()),
            grad_entropy: Some(h.view()),
            grad_topk_log_probs: Some(gk.view()),
        },
    ];
    for logits in [
        Logits::F32(xf.view()),
        Logits::Bf16(xb.view()),
        Logits::F64(x.view()),
    ] {
        for cot in &cots {
            for (masked, ent, t) in [
                (false, EntropyLogits::Unmasked, 1.0),
                (true, EntropyLogits::Unmasked, 0.7),
                (true, EntropyLogits::Masked, 1.5),
            ] {
                let mut p = Problem::new(logits);
                p.tokens = Some(tokens.view());
                p.topk_ids = Some(ids.view());
                p.options.entropy = Some(ent);
                p.options.temperature = t;
                if masked {
                    p.sampling_mask = Some(mask.view());
                }
                check_backward(&p, cot, Dtype::F32);
                check_backward(&p, cot, Dtype::Bf16);
                // z = round_input(x / T) materialised by the caller; dz/dx = 1/T.
                p.options.temperature_dtype = TemperatureDtype::Input;
                check_backward(&p, cot, Dtype::F32);
            }
        }
    }
}

#[test]
fn in_place_backward_equals_out_of_place() {
    let mut rng = Rng(3);
    let (n, v) = (5, 3000);
    let x = Array2::from_shape_fn((n, v), |_| (rng.normal() * 3.0) as f32);
    let tokens = array![1i64, -100, 2999, 0, 1500];
    let ids = Array2::from_shape_fn((n, 2), |(r, k)| ((r * 13 + k * 700) % v) as i64);
    let g = Array1::from_shape_fn(n, |r| 1.0 + r as f64);
    let h = Array1::from_shape_fn(n, |r| 0.25 * r as f64 - 0.5);
    let gk = Array2::from_shape_fn((n, 2), |(r, k)| 0.5 * (r + k) as f64);
    let cot = Cotangents {
        grad_log_probs: Some(g.view()),
        grad_entropy: Some(h.view()),
        grad_topk_log_probs: Some(gk.view()),
    };
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
            k.backward_in_place(
                logprobe_reference::spec::ProblemMut {
                    logits: LogitsMut::F32(y.view_mut()),
                    tokens: p.tokens,
                    sampling_mask: None,
                    topk_ids: p.topk_ids,
                    options: p.options,
                },
                &cot,
            )
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
            k.backward_in_place(
                logprobe_reference::spec::ProblemMut {
                    logits: LogitsMut::Bf16(yb.view_mut()),
                    tokens: p.tokens,
                    sampling_mask: None,
                    topk_ids: p.topk_ids,
                    options: p.options,
                },
                &cot,
            )
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
fn bad_input_gives_typed_errors_and_leaves_logits_unchanged() {
    let mut x = cast::<f32>(&hand_rows());
    x[[3, 2]] = f32::NAN;
    let tokens = array![3i64, 0, 1, 2, 2];
    let g = array![1.0, 1.0, 1.0, 1.0, 1.0];
    let cot = Cotangents {
        grad_log_probs: Some(g.view()),
        ..Default::default()
    };
    let mut p = Problem::new(Logits::F32(x.view()));
    p.tokens = Some(tokens.view());
    let want = p.validate().unwrap_err();
    assert!(matches!(
        want,
        SpecError::NonFiniteLogit { row: 3, col: 2, .. }
    ));
    for k in kernels() {
        // NaN != NaN: compare the errors' debug forms.
        let same =
            |e: KernelError| format!("{e:?}") == format!("{:?}", KernelError::Spec(want.clone()));
        assert!(same(k.forward(&p, Dtype::F32).unwrap_err()), "{}", k.name());
        assert!(
            same(k.backward(&p, &cot, Dtype::F32).unwrap_err()),
            "{}",
            k.name()
        );
        let mut y = x.clone();
        let err = k
            .backward_in_place(
                logprobe_reference::spec::ProblemMut {
                    logits: LogitsMut::F32(y.view_mut()),
                    tokens: p.tokens,
                    sampling_mask: None,
                    topk_ids: None,
                    options: p.options,
                },
                &cot,
            )
            .unwrap_err();
        assert!(same(err), "{}", k.name());
        assert!(
            y.iter().zip(&x).all(|(a, b)| a.to_bits() == b.to_bits()),
            "logits changed on error"
        );
    }
    // Target with -inf logit, out of range, masked; no finite logit; chunk 0; bad T.
    let x = cast::<f32>(&hand_rows());
    let mut p = Problem::new(Logits::F32(x.view()));
    let bad_t = array![3i64, 0, 0, 2, 2];
    p.tokens = Some(bad_t.view());
    for k in kernels() {
        assert_eq!(
            k.forward(&p, Dtype::F32).unwrap_err(),
            KernelError::Spec(SpecError::TokenNegInf { row: 2, token: 0 })
        );
    }
    let oor = array![3i64, 6, 0, 2, 2];
    p.tokens = Some(oor.view());
    assert!(matches!(
        CpuKernel::fused().forward(&p, Dtype::F32),
        Err(KernelError::Spec(SpecError::TokenOutOfRange { row: 1, .. }))
    ));
    p.tokens = None;
    let none = Array2::from_elem((5, 6), false);
    p.sampling_mask = Some(none.view());
    for k in kernels() {
        assert!(matches!(
            k.forward(&p, Dtype::F32),
            Err(KernelError::Spec(SpecError::NoFiniteLogit { row: 0, .. }))
        ));
    }
    p.sampling_mask = None;
    assert_eq!(
        CpuKernel::chunked(0).forward(&p, Dtype::F32).unwrap_err(),
        KernelError::Spec(SpecError::ZeroChunkSize)
    );
    p.options.temperature = -1.0;
    assert!(matches!(
        CpuKernel::fused().forward(&p, Dtype::F32),
        Err(KernelError::Spec(SpecError::BadTemperature { .. }))
    ));
    // Input-dtype temperature overflowing f16 is the oracle's NonFiniteLogit.
    let xh = array![[f16::from_f64(60000.0), f16::from_f64(1.0)]];
    let mut p = Problem::new(Logits::F16(xh.view()));
    p.options.temperature = 0.5;
    p.options.temperature_dtype = TemperatureDtype::Input;
    let want = Oracle::default().forward(&p, Dtype::F32).unwrap_err();
    for k in kernels() {
        assert_eq!(
            k.forward(&p, Dtype::F32).unwrap_err(),
            KernelError::Spec(want.clone())
        );
    }
}

#[test]
fn empty_batch_gives_empty_outputs() {
    let x = Array2::<f32>::zeros((0, 1 << 22));
    let t = Array1::<i64>::zeros(0);
    let mut p = Problem::new(Logits::F32(x.view()));
    p.tokens = Some(t.view());
    let g = Array1::<f64>::zeros(0);
    let cot = Cotangents {
        grad_log_probs: Some(g.view()),
        ..Default::default()
    };
    for k in kernels() {
        let f = k.forward(&p, Dtype::F32).unwrap();
        assert_eq!(f.log_probs.unwrap().len(), 0);
        assert_eq!(f.entropy.unwrap().len(), 0);
        assert_eq!(
            k.backward(&p, &cot, Dtype::F32).unwrap().dim(),
            (0, 1 << 22)
        );
        assert_eq!(k.workspace_bytes(&p.validate_shapes().unwrap()), 0);
    }
}

#[test]
fn vocab_parallel_with_empty_padding_and_masked_shards_matches_oracle() {
    let x = hand_rows();
    let xf = cast::<f32>(&x);
    let tokens = array![3i64, 0, 1, -100, 2];
    let ids = array![[3i64, 0], [5, 5], [0, 4], [0, 3], [1, 2]];
    // Column 2 (a whole shard in some layouts) is masked out in every row but row 0.
    let mask = Array2::from_shape_fn((5, 6), |(r, j)| j != 2 || r == 0);
    let tokens_m = array![3i64, 0, 1, -100, 3];
    let g = array![1.0, -0.5, 2.0, 3.0, 0.75];
    let h = array![0.5, 1.0, -1.25, 0.0, 2.0];
    let gk = array![
        [0.25, -1.0],
        [0.5, 0.5],
        [1.0, 1.0],
        [-0.5, 0.125],
        [2.0, -2.0]
    ];
    let cot = Cotangents {
        grad_log_probs: Some(g.view()),
        grad_entropy: Some(h.view()),
        grad_topk_log_probs: Some(gk.view()),
    };
    let layouts: Vec<Box<dyn Kernel>> = vec![
        Box::new(CpuKernel::vocab_parallel(vec![6])),
        Box::new(CpuKernel::vocab_parallel(vec![2, 1, 0, 3])),
        Box::new(CpuKernel::vocab_parallel(vec![1, 1, 1, 1, 1, 1])),
        Box::new(CpuKernel::vocab_parallel(vec![0, 5, 1, 0])),
    ];
    for masked in [false, true] {
        let mut p = Problem::new(Logits::F32(xf.view()));
        p.topk_ids = Some(ids.view());
        p.tokens = Some(tokens.view());
        if masked {
            p.sampling_mask = Some(mask.view());
            p.tokens = Some(tokens_m.view());
        }
        check_forward_with(&p, Dtype::F32, &layouts);
        check_backward_with(&p, &cot, Dtype::F32, &layouts);
        p.options.temperature = 0.8;
        p.options.entropy = Some(EntropyLogits::Masked);
        check_forward_with(&p, Dtype::F32, &layouts);
        check_backward_with(&p, &cot, Dtype::F32, &layouts);
    }
    // Padded vocabulary: 8 columns, vocab_size 5; the last shard is all
    // padding (NaN, which must be ignored), the middle one half padding.
    let mut xp = Array2::<f32>::from_elem((5, 8), f32::NAN);
    xp.slice_mut(ndarray::s![.., ..5])
        .assign(&xf.slice(ndarray::s![.., ..5]));
    let tokens_p = array![3i64, 0, 1, -100, 2];
    let ids_p = array![[3i64, 0], [4, 4], [0, 4], [0, 3], [1, 2]];
    let mut p = Problem::new(Logits::F32(xp.view()));
    p.tokens = Some(tokens_p.view());
    p.topk_ids = Some(ids_p.view());
    p.options.vocab_size = Some(5);
    let padded: Vec<Box<dyn Kernel>> = vec![
        Box::new(CpuKernel::vocab_parallel(vec![3, 3, 2])),
        Box::new(CpuKernel::vocab_parallel(vec![4, 1, 3, 0])),
        Box::new(CpuKernel::fused()),
        Box::new(CpuKernel::chunked(2)),
    ];
    check_forward_with(&p, Dtype::F32, &padded);
    check_backward_with(&p, &cot, Dtype::F32, &padded);
    // Widths that do not cover the columns are a shape error.
    let bad = CpuKernel::vocab_parallel(vec![3, 3]);
    assert!(matches!(
        bad.forward(&p, Dtype::F32),
        Err(KernelError::Spec(SpecError::ShapeMismatch { .. }))
    ));
}

#[test]
fn vocab_parallel_long_rows_match_oracle() {
    let mut rng = Rng(5);
    let (n, v) = (2, 9000);
    let x = Array2::from_shape_fn((n, v), |_| (rng.normal() * 2.0) as f32);
    let tokens = array![8999i64, 0];
    let mut p = Problem::new(Logits::F32(x.view()));
    p.tokens = Some(tokens.view());
    let k: Vec<Box<dyn Kernel>> = vec![Box::new(CpuKernel::vocab_parallel(vec![
        4500, 0, 2047, 2453,
    ]))];
    check_forward_with(&p, Dtype::F32, &k);
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
