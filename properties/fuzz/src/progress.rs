//! Progress of a fuzz run on stderr: an indicatif bar on a terminal (cases,
//! failures, worst err/bound, cases/s), a plain line every few seconds
//! otherwise; a closed or full stderr is ignored. Drawn from the run's own thread between cases (no ticker
//! thread allocating while the memory property measures).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use super::TargetReport;

/// Seconds between lines on a non-terminal.
const LINE_EVERY: Duration = Duration::from_secs(5);

/// The progress display.
pub struct Progress {
    bar: Option<ProgressBar>,
    lines: bool,
    last: Instant,
}

impl Progress {
    /// A bar when `enabled` and stderr is a terminal, periodic lines when
    /// `enabled` otherwise, nothing when not `enabled`. `cases`: the case
    /// limit, if any (the bar's length).
    pub fn new(enabled: bool, cases: Option<u64>) -> Progress {
        let tty = std::io::stderr().is_terminal();
        let bar = (enabled && tty).then(|| {
            let b = match cases {
                Some(n) => ProgressBar::new(n),
                None => ProgressBar::new_spinner(),
            };
            let template = if cases.is_some() {
                "{elapsed} [{bar:24}] {pos}/{len} {msg}"
            } else {
                "{spinner} {elapsed} {msg}"
            };
            if let Ok(s) = ProgressStyle::with_template(template) {
                b.set_style(s);
            }
            b
        });
        Progress {
            bar,
            lines: enabled && !tty,
            last: Instant::now(),
        }
    }

    /// Prints a line above the bar (or on stderr).
    pub fn println(&self, s: &str) {
        match &self.bar {
            Some(b) => b.println(s),
            None => crate::stderr::eprint_line(s),
        }
    }

    /// Updates after `cases` cases.
    pub fn update<C>(&mut self, cases: u64, reports: &[TargetReport<C>], elapsed: Duration) {
        let failures = reports.iter().filter(|r| r.found.is_some()).count();
        let worst = reports.iter().map(|r| r.worst).fold(0.0, f64::max);
        let rate = cases as f64 / elapsed.as_secs_f64().max(1e-9);
        let msg = format!(
            "{cases} cases, {failures} failures, worst err/bound {worst:.3}, {rate:.1} cases/s"
        );
        if let Some(b) = &self.bar {
            b.set_position(cases);
            b.set_message(msg);
        } else if self.lines && self.last.elapsed() >= LINE_EVERY {
            self.last = Instant::now();
            crate::stderr::eprint_line(&format!("fuzz: {:.0} s: {msg}", elapsed.as_secs_f64()));
        }
    }

    /// Clears the bar.
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
