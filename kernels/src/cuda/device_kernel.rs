//! The [`Kernel`](crate::kernel::Kernel) trait over a [`Layout`] on a
//! [`Launcher`]: validation through the spec, upload, launches, download,
//! rounding to the output dtype, allocation tracking. [`super::CudaFused`],
//! [`super::CudaChunked`] and [`super::CudaVocabParallel`] are thin names
//! over it.

use std::sync::Arc;

use ndarray::Array2;

use logprobe_reference::spec::meta_key;

use logprobe_reference::spec::{
    Cotangents, Dtype, LogitsMut, Output, OutputSet, Problem, ProblemMut, Shape,
};

use super::backend::Launcher;
use super::backward::{backward, Dest, Grads, MAX_SLOTS};
use super::error::CudaError;
use super::forward::forward;
use super::inputs::{check_dtype, check_scaled_logits, HostLogits};
use super::memory::{MemoryReport, MemoryTracker};
use super::plan::Layout;
use crate::kernel::{Algorithm, Capabilities, Feature, FeatureSet, ForwardOutput, KernelError};

/// A CUDA kernel: back end, layout and its own allocation tracker.
#[derive(Clone, Debug)]
pub struct DeviceKernel {
    rt: Arc<dyn Launcher>,
    layout: Layout,
    tracker: MemoryTracker,
}

impl DeviceKernel {
    /// A kernel of `layout` on the shared runtime (device 0).
    ///
    /// # Errors
    /// [`CudaError`] when no CUDA device is usable (never a panic).
    #[cfg(feature = "cuda")]
    pub fn new(layout: Layout) -> Result<Self, CudaError> {
        Ok(Self::on(super::runtime::CudaRuntime::shared()?, layout))
    }

    /// A kernel of `layout` on `rt`.
    pub fn on(rt: Arc<dyn Launcher>, layout: Layout) -> Self {
        DeviceKernel {
            rt,
            layout,
            tracker: MemoryTracker::new(),
        }
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The back end.
    pub fn launcher(&self) -> &Arc<dyn Launcher> {
        &self.rt
    }

    /// The declared algorithm of a call with `shape`: the layout's
    /// reduction ([`Layout::algorithm`]) with the back end's `expf` /
    /// `log1pf` error bounds ([`Launcher::math`]).
    pub fn algorithm(&self, shape: &Shape) -> Algorithm {
        let math = self.rt.math();
        Algorithm {
            exp_ulps: math.exp_ulps,
            log_ulps: math.log_ulps,
            ..self.layout.algorithm(shape)
        }
    }

    /// Device memory of this kernel's calls: live and peak bytes by kind.
    pub fn memory(&self) -> MemoryReport {
        self.tracker.report()
    }

    /// Resets the peaks, so the next call's peak can be read alone.
    pub fn reset_memory_peak(&self) {
        self.tracker.reset_peak()
    }

    /// Short name: `cuda-fused`, `cuda-chunked(chunk_size=64)`,
    /// `cuda-vocab-parallel(shards=4)`; on the host build `cuda-host-fused`
    /// and so on (`cuda-host[mutant]-fused` for a mutant build).
    pub fn name(&self) -> String {
        let p = self.rt.name_prefix();
        match &self.layout {
            Layout::Fused => format!("{p}-fused"),
            Layout::Chunked { chunk_size } => format!("{p}-chunked(chunk_size={chunk_size})"),
            Layout::VocabParallel(super::plan::Shards::Even(c)) => {
                format!("{p}-vocab-parallel(shards={c})")
            }
            Layout::VocabParallel(super::plan::Shards::Widths(w)) => {
                format!("{p}-vocab-parallel(widths={w:?})")
            }
        }
    }

    /// Everything but f64 logits; in place except vocab-parallel.
    pub fn capabilities(&self) -> Capabilities {
        let features = FeatureSet::of(&[
            Feature::MaskedEntropy,
            Feature::SamplingMask,
            Feature::Temperature,
            Feature::PaddedVocab,
        ]);
        Capabilities {
            outputs: OutputSet::of(&[
                Output::LogProbs,
                Output::Entropy,
                Output::TopkLogProbs,
                Output::GradLogits,
            ]),
            features: match self.layout {
                Layout::VocabParallel(_) => features,
                _ => features.with(Feature::InPlaceBackward),
            },
        }
    }

    fn device_err(&self) -> impl Fn(CudaError) -> KernelError + '_ {
        move |e| e.into_kernel_error(self.name())
    }

