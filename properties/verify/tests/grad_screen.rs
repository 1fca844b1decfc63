//! The gradient screen (`verify/grad_screen.rs`, (T14s) in TOLERANCE.md)
//! changes no bit of a report: every dump with `grad_logits` is verified
//! with the screen on and off and the JSON reports (less `seconds`) must be
//! equal, on a correct dump, on dumps whose gradients are wrong (a few
//! elements, or every element by a little), with top-k ids and a
//! temperature, on cross-entropy gradients (label smoothing, ignored rows,
//! every row ignored), and on every shipped dump with `grad_logits` (the
//! loss side, the policy terms, the top-k KL, the soft cross-entropy).

use std::path::Path;

use logprobe_reference::spec::Dtype;
use logprobe_reference::splitmix::SplitMix64;
use logprobe_verify::dump::{serialize_dump, Dump, DumpTensor};
use logprobe_verify::keys;
use logprobe_verify::verify::{set_grad_screen, verify_dump, ReportVerdict, VerifyConfig};

/// How the candidate gradients are wrong.
#[derive(Clone, Copy)]
enum Wrong {
    /// Correct: f64 VJP rounded once.
    None,
    /// Every 97th element off by `2e-4` relative.
    Few,
    /// Every element off by `3e-6` relative (tens of f32 ulps): near the
    /// bound, the ratios spread over a wide range.
    All,
}

/// An f32 dump `[n, v]` with log_probs, entropy and grad_logits (and,
/// with `extras`, top-k ids with their cotangents and `temperature = 0.7`); candidates from f64 math rounded to f32.
fn dump_bytes(n: usize, v: usize, seed: u64, wrong: Wrong, extras: bool) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed);
    let (k, temp) = if extras { (3, 0.7) } else { (0, 1.0) };
    let r32 = |x: f64| x as f32 as f64;
    let (mut logits, mut tokens, mut lp, mut ent) = (vec![], vec![], vec![], vec![]);
    let (mut g_lp, mut g_ent, mut grad) = (vec![], vec![], vec![]);
    let (mut ids, mut g_topk, mut topk_lp) = (vec![], vec![], vec![]);
    for _ in 0..n {
        let row: Vec<f64> = (0..v).map(|_| r32(3.0 * rng.normal())).collect();
        let allowed: Vec<bool> = vec![true; v];
        let t = (rng.next_u64() % v as u64) as usize;
        let t = if allowed[t] { t } else { t ^ 1 };
        let z: Vec<f64> = row.iter().map(|&x| x / temp).collect();
        let m = z
            .iter()
            .zip(&allowed)
            .filter(|(_, &a)| a)
            .map(|(&z, _)| z)
            .fold(f64::NEG_INFINITY, f64::max);
        let e = |j: usize| if allowed[j] { (z[j] - m).exp() } else { 0.0 };
        let s: f64 = (0..v).map(e).sum();
        let ln_s = s.ln();
        let r: f64 = (0..v)
            .filter(|&j| allowed[j])
            .map(|j| e(j) * (m - z[j]))
            .sum::<f64>()
            / s;
        let lpj = |j: usize| z[j] - m - ln_s;
        tokens.push(t as i64);
        lp.push(r32(lpj(t)));
        ent.push(r32(ln_s + r));
        let row_ids: Vec<usize> = (0..k).map(|i| (t + 1 + 7 * i) % v).collect();
        let row_ids: Vec<usize> = row_ids
            .into_iter()
            .map(|j| if allowed[j] { j } else { (j + 1) % v })
            .collect();
        let gk: Vec<f64> = (0..k).map(|_| r32(0.5 * rng.normal())).collect();
        for (&id, &g) in row_ids.iter().zip(&gk) {
            ids.push(id as i64);
            g_topk.push(g);
            topk_lp.push(r32(lpj(id)));
        }
        let (g, h) = (r32(-1.0 + 0.1 * rng.normal()), r32(0.01));
        g_lp.push(g);
        g_ent.push(h);
        let g_all = g + gk.iter().sum::<f64>();
        for j in 0..v {
            let dx = if allowed[j] {
                let p = e(j) / s;
                let mut ind = if j == t { g } else { 0.0 };
                for (&id, &gk) in row_ids.iter().zip(&gk) {
                    if id == j {
                        ind += gk;
                    }
                }
                (ind - g_all * p - h * p * (z[j] - m + r)) / temp
            } else {
                0.0
            };
            let off = match wrong {
                Wrong::None => 0.0,
                Wrong::Few if j % 97 == 3 => 2e-4,
                Wrong::Few => 0.0,
                Wrong::All => 3e-6,
            };
            grad.push(r32(dx * (1.0 + off)));
        }
        logits.extend(row);
    }
    let f = |shape: &[usize], x: &[f64]| DumpTensor::floats(Dtype::F32, shape, x);
    let mut tensors = vec![
        ("logits", f(&[n, v], &logits)),
        ("tokens", DumpTensor::i64s(&[n], &tokens)),
        ("log_probs", f(&[n], &lp)),
        ("entropy", f(&[n], &ent)),
        ("grad_log_probs", f(&[n], &g_lp)),
        ("grad_entropy", f(&[n], &g_ent)),
        ("grad_logits", f(&[n, v], &grad)),
    ];
    let mut meta = vec![];
    if extras {
        tensors.push(("topk_ids", DumpTensor::i64s(&[n, k], &ids)));
        tensors.push(("topk_log_probs", f(&[n, k], &topk_lp)));
        tensors.push(("grad_topk_log_probs", f(&[n, k], &g_topk)));
        meta.push((keys::TEMPERATURE.name, "0.7".to_string()));
    }
    let meta: Vec<(&str, &str)> = meta.iter().map(|(k, v)| (*k, v.as_str())).collect();
    serialize_dump(&tensors, &meta).expect("consistent shapes")
}

