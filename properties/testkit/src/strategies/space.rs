//! The proptest strategies: a thin wrapper ([`Drawn`]) over the plain-Rust
//! recipe spaces of [`super::sampler`]. Proptest's RNG picks one `u64`, the
//! seed of the [`SplitMix64`] stream the recipe is drawn from; shrinking
//! walks the space's own shrink steps. Proptest never shrinks a vector.

use proptest::prelude::*;
use proptest::strategy::{NewTree, ValueTree};
use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};

use logprobe_reference::splitmix::SplitMix64;

use super::*;

/// A proptest runner's RNG for `(seed, stream)` (ChaCha keyed by the
/// SplitMix64 stream): it drives proptest's own strategies (the fuzz
/// case's and the properties' knobs) and picks the seed of each recipe,
/// never a recipe's values.
pub fn runner_rng(seed: u64, stream: u64) -> TestRng {
    let mut s = SplitMix64::for_stream(seed, stream);
    let mut bytes = [0u8; 32];
    for chunk in bytes.chunks_mut(8) {
        chunk.copy_from_slice(&s.next_u64().to_le_bytes());
    }
    TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)
}

/// The strategy of a recipe space: [`Recipes::sample`] from the stream
/// seeded by one draw of the runner's RNG, shrunk by [`Recipes::shrink`].
#[derive(Clone, Debug)]
pub struct Drawn<S: Recipes>(pub S);

impl<S: Recipes> Strategy for Drawn<S> {
    type Tree = RecipeTree<S>;
    type Value = S::Recipe;

    fn new_tree(&self, runner: &mut TestRunner) -> NewTree<Self> {
        let seed = runner.rng().next_u64();
        let r = self.0.sample(&mut SplitMix64::new(seed));
        Ok(RecipeTree {
            space: self.0.clone(),
            current: r.clone(),
            failing: r,
            steps: Vec::new(),
            next: 0,
            done: false,
        })
    }
}

/// The value tree of [`Drawn`]: after a failure, the failing recipe's
/// shrink steps are tried in order; a step that fails becomes the new
/// failing recipe, a step that passes gives way to the next one. When the
/// steps run out after a pass, the tree returns once to the failing recipe
/// (so an enclosing tuple moves on to its next element) and is done.
#[derive(Clone, Debug)]
pub struct RecipeTree<S: Recipes> {
    space: S,
    current: S::Recipe,
    failing: S::Recipe,
    steps: Vec<S::Recipe>,
    next: usize,
    done: bool,
}

impl<S: Recipes> RecipeTree<S> {
    /// Moves to the next step of the failing recipe (`false`, back at the
    /// failing recipe, when none is left).
    fn advance(&mut self) -> bool {
        match self.steps.get(self.next) {
            Some(s) => {
                self.current = s.clone();
                self.next += 1;
                true
            }
            None => {
                self.current = self.failing.clone();
                self.done = true;
                false
            }
        }
    }
}

impl<S: Recipes> ValueTree for RecipeTree<S> {
    type Value = S::Recipe;

    fn current(&self) -> S::Recipe {
        self.current.clone()
    }

    /// The current recipe failed: its steps are next.
    fn simplify(&mut self) -> bool {
        if self.done {
            self.current = self.failing.clone();
            return false;
        }
        self.failing = self.current.clone();
        self.steps = self.space.shrink(&self.failing);
        self.next = 0;
        self.advance()
    }

    /// The current step passed: the failing recipe's next step, or once
    /// the failing recipe itself.
    fn complicate(&mut self) -> bool {
        if self.done {
            return false;
        }
        // The next step, or (none left) back at the failing recipe: the
        // value changed from the passing step either way.
        self.advance();
        true
    }
}

/// Problem recipes over `space` ([`RecipeSpace`]'s sampler and shrink steps).
pub fn problem_recipe(space: RecipeSpace) -> BoxedStrategy<ProblemRecipe> {
    Drawn(space).boxed()
}

/// Cotangent recipes ([`CotangentSpace`]).
pub fn cotangent_recipe() -> BoxedStrategy<CotangentRecipe> {
    Drawn(CotangentSpace).boxed()
}

/// Recipes of edge rows ([`EdgeSpace`]).
pub fn edge_recipe() -> BoxedStrategy<ProblemRecipe> {
    Drawn(EdgeSpace::default()).boxed()
}
