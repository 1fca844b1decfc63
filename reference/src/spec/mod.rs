//! The problem's vocabulary, shared by the oracle, every kernel and the
//! verifier: dtypes, input views, options, cotangents, typed errors, input
//! validation, the algorithm vocabulary kernels declare and the tolerance
//! model reads, and the [`Output`] seam every layer keys its results by. Plain Rust: no MPFR here.

mod algorithm;
mod cotangents;
mod dtype;
mod error;
mod logits;
mod loss;
pub mod meta_key;
mod options;
mod output;
mod output_set;
mod per_output;
mod policy;
mod problem;
mod topk_kl;

pub use algorithm::{ceil_log2, Algorithm, EntropyForm, Shift, Summation};
pub use cotangents::Cotangents;
pub use dtype::{pow2, Dtype, Element};
pub use error::SpecError;
pub use logits::{Logits, LogitsMut};
pub use loss::{CrossEntropy, LossOptions, MeanAllIgnored, MeanDivisor, Reduction};
pub use options::{EntropyLogits, Options, SoftcapDtype, TeacherForm, TemperatureDtype};
pub use output::{Columns, Family, LossTerm, Output, RowStat};
pub use output_set::OutputSet;
pub use per_output::PerOutput;
pub use policy::{PolicyClamps, PolicyInputs, PolicyRow, PolicyTerm};
pub use problem::{Problem, ProblemMut, ProblemOf, Shape, DEFAULT_IGNORE_INDEX};
pub use topk_kl::{check_teacher_row, first_duplicate, teacher_mass_lower, KlDirection, TopkKl};
