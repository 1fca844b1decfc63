//! `verify` on dumps with the loss-side cotangents (`grad_lse`,
//! `grad_z_loss`, `grad_loss`; format version 2) and their `grad_logits`:
//! our correct kernel's and the exact gradients pass under every
//! reduction (label smoothing, `ignore_index`, a mask, weights) on f32,
//! bf16 and f16 logits, also for a selection of rows of a `mean` (each
//! one-row view divides by the whole dump's `W`) and without a `loss`
//! candidate; the z-loss gradient without its factor 2, the mean's
//! gradient divided by `N` and a smoothing gradient on ignored rows fail;
//! misshapen cotangents are typed errors naming `grad_loss`.

use std::path::Path;

use half::{bf16, f16};
use logprobe_kernels::{CpuKernel, Kernel};
use logprobe_reference::oracle::Oracle;
use logprobe_reference::spec::{
    Cotangents, Dtype, Logits, LossOptions, MeanAllIgnored, Output, Problem, Reduction, SpecError,
};
use logprobe_verify::dump::{serialize_dump, Dump, DumpError, DumpTensor};
use logprobe_verify::keys;
use logprobe_verify::verify::{
    render_table, verify_dump, FileReport, ReportVerdict, RowSelection, VerifyConfig,
};
use ndarray::{Array1, Array2};

const N: usize = 7;
const V: usize = 700;
const COEF: f64 = 1e-3;
const T: f64 = 0.7;

struct Case {
    x: Array2<f32>,
    xb: Array2<bf16>,
    xh: Array2<f16>,
    tokens: Array1<i64>,
    mask: Array2<bool>,
    w: Array1<f64>,
    a: Array1<f64>,
    b: Array1<f64>,
    g_rows: Array1<f64>,
    g_one: Array1<f64>,
}

fn case() -> Case {
    let x = Array2::from_shape_fn((N, V), |(r, j)| {
        ((r * 131 + j * 17) as f32 * 0.37).sin() * (2.0 + (r % 3) as f32 * 3.0)
    });
    Case {
        xb: x.mapv(bf16::from_f32),
        xh: x.mapv(f16::from_f32),
        x,
        tokens: Array1::from_shape_fn(N, |r| {
            if r % 3 == 1 {
                -100
            } else {
                ((r * 7) % V) as i64
            }
        }),
        mask: Array2::from_shape_fn((N, V), |(r, j)| (r + j) % 5 != 0 || j == (r * 7) % V),
        w: Array1::from_shape_fn(N, |r| 0.5 + 0.25 * r as f64),
        a: Array1::from_shape_fn(N, |r| 0.75 - 0.25 * r as f64),
        b: Array1::from_shape_fn(N, |r| 1.0 + r as f64),
        g_rows: Array1::from_shape_fn(N, |r| 2.0 - 0.5 * r as f64),
        g_one: Array1::from(vec![3.0]),
    }
}

impl Case {
    fn logits(&self, dtype: Dtype) -> Logits<'_> {
        match dtype {
            Dtype::F32 => Logits::F32(self.x.view()),
            Dtype::Bf16 => Logits::Bf16(self.xb.view()),
            _ => Logits::F16(self.xh.view()),
        }
    }

    fn problem<'a>(&'a self, dtype: Dtype, red: Reduction, eps: f64) -> Problem<'a> {
        let mut p = Problem::new(self.logits(dtype));
        p.tokens = Some(self.tokens.view());
        p.sampling_mask = Some(self.mask.view());
        p.options.entropy = None;
        p.options.temperature = T;
        p.options.lse = true;
        p.options.z_loss_coef = Some(COEF);
        p.options.loss = Some(LossOptions {
            reduction: red,
            label_smoothing: eps,
            mean_all_ignored: MeanAllIgnored::Nan,
        });
        p.loss_weights = Some(self.w.view());
        p
    }

    fn cot(&self, red: Reduction) -> Cotangents<'_> {
        Cotangents::default()
            .with_column(Output::Lse, self.a.view())
            .with_column(Output::ZLoss, self.b.view())
            .with_column(
                Output::Loss,
                match red {
                    Reduction::None => self.g_rows.view(),
                    _ => self.g_one.view(),
                },
            )
    }

    /// The dump of `grad` (in `out`) for `p`'s options and cotangents
    /// `cot` (stored `[N]`, or `[]` for a reduced loss's), with or without
    /// weights.
    fn dump(
        &self,
        p: &Problem<'_>,
        cot: &Cotangents<'_>,
        grad: &Array2<f64>,
        out: Dtype,
        weights: bool,
    ) -> Vec<u8> {
        let scalar: &[usize] = if p.options.loss.unwrap().reduction == Reduction::None {
            &[N]
        } else {
            &[]
        };
        self.dump_shaped(p, cot, grad, out, weights, scalar)
    }

    /// [`Case::dump`] with `grad_loss` stored in shape `scalar`.
    fn dump_shaped(
        &self,
        p: &Problem<'_>,
        cot: &Cotangents<'_>,
        grad: &Array2<f64>,
        out: Dtype,
        weights: bool,
        scalar: &[usize],
    ) -> Vec<u8> {
        let lo = p.options.loss.unwrap();
        let dtype = p.logits.dtype();
        let x: Vec<f64> = self
            .x
            .iter()
            .map(|&v| dtype.round_f64(f64::from(v)))
            .collect();
        let mut tensors = vec![
            ("logits", DumpTensor::floats(dtype, &[N, V], &x)),
            (
                "tokens",
                DumpTensor::i64s(&[N], self.tokens.as_slice().unwrap()),
            ),
            (
                "sampling_mask",
                DumpTensor::bools(&[N, V], self.mask.as_slice().unwrap()),
            ),
            (
                "grad_logits",
                DumpTensor::floats(out, &[N, V], grad.as_slice().unwrap()),
            ),
        ];
        for (name, g, shape) in [
            ("grad_lse", cot.column(Output::Lse), &[N][..]),
            ("grad_z_loss", cot.column(Output::ZLoss), &[N][..]),
            ("grad_loss", cot.column(Output::Loss), scalar),
        ] {
            if let Some(g) = g {
                tensors.push((name, DumpTensor::floats(Dtype::F64, shape, &g.to_vec())));
            }
        }
        if weights {
            tensors.push((
                "loss_weights",
                DumpTensor::floats(Dtype::F64, &[N], &self.w.to_vec()),
            ));
        }
        let eps = lo.label_smoothing.to_string();
        let (t, coef) = (T.to_string(), COEF.to_string());
        serialize_dump(
            &tensors,
            &[
                (keys::FORMAT_VERSION.name, "2"),
                (keys::TEMPERATURE.name, &t),
                (keys::Z_LOSS_COEF.name, &coef),
                (keys::REDUCTION.name, lo.reduction.name()),
                (keys::LABEL_SMOOTHING.name, &eps),
            ],
        )
        .unwrap()
    }
}

