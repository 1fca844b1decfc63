//! (T2a) The forms of the shift a foreign kernel may use, written here as
//! f32 kernels (raw `x_t - logsumexp(x)`, scale before the shift, after an
//! upcast from bf16, multiply by `fl(1/T)`), against the exact values, under
//! the default presets (`Shift::Any`) at offsets up to 1e4; and the
//! unshifted entropy, which (T2a) classifies as a defect, beyond them.

use super::super::Statistical;
use super::*;

/// How an f32 kernel under test forms `z` and its log-probs.
#[derive(Clone, Copy, Debug)]
enum Form {
    /// `(x - x_max) / T`.
    SubtractThenScale,
    /// `x / T - max(x / T)` (`log_softmax(x.float() / T)`).
    ScaleFirst,
    /// `x * fl(1/T) - max(..)` (Liger).
    Reciprocal,
    /// `z_t - (z_max + ln S)` with `z = x / T` (`gather - logsumexp`).
    Raw,
}

struct FormOut {
    lp: Vec<f32>,
    entropy_fused: f32,
    /// `lse - sum_j p_j z_j` on unshifted `z`: the defect.
    entropy_unshifted: f32,
}

fn kernel_form(x: &[f64], t: f32, form: Form, how: Sum32) -> FormOut {
    let x: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let r = 1.0f32 / t;
    let z: Vec<f32> = x
        .iter()
        .map(|&v| match form {
            Form::Reciprocal => v * r,
            _ => v / t,
        })
        .collect();
    let xm = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let zm = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let d: Vec<f32> = match form {
        Form::SubtractThenScale => x.iter().map(|&v| (v - xm) / t).collect(),
        _ => z.iter().map(|&v| v - zm).collect(),
    };
    let e: Vec<f32> = d.iter().map(|&v| v.exp()).collect();
    let s = sum32(&e, how);
    let l = s.ln();
    let lse = zm + l;
    let lp: Vec<f32> = match form {
        Form::Raw => z.iter().map(|&v| v - lse).collect(),
        _ => d.iter().map(|&v| v - l).collect(),
    };
    let b: Vec<f32> = e.iter().zip(&d).map(|(&e, &d)| e * -d).collect();
    let pz: Vec<f32> = e.iter().zip(&z).map(|(&e, &z)| (e / s) * z).collect();
    FormOut {
        lp,
        entropy_fused: l + sum32(&b, how) / s,
        entropy_unshifted: lse - sum32(&pz, how),
    }
}

/// `x` rounded to bf16 (round to nearest even), as an f64.
fn bf16_round(x: f64) -> f64 {
    half::bf16::from_f32(x as f32).to_f64()
}

#[test]
fn correct_forms_pass_the_default_presets_at_any_offset() {
    let mut rng = SplitMix64::new(42);
    let mut worst = [0.0f64; 4];
    for case in 0..48 {
        let v = [256, 1024, 4096, 30522][case % 4];
        let t = [1.0f32, 0.7, 1.3][case % 3];
        let offset = [0.0, 100.0, 300.0, 1e3, -9290.0, 1e4][case % 6];
        let upcast = case % 5 == 0;
        let how = [Sum32::Lanes8, Sum32::Tree, Sum32::Sequential][case % 3];
        let x: Vec<f64> = row(&mut rng, v, case % 4)
            .into_iter()
            .map(|x| {
                let x = ((x + offset) as f32) as f64;
                if upcast {
                    bf16_round(x)
                } else {
                    x
                }
            })
            .collect();
        let z_max_abs = x.iter().fold(0.0f64, |a, &v| a.max(v.abs())) / t as f64;
        let ctx = RowContext {
            temperature: t as f64,
            z_max_abs: z_max_abs * (1.0 + 1e-6),
            softcap: None,
            linear: None,
        };
        let argmax = (0..v).fold(0, |b, j| if x[j] > x[b] { j } else { b });
        for (fi, form) in [
            Form::SubtractThenScale,
            Form::ScaleFirst,
            Form::Reciprocal,
            Form::Raw,
        ]
        .into_iter()
        .enumerate()
        {
            let out = kernel_form(&x, t, form, how);
            for tgt in [argmax, (case * 37) % v] {
                let st = stats_f64(&x, t as f64, None, Some(tgt));
                let rb = model_for(how)
                    .with_entropy_form(EntropyForm::Fused)
                    .row_bounds(&st, &ctx);
                let sb = Statistical::new(model_for(how).with_entropy_form(EntropyForm::Fused))
                    .row_bounds(&st, &ctx);
                let b_lp = abs(&rb.log_prob(Dtype::F32));
                let e_lp = far_error(out.lp[tgt] as f64, exact_log_prob(&st));
                let s_lp = abs(&sb.log_prob(Dtype::F32));
                assert!(
                    e_lp <= s_lp,
                    "{form:?} log_prob SUSPECT case {case} V={v} T={t} offset={offset}: {e_lp} > {s_lp}"
                );
                assert!(
                    e_lp <= b_lp,
                    "{form:?} log_prob case {case} V={v} T={t} offset={offset}: {e_lp} > {b_lp}"
                );
                worst[fi] = worst[fi].max(e_lp / b_lp);
                if matches!(form, Form::Raw) {
                    continue; // the raw form's entropy is the unshifted one
                }
                let b_h = abs(&rb.entropy(Dtype::F32));
                let e_h = far_error(out.entropy_fused as f64, exact_entropy(&st));
                assert!(
                    e_h <= b_h,
                    "{form:?} entropy case {case} V={v} T={t} offset={offset}: {e_h} > {b_h}"
                );
                let s_h = abs(&sb.entropy(Dtype::F32));
                assert!(
                    e_h <= s_h,
                    "{form:?} entropy SUSPECT case {case} V={v} T={t} offset={offset}: {e_h} > {s_h}"
                );
            }
        }
    }
    eprintln!("tightness of log_prob, STS / scale-first / reciprocal / raw: {worst:?}");
}

