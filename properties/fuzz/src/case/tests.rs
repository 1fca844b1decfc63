//! Unit tests of fuzz cases: the recipe text round trip, pins, the space.

use super::*;
use logprobe_testkit::strategies::{Offset, RowKind};
use proptest::strategy::Strategy;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

#[test]
fn recipes_round_trip_through_the_grammar() {
    let space = Space::parse("").unwrap();
    let mut runner = TestRunner::deterministic();
    let s = space.strategy();
    for _ in 0..200 {
        let c = s.new_tree(&mut runner).unwrap().current();
        let text = c.recipe();
        let back = FuzzCase::parse(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(back.recipe(), text);
        // A printed recipe given as --options pins the same case.
        let pinned = Space::parse(&text).unwrap().pin(FuzzCase::plain(1, 3, 40));
        assert_eq!(pinned.recipe(), text);
    }
}

#[test]
fn pins_hold_on_every_drawn_case() {
    let space = Space::parse(
        "dtype=bf16|f16,vocab=50257|1..8,temperature=0.7,mask=0.5,kind=neginf,offset=max,chunk=3",
    )
    .unwrap();
    let mut runner = TestRunner::deterministic();
    let s = space.strategy();
    for _ in 0..100 {
        let c = s.new_tree(&mut runner).unwrap().current();
        let r = &c.recipe;
        assert!(matches!(r.dtype, Dtype::Bf16 | Dtype::F16));
        assert!(
            r.vocab_size == 50257 || (1..=8).contains(&r.vocab_size),
            "{r:?}"
        );
        assert_eq!(r.temperature, 0.7);
        assert_eq!(r.mask_rate, Some(0.5));
        assert!(matches!(r.kind, RowKind::NegInf { .. }));
        assert_eq!(r.offset, Offset::Extreme { negative: false });
        assert_eq!(c.chunk, 3);
    }
    assert!(Space::parse("dtype=f8").is_err());
    assert!(Space::parse("pad=1..3").is_err());
}
