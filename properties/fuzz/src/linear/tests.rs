//! The fused linear fuzz targets: the correct kernels stay clean, every
//! planted mutant is found (its twin passing the case) and shrunk, and a
//! finding's dump replays.

use std::time::Duration;

use super::*;

fn config(targets: &str, seed: u64, cases: u64, out: &Path) -> LinearConfig {
    LinearConfig {
        targets: targets
            .split(',')
            .map(|n| parse_linear_target(n).unwrap())
            .collect(),
        space: LinearSpace::parse("").unwrap(),
        seed,
        budget: Duration::from_secs(600),
        cases: Some(cases),
        shrink_budget: Duration::from_secs(2),
        out_dir: out.to_path_buf(),
        progress: false,
    }
}

#[test]
fn the_correct_kernels_are_clean() {
    let dir = tempfile::tempdir().unwrap();
    let r = run_linear(&config("fused-linear,fused-linear-tp", 45, 24, dir.path()));
    for t in &r.targets {
        assert!(t.found.is_none(), "{}: {:?}", t.name, t.found);
        assert!(t.worst > 0.0 && t.worst <= 1.0, "{}: {}", t.name, t.worst);
    }
}

#[test]
fn every_mutant_is_found_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    for (m, _) in LINEAR_MUTANTS {
        let name = format!("mutant:{m}");
        let r = run_linear(&config(&name, 1, 100, dir.path()));
        let f = r.targets[0]
            .found
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: not found in 100 cases"));
        assert_eq!(f.twin_passes, Some(true), "{name}: {}", f.case.recipe());
        eprintln!(
            "{name}: case {} {}: {}",
            f.case_index,
            f.finding.property,
            f.case.recipe()
        );
        let (path, verdict) = f.dump.as_ref().expect("a dump");
        if f.finding.property == "oracle agreement" {
            assert_eq!(verdict, "FAIL", "{name}");
        }
        let (kernel, recipe, _, _) = crate::counterexample::read_meta(path).unwrap();
        assert_eq!(kernel, name);
        let (case, again) = replay_linear(&kernel, &recipe).unwrap();
        assert_eq!(case, f.case);
        assert!(again.is_some(), "{name}: the replay passes");
    }
}

#[test]
fn unknown_names_are_typed_errors() {
    assert!(parse_linear_target("mutant:linear-nothing").is_err());
    assert!(parse_linear_target("fused").is_err());
    assert!(is_linear("mutant:linear-dropped-remainder") && !is_linear("mutant:fused-nothing"));
}