/// Without the default's looser terms the forms the issue measured fail:
/// the presets of old (subtract-then-scale alone) do not bound them.
#[test]
fn subtract_then_scale_alone_does_not_bound_raw_or_scale_first() {
    let mut rng = SplitMix64::new(7);
    let mut beyond = [false; 2];
    for case in 0..12 {
        let v = [256, 1024][case % 2];
        let t = if case % 2 == 0 { 0.7f32 } else { 1.0 };
        let x: Vec<f64> = row(&mut rng, v, 0)
            .into_iter()
            .map(|x| ((x + 300.0) as f32) as f64)
            .collect();
        let ctx = RowContext {
            temperature: t as f64,
            z_max_abs: 400.0 / t as f64,
            softcap: None,
            linear: None,
        };
        let sts = Model::lanes(8).with_shift(Shift::SubtractThenScale);
        for (i, form) in [Form::ScaleFirst, Form::Raw].into_iter().enumerate() {
            let out = kernel_form(&x, t, form, Sum32::Lanes8);
            for tgt in 0..v {
                let st = stats_f64(&x, t as f64, None, Some(tgt));
                let e = far_error(out.lp[tgt] as f64, exact_log_prob(&st));
                if e > abs(&sts.row_bounds(&st, &ctx).log_prob(Dtype::F32)) {
                    beyond[i] = true;
                    break;
                }
            }
        }
    }
    assert_eq!(
        beyond,
        [true, true],
        "scale-first, raw beyond subtract-then-scale's bound"
    );
}

/// (T2a) The unshifted entropy is not a correct form: its error (`~|z| u`,
/// at `T = 1`) grows with the offset, and from an offset of 1e4 it is
/// beyond the default presets' statistical threshold on every row
/// (SUSPECT: a failure under `--strict`). Below that the sound bound and
/// the threshold (`gamma_{V/8}`-wide) hold it on some rows: catching it at
/// smaller offsets is the relative rule's work (issue 42, step 2).
#[test]
fn unshifted_entropy_is_suspect_at_large_offsets() {
    let mut rng = SplitMix64::new(9);
    for offset in [1e4, -3e4] {
        let mut failed = 0;
        for case in 0..8 {
            let v = [1024, 4096][case % 2];
            let x: Vec<f64> = row(&mut rng, v, case % 3)
                .into_iter()
                .map(|x| ((x + offset) as f32) as f64)
                .collect();
            let z_max_abs = x.iter().fold(0.0f64, |a, &v| a.max(v.abs()));
            let ctx = RowContext {
                temperature: 1.0,
                z_max_abs,
                softcap: None,
                linear: None,
            };
            let out = kernel_form(&x, 1.0, Form::ScaleFirst, Sum32::Lanes8);
            let st = stats_f64(&x, 1.0, None, Some(0));
            let b = abs(&Statistical::new(Model::lanes(8))
                .row_bounds(&st, &ctx)
                .entropy(Dtype::F32));
            let e = far_error(out.entropy_unshifted as f64, exact_entropy(&st));
            eprintln!(
                "unshifted entropy offset {offset} V={v}: err/threshold {}",
                e / b
            );
            if e > b {
                failed += 1;
            }
        }
        assert_eq!(
            failed, 8,
            "unshifted entropy at offset {offset} beyond the statistical threshold"
        );
    }
}
