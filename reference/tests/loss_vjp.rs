//! The VJP of the loss-side outputs (`grad_lse`, `grad_z_loss`,
//! `grad_loss`; docs/design.md, "The loss side") in the oracle, against the textbook
//! objective evaluated directly in 320-bit MPFR: `F(x) = sum_r (a_r lse_r +
//! b_r coef lse_r^2) + <g, loss>` with `z = c tanh(x / c) / T` (softcap
//! optional), `lse = ln sum e^z` over the allowed entries, the smoothed
//! row loss and its reduction. The gradient of the definition is checked
//! against a central difference of `F` (so the formula is not taken on
//! trust), and the oracle's correctly rounded VJP against the definition's
//! gradient rounded to the target; plus the cotangents' typed errors.

use logprobe_reference::oracle::{round_to_dtype, Oracle, Tier};
use logprobe_reference::spec::Logits;
use logprobe_reference::spec::{
    Cotangents, Dtype, LossOptions, MeanAllIgnored, Output, Problem, Reduction, SpecError,
};
use ndarray::{array, Array1, Array2};
use rug::Float;

const P: u32 = 320;

/// One problem's data by the definition.
struct Case {
    x: Array2<f64>,
    tokens: Vec<i64>,
    mask: Option<Array2<bool>>,
    temperature: f64,
    softcap: Option<f64>,
    coef: f64,
    eps: f64,
    reduction: Reduction,
    weights: Option<Vec<f64>>,
    /// Cotangents: `a [N]`, `b [N]`, `g` (`[N]` or `[1]`).
    a: Vec<f64>,
    b: Vec<f64>,
    g: Vec<f64>,
}

fn z_of(x: f64, c: &Case, h: &Float) -> Float {
    let xv = Float::with_val(P, x) + h;
    let xc = match c.softcap {
        Some(cap) => (xv / cap).tanh() * cap,
        None => xv,
    };
    xc / c.temperature
}

fn allowed(c: &Case, r: usize, j: usize) -> bool {
    c.mask.as_ref().is_none_or(|m| m[[r, j]])
}

/// `F(x + h e_{(row, col)})` by the definition.
fn objective(c: &Case, row: usize, col: usize, h: &Float) -> Float {
    let (n, v) = c.x.dim();
    let zero = Float::with_val(P, 0);
    let mut f = Float::with_val(P, 0);
    let mut sum_wl = Float::with_val(P, 0);
    let mut sum_w = Float::with_val(P, 0);
    for r in 0..n {
        let z: Vec<Option<Float>> = (0..v)
            .map(|j| {
                allowed(c, r, j)
                    .then(|| z_of(c.x[[r, j]], c, if (r, j) == (row, col) { h } else { &zero }))
            })
            .collect();
        let mut s = Float::with_val(P, 0);
        for zj in z.iter().flatten() {
            s += zj.clone().exp();
        }
        let lse = s.ln();
        f += Float::with_val(P, &lse * c.a[r]);
        f += Float::with_val(P, &lse * &lse) * c.coef * c.b[r];
        if c.tokens[r] == -100 {
            continue;
        }
        let t = c.tokens[r] as usize;
        let nll = Float::with_val(P, &lse - z[t].as_ref().unwrap());
        let count = z.iter().flatten().count();
        let mut smooth = Float::with_val(P, 0);
        for zj in z.iter().flatten() {
            smooth += Float::with_val(P, &lse - zj);
        }
        smooth /= count as f64;
        let l = nll * (1.0 - c.eps) + smooth * c.eps;
        let w = c.weights.as_ref().map_or(1.0, |w| w[r]);
        match c.reduction {
            Reduction::None => f += l * w * c.g[r],
            _ => {
                sum_wl += l * w;
                sum_w += w;
            }
        }
    }
    match c.reduction {
        Reduction::None => {}
        Reduction::Sum => f += sum_wl * c.g[0],
        Reduction::Mean => {
            if !sum_w.is_zero() {
                f += sum_wl / sum_w * c.g[0]
            }
        }
    }
    f
}