/// Which rows of a cross-entropy dump are ignored (`ignore_index`).
#[derive(Clone, Copy)]
enum Ignored {
    Every3rd,
    All,
}

/// An f32 cross-entropy dump `[n, v]`, `reduction = none` with label
/// smoothing `eps`, a random `grad_loss` per row and its `grad_logits`
/// from f64 math rounded once (wrong as `wrong` says); ignored rows have
/// loss 0 and a zero gradient.
fn loss_dump_bytes(
    n: usize,
    v: usize,
    seed: u64,
    wrong: Wrong,
    eps: f64,
    ignored: Ignored,
) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed);
    let r32 = |x: f64| x as f32 as f64;
    let (mut logits, mut tokens, mut loss, mut cot, mut grad) =
        (vec![], vec![], vec![], vec![], vec![]);
    for i in 0..n {
        let row: Vec<f64> = (0..v).map(|_| r32(3.0 * rng.normal())).collect();
        let skip = match ignored {
            Ignored::Every3rd => i % 3 == 1,
            Ignored::All => true,
        };
        let t = (rng.next_u64() % v as u64) as usize;
        let c = r32(rng.normal());
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|&x| (x - m).exp()).sum();
        let lp = |j: usize| row[j] - m - s.ln();
        let mean_lp = (0..v).map(lp).sum::<f64>() / v as f64;
        tokens.push(if skip { -100 } else { t as i64 });
        loss.push(if skip {
            0.0
        } else {
            r32(-(1.0 - eps) * lp(t) - eps * mean_lp)
        });
        cot.push(c);
        for j in 0..v {
            let p = lp(j).exp();
            let dx = if skip {
                0.0
            } else {
                let ind = if j == t { 1.0 } else { 0.0 };
                c * (p - (1.0 - eps) * ind - eps / v as f64)
            };
            let off = match wrong {
                Wrong::None => 0.0,
                Wrong::Few if j % 97 == 3 => 2e-4,
                Wrong::Few => 0.0,
                Wrong::All => 3e-6,
            };
            grad.push(r32(dx * (1.0 + off)));
        }
        logits.extend(row);
    }
    let f = |shape: &[usize], x: &[f64]| DumpTensor::floats(Dtype::F32, shape, x);
    let tensors = vec![
        ("logits", f(&[n, v], &logits)),
        ("tokens", DumpTensor::i64s(&[n], &tokens)),
        ("loss", f(&[n], &loss)),
        ("grad_loss", f(&[n], &cot)),
        ("grad_logits", f(&[n, v], &grad)),
    ];
    let eps = eps.to_string();
    let meta = [
        (keys::FORMAT_VERSION.name, "2"),
        (keys::REDUCTION.name, "none"),
        (keys::LABEL_SMOOTHING.name, eps.as_str()),
    ];
    serialize_dump(&tensors, &meta).expect("consistent shapes")
}

