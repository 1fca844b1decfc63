//! Progress of `verify` on stderr: a bar on a terminal (indicatif), and
//! when stderr is not a terminal (CI logs, `2> file`) one line every
//! `interval` (`file: 120/4096 rows, 31 s`), from a ticker thread, so that
//! a log shows life even while one huge row is being verified.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressMode {
    /// Nothing.
    Off,
    /// A bar on a terminal; otherwise a line every `interval`.
    Auto {
        /// Time between two lines when stderr is not a terminal.
        interval: Duration,
    },
}

impl ProgressMode {
    /// The default line interval on a non-terminal stderr (5 s).
    pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
}

/// A running progress display for one file; [`Progress::inc`] per row,
/// [`Progress::finish`] at the end (also on drop).
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
    done: Arc<AtomicUsize>,
    stop: Option<mpsc::Sender<()>>,
    ticker: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    /// Starts the display for `len` rows of `path`.
    pub fn start(mode: ProgressMode, len: usize, path: &Path) -> Self {
        let done = Arc::new(AtomicUsize::new(0));
        let mut p = Progress {
            bar: None,
            done: done.clone(),
            stop: None,
            ticker: None,
        };
        let ProgressMode::Auto { interval } = mode else {
            return p;
        };
        let interval = interval.max(Duration::from_millis(10));
        let name = path
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        if std::io::stderr().is_terminal() {
            let bar = indicatif::ProgressBar::new(len as u64);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{msg} [{bar:30}] {pos}/{len} rows, {per_sec}, eta {eta}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_message(name);
            p.bar = Some(bar);
        } else {
            let (tx, rx) = mpsc::channel::<()>();
            let start = Instant::now();
            p.stop = Some(tx);
            p.ticker = Some(std::thread::spawn(move || {
                // Sends nothing: the sender's drop (or `finish`) ends it.
                while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(interval) {
                    // A closed stderr is not an error of the verification.
                    let (n, t) = (done.load(Ordering::Relaxed), start.elapsed().as_secs_f64());
                    let rate = n as f64 / t.max(1e-9);
                    let eta = if n > 0 {
                        format!(", eta {:.0} s", len.saturating_sub(n) as f64 / rate)
                    } else {
                        String::new()
                    };
                    let _ = writeln!(
                        std::io::stderr(),
                        "{name}: {n}/{len} rows, {t:.0} s, {rate:.1} rows/s{eta}"
                    );
                }
            }));
        }
        p
    }

    /// One more row done.
    pub fn inc(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
        if let Some(b) = &self.bar {
            b.inc(1);
        }
    }

    /// Clears the bar / stops the ticker.
    pub fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
        self.stop.take();
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