    fn validate(&self, problem: &Problem<'_>) -> Result<Shape, KernelError> {
        let shape = problem.validate_shapes()?;
        check_dtype(&shape, &self.name())?;
        let shape = problem.validate()?;
        check_scaled_logits(problem, &shape)?;
        if let Layout::VocabParallel(shards) = &self.layout {
            shards.ranges(shape.v_total)?;
        }
        if problem.options.lse || problem.options.z_loss_coef.is_some() {
            return Err(KernelError::Unsupported {
                kernel: self.name(),
                what: "lse / z_loss",
            });
        }
        if problem.options.loss.is_some() {
            return Err(KernelError::Unsupported {
                kernel: self.name(),
                what: "cross-entropy loss",
            });
        }
        if !problem.policy.is_empty() {
            return Err(KernelError::Unsupported {
                kernel: self.name(),
                what: "policy terms (ref_log_probs / old_log_probs)",
            });
        }
        if problem.options.topk_kl.is_some() {
            return Err(KernelError::Unsupported {
                kernel: self.name(),
                what: "top-k KL",
            });
        }
        if problem.options.softcap.is_some() {
            return Err(KernelError::Unsupported {
                kernel: self.name(),
                what: meta_key::SOFTCAP,
            });
        }
        if shape.k + 1 > MAX_SLOTS {
            return Err(KernelError::Unsupported {
                kernel: self.name(),
                what: "top-k wider than 12287 ids",
            });
        }
        self.capabilities().check_requested(problem, &self.name())?;
        Ok(shape)
    }

    /// [`Kernel::forward`](crate::kernel::Kernel::forward).
    ///
    /// # Errors
    /// As [`Kernel::forward`](crate::kernel::Kernel::forward);
    /// [`KernelError::Device`] from the device.
    pub fn forward(&self, problem: &Problem<'_>, out: Dtype) -> Result<ForwardOutput, KernelError> {
        let shape = self.validate(problem)?;
        forward(&*self.rt, &self.tracker, &self.layout, problem, &shape, out)
            .map_err(self.device_err())
    }

    /// [`Kernel::backward`](crate::kernel::Kernel::backward).
    ///
    /// # Errors
    /// As [`Kernel::backward`](crate::kernel::Kernel::backward);
    /// [`KernelError::Device`] from the device.
    pub fn backward(
        &self,
        problem: &Problem<'_>,
        cot: &Cotangents<'_>,
        out: Dtype,
    ) -> Result<Array2<f64>, KernelError> {
        // The oracle's order (`Oracle::vjp`): shapes, cotangents, then values.
        problem.validate_cotangents(&problem.validate_shapes()?, cot)?;
        if logprobe_reference::spec::PolicyTerm::ALL
            .iter()
            .any(|&t| cot.policy(t).is_some())
        {
            return Err(KernelError::Unsupported {
                kernel: self.name(),
                what: "policy-term cotangents",
            });
        }
        let shape = self.validate(problem)?;
        match backward(
            &*self.rt,
            &self.tracker,
            &self.layout,
            problem,
            &shape,
            cot,
            Dest::New(out),
        )
        .map_err(self.device_err())?
        {
            Grads::New(g) => Ok(g),
            Grads::InPlace(_) => Err(CudaError::Driver {
                context: "backward",
                message: "unexpected in-place result".into(),
            })
            .map_err(self.device_err()),
        }
    }

