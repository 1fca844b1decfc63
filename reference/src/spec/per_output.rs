//! [`PerOutput`]: one value (or none) per [`Output`], the container every
//! per-output quantity is held in (module `output` for the outputs).

use ndarray::{Array2, ArrayView1};

use super::output::Output;
use super::problem::Problem;

/// One value (or none) per [`Output`]: the container every per-output
/// quantity is held in. Iteration follows [`Output::ALL`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PerOutput<T> {
    slots: [Option<T>; Output::COUNT],
}

impl<T> Default for PerOutput<T> {
    fn default() -> Self {
        PerOutput {
            slots: std::array::from_fn(|_| None),
        }
    }
}

impl<T> PerOutput<T> {
    /// Nothing for any output.
    pub fn new() -> Self {
        Self::default()
    }

    /// `f(output)` for every output.
    pub fn from_fn(mut f: impl FnMut(Output) -> Option<T>) -> Self {
        PerOutput {
            slots: Output::ALL.map(&mut f),
        }
    }

    /// `make(output)` for every forward output `problem` requests
    /// ([`Output::requested`]).
    pub fn for_requested(problem: &Problem<'_>, mut make: impl FnMut(Output) -> T) -> Self {
        Self::from_fn(|o| o.requested(problem).then(|| make(o)))
    }

    /// The value of `output`, if any.
    pub fn get(&self, output: Output) -> Option<&T> {
        self.slots[output.index()].as_ref()
    }

    /// The value of `output`, mutably.
    pub fn get_mut(&mut self, output: Output) -> Option<&mut T> {
        self.slots[output.index()].as_mut()
    }

    /// Whether `output` has a value.
    pub fn contains(&self, output: Output) -> bool {
        self.slots[output.index()].is_some()
    }

    /// Sets `output`'s value, returning the previous one.
    pub fn insert(&mut self, output: Output, value: T) -> Option<T> {
        self.slots[output.index()].replace(value)
    }

    /// Removes and returns `output`'s value.
    pub fn take(&mut self, output: Output) -> Option<T> {
        self.slots[output.index()].take()
    }

    /// `output`'s value, inserting `make()` first when absent.
    pub fn get_or_insert_with(&mut self, output: Output, make: impl FnOnce() -> T) -> &mut T {
        self.slots[output.index()].get_or_insert_with(make)
    }

    /// The outputs with a value and their values, in [`Output::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (Output, &T)> {
        Output::ALL
            .into_iter()
            .zip(&self.slots)
            .filter_map(|(o, v)| v.as_ref().map(|v| (o, v)))
    }

    /// As [`PerOutput::iter`], mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (Output, &mut T)> {
        Output::ALL
            .into_iter()
            .zip(&mut self.slots)
            .filter_map(|(o, v)| v.as_mut().map(|v| (o, v)))
    }

    /// The outputs with a value.
    pub fn outputs(&self) -> impl Iterator<Item = Output> + '_ {
        self.iter().map(|(o, _)| o)
    }

    /// How many outputs have a value.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// Whether no output has a value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Each value mapped by `f(output, value)`.
    pub fn map<U>(self, mut f: impl FnMut(Output, T) -> U) -> PerOutput<U> {
        let mut slots = self.slots.into_iter();
        PerOutput {
            slots: Output::ALL.map(|o| slots.next().flatten().map(|v| f(o, v))),
        }
    }

    /// Borrows every value.
    pub fn as_ref(&self) -> PerOutput<&T> {
        PerOutput {
            slots: self.slots.each_ref().map(Option::as_ref),
        }
    }
}

impl<T> FromIterator<(Output, T)> for PerOutput<T> {
    fn from_iter<I: IntoIterator<Item = (Output, T)>>(iter: I) -> Self {
        let mut out = PerOutput::new();
        for (o, v) in iter {
            out.insert(o, v);
        }
        out
    }
}

impl<T> IntoIterator for PerOutput<T> {
    type Item = (Output, T);
    type IntoIter = std::iter::FilterMap<
        std::iter::Zip<
            std::array::IntoIter<Output, { Output::COUNT }>,
            std::array::IntoIter<Option<T>, { Output::COUNT }>,
        >,
        fn((Output, Option<T>)) -> Option<(Output, T)>,
    >;
    fn into_iter(self) -> Self::IntoIter {
        fn pair<T>((o, v): (Output, Option<T>)) -> Option<(Output, T)> {
            v.map(|v| (o, v))
        }
        Output::ALL
            .into_iter()
            .zip(self.slots)
            .filter_map(pair as fn(_) -> _)
    }
}

impl<T> std::ops::Index<Output> for PerOutput<T> {
    type Output = T;
    /// The value of `output`.
    ///
    /// # Panics
    /// When `output` has no value (use [`PerOutput::get`] where it may not).
    fn index(&self, output: Output) -> &T {
        match self.get(output) {
            Some(v) => v,
            None => panic!("no {output} here"),
        }
    }
}

impl<T> PerOutput<Array2<T>> {
    /// A per-row output (width 1) as `[N]`; `None` when absent.
    pub fn per_row(&self, output: Output) -> Option<ArrayView1<'_, T>> {
        self.get(output).map(|a| a.column(0))
    }
}
