//! `logprobe fuzz` end to end: a few clean cases on our kernels, a planted
//! mutant found, shrunk and written as a dump that `verify` fails and
//! `fuzz --replay` reruns, and bad usage exiting 2. No timing is asserted.

use std::process::Command;

fn logprobe(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_logprobe"))
        .args(args)
        .output()
        .expect("run logprobe")
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn fuzz_runs_clean_finds_a_mutant_and_replays_it() {
    let dir = std::env::temp_dir().join(format!("logprobe-fuzz-smoke-{}", std::process::id()));
    let out = dir.to_str().unwrap();
    // Clean: a few small cases on every default kernel.
    let o = logprobe(&[
        "fuzz",
        "--cases",
        "6",
        "--seed",
        "7",
        "--vocab",
        "1..64",
        "--out",
        out,
        "--no-progress",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("clean"), "{}", text(&o));

    // A planted mutant: found, shrunk, dumped.
    let o = logprobe(&[
        "fuzz",
        "--kernel",
        "mutant:temperature-twice",
        "--cases",
        "50",
        "--seed",
        "1",
        "--vocab",
        "1..64",
        "--shrink-budget",
        "3s",
        "--out",
        out,
        "--no-progress",
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("FOUND mutant:temperature-twice"), "{t}");
    assert!(t.contains("correct twin on this case: passes"), "{t}");
    let recipe = t
        .lines()
        .find_map(|l| l.trim().strip_prefix("recipe: "))
        .expect("a recipe line");
    assert!(
        recipe.contains("temperature=") && !recipe.contains("temperature=1,"),
        "{recipe}"
    );
    // Named `fuzz-<kernel>-seed<S>-<hash>.safetensors` (never overwritten).
    let dump = std::path::PathBuf::from(
        t.lines()
            .find_map(|l| l.strip_prefix("  dump:   "))
            .expect("a dump line"),
    );
    assert!(dump.exists(), "{t}");
    let name = dump.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with("fuzz-mutant-temperature-twice-seed1-"),
        "{name}"
    );
    let d = dump.to_str().unwrap();

    // verify reproduces the verdict; replay reruns the case.
    let v = logprobe(&["verify", "--no-progress", d]);
    assert_eq!(v.status.code(), Some(1), "{}", text(&v));
    let r = logprobe(&["fuzz", "--replay", d]);
    assert_eq!(r.status.code(), Some(1), "{}", text(&r));
    assert!(text(&r).contains("still fails"), "{}", text(&r));

    // The printed recipe pins the same case on the correct kernel: it passes.
    let ok = logprobe(&[
        "fuzz",
        "--kernel",
        "fused",
        "--cases",
        "1",
        "--options",
        recipe,
        "--out",
        out,
        "--no-progress",
    ]);
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok));

    // Bad usage (and `cuda` in a binary without the feature).
    let cuda: &[&str] = &["fuzz", "--kernel", "cuda", "--cases", "1"];
    for args in [
        &["fuzz", "--kernel", "mutant:nope"][..],
        if cfg!(feature = "cuda") {
            &["fuzz", "--kernel", ""][..]
        } else {
            cuda
        },
        &["fuzz", "--options", "colour=red"][..],
        &["fuzz", "--dtype", "f8"][..],
        &["fuzz", "--budget", "soon"][..],
    ] {
        let o = logprobe(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn list_mutants_prints_the_catalog() {
    // scripts/fuzz-mutants.sh reads this list: it must be the catalog, whole.
    let o = logprobe(&["fuzz", "--list-mutants"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let listed: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    let catalog: Vec<String> = logprobe_testkit::mutants::CATALOG
        .iter()
        .map(|e| e.name.to_string())
        .chain(
            logprobe_fuzz::linear::LINEAR_MUTANTS
                .iter()
                .map(|(n, _)| n.to_string()),
        )
        .collect();
    assert_eq!(listed, catalog);
    // Every listed name is a fuzz target.
    for name in &listed {
        let m = format!("mutant:{name}");
        assert!(
            logprobe_fuzz::target::parse_target(&m).is_ok()
                || logprobe_fuzz::linear::parse_linear_target(&m).is_ok(),
            "{name}"
        );
    }
}

#[test]
fn fused_linear_targets_run_clean_and_a_mutant_replays() {
    let dir = std::env::temp_dir().join(format!("logprobe-fuzz-linear-{}", std::process::id()));
    let out = dir.to_str().unwrap();
    // Both families in one list share the budget; each prints its table.
    let o = logprobe(&[
        "fuzz",
        "--kernel",
        "fused,fused-linear,fused-linear-tp",
        "--cases",
        "4",
        "--seed",
        "3",
        "--vocab",
        "1..64",
        "--options",
        "dtype=bf16|f32",
        "--out",
        out,
        "--no-progress",
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    for k in ["fused ", "fused-linear ", "fused-linear-tp "] {
        assert!(
            t.lines().any(|l| l.starts_with(k) && l.contains("clean")),
            "{k}: {t}"
        );
    }
    let o = logprobe(&[
        "fuzz",
        "--kernel",
        "mutant:linear-dropped-remainder",
        "--cases",
        "50",
        "--seed",
        "2",
        "--shrink-budget",
        "2s",
        "--out",
        out,
        "--no-progress",
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("correct twin on this case: passes"), "{t}");
    let dump = t
        .lines()
        .find_map(|l| l.strip_prefix("  dump:   "))
        .expect("a dump line")
        .to_string();
    let o = logprobe(&["verify", "--no-progress", &dump]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let o = logprobe(&["fuzz", "--replay", &dump]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("still fails"), "{}", text(&o));
    // A key of the other family's space is a usage error that names the keys.
    let o = logprobe(&[
        "fuzz",
        "--kernel",
        "fused-linear",
        "--options",
        "topk=3",
        "--cases",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("weight_scale"), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&dir);
}