/// The report as JSON without its timing.
fn report_json(dump: &Dump<'_>, screen: bool) -> (serde_json::Value, ReportVerdict) {
    set_grad_screen(screen);
    let config = VerifyConfig {
        worst: 5,
        ..VerifyConfig::default()
    };
    let report = verify_dump(dump, Path::new("grad"), &config).expect("verifies");
    set_grad_screen(true);
    let mut json = serde_json::to_value(&report).expect("serializes");
    json.as_object_mut().expect("an object").remove("seconds");
    (json, report.verdict)
}

fn assert_screen_changes_nothing(bytes: &[u8], what: &str) -> ReportVerdict {
    let dump = Dump::parse(bytes).expect("parses");
    let (off, verdict) = report_json(&dump, false);
    let (on, _) = report_json(&dump, true);
    assert_eq!(off, on, "{what}: the screen changed the report");
    verdict
}

#[test]
fn grad_screen_leaves_every_report_bit_for_bit_the_same() {
    for (seed, wrong, extras, expect) in [
        (1, Wrong::None, false, Some(ReportVerdict::Pass)),
        (2, Wrong::Few, false, Some(ReportVerdict::Fail)),
        (3, Wrong::All, false, None),
        (4, Wrong::None, true, Some(ReportVerdict::Pass)),
        (5, Wrong::All, true, None),
        (6, Wrong::Few, true, Some(ReportVerdict::Fail)),
    ] {
        let bytes = dump_bytes(4, 3000, seed, wrong, extras);
        let verdict = assert_screen_changes_nothing(&bytes, &format!("seed {seed}"));
        if let Some(expect) = expect {
            if verdict != expect {
                let dump = Dump::parse(&bytes).expect("parses");
                let r = verify_dump(&dump, Path::new("grad"), &VerifyConfig::default()).unwrap();
                eprintln!("{}", logprobe_verify::verify::render_table(&r));
            }
            assert_eq!(verdict, expect, "seed {seed}");
        }
    }
}

#[test]
fn grad_screen_leaves_cross_entropy_reports_the_same() {
    for (seed, wrong, eps, ignored, expect) in [
        (
            11,
            Wrong::None,
            0.0,
            Ignored::Every3rd,
            Some(ReportVerdict::Pass),
        ),
        (
            12,
            Wrong::None,
            0.1,
            Ignored::Every3rd,
            Some(ReportVerdict::Pass),
        ),
        (
            13,
            Wrong::Few,
            0.1,
            Ignored::Every3rd,
            Some(ReportVerdict::Fail),
        ),
        (14, Wrong::All, 0.0, Ignored::Every3rd, None),
        (15, Wrong::All, 0.1, Ignored::Every3rd, None),
        (
            16,
            Wrong::None,
            0.1,
            Ignored::All,
            Some(ReportVerdict::Pass),
        ),
    ] {
        let bytes = loss_dump_bytes(5, 3000, seed, wrong, eps, ignored);
        let verdict = assert_screen_changes_nothing(&bytes, &format!("loss seed {seed}"));
        if let Some(expect) = expect {
            assert_eq!(verdict, expect, "loss seed {seed}");
        }
    }
}

/// Every shipped dump with `grad_logits`: cross-entropy, z-loss, policy,
/// top-k KL, soft cross-entropy and fused linear gradients.
#[test]
fn grad_screen_leaves_every_shipped_gradient_report_the_same() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/torch");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("fixtures/torch") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_none_or(|e| e != "safetensors") {
            continue;
        }
        let bytes = std::fs::read(&path).expect("a shipped dump");
        let dump = match Dump::parse(&bytes) {
            // One rank of a tensor-parallel set: judged with its set.
            Err(logprobe_verify::dump::DumpError::TpSet(_)) => continue,
            parsed => parsed.expect("parses"),
        };
        if dump
            .candidates
            .get(logprobe_reference::spec::Output::GradLogits)
            .is_none()
        {
            continue;
        }
        assert_screen_changes_nothing(&bytes, &path.display().to_string());
        seen += 1;
    }
    assert!(seen >= 14, "{seen} shipped gradient dumps");
}