/// The definition's gradient (the brief's formula, chain rule through
/// `x / T` and `c tanh(x / c)`).
fn grad_def(c: &Case) -> Array2<Float> {
    let (n, v) = c.x.dim();
    let zero = Float::with_val(P, 0);
    let mut sum_w = Float::with_val(P, 0);
    for r in 0..n {
        if c.tokens[r] != -100 {
            sum_w += c.weights.as_ref().map_or(1.0, |w| w[r]);
        }
    }
    Array2::from_shape_fn((n, v), |(r, j)| {
        if !allowed(c, r, j) {
            return Float::with_val(P, 0);
        }
        let mut s = Float::with_val(P, 0);
        for k in 0..v {
            if allowed(c, r, k) {
                s += z_of(c.x[[r, k]], c, &zero).exp();
            }
        }
        let lse = s.ln();
        let p = Float::with_val(P, z_of(c.x[[r, j]], c, &zero) - &lse).exp();
        let mut d =
            Float::with_val(P, &p * c.a[r]) + Float::with_val(P, &p * &lse) * 2.0 * c.coef * c.b[r];
        if c.tokens[r] != -100 {
            let w = c.weights.as_ref().map_or(1.0, |w| w[r]);
            let ell = match c.reduction {
                Reduction::None => Float::with_val(P, c.g[r] * w),
                Reduction::Sum => Float::with_val(P, c.g[0] * w),
                Reduction::Mean if sum_w.is_zero() => Float::with_val(P, 0),
                Reduction::Mean => Float::with_val(P, c.g[0] * w) / &sum_w,
            };
            let count = (0..v).filter(|&k| allowed(c, r, k)).count();
            let ind = if j == c.tokens[r] as usize { 1.0 } else { 0.0 };
            let term = (Float::with_val(P, &p - ind)) * (1.0 - c.eps)
                + (Float::with_val(P, &p - Float::with_val(P, count).recip())) * c.eps;
            d += term * ell;
        }
        let factor = match c.softcap {
            Some(cap) => (Float::with_val(P, c.x[[r, j]]) / cap).sech().square(),
            None => Float::with_val(P, 1),
        };
        d * factor / c.temperature
    })
}

fn problem<'a>(c: &'a Case, tokens: &'a Array1<i64>, w: &'a Option<Array1<f64>>) -> Problem<'a> {
    let mut p = Problem::new(Logits::F64(c.x.view()));
    p.tokens = Some(tokens.view());
    p.sampling_mask = c.mask.as_ref().map(|m| m.view());
    p.options.temperature = c.temperature;
    p.options.softcap = c.softcap;
    p.options.lse = true;
    p.options.z_loss_coef = Some(c.coef);
    p.options.loss = Some(LossOptions {
        reduction: c.reduction,
        label_smoothing: c.eps,
        mean_all_ignored: MeanAllIgnored::Nan,
    });
    p.loss_weights = w.as_ref().map(|w| w.view());
    p
}

fn base(reduction: Reduction) -> Case {
    let x = array![
        [1.5f64, -0.25, 3.0, 0.5, -2.0],
        [0.0, 2.0, -1.0, 4.5, 1.0],
        [-3.0, 0.75, 0.25, 2.5, -0.5],
    ];
    Case {
        x,
        tokens: vec![2, -100, 4],
        mask: None,
        temperature: 0.7,
        softcap: None,
        coef: 1e-4,
        eps: 0.125,
        reduction,
        weights: Some(vec![0.5, 3.0, 2.0]),
        a: vec![0.5, -1.25, 2.0],
        b: vec![3.0, 0.5, -1.0],
        g: match reduction {
            Reduction::None => vec![1.0, 7.0, -0.75],
            _ => vec![1.5],
        },
    }
}

fn cases() -> Vec<(&'static str, Case)> {
    let mut out = vec![
        ("none", base(Reduction::None)),
        ("sum", base(Reduction::Sum)),
        ("mean", base(Reduction::Mean)),
    ];
    let mut capped = base(Reduction::Mean);
    capped.softcap = Some(2.5);
    capped.temperature = 1.0;
    out.push(("mean softcap", capped));
    let mut masked = base(Reduction::None);
    masked.mask = Some(array![
        [true, false, true, true, true],
        [true, true, true, false, true],
        [false, true, true, true, true],
    ]);
    masked.eps = 1.0;
    out.push(("none masked eps=1", masked));
    let mut all_ignored = base(Reduction::Mean);
    all_ignored.tokens = vec![-100, -100, -100];
    out.push(("mean all ignored", all_ignored));
    let mut unweighted = base(Reduction::Mean);
    unweighted.weights = None;
    unweighted.eps = 0.0;
    out.push(("mean unweighted", unweighted));
    out
}

