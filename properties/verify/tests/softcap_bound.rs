//! The softcap `x' = c tanh(x / c)` (TOLERANCE.md (T18)) against our CPU
//! kernels and the exact oracle: every staging passes log-probs, entropy,
//! top-k, lse, z-loss and grad logits for f32, bf16 and f16 logits at
//! V = 2000 (softcap 30 and 50, Gemma 2's; a temperature that is not a
//! power of two; both `softcap_dtype`s), the bound is not vacuous, and the
//! bugs of the unsloth-zoo PR #593 kind (a wrong formula, a backward
//! without `1 - tanh^2`) fail it.

use half::{bf16, f16};
use logprobe_kernels::{CpuKernel, Kernel};
use logprobe_reference::oracle::{Exact, Oracle};
use logprobe_reference::spec::{Cotangents, Dtype, Logits, Output, Problem, SoftcapDtype};
use logprobe_verify::keys;
use logprobe_verify::tolerance::{ErrorBound, GradCotangents, Model, RowContext};
use ndarray::{Array1, Array2};

const N: usize = 6;
const V: usize = 2000;
const K: usize = 3;

/// Logits inside and well outside the caps (up to about 110 in magnitude).
fn logits() -> Array2<f32> {
    Array2::from_shape_fn((N, V), |(r, j)| {
        let x = ((r * 131 + j * 17) as f32 * 0.37).sin() * (2.0 + (r % 3) as f32 * 40.0);
        if j == (r * 7) % V {
            x + 9.0
        } else {
            x
        }
    })
}

fn ids() -> Array2<i64> {
    Array2::from_shape_fn((N, K), |(r, k)| ((r * 7 + k * 401) % V) as i64)
}

/// `max err / bound` over every judged element; panics on a missing bound.
#[derive(Default, Debug)]
struct Worst {
    ratio: f64,
    fails: usize,
}

impl Worst {
    fn add(&mut self, e: &Exact, candidate: f64, b: ErrorBound, what: &str) {
        let ErrorBound::Abs(bound) = b else {
            panic!("{what}: no bound: {b:?}")
        };
        let err = e.error(candidate);
        if err > bound {
            self.fails += 1;
        }
        let r = if bound > 0.0 {
            err / bound
        } else if err > 0.0 {
            f64::INFINITY
        } else {
            0.0
        };
        self.ratio = self.ratio.max(r);
    }
}

/// The oracle's values of one problem in one dtype.
struct Exacts {
    fwd: logprobe_reference::oracle::OracleForward,
    dx: Array2<Exact>,
    stats: Vec<logprobe_reference::oracle::RowStats>,
}

fn exacts(p: &Problem<'_>, cot: &Cotangents<'_>, out: Dtype) -> Exacts {
    let o = Oracle::default();
    Exacts {
        fwd: o.forward(p, out).unwrap(),
        dx: o.vjp(p, cot, out).unwrap(),
        stats: (0..N).map(|r| o.row_stats(p, r).unwrap()).collect(),
    }
}

/// Judges `fwd` (forward values) and `grad` (grad logits) of `p` against
/// the oracle's `ex` under `model`'s bounds, in `out`.
fn judge(
    p: &Problem<'_>,
    cot: &Cotangents<'_>,
    model: &Model,
    fwd: &logprobe_kernels::ForwardOutput,
    grad: &Array2<f64>,
    out: Dtype,
    ex: &Exacts,
) -> (Worst, Worst) {
    let (exact, dx) = (&ex.fwd, &ex.dx);
    let (mut wf, mut wg) = (Worst::default(), Worst::default());
    let ids = p.topk_ids.unwrap();
    for r in 0..N {
        let stats = &ex.stats[r];
        let ctx = RowContext::from_problem(p, r).unwrap();
        let rb = model.row_bounds(stats, &ctx);
        let val = |o: Output, c: usize| fwd.values[o][[r, c]];
        let ex = |o: Output, c: usize| exact.values[o][[r, c]];
        wf.add(
            &ex(Output::LogProbs, 0),
            val(Output::LogProbs, 0),
            rb.log_prob(out),
            "log_prob",
        );
        wf.add(
            &ex(Output::Entropy, 0),
            val(Output::Entropy, 0),
            rb.entropy(out),
            "entropy",
        );
        wf.add(&ex(Output::Lse, 0), val(Output::Lse, 0), rb.lse(out), "lse");
        let coef = p.options.z_loss_coef.unwrap();
        wf.add(
            &ex(Output::ZLoss, 0),
            val(Output::ZLoss, 0),
            rb.z_loss(coef, out),
            "z_loss",
        );
        for k in 0..K {
            let id = ids[[r, k]] as usize;
            wf.add(
                &ex(Output::TopkLogProbs, k),
                val(Output::TopkLogProbs, k),
                rb.topk(id, out),
                "topk",
            );
        }
        let gk = cot.get(Output::TopkLogProbs).unwrap();
        let live = GradCotangents::live_topk(
            ids.row(r).iter().copied(),
            gk.row(r).iter().copied(),
            |_| true,
        );
        let gc = GradCotangents {
            g: cot.column(Output::LogProbs).unwrap()[r],
            h: cot.column(Output::Entropy).unwrap()[r],
            token: Some(p.tokens.unwrap()[r] as usize),
            topk: &live,
            loss: None,
            policy: None,
            kl: None,
        };
        for j in 0..V {
            wg.add(&dx[[r, j]], grad[[r, j]], rb.grad(j, &gc, out), "grad");
        }
    }
    (wf, wg)
}