fn verify_rows(bytes: &[u8], rows: RowSelection) -> Result<FileReport, DumpError> {
    let dump = Dump::parse(bytes)?;
    verify_dump(
        &dump,
        Path::new("loss_grad.safetensors"),
        &VerifyConfig {
            rows,
            ..VerifyConfig::default()
        },
    )
}

fn verify(bytes: &[u8]) -> Result<FileReport, DumpError> {
    verify_rows(bytes, RowSelection::All)
}

fn grad_count(r: &FileReport) -> usize {
    r.outputs
        .iter()
        .find(|o| o.output == "grad_logits")
        .unwrap()
        .count
}

#[test]
fn correct_loss_gradients_pass_every_reduction_and_dtype() {
    let c = case();
    let o = Oracle::default();
    for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
        for red in [Reduction::None, Reduction::Sum, Reduction::Mean] {
            for eps in [0.0, 0.1] {
                let p = c.problem(dtype, red, eps);
                let cot = c.cot(red);
                let what = format!("{dtype} {red} eps {eps}");
                let ours = CpuKernel::fused().backward(&p, &cot, Dtype::F32).unwrap();
                let r = verify(&c.dump(&p, &cot, &ours, Dtype::F32, true)).unwrap();
                assert_eq!(
                    r.verdict,
                    ReportVerdict::Pass,
                    "{what}: {}",
                    render_table(&r)
                );
                assert_eq!(grad_count(&r), N * V, "{what}");
                let exact = o.vjp(&p, &cot, Dtype::F32).unwrap().mapv(|e| e.rounded);
                let r = verify(&c.dump(&p, &cot, &exact, Dtype::F32, true)).unwrap();
                assert_eq!(r.verdict, ReportVerdict::Pass, "{what} exact");
                let g = r
                    .outputs
                    .iter()
                    .find(|o| o.output == "grad_logits")
                    .unwrap();
                assert!(g.max_ulps <= 0.5, "{what} exact: {} ulps", g.max_ulps);
            }
        }
    }
}

/// A `mean`'s gradient divides by the whole dump's `W`: a selection of its
/// rows, and a dump without the `loss` candidate, still pass; weights
/// dropped from the dump (so `W` = the counted rows) fail the same values.
#[test]
fn a_mean_gradient_divides_by_the_whole_dump() {
    let c = case();
    let (red, eps) = (Reduction::Mean, 0.1);
    let p = c.problem(Dtype::Bf16, red, eps);
    let cot = c.cot(red);
    let ours = CpuKernel::chunked(64)
        .backward(&p, &cot, Dtype::F32)
        .unwrap();
    let bytes = c.dump(&p, &cot, &ours, Dtype::F32, true);
    for rows in [
        RowSelection::Range { start: 2, end: 3 },
        RowSelection::Sample(3),
    ] {
        let r = verify_rows(&bytes, rows).unwrap();
        assert_eq!(
            r.verdict,
            ReportVerdict::Pass,
            "{rows}: {}",
            render_table(&r)
        );
        assert!(grad_count(&r) > 0 && grad_count(&r) < N * V);
    }
    let r = verify(&c.dump(&p, &cot, &ours, Dtype::F32, false)).unwrap();
    assert_eq!(r.verdict, ReportVerdict::Fail, "{}", render_table(&r));
}