fn cotangents<'a>(a: &'a Array1<f64>, b: &'a Array1<f64>, g: &'a Array1<f64>) -> Cotangents<'a> {
    Cotangents::default()
        .with_column(Output::Lse, a.view())
        .with_column(Output::ZLoss, b.view())
        .with_column(Output::Loss, g.view())
}

#[test]
fn definition_gradient_matches_a_central_difference() {
    // h = 2^-100: the central difference errs by O(h^2) ~ 2^-200 on O(1)
    // third derivatives, far below the 2^-60 asked.
    let h = Float::with_val(P, 1) >> 100u32;
    let mh = Float::with_val(P, -&h);
    for (name, c) in cases() {
        let g = grad_def(&c);
        let (n, v) = c.x.dim();
        for r in 0..n {
            for j in 0..v {
                if !allowed(&c, r, j) {
                    continue;
                }
                let fd = (objective(&c, r, j, &h) - objective(&c, r, j, &mh))
                    / (Float::with_val(P, &h) * 2u32);
                let diff = Float::with_val(P, &fd - &g[[r, j]]).abs();
                assert!(diff < 1e-18, "{name} [{r}, {j}]: fd {fd} vs {}", g[[r, j]]);
            }
        }
    }
}

#[test]
fn oracle_vjp_is_the_definition_correctly_rounded() {
    for (name, c) in cases() {
        let want = grad_def(&c);
        let tokens = Array1::from(c.tokens.clone());
        let w = c.weights.clone().map(Array1::from);
        let p = problem(&c, &tokens, &w);
        let (a, b, g) = (
            Array1::from(c.a.clone()),
            Array1::from(c.b.clone()),
            Array1::from(c.g.clone()),
        );
        let cot = cotangents(&a, &b, &g);
        for tier in [Tier::Mpfr, Oracle::default().tier] {
            let o = Oracle {
                tier,
                ..Oracle::default()
            };
            for target in [Dtype::F64, Dtype::F32, Dtype::Bf16] {
                let got = o.vjp(&p, &cot, target).unwrap();
                for ((r, j), e) in got.indexed_iter() {
                    assert!(e.decided, "{name} [{r}, {j}] {target:?}");
                    assert_eq!(
                        e.rounded,
                        round_to_dtype(&want[[r, j]], target),
                        "{name} [{r}, {j}] {target:?}: want {}",
                        want[[r, j]]
                    );
                }
            }
        }
    }
}

#[test]
fn loss_side_cotangents_add_to_the_log_prob_ones() {
    // grad_loss under `none` with eps = 0 and unit weights is exactly the
    // negated log-prob cotangent: the two VJPs agree bit for bit.
    let mut c = base(Reduction::None);
    c.eps = 0.0;
    c.weights = None;
    let tokens = Array1::from(c.tokens.clone());
    let p = problem(&c, &tokens, &None);
    let g = Array1::from(c.g.clone());
    let neg: Array1<f64> = g.mapv(|x| -x);
    let via_loss = Oracle::default()
        .vjp(
            &p,
            &Cotangents::default().with_column(Output::Loss, g.view()),
            Dtype::F64,
        )
        .unwrap();
    let via_lp = Oracle::default()
        .vjp(
            &p,
            &Cotangents::default().with_column(Output::LogProbs, neg.view()),
            Dtype::F64,
        )
        .unwrap();
    for (x, y) in via_loss.iter().zip(&via_lp) {
        assert_eq!(x.rounded, y.rounded);
    }
}

