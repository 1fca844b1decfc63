//! Verdicts of `logprobe verify` on the PyTorch dumps shipped in
//! `fixtures/torch/` (they must equal `expected.json`), through the library
//! and through the binary.

use std::path::{Path, PathBuf};
use std::process::Command;

use logprobe_verify::verify::{
    exit_status, exit_status_strict, verify_files, Expectations, FileOutcome, FileReport,
    OutputReport, ReportVerdict, VerifyConfig,
};

fn torch_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/torch")
}

fn dumps() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(torch_dir())
        .expect("fixtures/torch exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    v.sort();
    v
}

fn output<'r>(r: &'r FileReport, name: &str) -> &'r OutputReport {
    r.outputs
        .iter()
        .find(|o| o.output == name)
        .unwrap_or_else(|| panic!("{}: no {name}", r.name))
}

#[test]
fn shipped_torch_dumps_get_their_expected_verdicts() {
    let expect = Expectations::load(&torch_dir().join("expected.json")).unwrap();
    let paths = dumps();
    // 68 dumps of their own and three tensor-parallel sets of 4 rank dumps.
    assert_eq!(paths.len(), 80, "{paths:?}");
    let outcomes = verify_files(&paths, &VerifyConfig::default());
    assert_eq!(outcomes.len(), 71, "one outcome per set");
    let rows = expect.compare(&outcomes);
    for r in &rows {
        assert!(
            r.matches,
            "{}: expected {:?}, found {}",
            r.name, r.expected, r.found
        );
    }
    assert_eq!(exit_status(&outcomes, Some(&rows)), 0);
    assert_eq!(exit_status(&outcomes, None), 1, "ten dumps fail");
    // Under --strict the two SUSPECT dumps are expected to fail, and do.
    let strict_rows = expect.compare_mode(&outcomes, true);
    for r in &strict_rows {
        assert!(
            r.matches,
            "--strict {}: expected {:?}, found {}",
            r.name, r.expected, r.found
        );
    }
    assert_eq!(
        strict_rows
            .iter()
            .filter(|r| r.expected.as_deref() == Some("fail"))
            .count(),
        rows.iter()
            .filter(|r| matches!(r.expected.as_deref(), Some("fail" | "suspect")))
            .count()
    );
    assert_eq!(exit_status_strict(&outcomes, Some(&strict_rows), true), 0);

    let reports: Vec<&FileReport> = outcomes
        .iter()
        .map(|o| match o {
            FileOutcome::Report(r) => r,
            FileOutcome::BadInput { path, error } => panic!("{}: {error}", path.display()),
        })
        .collect();
    let by = |name: &str| *reports.iter().find(|r| r.name == name).unwrap();

    // A tensor-parallel set (Megatron's vocab-parallel cross-entropy, 4
    // ranks): judged as one [16, 8192] dump, every rank's all-reduced loss
    // the same bits, so one report covers all four ranks.
    let tp = by("megatron_tp_ce_rank0");
    let set = tp.tp_set.as_ref().expect("a tensor-parallel set");
    assert_eq!((set.files.len(), set.ranks.clone()), (4, vec![0, 1, 2, 3]));
    assert_eq!((tp.rows, tp.columns), (16, 8192));
    assert_eq!(output(tp, "grad_logits").count, 16 * 8192);
    for bug in [
        "megatron_tp_ce_target_not_shifted_rank0",
        "megatron_tp_ce_local_max_rank0",
    ] {
        for out in ["loss", "grad_logits"] {
            assert_eq!(
                output(by(bug), out).verdict,
                ReportVerdict::Fail,
                "{bug} {out}"
            );
        }
    }

    // The top-k KL (issue 18): verl-style fp32 math passes on both terms;
    // the teacher's probabilities taken as a_k fail forward_kl.
    let r = by("topk_forward_kl_verl_bf16");
    for name in ["forward_kl", "reverse_kl"] {
        assert_eq!(output(r, name).verdict, ReportVerdict::Pass, "{name}");
    }
    let r = by("topk_forward_kl_teacher_prob_as_log_prob");
    assert_eq!(output(r, "forward_kl").verdict, ReportVerdict::Fail);
    // Their gradients (T25): autograd's passes, renormalised or not; the
    // normaliser detached passes forward and fails grad_logits alone.
    for name in ["topk_kl_grad_verl_bf16", "topk_kl_grad_renormalized_bf16"] {
        let r = by(name);
        let g = output(r, "grad_logits");
        assert_eq!(g.verdict, ReportVerdict::Pass, "{name}: {g:?}");
        assert_eq!(g.count, 12 * 32000, "{name}");
        assert_eq!(
            output(r, "forward_kl").verdict,
            ReportVerdict::Pass,
            "{name}"
        );
    }
    let r = by("topk_kl_grad_normalizer_detached");
    for name in ["forward_kl", "reverse_kl"] {
        assert_eq!(output(r, name).verdict, ReportVerdict::Pass, "{name}");
    }
    let g = output(r, "grad_logits");
    assert!(
        g.verdict == ReportVerdict::Fail && g.max_ratio.unwrap() > 100.0,
        "{g:?}"
    );

    // Each failing dump fails on the output its bug is in, and only there.
    let r = by("neg_inf_logits_naive_entropy");
    assert_eq!(output(r, "entropy").verdict, ReportVerdict::Fail);
    assert_eq!(output(r, "log_probs").verdict, ReportVerdict::Pass);
    let r = by("bf16_accumulated_logsumexp");
    assert!(
        output(r, "log_probs").max_ratio.unwrap() > 10.0,
        "far beyond bf16 rounding"
    );
    // Truncation instead of rounding: beyond the sound bound, but by less
    // than 3x (a loose bound would pass it), and under 1 ulp of f16.
    let r = by("f16_truncated_outputs");
    let lp = output(r, "log_probs");
    assert_eq!(lp.verdict, ReportVerdict::Fail);
    assert!(
        lp.max_ratio.unwrap() > 1.0 && lp.max_ratio.unwrap() < 3.0,
        "{:?}",
        lp.max_ratio
    );
    assert!(lp.max_ulps <= 1.0, "{}", lp.max_ulps);
    assert_eq!(output(r, "entropy").verdict, ReportVerdict::Fail);
    // The policy terms (issue 18): verl's low_var_kl and the PPO ratio in
    // fp32 pass on every term; the same k3 in bf16 fails on kl_k3.
    let r = by("kl_k3_low_var_kl_bf16");
    for name in ["log_probs", "kl_k1", "kl_k2", "kl_k3", "kl_abs"] {
        assert_eq!(output(r, name).verdict, ReportVerdict::Pass, "{name}");
    }
    assert_eq!(
        output(by("ppo_ratio_fp32"), "ratio").verdict,
        ReportVerdict::Pass
    );
    assert_eq!(
        output(by("kl_k3_naive_in_bf16"), "kl_k3").verdict,
        ReportVerdict::Fail
    );
    // Their gradients (T21): autograd's grad_logits of a k3 penalty plus a
    // PPO ratio term passes with every element (tree-tight); a k3 backward
    // with the slope 1 - e^d fails on grad_logits alone.
    let r = by("policy_grad_k3_ratio_bf16");
    for name in ["log_probs", "kl_k3", "ratio", "grad_logits"] {
        assert_eq!(output(r, name).verdict, ReportVerdict::Pass, "{name}");
    }
    let g = output(r, "grad_logits");
    assert_eq!(g.count, 8 * 32000);
    assert_eq!(g.tightest_model.as_deref(), Some("tree"), "{g:?}");
    let r = by("policy_grad_k3_wrong_sign");
    for name in ["log_probs", "kl_k3", "ratio"] {
        assert_eq!(output(r, name).verdict, ReportVerdict::Pass, "{name}");
    }
    let g = output(r, "grad_logits");
    assert!(
        g.verdict == ReportVerdict::Fail && g.max_ratio.unwrap() > 100.0,
        "{g:?}"
    );
    // The loss side: z_loss squared from an lse stored in bf16 fails on
    // z_loss alone (that lse, correctly rounded to bf16, passes).
    let r = by("z_loss_from_bf16_lse");
    assert_eq!(output(r, "z_loss").verdict, ReportVerdict::Fail);
    assert_eq!(output(r, "lse").verdict, ReportVerdict::Pass);
    let r = by("z_loss_fp32_math_bf16");
    for name in ["log_probs", "lse", "z_loss"] {
        assert_eq!(output(r, name).verdict, ReportVerdict::Pass, "{name}");
    }
    // The softcap (c = 30): PyTorch's fp32 `30 * tanh(x / 30)` passes well
    // within the bound; `tanh(x) * 30` (the PR #593 kind) fails both outputs.
    let r = by("softcap_fp32_math_bf16");
    for name in ["log_probs", "entropy"] {
        let o = output(r, name);
        assert!(o.max_ratio.unwrap() < 0.1, "{name}: {o:?}");
    }
    let r = by("softcap_tanh_x_times_c");
    for name in ["log_probs", "entropy"] {
        let o = output(r, name);
        assert_eq!(o.verdict, ReportVerdict::Fail, "{name}");
        assert!(o.max_ratio.unwrap() > 1e3, "{name}: {o:?}");
    }
    // Cross-entropy: PyTorch's F.cross_entropy under each reduction (one
    // element for sum / mean, [N] under none), the all-ignored mean's
    // NaN, and #73205's leaked smoothing term far beyond the bound.
    for (name, reduction, count) in [
        ("cross_entropy_none_smoothing_bf16", "none", 16),
        ("cross_entropy_sum_smoothing_bf16", "sum", 1),
        ("cross_entropy_mean_smoothing_bf16", "mean", 1),
        ("cross_entropy_all_ignored_mean", "mean", 1),
        ("cross_entropy_weighted_mean", "mean", 1),
    ] {
        let l = output(by(name), "loss");
        assert_eq!(
            (l.verdict, l.reduction, l.count),
            (ReportVerdict::Pass, Some(reduction), count),
            "{name}"
        );
    }
    assert!(
        output(by("cross_entropy_all_ignored_mean"), "loss").worst[0]
            .candidate
            .is_nan()
    );
    let l = output(by("cross_entropy_smoothing_counts_ignored_rows"), "loss");
    assert!(
        l.verdict == ReportVerdict::Fail && l.max_ratio.unwrap() > 100.0,
        "{l:?}"
    );

    // Correct dumps: every output within bound, gradients included.
    let r = by("fp32_autograd_gradients");
    let g = output(r, "grad_logits");
    assert_eq!((g.verdict, g.count), (ReportVerdict::Pass, 8 * 32000));
    assert!(output(r, "log_probs").tightest_model.is_some());
    let r = by("qwen_vocab_bf16_fp32_math");
    assert_eq!((r.rows_checked, r.columns), (16, 151936));
    for name in ["log_probs", "entropy"] {
        let o = output(r, name);
        assert!(
            o.max_ratio.unwrap() <= 1.0 && o.max_ulps <= 0.5 + 1e-9,
            "{name}: {o:?}"
        );
    }
    // PyTorch's bf16 `x / 0.6` (two roundings, temperature_dtype=input):
    // correct code, well within the bound once z is taken as PyTorch forms
    // it (one rounding of the exact quotient gave err/bound up to 471).
    let r = by("temperature_input_bf16");
    for name in ["log_probs", "entropy"] {
        let o = output(r, name);
        assert!(o.max_ratio.unwrap() < 0.1, "{name}: {o:?}");
    }
    for r in &reports {
        for o in &r.outputs {
            assert!(
                !o.worst.is_empty() && o.worst.len() <= 5,
                "{} {}",
                r.name,
                o.output
            );
            assert!(o.reference_ratios.len() == 3);
        }
    }
}