struct Case {
    x: Array2<f32>,
    xb: Array2<bf16>,
    xh: Array2<f16>,
    t: Array1<i64>,
    ids: Array2<i64>,
    g: Array1<f64>,
    h: Array1<f64>,
    gk: Array2<f64>,
}

fn case() -> Case {
    let x = logits();
    Case {
        xb: x.mapv(bf16::from_f32),
        xh: x.mapv(f16::from_f32),
        x,
        t: Array1::from_shape_fn(N, |r| ((r * 7) % V) as i64),
        ids: ids(),
        g: Array1::from_shape_fn(N, |r| 1.0 - 0.25 * r as f64),
        h: Array1::from_shape_fn(N, |r| 0.5 - 0.125 * r as f64),
        gk: Array2::from_shape_fn((N, K), |(r, k)| 0.25 * (k as f64 - r as f64 * 0.5)),
    }
}

fn problems(c: &Case) -> Vec<(Problem<'_>, Dtype)> {
    [
        (Logits::F32(c.x.view()), Dtype::F32),
        (Logits::Bf16(c.xb.view()), Dtype::Bf16),
        (Logits::F16(c.xh.view()), Dtype::F16),
    ]
    .into_iter()
    .map(|(l, d)| {
        let mut p = Problem::new(l);
        p.tokens = Some(c.t.view());
        p.topk_ids = Some(c.ids.view());
        p.options.lse = true;
        p.options.z_loss_coef = Some(1e-4);
        (p, d)
    })
    .collect()
}

fn cot(c: &Case) -> Cotangents<'_> {
    Cotangents::default()
        .with_column(Output::LogProbs, c.g.view())
        .with_column(Output::Entropy, c.h.view())
        .with(Output::TopkLogProbs, c.gk.view())
}

#[test]
fn correct_kernels_pass_with_softcap() {
    let c = case();
    let cot = cot(&c);
    let (mut worst_f, mut worst_g) = (0.0f64, 0.0f64);
    for (base, dtype) in problems(&c) {
        for (cap, temp, sdt) in [
            (30.0, 1.0, SoftcapDtype::Accumulation),
            (50.0, 0.7, SoftcapDtype::Accumulation),
            (30.0, 0.7, SoftcapDtype::Input),
        ] {
            let mut p = base;
            p.options.softcap = Some(cap);
            p.options.softcap_dtype = sdt;
            p.options.temperature = temp;
            let shape = p.validate_shapes().unwrap();
            let outs: Vec<Dtype> = if dtype == Dtype::F32 {
                vec![Dtype::F32]
            } else {
                vec![Dtype::F32, dtype]
            };
            for out in outs {
                let ex = exacts(&p, &cot, out);
                let mut fused_bits = None;
                for k in [
                    CpuKernel::fused(),
                    CpuKernel::chunked(1),
                    CpuKernel::chunked(4),
                ] {
                    let model = Model::declared(&k.algorithm(&shape))
                        .with_entropy_form(k.entropy_form().unwrap());
                    let fwd = k.forward(&p, out).unwrap();
                    let grad = k.backward(&p, &cot, out).unwrap();
                    let (wf, wg) = judge(&p, &cot, &model, &fwd, &grad, out, &ex);
                    assert_eq!(
                        wf.fails + wg.fails,
                        0,
                        "{} {dtype:?}->{out:?} c={cap} T={temp} {sdt:?}: {wf:?} {wg:?}",
                        k.name()
                    );
                    if out == Dtype::F32 {
                        worst_f = worst_f.max(wf.ratio);
                        worst_g = worst_g.max(wg.ratio);
                    }
                    // Fused and chunked: the same bits.
                    let bits: Vec<u64> = grad
                        .iter()
                        .chain(fwd.values[Output::LogProbs].iter())
                        .chain(fwd.values[Output::Entropy].iter())
                        .map(|v| v.to_bits())
                        .collect();
                    match &fused_bits {
                        None => fused_bits = Some(bits),
                        Some(b) => assert_eq!(b, &bits, "{} differs from fused", k.name()),
                    }
                }
            }
        }
    }
    println!("worst f32 err/bound: forward {worst_f:.3}, grad {worst_g:.3}");
    // Not vacuous: the bound is within 64x of what the kernels achieve.
    assert!(worst_f > 1.0 / 64.0, "forward bound loose: {worst_f}");
}

