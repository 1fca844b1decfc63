//! `verify` on dumps with a cross-entropy `loss` (format version 2):
//! every reduction with label smoothing, `ignore_index`, a sampling mask
//! and weights passes for our correct kernel and the exact values; the
//! issue's bugs fail; the all-ignored mean follows its declared value
//! (a NaN only as a NaN); a reduced loss over part of the rows is
//! UNCHECKED; an f64 reduced loss is decided by the row-by-row MPFR path;
//! bad loss input is a typed error.

use std::path::Path;

use logprobe_kernels::CpuKernel;
use logprobe_reference::oracle::Oracle;
use logprobe_reference::spec::{
    CrossEntropy, Dtype, Logits, MeanAllIgnored, Problem, Reduction, SpecError,
};
use logprobe_verify::dump::{serialize_dump, Dump, DumpError, DumpTensor};
use logprobe_verify::keys;
use logprobe_verify::names::NameError;
use logprobe_verify::verify::{render_table, verify_dump, FileReport, ReportVerdict, VerifyConfig};
use ndarray::{Array1, Array2};

const N: usize = 9;
const V: usize = 500;

struct Case {
    x: Array2<f32>,
    tokens: Array1<i64>,
    mask: Array2<bool>,
    weights: Array1<f64>,
}

fn case() -> Case {
    let x = Array2::from_shape_fn((N, V), |(r, j)| {
        let x = ((r * 131 + j * 17) as f32 * 0.37).sin() * (1.0 + (r % 4) as f32 * 3.0);
        if j == (r * 7) % V {
            x + 6.0
        } else {
            x
        }
    });
    let tokens = Array1::from_shape_fn(N, |r| {
        if r % 3 == 2 {
            -100
        } else {
            ((r * 7) % V) as i64
        }
    });
    let mask = Array2::from_shape_fn((N, V), |(r, j)| {
        r % 4 != 3 || j % 5 != 1 || j == (r * 7) % V
    });
    let weights = Array1::from_shape_fn(N, |r| 0.5 + 0.25 * (r % 4) as f64);
    Case {
        x,
        tokens,
        mask,
        weights,
    }
}

impl Case {
    fn problem<'a>(&'a self, tokens: &'a Array1<i64>) -> Problem<'a> {
        let mut p = Problem::new(Logits::F32(self.x.view()));
        p.tokens = Some(tokens.view());
        p.sampling_mask = Some(self.mask.view());
        p
    }

    /// The dump of `loss` (`values` in `dtype`) under `ce`'s options.
    fn dump(
        &self,
        tokens: &Array1<i64>,
        ce: &CrossEntropy<'_>,
        values: &[f64],
        dtype: Dtype,
        extra: &[(&str, DumpTensor)],
    ) -> Vec<u8> {
        let shape: Vec<usize> = match ce.reduction {
            Reduction::None => vec![N],
            _ => vec![],
        };
        let mut tensors = vec![
            (
                "logits",
                DumpTensor::floats(
                    Dtype::F32,
                    &[N, V],
                    &self.x.iter().map(|&v| v as f64).collect::<Vec<_>>(),
                ),
            ),
            ("tokens", DumpTensor::i64s(&[N], tokens.as_slice().unwrap())),
            (
                "sampling_mask",
                DumpTensor::bools(&[N, V], self.mask.as_slice().unwrap()),
            ),
            ("loss", DumpTensor::floats(dtype, &shape, values)),
        ];
        if let Some(w) = ce.loss_weights {
            tensors.push((
                "loss_weights",
                DumpTensor::floats(Dtype::F64, &[N], &w.to_vec()),
            ));
        }
        tensors.extend(extra.iter().cloned());
        let eps = ce.label_smoothing.to_string();
        serialize_dump(
            &tensors,
            &[
                (keys::FORMAT_VERSION.name, "2"),
                (keys::REDUCTION.name, ce.reduction.name()),
                (keys::LABEL_SMOOTHING.name, &eps),
                (keys::MEAN_ALL_IGNORED.name, ce.mean_all_ignored.name()),
            ],
        )
        .unwrap()
    }
}

fn verify(bytes: &[u8]) -> Result<FileReport, DumpError> {
    let dump = Dump::parse(bytes)?;
    verify_dump(
        &dump,
        Path::new("loss.safetensors"),
        &VerifyConfig::default(),
    )
}

fn loss_report(r: &FileReport) -> &logprobe_verify::verify::OutputReport {
    r.outputs.iter().find(|o| o.output == "loss").unwrap()
}