/// The binary on the small dumps (78 files: 66 of their own and three
/// tensor-parallel sets of four), through `--expect` and `--json`; the two large dumps, whose
/// verdicts the library test above checks, would double the test's cost
/// for the same code path.
#[test]
fn binary_matches_expected_json() {
    let small: Vec<PathBuf> = dumps()
        .into_iter()
        .filter(|p| std::fs::metadata(p).unwrap().len() < 3 << 20)
        .collect();
    assert_eq!(small.len(), 78);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_logprobe"));
    cmd.arg("verify")
        .args(&small)
        .arg("--expect")
        .arg(torch_dir().join("expected.json"))
        .arg("--json");
    let out = cmd.output().expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_str(&stdout).expect("valid JSON");
    assert_eq!(json["exit_status"], 0);
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(torch_dir().join("expected.json")).unwrap())
            .unwrap();
    let files = json["files"].as_array().unwrap();
    assert_eq!(files.len(), 69, "a set is one report");
    for f in files {
        let name = f["name"].as_str().unwrap();
        assert_eq!(f["verdict"], expected[name]["expect"], "{name}");
    }
    for row in json["expect"].as_array().unwrap() {
        assert_eq!(row["matches"], true, "{row}");
    }
}

#[test]
fn binary_table_and_exit_status_of_single_dumps() {
    let run = |name: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_logprobe"))
            .arg("verify")
            .arg(torch_dir().join(format!("{name}.safetensors")))
            .output()
            .expect("runs");
        (
            out.status.code().unwrap(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, text) = run("neg_inf_logits_naive_entropy");
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("FAIL") && text.contains("entropy") && text.contains("NaN"),
        "{text}"
    );
    // A wrong expectation makes --expect fail.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("verify_cases");
    std::fs::create_dir_all(&dir).unwrap();
    let wrong = dir.join("wrong.json");
    std::fs::write(
        &wrong,
        r#"{"neg_inf_logits_naive_entropy": {"expect": "pass"}}"#,
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_logprobe"))
        .arg("verify")
        .arg(torch_dir().join("neg_inf_logits_naive_entropy.safetensors"))
        .arg("--expect")
        .arg(&wrong)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("MISMATCH"), "{text}");
}

