//! Fallback rates of the oracle's certified f64 tier on dumps: for each
//! file and output, how many outputs (and rows) the MPFR path had to
//! decide, with the oracle calls `logprobe verify` makes (forward in each
//! candidate dtype, the VJP in the gradient's dtype, the row statistics).
//!
//! Run: `cargo run --release -p logprobe-cli --example fallback_rates
//! -- fixtures/torch/*.safetensors`

use logprobe_reference::oracle::{Fallback, Oracle, Tier};
use logprobe_reference::spec::Output;
use logprobe_verify::dump::DumpFile;

fn main() {
    // The VJP on the f64 tier too (the default keeps it on MPFR).
    let oracle = Oracle {
        tier: Tier::FastVjp,
        ..Oracle::default()
    };
    let mut total = [Fallback::default(); 3];
    println!(
        "{:40} {:>26} {:>26} {:>26}",
        "dump", "forward: outputs (rows)", "grad: elements (rows)", "row stats: rows"
    );
    for path in std::env::args().skip(1) {
        let file = DumpFile::open(&path).expect("open");
        let dump = file.parse().expect("parse");
        let mut dtypes: Vec<_> = dump
            .candidates
            .iter()
            .filter(|(o, _)| o.is_forward())
            .map(|(_, c)| c.dtype)
            .collect();
        dtypes.sort();
        dtypes.dedup();
        let mut fb = [Fallback::default(); 3];
        for r in 0..dump.n() {
            let inputs = dump.row(r).expect("row");
            let p = inputs.problem();
            for &d in &dtypes {
                fb[0] += oracle.forward(&p, d).expect("forward").fallback;
            }
            if let Some(g) = dump.candidates.get(Output::GradLogits) {
                fb[1] += oracle
                    .vjp_counted(&p, &inputs.cotangents(), g.dtype)
                    .expect("vjp")
                    .1;
            }
            fb[2] += oracle.row_stats_counted(&p, 0).expect("stats").1;
        }
        let name = std::path::Path::new(&path)
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .to_string();
        let cell = |f: &Fallback| {
            format!(
                "{}/{} ({}/{})",
                f.outputs_mpfr, f.outputs, f.rows_mpfr, f.rows
            )
        };
        println!(
            "{name:40} {:>26} {:>26} {:>26}",
            cell(&fb[0]),
            cell(&fb[1]),
            cell(&fb[2])
        );
        for i in 0..3 {
            total[i] += fb[i];
        }
    }
    println!(
        "{:40} {:>26} {:>26} {:>26}",
        "all",
        format!(
            "{:.2e} ({:.2e})",
            total[0].output_rate(),
            total[0].row_rate()
        ),
        format!(
            "{:.2e} ({:.2e})",
            total[1].output_rate(),
            total[1].row_rate()
        ),
        format!("{:.2e}", total[2].row_rate()),
    );
}