#[test]
fn correct_losses_pass_every_reduction_and_the_bugs_fail() {
    let c = case();
    let p = c.problem(&c.tokens);
    let o = Oracle::default();
    for reduction in [Reduction::None, Reduction::Sum, Reduction::Mean] {
        for eps in [0.0, 0.1] {
            for weights in [None, Some(c.weights.view())] {
                let ce = CrossEntropy {
                    reduction,
                    label_smoothing: eps,
                    loss_weights: weights,
                    ..Default::default()
                };
                let what = format!("{reduction} eps {eps} weights {}", weights.is_some());
                for dtype in [Dtype::F32, Dtype::Bf16] {
                    let ours = CpuKernel::fused().cross_entropy(&p, &ce, dtype).unwrap();
                    let r = verify(&c.dump(&c.tokens, &ce, &ours.values, dtype, &[])).unwrap();
                    let l = loss_report(&r);
                    assert_eq!(
                        r.verdict,
                        ReportVerdict::Pass,
                        "{what} {dtype}: {}",
                        render_table(&r)
                    );
                    assert_eq!(l.count, reduction.len(N), "{what}");
                    assert_eq!(l.reduction, Some(reduction.name()));
                    let exact = o.cross_entropy(&p, &ce, dtype).unwrap();
                    let values: Vec<f64> = exact.values.iter().map(|e| e.rounded).collect();
                    let r = verify(&c.dump(&c.tokens, &ce, &values, dtype, &[])).unwrap();
                    assert_eq!(r.verdict, ReportVerdict::Pass, "{what} exact {dtype}");
                    // The correctly rounded value is within half an ulp.
                    assert!(loss_report(&r).max_ulps <= 0.5, "{what} exact {dtype}");
                }
            }
        }
    }
    // PyTorch #73205 (the count): a smoothed mean over all N rows, the
    // ignored ones counted, fails.
    let sum = CrossEntropy {
        reduction: Reduction::Sum,
        label_smoothing: 0.1,
        ..Default::default()
    };
    let s = CpuKernel::fused()
        .cross_entropy(&p, &sum, Dtype::F32)
        .unwrap()
        .values[0];
    let mean = CrossEntropy {
        reduction: Reduction::Mean,
        ..sum
    };
    let bad = [Dtype::F32.round_f64(s / N as f64)];
    let r = verify(&c.dump(&c.tokens, &mean, &bad, Dtype::F32, &[])).unwrap();
    assert_eq!(r.verdict, ReportVerdict::Fail, "{}", render_table(&r));
    let table = render_table(&r);
    assert!(
        table.contains("loss (mean)") && table.contains("(mean)"),
        "{table}"
    );
    // A `none` loss with an ignored row's value not 0 fails.
    let none = CrossEntropy {
        reduction: Reduction::None,
        ..sum
    };
    let mut v = CpuKernel::fused()
        .cross_entropy(&p, &none, Dtype::F32)
        .unwrap()
        .values;
    v[2] = 1e-3;
    let r = verify(&c.dump(&c.tokens, &none, &v, Dtype::F32, &[])).unwrap();
    assert_eq!(r.verdict, ReportVerdict::Fail);
    assert_eq!(loss_report(&r).worst[0].row, 2);
}

#[test]
fn an_all_ignored_mean_is_its_declared_value_and_nan_only_as_nan() {
    let c = case();
    let ignored = Array1::from_elem(N, -100i64);
    for (mai, right, wrong) in [
        (MeanAllIgnored::Nan, f64::NAN, 0.0),
        (MeanAllIgnored::Zero, 0.0, f64::NAN),
    ] {
        let ce = CrossEntropy {
            reduction: Reduction::Mean,
            label_smoothing: 0.1,
            mean_all_ignored: mai,
            ..Default::default()
        };
        let r = verify(&c.dump(&ignored, &ce, &[right], Dtype::F32, &[])).unwrap();
        assert_eq!(
            r.verdict,
            ReportVerdict::Pass,
            "{mai:?}: {}",
            render_table(&r)
        );
        assert_eq!(loss_report(&r).count, 1);
        for w in [wrong, 1.0, f64::INFINITY] {
            let r = verify(&c.dump(&ignored, &ce, &[w], Dtype::F32, &[])).unwrap();
            assert_eq!(r.verdict, ReportVerdict::Fail, "{mai:?} candidate {w}");
        }
    }
    // The sum of no rows is 0.
    let sum = CrossEntropy {
        reduction: Reduction::Sum,
        ..Default::default()
    };
    let r = verify(&c.dump(&ignored, &sum, &[0.0], Dtype::F32, &[])).unwrap();
    assert_eq!(r.verdict, ReportVerdict::Pass);
    let r = verify(&c.dump(&ignored, &sum, &[f64::NAN], Dtype::F32, &[])).unwrap();
    assert_eq!(r.verdict, ReportVerdict::Fail);
}