#[test]
fn loss_gradient_bugs_fail() {
    let c = case();
    let k = CpuKernel::fused();
    for dtype in [Dtype::F32, Dtype::Bf16] {
        // The z-loss gradient without its factor 2.
        let p = c.problem(dtype, Reduction::Sum, 0.0);
        let cot = c.cot(Reduction::Sum);
        let half_b = c.b.mapv(|b| b / 2.0);
        let bug = k
            .backward(
                &p,
                &cot.with_column(Output::ZLoss, half_b.view()),
                Dtype::F32,
            )
            .unwrap();
        let r = verify(&c.dump(&p, &cot, &bug, Dtype::F32, true)).unwrap();
        assert_eq!(r.verdict, ReportVerdict::Fail, "z-loss without 2, {dtype}");
        // The mean's gradient divided by N, not by the counted weight.
        let p = c.problem(dtype, Reduction::Mean, 0.1);
        let cot = c.cot(Reduction::Mean);
        let w_sum: f64 = p.loss_divisor_terms().unwrap().sum();
        let scaled = Array1::from(vec![c.g_one[0] * w_sum / N as f64]);
        let bug = k
            .backward(
                &p,
                &cot.with_column(Output::Loss, scaled.view()),
                Dtype::F32,
            )
            .unwrap();
        let r = verify(&c.dump(&p, &cot, &bug, Dtype::F32, true)).unwrap();
        assert_eq!(r.verdict, ReportVerdict::Fail, "mean over N, {dtype}");
        // Label smoothing differentiated on the ignored rows too (their
        // smoothing term kept: `g w eps (p_j - [j in A] / |A|) / T`).
        let p = c.problem(dtype, Reduction::None, 0.1);
        let cot = Cotangents::default().with_column(Output::Loss, c.g_rows.view());
        let good = k.backward(&p, &cot, Dtype::F32).unwrap();
        let ignored: Vec<usize> = (0..N).filter(|&r| !p.has_target(r)).collect();
        let tokens = Array1::from_shape_fn(N, |r| ((r * 7) % V) as i64);
        let g_ign = Array1::from_shape_fn(N, |r| {
            if ignored.contains(&r) {
                c.g_rows[r] * 0.1
            } else {
                0.0
            }
        });
        let mut q = c.problem(dtype, Reduction::None, 1.0);
        q.tokens = Some(tokens.view());
        let extra = k
            .backward(
                &q,
                &Cotangents::default().with_column(Output::Loss, g_ign.view()),
                Dtype::F32,
            )
            .unwrap();
        let bug = (&good + &extra).mapv(|v| Dtype::F32.round_f64(v));
        let r = verify(&c.dump(&p, &cot, &good, Dtype::F32, true)).unwrap();
        assert_eq!(r.verdict, ReportVerdict::Pass, "{}", render_table(&r));
        let r = verify(&c.dump(&p, &cot, &bug, Dtype::F32, true)).unwrap();
        assert_eq!(
            r.verdict,
            ReportVerdict::Fail,
            "smoothing on ignored rows, {dtype}"
        );
    }
}

#[test]
fn misshapen_loss_cotangents_are_typed_errors() {
    let c = case();
    let err = |bytes: Vec<u8>| match verify(&bytes) {
        Err(e) => e,
        Ok(r) => panic!("accepted: {}", render_table(&r)),
    };
    let grad = Array2::zeros((N, V));
    // `[N]` under `mean`, `[]` under `none`: the shape follows the reduction.
    let mean = c.problem(Dtype::F32, Reduction::Mean, 0.0);
    let rows = Cotangents::default().with_column(Output::Loss, c.g_rows.view());
    let e = err(c.dump_shaped(&mean, &rows, &grad, Dtype::F32, true, &[N]));
    assert!(
        matches!(
            e,
            DumpError::BadShape {
                tensor: "grad_loss",
                ..
            }
        ),
        "{e}"
    );
    let none = c.problem(Dtype::F32, Reduction::None, 0.0);
    let one = Cotangents::default().with_column(Output::Loss, c.g_one.view());
    let e = err(c.dump_shaped(&none, &one, &grad, Dtype::F32, true, &[]));
    assert!(
        matches!(
            e,
            DumpError::BadShape {
                tensor: "grad_loss",
                ..
            }
        ),
        "{e}"
    );
    // `[1]` is a reduced loss's cotangent too.
    let ok = c.dump_shaped(&mean, &one, &grad, Dtype::F32, true, &[1]);
    assert!(Dump::parse(&ok).is_ok());
    // A negative weight under a mean's gradient: the row named.
    let neg = Case {
        w: Array1::from_shape_fn(N, |r| if r == 3 { -1.0 } else { 1.0 }),
        ..case()
    };
    let q = neg.problem(Dtype::F32, Reduction::Mean, 0.0);
    let e = err(neg.dump(&q, &neg.cot(Reduction::Mean), &grad, Dtype::F32, true));
    assert!(
        matches!(e, DumpError::Spec(SpecError::BadLossWeight { row: 3, .. })),
        "{e}"
    );
}