/// `x'` of the PR #593 kind: `tanh(x) * c` instead of `c tanh(x / c)`.
fn wrong_formula(x: &Array2<f32>, c: f32) -> Array2<f32> {
    x.mapv(|v| v.tanh() * c)
}

#[test]
fn softcap_bugs_fail_the_bound() {
    let c = case();
    let cot = cot(&c);
    let (base, _) = problems(&c).remove(0);
    let mut p = base;
    p.options.softcap = Some(30.0);
    let shape = p.validate_shapes().unwrap();
    let k = CpuKernel::fused();
    let model = Model::declared(&k.algorithm(&shape)).with_entropy_form(k.entropy_form().unwrap());
    // The correct x', materialised in f32, run without softcap: its forward
    // is right (within the bound), its backward lacks 1 - tanh^2.
    let xs = c.x.mapv(|v| 30.0 * (v / 30.0).tanh());
    let mut q = p;
    q.logits = Logits::F32(xs.view());
    q.options.softcap = None;
    let fwd = k.forward(&q, Dtype::F32).unwrap();
    let grad = k.backward(&q, &cot, Dtype::F32).unwrap();
    let ex = exacts(&p, &cot, Dtype::F32);
    let (wf, wg) = judge(&p, &cot, &model, &fwd, &grad, Dtype::F32, &ex);
    assert!(wg.fails > 0, "missing 1 - tanh^2 passed: {wg:?}");
    println!(
        "no tanh' in backward: grad err/bound {:.3e} ({} fails); forward {:.3}",
        wg.ratio, wg.fails, wf.ratio
    );
    // The wrong formula: forward fails.
    let xw = wrong_formula(&c.x, 30.0);
    q.logits = Logits::F32(xw.view());
    let fwd = k.forward(&q, Dtype::F32).unwrap();
    let grad = k.backward(&q, &cot, Dtype::F32).unwrap();
    let (wf, _) = judge(&p, &cot, &model, &fwd, &grad, Dtype::F32, &ex);
    assert!(wf.fails > 0, "tanh(x) * c passed: {wf:?}");
    println!("tanh(x) * c: forward err/bound {:.3e}", wf.ratio);
}

/// A verify dump of `x` (bf16 logits, f32 candidates) with `meta`, the
/// candidates from `k` on `p` (softcapped) or on `given` logits.
fn dump_bytes(
    p: &Problem<'_>,
    xb: &Array2<bf16>,
    candidates: &logprobe_kernels::ForwardOutput,
    meta: &[(&str, &str)],
) -> Vec<u8> {
    use logprobe_verify::dump::{serialize_dump, DumpTensor};
    let x: Vec<f64> = xb.iter().map(|v| v.to_f64()).collect();
    let t: Vec<i64> = p.tokens.unwrap().to_vec();
    let lp: Vec<f64> = candidates.values[Output::LogProbs]
        .iter()
        .copied()
        .collect();
    let h: Vec<f64> = candidates.values[Output::Entropy].iter().copied().collect();
    let tensors = [
        ("logits", DumpTensor::floats(Dtype::Bf16, &[N, V], &x)),
        ("tokens", DumpTensor::i64s(&[N], &t)),
        ("log_probs", DumpTensor::floats(Dtype::F32, &[N], &lp)),
        ("entropy", DumpTensor::floats(Dtype::F32, &[N], &h)),
    ];
    serialize_dump(&tensors, meta).unwrap()
}