#[test]
fn a_reduced_loss_over_part_of_the_rows_is_unchecked() {
    let c = case();
    let p = c.problem(&c.tokens);
    let ce = CrossEntropy {
        reduction: Reduction::Sum,
        ..Default::default()
    };
    let v = CpuKernel::fused()
        .cross_entropy(&p, &ce, Dtype::F32)
        .unwrap()
        .values;
    let mask: Vec<bool> = (0..N).map(|r| r != 4).collect();
    let extra = [("row_mask", DumpTensor::bools(&[N], &mask))];
    let r = verify(&c.dump(&c.tokens, &ce, &v, Dtype::F32, &extra)).unwrap();
    let l = loss_report(&r);
    assert_eq!(l.verdict, ReportVerdict::Unchecked);
    assert!(
        l.nothing_checked.as_ref().unwrap().contains("1 of 9 rows"),
        "{l:?}"
    );
}

#[test]
fn an_f64_reduced_loss_is_decided_row_by_row() {
    let c = case();
    let x64 = c.x.mapv(f64::from);
    let mut p = Problem::new(Logits::F64(x64.view()));
    p.tokens = Some(c.tokens.view());
    p.sampling_mask = Some(c.mask.view());
    for reduction in [Reduction::Sum, Reduction::Mean] {
        let ce = CrossEntropy {
            reduction,
            label_smoothing: 0.25,
            loss_weights: Some(c.weights.view()),
            ..Default::default()
        };
        let exact = Oracle::default()
            .cross_entropy(&p, &ce, Dtype::F64)
            .unwrap()
            .values[0];
        let ours = CpuKernel::fused()
            .cross_entropy(&p, &ce, Dtype::F64)
            .unwrap()
            .values;
        let mut tensors = vec![
            (
                "logits",
                DumpTensor::floats(Dtype::F64, &[N, V], x64.as_slice().unwrap()),
            ),
            (
                "tokens",
                DumpTensor::i64s(&[N], c.tokens.as_slice().unwrap()),
            ),
            (
                "sampling_mask",
                DumpTensor::bools(&[N, V], c.mask.as_slice().unwrap()),
            ),
            (
                "loss_weights",
                DumpTensor::floats(Dtype::F64, &[N], c.weights.as_slice().unwrap()),
            ),
        ];
        for (value, pass) in [
            (exact.rounded, true),
            (ours[0], true),
            (exact.rounded * (1.0 + 1e-9), false),
        ] {
            tensors.truncate(4);
            tensors.push(("loss", DumpTensor::floats(Dtype::F64, &[1], &[value])));
            let bytes = serialize_dump(
                &tensors,
                &[
                    (keys::FORMAT_VERSION.name, "2"),
                    (keys::REDUCTION.name, reduction.name()),
                    (keys::LABEL_SMOOTHING.name, "0.25"),
                ],
            )
            .unwrap();
            let r = verify(&bytes).unwrap();
            let l = loss_report(&r);
            assert_eq!(
                l.verdict == ReportVerdict::Pass,
                pass,
                "{reduction} {value}: {}",
                render_table(&r)
            );
            if value == exact.rounded {
                assert_eq!(l.max_abs_error.to_bits(), exact.error(value).to_bits());
            }
            assert!(r.fallback.outputs_mpfr > 0, "f64: MPFR decided");
            // Every output MPFR decided is one of the outputs counted (the
            // report once said "14 of 12 oracle outputs").
            assert!(
                r.fallback.outputs_mpfr <= r.fallback.outputs,
                "{:?}",
                r.fallback
            );
        }
    }
}