    /// [`Kernel::backward_in_place`](crate::kernel::Kernel::backward_in_place).
    ///
    /// # Errors
    /// As [`Kernel::backward_in_place`](crate::kernel::Kernel::backward_in_place);
    /// on error the logits are unchanged.
    pub fn backward_in_place(
        &self,
        mut problem: ProblemMut<'_>,
        cot: &Cotangents<'_>,
    ) -> Result<(), KernelError> {
        if matches!(self.layout, Layout::VocabParallel(_)) {
            return Err(KernelError::Unsupported {
                kernel: self.name(),
                what: "in-place backward",
            });
        }
        let new_contents = {
            let problem = problem.view();
            problem.validate_cotangents(&problem.validate_shapes()?, cot)?;
            let shape = self.validate(&problem)?;
            match backward(
                &*self.rt,
                &self.tracker,
                &self.layout,
                &problem,
                &shape,
                cot,
                Dest::InPlace,
            )
            .map_err(self.device_err())?
            {
                Grads::InPlace(h) => h,
                Grads::New(_) => {
                    return Err(CudaError::Driver {
                        context: "backward",
                        message: "unexpected new buffer".into(),
                    })
                    .map_err(self.device_err())
                }
            }
        };
        write_back(&mut problem.logits, &new_contents).map_err(self.device_err())
    }
}

/// Copies row-major device contents back over the host logits.
fn write_back(logits: &mut LogitsMut<'_>, contents: &HostLogits) -> Result<(), CudaError> {
    use half::{bf16, f16};
    let mismatch = || CudaError::Driver {
        context: "writing back",
        message: "dtype mismatch".into(),
    };
    match (logits, contents) {
        (LogitsMut::F32(v), HostLogits::F32(c)) => v.iter_mut().zip(c).for_each(|(d, &s)| *d = s),
        (LogitsMut::Bf16(v), HostLogits::U16(c)) => v
            .iter_mut()
            .zip(c)
            .for_each(|(d, &s)| *d = bf16::from_bits(s)),
        (LogitsMut::F16(v), HostLogits::U16(c)) => v
            .iter_mut()
            .zip(c)
            .for_each(|(d, &s)| *d = f16::from_bits(s)),
        _ => return Err(mismatch()),
    }
    Ok(())
}

/// Implements [`Kernel`] for a newtype over [`DeviceKernel`] (field `0`).
macro_rules! delegate_kernel {
    ($ty:ty) => {
        impl $crate::kernel::Kernel for $ty {
            fn name(&self) -> String {
                self.0.name()
            }
            fn capabilities(&self) -> $crate::kernel::Capabilities {
                self.0.capabilities()
            }
            fn algorithm(
                &self,
                shape: &logprobe_reference::spec::Shape,
            ) -> $crate::kernel::Algorithm {
                self.0.algorithm(shape)
            }
            fn workspace_bytes(&self, shape: &logprobe_reference::spec::Shape) -> usize {
                self.0.layout().workspace_bytes(shape)
            }
            fn forward(
                &self,
                problem: &logprobe_reference::spec::Problem<'_>,
                out: logprobe_reference::spec::Dtype,
            ) -> Result<$crate::kernel::ForwardOutput, $crate::kernel::KernelError> {
                self.0.forward(problem, out)
            }
            fn backward(
                &self,
                problem: &logprobe_reference::spec::Problem<'_>,
                cotangents: &logprobe_reference::spec::Cotangents<'_>,
                out: logprobe_reference::spec::Dtype,
            ) -> Result<ndarray::Array2<f64>, $crate::kernel::KernelError> {
                self.0.backward(problem, cotangents, out)
            }
            fn backward_in_place(
                &self,
                problem: logprobe_reference::spec::ProblemMut<'_>,
                cotangents: &logprobe_reference::spec::Cotangents<'_>,
            ) -> Result<(), $crate::kernel::KernelError> {
                self.0.backward_in_place(problem, cotangents)
            }
        }
    };
}
pub(crate) use delegate_kernel;
