//! `verify` on dumps with the top-k distillation KL (`forward_kl`,
//! `reverse_kl`, `teacher_topk_log_probs`, `kl_renormalized`; issue 18):
//! our correct kernel and the exact values pass, renormalised or not, f32
//! and bf16 outputs, bf16 logits at a real vocabulary (V = 151936); the
//! bug kinds fail (teacher probabilities taken as `a_k`, renormalisation
//! skipped); a teacher that is not log-probs, ids that repeat or are masked,
//! and a teacher without a KL candidate are bad input naming the row.

use std::path::Path;

use logprobe_kernels::kernel::Kernel;
use logprobe_kernels::CpuKernel;
use logprobe_reference::oracle::Oracle;
use logprobe_reference::spec::{Dtype, Logits, Output, Problem, SpecError, TopkKl};
use logprobe_reference::splitmix::SplitMix64;
use logprobe_verify::dump::{serialize_dump, Dump, DumpError, DumpTensor};
use logprobe_verify::keys;
use logprobe_verify::verify::{render_table, verify_dump, FileReport, ReportVerdict, VerifyConfig};
use ndarray::Array2;

const K: usize = 8;

/// `n` bf16 rows of width `v` (LLM-like: a Gaussian body, a few large
/// entries), distinct random ids, and a teacher near the student.
struct Case {
    x: Array2<half::bf16>,
    ids: Array2<i64>,
    a: Array2<f64>,
}

fn case(seed: u64, n: usize, v: usize) -> Case {
    let mut rng = SplitMix64::new(seed);
    let x = Array2::from_shape_fn((n, v), |_| {
        let b = 2.0 * rng.normal();
        half::bf16::from_f64(if rng.chance(0.001) { b + 10.0 } else { b })
    });
    let mut ids = Array2::<i64>::zeros((n, K));
    let mut a = Array2::<f64>::zeros((n, K));
    for r in 0..n {
        let z: Vec<f64> = x.row(r).iter().map(|b| b.to_f64()).collect();
        let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + z.iter().map(|q| (q - m).exp()).sum::<f64>().ln();
        // The K largest ids first (the teacher's top-k), then noise.
        let mut order: Vec<usize> = (0..v).collect();
        order.sort_by(|&i, &j| z[j].total_cmp(&z[i]).then(i.cmp(&j)));
        let vals: Vec<f64> = (0..K)
            .map(|k| z[order[k]] - lse + 0.05 * rng.normal())
            .collect();
        let mass: f64 = vals.iter().map(|q| q.exp()).sum();
        let shift = if mass > 0.99 { (mass / 0.99).ln() } else { 0.0 };
        for k in 0..K {
            ids[[r, k]] = order[k] as i64;
            a[[r, k]] = (vals[k] - shift) as f32 as f64;
        }
    }
    Case { x, ids, a }
}

impl Case {
    fn problem(&self, renormalized: bool) -> Problem<'_> {
        let mut p = Problem::new(Logits::Bf16(self.x.view()));
        p.options.entropy = None;
        p.topk_ids = Some(self.ids.view());
        p.teacher_topk_log_probs = Some(self.a.view());
        p.options.topk_kl = Some(TopkKl {
            forward: true,
            reverse: true,
            renormalized,
            teacher_dtype: Dtype::F32,
        });
        p
    }

    fn dump(
        &self,
        kl: &[(&str, Vec<f64>)],
        dtype: Dtype,
        ids: &Array2<i64>,
        a: &Array2<f64>,
        renorm: bool,
    ) -> Vec<u8> {
        let (n, v) = self.x.dim();
        let mut t = vec![
            (
                "logits",
                DumpTensor::floats(
                    Dtype::Bf16,
                    &[n, v],
                    &self.x.iter().map(|b| b.to_f64()).collect::<Vec<_>>(),
                ),
            ),
            (
                "topk_ids",
                DumpTensor::i64s(&[n, K], ids.as_slice().unwrap()),
            ),
            (
                "teacher_topk_log_probs",
                DumpTensor::floats(Dtype::F32, &[n, K], a.as_slice().unwrap()),
            ),
        ];
        for (name, vals) in kl {
            t.push((name, DumpTensor::floats(dtype, &[n], vals)));
        }
        let r = renorm.to_string();
        serialize_dump(
            &t,
            &[
                (keys::FORMAT_VERSION.name, "2"),
                (keys::KL_RENORMALIZED.name, &r),
            ],
        )
        .unwrap()
    }
}

fn verify(bytes: &[u8]) -> Result<FileReport, DumpError> {
    verify_dump(
        &Dump::parse(bytes)?,
        Path::new("kl.safetensors"),
        &VerifyConfig::default(),
    )
}

fn col(a: &Array2<f64>) -> Vec<f64> {
    a.column(0).to_vec()
}