#[test]
fn bad_loss_input_is_typed() {
    let c = case();
    let v1 = [1.0];
    let vn: Vec<f64> = vec![1.0; N];
    let base = |meta: &[(&str, &str)], loss: DumpTensor, extra: Vec<(&str, DumpTensor)>| {
        let mut t = vec![
            (
                "logits",
                DumpTensor::floats(
                    Dtype::F32,
                    &[N, V],
                    &c.x.iter().map(|&v| v as f64).collect::<Vec<_>>(),
                ),
            ),
            (
                "tokens",
                DumpTensor::i64s(&[N], c.tokens.as_slice().unwrap()),
            ),
            ("loss", loss),
        ];
        t.extend(extra);
        serialize_dump(&t, meta).unwrap()
    };
    let v2 = (keys::FORMAT_VERSION.name, "2");
    let f = |v: &[f64], shape: &[usize]| DumpTensor::floats(Dtype::F32, shape, v);
    let err = |b: Vec<u8>| verify(&b).unwrap_err();
    // eps outside [0, 1].
    for eps in ["-0.1", "1.5", "nan"] {
        assert!(matches!(
            err(base(
                &[v2, (keys::LABEL_SMOOTHING.name, eps)],
                f(&vn, &[N]),
                vec![]
            )),
            DumpError::Spec(SpecError::BadLabelSmoothing { .. })
        ));
    }
    assert!(matches!(
        err(base(
            &[v2, (keys::LABEL_SMOOTHING.name, "lots")],
            f(&vn, &[N]),
            vec![]
        )),
        DumpError::BadMetadata {
            key: "label_smoothing",
            ..
        }
    ));
    // Unknown reduction and all-ignored value.
    assert!(matches!(
        err(base(
            &[v2, (keys::REDUCTION.name, "avg")],
            f(&v1, &[]),
            vec![]
        )),
        DumpError::Spec(SpecError::UnknownReduction { .. })
    ));
    assert!(matches!(
        err(base(
            &[v2, (keys::MEAN_ALL_IGNORED.name, "inf")],
            f(&vn, &[N]),
            vec![]
        )),
        DumpError::Spec(SpecError::UnknownMeanAllIgnored { .. })
    ));
    // Shapes that do not match the reduction.
    assert!(matches!(
        err(base(
            &[v2, (keys::REDUCTION.name, "mean")],
            f(&vn, &[N]),
            vec![]
        )),
        DumpError::Spec(SpecError::ShapeMismatch { tensor: "loss", .. })
    ));
    assert!(verify(&base(&[v2], f(&v1, &[]), vec![])).is_err());
    // Weights: negative (the row named), misshapen, or without a loss.
    let mut w = vec![1.0; N];
    w[5] = -1.0;
    let wt = |w: &[f64], n: usize| ("loss_weights", DumpTensor::floats(Dtype::F64, &[n], w));
    assert!(matches!(
        err(base(&[v2], f(&vn, &[N]), vec![wt(&w, N)])),
        DumpError::Spec(SpecError::BadLossWeight { row: 5, .. })
    ));
    assert!(verify(&base(&[v2], f(&vn, &[N]), vec![wt(&w[..3], 3)])).is_err());
    let no_loss = serialize_dump(
        &[
            (
                "logits",
                DumpTensor::floats(Dtype::F32, &[N, V], &vec![0.0; N * V]),
            ),
            (
                "tokens",
                DumpTensor::i64s(&[N], c.tokens.as_slice().unwrap()),
            ),
            ("log_probs", f(&vn, &[N])),
            wt(&[1.0; N], N),
        ],
        &[v2],
    )
    .unwrap();
    assert!(matches!(
        err(no_loss),
        DumpError::MissingTensor { tensor: "loss", .. }
    ));
    // A loss needs tokens and format version 2; its cotangent is not built.
    let no_tokens = serialize_dump(
        &[
            (
                "logits",
                DumpTensor::floats(Dtype::F32, &[N, V], &vec![0.0; N * V]),
            ),
            ("loss", f(&vn, &[N])),
        ],
        &[v2],
    )
    .unwrap();
    assert!(matches!(
        err(no_tokens),
        DumpError::MissingTensor {
            tensor: "tokens",
            ..
        }
    ));
    assert!(matches!(
        err(base(&[], f(&vn, &[N]), vec![])),
        DumpError::Name(NameError::NeedsVersion2 { name: "loss", .. })
    ));
    // `grad_loss` is built: `[N]` under `none` (a wrong shape is a typed
    // error, `tests/verify_loss_grad.rs`); a name reserved but not built
    // is still refused as such.
    assert!(Dump::parse(&base(
        &[v2],
        f(&vn, &[N]),
        vec![("grad_loss", f(&vn, &[N]))]
    ))
    .is_ok());
    assert!(matches!(
        err(base(
            &[v2, (keys::LOSS_NORMALIZER.name, "2")],
            f(&vn, &[N]),
            vec![]
        )),
        DumpError::Name(NameError::NotSupported {
            name: "loss_normalizer",
            ..
        })
    ));
}