/// `--form` and `--k3-form` (issue 42): a declared form is bounded alone.
/// The default (`any`) bounds every correct form, so its bound is never
/// tighter than a declared one's; declaring `expm1` for a `kl_k3` that the
/// kernel evaluated as `exp(-d) + d - 1` makes it SUSPECT, where the
/// default passes it.
#[test]
fn declared_forms_narrow_the_bound() {
    let verify_one = |name: &str, config: &VerifyConfig| -> FileReport {
        let path = torch_dir().join(format!("{name}.safetensors"));
        match verify_files(&[path], config).remove(0) {
            FileOutcome::Report(r) => r,
            FileOutcome::BadInput { error, .. } => panic!("{name}: {error}"),
        }
    };
    let any = VerifyConfig::default();
    let sts = VerifyConfig {
        form: logprobe_reference::spec::Shift::SubtractThenScale,
        ..VerifyConfig::default()
    };
    let name = "temperature_input_bf16";
    let (a, s) = (verify_one(name, &any), verify_one(name, &sts));
    let ratio = |r: &FileReport| output(r, "log_probs").max_ratio.unwrap();
    assert!(ratio(&a) <= ratio(&s), "{} > {}", ratio(&a), ratio(&s));
    assert_eq!(s.model, "lanes=8 form=subtract-then-scale");
    assert_eq!(a.model, "lanes=8");

    let expm1 = VerifyConfig {
        k3_form: logprobe_verify::tolerance::K3Form::Expm1,
        ..VerifyConfig::default()
    };
    let name = "policy_grad_k3_ratio_bf16";
    let (a, e) = (verify_one(name, &any), verify_one(name, &expm1));
    assert_eq!(output(&a, "kl_k3").verdict, ReportVerdict::Pass);
    assert_eq!(output(&e, "kl_k3").verdict, ReportVerdict::Suspect);
    assert_eq!(e.model, "lanes=8 k3_form=expm1");
}

