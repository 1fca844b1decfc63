//! `logprobe-verify`: the product library. The tolerance model ([`tolerance`]:
//! derived error bounds from a declared algorithm and the oracle's row
//! statistics), the dump format read and written ([`dump`]: safetensors
//! files of inputs and candidate outputs), and the verify engine with its
//! reports ([`verify`]), also from tensors in memory ([`tensors`]), and the
//! fuzz protocol types ([`protocol`]). Links neither proptest nor candle: the `logprobe`
//! binary, fuzz and the Python wheel build on it.
#![warn(missing_docs)]

pub mod compare;
pub mod dump;
pub mod format;
pub mod header;
pub mod json;
pub mod keys;
pub mod names;
pub mod progress;
pub mod protocol;
mod row_oracle;
mod scratch;
pub mod shapes;
pub mod temperature;
pub mod tensors;
pub mod tolerance;
pub mod topk_set;
pub mod verify;
