//! [`OutputSet`]: a set of [`Output`]s (a bitset, built in `const`), e.g.
//! the outputs a kernel computes.

use super::output::{Family, Output};

/// A set of outputs, iterated in [`Output::ALL`] order.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct OutputSet(u32);

// One bit per output.
const _: () = assert!(Output::COUNT <= u32::BITS as usize);

impl OutputSet {
    /// No output.
    pub const EMPTY: OutputSet = OutputSet(0);

    /// Every output.
    pub const ALL: OutputSet = OutputSet::of(&Output::ALL);

    /// The outputs in `outputs`.
    pub const fn of(outputs: &[Output]) -> OutputSet {
        let mut set = OutputSet::EMPTY;
        let mut i = 0;
        while i < outputs.len() {
            set = set.with(outputs[i]);
            i += 1;
        }
        set
    }

    /// The outputs whose [`Output::family`] is of the same kind as
    /// `family` (its part ignored): `OutputSet::family(Family::Policy(_))`
    /// holds every policy term.
    pub const fn family(family: Family) -> OutputSet {
        let mut set = OutputSet::EMPTY;
        let mut i = 0;
        while i < Output::COUNT {
            let o = Output::ALL[i];
            if same_family(o.family(), family) {
                set = set.with(o);
            }
            i += 1;
        }
        set
    }

    /// This set with `output`.
    pub const fn with(self, output: Output) -> OutputSet {
        OutputSet(self.0 | 1 << output.index())
    }

    /// This set without `output`.
    pub const fn without(self, output: Output) -> OutputSet {
        OutputSet(self.0 & !(1 << output.index()))
    }

    /// The outputs in either set.
    pub const fn union(self, other: OutputSet) -> OutputSet {
        OutputSet(self.0 | other.0)
    }

    /// Whether `output` is in the set.
    pub const fn contains(self, output: Output) -> bool {
        self.0 & 1 << output.index() != 0
    }

    /// Whether every output of `other` is in this set.
    pub const fn contains_all(self, other: OutputSet) -> bool {
        self.0 & other.0 == other.0
    }

    /// How many outputs the set holds.
    pub const fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The outputs in the set, in [`Output::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = Output> {
        Output::ALL.into_iter().filter(move |&o| self.contains(o))
    }
}

/// Whether two families are the same variant (parts ignored).
const fn same_family(a: Family, b: Family) -> bool {
    /// The variant's position (exhaustive: a new family must be placed).
    const fn kind(f: Family) -> u8 {
        match f {
            Family::LogSoftmax(_) => 0,
            Family::TopK => 1,
            Family::Loss(_) => 2,
            Family::TopkKl(_) => 3,
            Family::Policy(_) => 4,
            Family::Gradient => 5,
        }
    }
    kind(a) == kind(b)
}

impl std::fmt::Debug for OutputSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set()
            .entries(self.iter().map(Output::name))
            .finish()
    }
}

impl FromIterator<Output> for OutputSet {
    fn from_iter<I: IntoIterator<Item = Output>>(iter: I) -> Self {
        iter.into_iter().fold(OutputSet::EMPTY, OutputSet::with)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{KlDirection, PolicyTerm};

    #[test]
    fn sets_hold_what_they_are_built_from() {
        let s = OutputSet::of(&[Output::Entropy, Output::Ratio]);
        assert!(s.contains(Output::Entropy) && s.contains(Output::Ratio));
        assert!(!s.contains(Output::LogProbs));
        assert_eq!(s.len(), 2);
        assert_eq!(
            s.iter().collect::<Vec<_>>(),
            [Output::Entropy, Output::Ratio]
        );
        assert_eq!(s.without(Output::Ratio), OutputSet::of(&[Output::Entropy]));
        assert_eq!(OutputSet::ALL.len(), Output::COUNT);
        assert!(OutputSet::EMPTY.is_empty());
        let policy = OutputSet::family(Family::Policy(PolicyTerm::K1));
        assert_eq!(policy.len(), PolicyTerm::ALL.len());
        assert!(PolicyTerm::ALL.iter().all(|t| policy.contains(t.output())));
        let kl = OutputSet::family(Family::TopkKl(KlDirection::Reverse));
        assert_eq!(kl, OutputSet::of(&[Output::ForwardKl, Output::ReverseKl]));
        assert_eq!(format!("{kl:?}"), r#"{"forward_kl", "reverse_kl"}"#);
    }
}