/// The fallback counts of an f64 dump whose `z_loss` the f64 tier cannot
/// decide in f64: every output MPFR decided is one of the outputs counted
/// (the report once printed "14 of 12 oracle outputs": the loss side's
/// derived outputs were counted when MPFR decided them, never as outputs).
#[test]
fn fallback_counts_include_the_derived_loss_outputs() {
    let (n, v) = (3, 50);
    let x = Array2::from_shape_fn((n, v), |(r, j)| {
        ((r * 31 + j * 7) as f64 * 0.37).sin() * 3.0
    });
    let mut p = Problem::new(Logits::F64(x.view()));
    p.options.lse = true;
    p.options.z_loss_coef = Some(1e-4);
    let exact = Oracle::default().forward(&p, Dtype::F64).unwrap();
    let col = |o: logprobe_reference::spec::Output| -> Vec<f64> {
        exact.values[o]
            .column(0)
            .iter()
            .map(|e| e.rounded)
            .collect()
    };
    let bytes = serialize_dump(
        &[
            (
                "logits",
                DumpTensor::floats(Dtype::F64, &[n, v], x.as_slice().unwrap()),
            ),
            (
                "lse",
                DumpTensor::floats(
                    Dtype::F64,
                    &[n],
                    &col(logprobe_reference::spec::Output::Lse),
                ),
            ),
            (
                "z_loss",
                DumpTensor::floats(
                    Dtype::F64,
                    &[n],
                    &col(logprobe_reference::spec::Output::ZLoss),
                ),
            ),
        ],
        &[
            (keys::FORMAT_VERSION.name, "2"),
            (keys::Z_LOSS_COEF.name, "1e-4"),
        ],
    )
    .unwrap();
    let r = verify(&bytes).unwrap();
    assert_eq!(r.verdict, ReportVerdict::Pass, "{}", render_table(&r));
    let fb = &r.fallback;
    assert!(fb.outputs_mpfr > 0, "the f64 z_loss needs MPFR: {fb:?}");
    assert!(fb.outputs_mpfr <= fb.outputs, "{fb:?}");
    // Per row: the statistics, `lse` and the derived `z_loss`.
    assert_eq!(fb.outputs, 3 * n as u64, "{fb:?}");
}

/// (R5) A reduced loss is held to careful code's rows reduced in the
/// declared order: a mean of per-token losses rounded to bf16 (an autocast
/// region's output, summed in f32) is SUSPECT by the relative rule, while
/// the same mean of f32-rounded terms is not (TOLERANCE.md (R5)).
#[test]
fn a_mean_of_bf16_rounded_terms_is_suspect_by_the_relative_rule() {
    let c = case();
    let p = c.problem(&c.tokens);
    let none = CrossEntropy {
        reduction: Reduction::None,
        ..Default::default()
    };
    let per_row = Oracle::default()
        .cross_entropy(&p, &none, Dtype::F64)
        .unwrap();
    let counted: Vec<f64> = per_row
        .values
        .iter()
        .zip(c.tokens.iter())
        .filter(|(_, &t)| t != -100)
        .map(|(e, _)| e.rounded)
        .collect();
    let mean_of = |term: Dtype| {
        let s = counted
            .iter()
            .fold(0f32, |s, &l| s + term.round_f64(l) as f32);
        f64::from(s / counted.len() as f32)
    };
    let mean = CrossEntropy {
        reduction: Reduction::Mean,
        ..Default::default()
    };
    let rule = |value: f64| {
        let r = verify(&c.dump(&c.tokens, &mean, &[value], Dtype::F32, &[])).unwrap();
        let l = loss_report(&r).clone();
        (r.verdict, l)
    };
    let (verdict, l) = rule(mean_of(Dtype::F32));
    let rel = l.relative_rule.clone().expect("the rule covers a mean");
    assert_eq!(verdict, ReportVerdict::Pass, "{rel:?}");
    assert!(!rel.fires && rel.ratio <= rel.r, "{rel:?}");
    let (verdict, l) = rule(mean_of(Dtype::Bf16));
    let rel = l.relative_rule.clone().unwrap();
    assert!(rel.fires && rel.ratio > 10.0 * rel.r, "{rel:?}");
    assert!(
        l.suspect_rules.contains(&"relative"),
        "{:?}",
        l.suspect_rules
    );
    assert_ne!(verdict, ReportVerdict::Pass);
}