/// The dump's own `k3_form=expm1` (issue 42: a declaration a dump can
/// carry) narrows the bound as `--k3-form expm1` does: the same tensors
/// as `policy_grad_k3_ratio_bf16` (whose kernel evaluates `exp(kl) - kl -
/// 1`) with the key added are SUSPECT where the file passes, and the
/// report names the form.
#[test]
fn a_dump_declares_its_k3_form() {
    let report = verify_patched("policy_grad_k3_ratio_bf16", "k3_form", "expm1");
    assert_eq!(output(&report, "kl_k3").verdict, ReportVerdict::Suspect);
    assert_eq!(report.model, "lanes=8 k3_form=expm1");
}

/// A shipped dump with one metadata key set in its header, verified
/// under the default configuration.
fn verify_patched(name: &str, key: &str, value: &str) -> FileReport {
    let src = std::fs::read(torch_dir().join(format!("{name}.safetensors"))).unwrap();
    let n = u64::from_le_bytes(src[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&src[8..8 + n]).unwrap();
    header["__metadata__"][key] = serde_json::Value::from(value);
    let mut text = serde_json::to_vec(&header).unwrap();
    // The data stays 8-byte aligned: the header padded with spaces.
    while !(8 + text.len()).is_multiple_of(8) {
        text.push(b' ');
    }
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&text);
    bytes.extend_from_slice(&src[8 + n..]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{name}.safetensors"));
    std::fs::write(&path, bytes).unwrap();
    match verify_files(&[path], &VerifyConfig::default()).remove(0) {
        FileOutcome::Report(r) => r,
        FileOutcome::BadInput { error, .. } => panic!("{error}"),
    }
}

/// The relative rule on a fused linear + loss dump (TOLERANCE.md (R2)):
/// Liger's bf16 chunks with the temperature forgotten (outputs at T = 1,
/// the dump declaring 0.98) are within the sound bound and SUSPECT by the
/// relative rule alone; at the declared temperature they pass.
#[test]
fn a_forgotten_temperature_is_suspect_on_a_fused_linear_dump() {
    let report = verify_patched("fused_linear_liger_bf16", "temperature", "0.98");
    for name in ["log_probs", "entropy"] {
        let o = output(&report, name);
        assert_eq!(o.verdict, ReportVerdict::Suspect, "{name}");
        assert!(o.max_ratio.unwrap() < 1.0, "{name}");
        assert_eq!(o.suspect_rules, ["relative"], "{name}");
    }
    let report = verify_patched("fused_linear_liger_bf16", "temperature", "1");
    for name in ["log_probs", "entropy"] {
        let o = output(&report, name);
        assert_eq!(o.verdict, ReportVerdict::Pass, "{name}");
        assert!(o.relative_rule.as_ref().unwrap().ratio < 2.0, "{name}");
    }
}
