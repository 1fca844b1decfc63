//! `logprobe-properties`: the tolerance model, proptest strategies, the
//! property checks, the dump verifier, and the `logprobe` binary.
#![warn(missing_docs)]

pub mod bench;
pub mod cache;
pub mod checks;
pub mod dump;
pub mod memory;
pub mod mutants;
pub mod strategies;
pub mod suite;
pub mod tolerance;
pub mod verify;

/// The README's code, compiled and run as a doctest so it cannot rot.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