#[test]
fn verify_reads_softcap_and_judges_by_it() {
    use logprobe_verify::dump::{Dump, DumpError};
    use logprobe_verify::verify::{verify_dump, ReportVerdict, VerifyConfig};
    let c = case();
    let mut p = Problem::new(Logits::Bf16(c.xb.view()));
    p.tokens = Some(c.t.view());
    p.options.softcap = Some(30.0);
    let k = CpuKernel::fused();
    let good = k.forward(&p, Dtype::F32).unwrap();
    let meta = [(keys::FORMAT_VERSION.name, "2"), (keys::SOFTCAP.name, "30")];
    let verdict = |bytes: &[u8]| {
        let d = Dump::parse(bytes).unwrap();
        assert_eq!(d.options.softcap, Some(30.0));
        let r = verify_dump(
            &d,
            std::path::Path::new("softcap"),
            &VerifyConfig::default(),
        )
        .unwrap();
        r.outputs.iter().map(|o| o.verdict).collect::<Vec<_>>()
    };
    assert!(verdict(&dump_bytes(&p, &c.xb, &good, &meta))
        .iter()
        .all(|v| *v == ReportVerdict::Pass));
    // The same candidates judged without the softcap (a reader that
    // ignored the key) fail: the key changes the verdict.
    let bytes = dump_bytes(&p, &c.xb, &good, &[(keys::FORMAT_VERSION.name, "2")]);
    let d = Dump::parse(&bytes).unwrap();
    let r = verify_dump(
        &d,
        std::path::Path::new("no softcap"),
        &VerifyConfig::default(),
    )
    .unwrap();
    assert!(r.outputs.iter().any(|o| o.verdict == ReportVerdict::Fail));
    // tanh(x) * c candidates fail with the key.
    let xw = wrong_formula(&c.x, 30.0);
    let mut q = p;
    q.logits = Logits::F32(xw.view());
    q.options.softcap = None;
    let bad = k.forward(&q, Dtype::F32).unwrap();
    assert!(verdict(&dump_bytes(&p, &c.xb, &bad, &meta)).contains(&ReportVerdict::Fail));
    // Bad metadata is a typed error naming its key.
    for (m, key) in [
        (
            vec![(keys::FORMAT_VERSION.name, "2"), (keys::SOFTCAP.name, "0")],
            "softcap",
        ),
        (
            vec![(keys::FORMAT_VERSION.name, "2"), (keys::SOFTCAP.name, "-3")],
            "softcap",
        ),
        (
            vec![
                (keys::FORMAT_VERSION.name, "2"),
                (keys::SOFTCAP.name, "inf"),
            ],
            "softcap",
        ),
        (
            vec![
                (keys::FORMAT_VERSION.name, "2"),
                (keys::SOFTCAP.name, "1e-50"),
            ],
            "softcap",
        ),
        (
            vec![
                (keys::FORMAT_VERSION.name, "2"),
                (keys::SOFTCAP_DTYPE.name, "input"),
            ],
            "softcap_dtype",
        ),
        (
            vec![
                (keys::FORMAT_VERSION.name, "2"),
                (keys::SOFTCAP.name, "30"),
                (keys::SOFTCAP_DTYPE.name, "f32"),
            ],
            "softcap_dtype",
        ),
        (
            vec![
                (keys::FORMAT_VERSION.name, "2"),
                (keys::SOFTCAP.name, "30"),
                (keys::TEMPERATURE_DTYPE.name, "input"),
            ],
            "softcap_dtype",
        ),
    ] {
        match Dump::parse(&dump_bytes(&p, &c.xb, &good, &m)) {
            Err(DumpError::BadMetadata { key: k, .. }) => assert_eq!(k, key, "{m:?}"),
            other => panic!("{m:?}: {:?}", other.map(|_| ())),
        }
    }
    // Version 1 does not know the key.
    assert!(Dump::parse(&dump_bytes(&p, &c.xb, &good, &[(keys::SOFTCAP.name, "30")])).is_err());
}