#[test]
fn correct_kl_passes_and_the_bug_kinds_fail() {
    let c = case(3, 6, 3000);
    let o = Oracle::default();
    for renorm in [false, true] {
        let p = c.problem(renorm);
        for dtype in [Dtype::F32, Dtype::Bf16] {
            for (what, fo) in [
                (
                    "fused",
                    CpuKernel::fused().forward(&p, dtype).unwrap().values,
                ),
                (
                    "chunked",
                    CpuKernel::chunked(4).forward(&p, dtype).unwrap().values,
                ),
            ] {
                let kl = [
                    ("forward_kl", col(&fo[Output::ForwardKl])),
                    ("reverse_kl", col(&fo[Output::ReverseKl])),
                ];
                let r = verify(&c.dump(&kl, dtype, &c.ids, &c.a, renorm)).unwrap();
                assert_eq!(
                    r.verdict,
                    ReportVerdict::Pass,
                    "{what} {dtype} {renorm}: {}",
                    render_table(&r)
                );
            }
            let ex = o.forward(&p, dtype).unwrap();
            let exact = |out: Output| {
                ex.values[out]
                    .column(0)
                    .iter()
                    .map(|e| e.rounded)
                    .collect::<Vec<_>>()
            };
            let kl = [
                ("forward_kl", exact(Output::ForwardKl)),
                ("reverse_kl", exact(Output::ReverseKl)),
            ];
            let r = verify(&c.dump(&kl, dtype, &c.ids, &c.a, renorm)).unwrap();
            assert_eq!(r.verdict, ReportVerdict::Pass, "exact {dtype} {renorm}");
            for out in &r.outputs {
                assert!(out.max_ulps <= 0.5, "{}: {}", out.output, out.max_ulps);
            }
        }
    }
    // The teacher's probabilities taken as a_k.
    let p = c.problem(false);
    let lp =
        CpuKernel::fused().forward(&p, Dtype::F32).unwrap().values[Output::TopkLogProbs].clone();
    let bad: Vec<f64> = (0..lp.nrows())
        .map(|r| {
            (0..K)
                .map(|k| c.a[[r, k]] * (c.a[[r, k]] - lp[[r, k]]))
                .sum::<f64>() as f32 as f64
        })
        .collect();
    let r = verify(&c.dump(&[("forward_kl", bad)], Dtype::F32, &c.ids, &c.a, false)).unwrap();
    assert_eq!(r.verdict, ReportVerdict::Fail, "{}", render_table(&r));
    // The renormalisation skipped: the plain KL declared renormalised.
    let plain = CpuKernel::fused().forward(&p, Dtype::F32).unwrap().values;
    let kl = [("forward_kl", col(&plain[Output::ForwardKl]))];
    let r = verify(&c.dump(&kl, Dtype::F32, &c.ids, &c.a, true)).unwrap();
    assert_eq!(r.verdict, ReportVerdict::Fail, "{}", render_table(&r));
}

#[test]
fn bf16_logits_at_real_vocab_pass() {
    let c = case(11, 2, 151936);
    for renorm in [false, true] {
        let p = c.problem(renorm);
        let fo = CpuKernel::fused().forward(&p, Dtype::Bf16).unwrap().values;
        let kl = [
            ("forward_kl", col(&fo[Output::ForwardKl])),
            ("reverse_kl", col(&fo[Output::ReverseKl])),
        ];
        let r = verify(&c.dump(&kl, Dtype::Bf16, &c.ids, &c.a, renorm)).unwrap();
        assert_eq!(
            r.verdict,
            ReportVerdict::Pass,
            "{renorm}: {}",
            render_table(&r)
        );
    }
}

#[test]
fn a_teacher_that_cannot_carry_a_kl_is_bad_input_naming_the_row() {
    let c = case(5, 4, 400);
    let kl = [("forward_kl", vec![0.0; 4])];
    let spec = |ids: &Array2<i64>, a: &Array2<f64>| match verify(&c.dump(
        &kl,
        Dtype::F32,
        ids,
        a,
        false,
    )) {
        Err(DumpError::Spec(e)) => e,
        other => panic!("expected a spec error, got {:?}", other.map(|r| r.verdict)),
    };
    let mut a = c.a.clone();
    a[[2, 3]] = 0.5;
    assert_eq!(
        spec(&c.ids, &a),
        SpecError::BadTeacherLogProb {
            row: 2,
            k: 3,
            value: 0.5
        }
    );
    let mut a = c.a.clone();
    for k in 0..K {
        a[[1, k]] = -0.5;
    }
    assert!(matches!(
        spec(&c.ids, &a),
        SpecError::TeacherMassAboveOne { row: 1, .. }
    ));
    let mut ids = c.ids.clone();
    ids[[3, 5]] = ids[[3, 1]];
    assert!(matches!(
        spec(&ids, &c.a),
        SpecError::TopkIdDuplicate { row: 3, k: 5, .. }
    ));
    // A teacher without a KL candidate, and a KL without its teacher.
    let (n, v) = c.x.dim();
    let logits = DumpTensor::floats(
        Dtype::Bf16,
        &[n, v],
        &c.x.iter().map(|b| b.to_f64()).collect::<Vec<_>>(),
    );
    let ids_t = DumpTensor::i64s(&[n, K], c.ids.as_slice().unwrap());
    let teacher = DumpTensor::floats(Dtype::F32, &[n, K], c.a.as_slice().unwrap());
    let lp = DumpTensor::floats(Dtype::F32, &[n, K], &vec![-1.0; n * K]);
    let b = serialize_dump(
        &[
            ("logits", logits.clone()),
            ("topk_ids", ids_t.clone()),
            ("topk_log_probs", lp),
            ("teacher_topk_log_probs", teacher),
        ],
        &[(keys::FORMAT_VERSION.name, "2")],
    )
    .unwrap();
    assert!(matches!(
        verify(&b),
        Err(DumpError::MissingTensor {
            tensor: "forward_kl",
            ..
        })
    ));
    let b = serialize_dump(
        &[
            ("logits", logits),
            ("topk_ids", ids_t),
            (
                "forward_kl",
                DumpTensor::floats(Dtype::F32, &[n], &[0.0; 4]),
            ),
        ],
        &[(keys::FORMAT_VERSION.name, "2")],
    )
    .unwrap();
    assert!(matches!(
        verify(&b),
        Err(DumpError::MissingTensor {
            tensor: "teacher_topk_log_probs",
            ..
        })
    ));
}
