//! Device-allocation tracker: current and peak bytes per kind, so the
//! memory property can bound a call's peak device memory (docs/design.md,
//! "The properties", 5).

use std::sync::{Arc, Mutex, PoisonError};

/// What a device allocation holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllocKind {
    /// Uploaded inputs: logits, mask, tokens and ids, cotangents.
    Input,
    /// Outputs: log-probs, entropy, top-k log-probs, grad logits.
    Output,
    /// Everything else: row statistics, gathered slots, chunk buffers.
    Workspace,
}

impl AllocKind {
    fn index(self) -> usize {
        match self {
            AllocKind::Input => 0,
            AllocKind::Output => 1,
            AllocKind::Workspace => 2,
        }
    }
}

/// Bytes by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bytes {
    /// [`AllocKind::Input`] bytes.
    pub input: usize,
    /// [`AllocKind::Output`] bytes.
    pub output: usize,
    /// [`AllocKind::Workspace`] bytes.
    pub workspace: usize,
}

impl Bytes {
    /// All kinds together.
    pub fn total(&self) -> usize {
        self.input + self.output + self.workspace
    }
}

/// A snapshot of the tracker (bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    /// Live now.
    pub current: Bytes,
    /// Peak of each kind since the last reset (each kind's own maximum).
    pub peak: Bytes,
    /// Peak of the total since the last reset.
    pub peak_total: usize,
    /// Allocations made since the last reset.
    pub allocations: usize,
}

/// Counts live device bytes by kind and their peaks. Thread-safe; cheap to
/// clone (shared).
#[derive(Clone, Debug, Default)]
pub struct MemoryTracker {
    inner: Arc<Mutex<MemoryReport>>,
}

impl MemoryTracker {
    /// A tracker with nothing allocated.
    pub fn new() -> Self {
        Self::default()
    }

    fn with<R>(&self, f: impl FnOnce(&mut MemoryReport) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Records an allocation of `bytes` bytes of `kind`.
    pub fn alloc(&self, kind: AllocKind, bytes: usize) {
        self.with(|r| {
            let cur = kind_mut(&mut r.current, kind);
            *cur += bytes;
            let now = *cur;
            let peak = kind_mut(&mut r.peak, kind);
            *peak = (*peak).max(now);
            r.peak_total = r.peak_total.max(r.current.total());
            r.allocations += 1;
        })
    }

    /// Records the release of an allocation of `bytes` bytes of `kind`.
    /// Releasing more than is live clamps at zero.
    pub fn free(&self, kind: AllocKind, bytes: usize) {
        self.with(|r| {
            let cur = kind_mut(&mut r.current, kind);
            *cur = cur.saturating_sub(bytes);
        })
    }

    /// The current counts and peaks.
    pub fn report(&self) -> MemoryReport {
        self.with(|r| *r)
    }

    /// Sets the peaks to the live bytes and the allocation count to 0, so
    /// the next call's peak can be read alone.
    pub fn reset_peak(&self) {
        self.with(|r| {
            r.peak = r.current;
            r.peak_total = r.current.total();
            r.allocations = 0;
        })
    }
}

fn kind_mut(b: &mut Bytes, kind: AllocKind) -> &mut usize {
    match kind.index() {
        0 => &mut b.input,
        1 => &mut b.output,
        _ => &mut b.workspace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracker_counts_current_and_peak_bytes_per_kind() {
        let t = MemoryTracker::new();
        t.alloc(AllocKind::Input, 100);
        t.alloc(AllocKind::Workspace, 40);
        t.alloc(AllocKind::Workspace, 60);
        t.free(AllocKind::Workspace, 40);
        t.alloc(AllocKind::Output, 8);
        let r = t.report();
        assert_eq!(
            r.current,
            Bytes {
                input: 100,
                output: 8,
                workspace: 60
            }
        );
        assert_eq!(
            r.peak,
            Bytes {
                input: 100,
                output: 8,
                workspace: 100
            }
        );
        assert_eq!(r.peak_total, 200);
        assert_eq!(r.allocations, 4);
        t.free(AllocKind::Input, 100);
        t.free(AllocKind::Output, 8);
        t.free(AllocKind::Workspace, 60);
        t.free(AllocKind::Workspace, 1);
        assert_eq!(t.report().current.total(), 0);
        t.reset_peak();
        let r = t.report();
        assert_eq!(
            (r.peak, r.peak_total, r.allocations),
            (Bytes::default(), 0, 0)
        );
    }

    #[test]
    fn clones_share_counts() {
        let t = MemoryTracker::new();
        let u = t.clone();
        u.alloc(AllocKind::Output, 4);
        assert_eq!(t.report().current.output, 4);
    }
}