#[test]
fn loss_side_cotangents_are_validated() {
    let c = base(Reduction::Mean);
    let tokens = Array1::from(c.tokens.clone());
    let w = c.weights.clone().map(Array1::from);
    let n3 = Array1::from(vec![1.0; 3]);
    let n2 = Array1::from(vec![1.0; 2]);
    let one = Array1::from(vec![1.0]);
    let nan = Array1::from(vec![0.0, f64::NAN, 1.0]);
    let o = Oracle::default();
    let run = |p: &Problem<'_>, cot: Cotangents<'_>| o.vjp(p, &cot, Dtype::F32).err();
    let p = problem(&c, &tokens, &w);
    // grad_loss of a mean is one value.
    assert!(matches!(
        run(
            &p,
            Cotangents::default().with_column(Output::Loss, n3.view())
        ),
        Some(SpecError::ShapeMismatch {
            tensor: "grad_loss",
            ..
        })
    ));
    assert!(matches!(
        run(
            &p,
            Cotangents::default().with_column(Output::Lse, n2.view())
        ),
        Some(SpecError::ShapeMismatch {
            tensor: "grad_lse",
            ..
        })
    ));
    assert!(matches!(
        run(
            &p,
            Cotangents::default().with_column(Output::ZLoss, nan.view())
        ),
        Some(SpecError::NonFiniteCotangent {
            tensor: "grad_z_loss",
            index: 1,
            ..
        })
    ));
    assert!(run(
        &p,
        Cotangents::default().with_column(Output::Loss, one.view())
    )
    .is_none());
    // A cotangent of an output that is not computed.
    let mut q = problem(&c, &tokens, &w);
    q.options.loss = None;
    q.options.lse = false;
    q.options.z_loss_coef = None;
    for cot in [
        Cotangents::default().with_column(Output::Loss, one.view()),
        Cotangents::default().with_column(Output::Lse, n3.view()),
        Cotangents::default().with_column(Output::ZLoss, n3.view()),
    ] {
        assert!(matches!(run(&q, cot), Some(SpecError::NoCotangent { .. })));
    }
    let mut nt = problem(&c, &tokens, &w);
    nt.tokens = None;
    let e = run(
        &nt,
        Cotangents::default().with_column(Output::Loss, one.view()),
    );
    assert!(
        matches!(
            e,
            Some(SpecError::MissingTensor {
                tensor: "tokens",
                ..
            })
        ),
        "{e:?}"
    );
}

/// A `-inf` logit among the allowed entries under label smoothing: the
/// row's loss is `+inf`, its gradient the finite formula (`-eps / |A|` at
/// the `-inf` entry), PyTorch's autograd values for
/// `F.cross_entropy([[1, 2, -inf, 0.5]], [1], label_smoothing=0.1)`
/// (torch 2.15: `[0.2062, -0.2965, -0.0250, 0.1152]`, printed to 4 digits).
#[test]
fn neg_inf_logit_under_smoothing_gives_autograd_gradient() {
    let x = array![[1.0f32, 2.0, f32::NEG_INFINITY, 0.5]];
    let tokens = array![1i64];
    let g = array![1.0];
    let mut p = Problem::new(Logits::F32(x.view()));
    p.tokens = Some(tokens.view());
    p.options.entropy = None;
    p.options.loss = Some(LossOptions {
        reduction: Reduction::Mean,
        label_smoothing: 0.1,
        mean_all_ignored: MeanAllIgnored::Nan,
    });
    let cot = Cotangents::default().with_column(Output::Loss, g.view());
    let o = Oracle::default();
    let ce = p.cross_entropy().unwrap();
    assert_eq!(
        o.cross_entropy(&p, &ce, Dtype::F32).unwrap().values[0].rounded,
        f64::INFINITY
    );
    let dx = o.vjp(&p, &cot, Dtype::F32).unwrap();
    let torch = [0.2062, -0.2965, -0.0250, 0.1152];
    for (j, t) in torch.iter().enumerate() {
        let v = dx[[0, j]].rounded;
        assert!((v - t).abs() < 6e-5, "[{j}]: {v} vs autograd {t}");
    }
    // Exactly `-eps / |A|` (eps as f32) at the `-inf` entry.
    assert_eq!(
        dx[[0, 2]].rounded,
        Dtype::F32.round_f64(-(0.1f32 as f64) / 4.0)
    );
}
