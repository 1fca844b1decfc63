//! Bugs of chunked kernels: the remainder chunk dropped, `chunk_size`
//! ignored, a chunk-dependent reduction order. Each wraps [`CpuKernel::chunked`] with
//! the mutant's `chunk_size`.

use ndarray::Array2;

use logprobe_kernels::kernel::{ForwardOutput, Kernel, KernelError};
use logprobe_kernels::CpuKernel;
use logprobe_reference::spec::{Cotangents, Dtype, Output, Problem, Shape, SpecError};

use super::rewired::{pick_rows1, pick_rows2, Reversed};
use super::PlantedBug;

/// Rows past the last full chunk are never written (left 0).
pub struct DroppedChunkRemainder {
    inner: CpuKernel,
    chunk_size: usize,
}

impl DroppedChunkRemainder {
    /// Catalog name.
    pub const NAME: &'static str = "dropped-chunk-remainder";

    /// The bug around [`CpuKernel::chunked`] with `chunk_size` rows per chunk.
    pub fn new(chunk_size: usize) -> DroppedChunkRemainder {
        DroppedChunkRemainder {
            inner: CpuKernel::chunked(chunk_size),
            chunk_size,
        }
    }

    /// The first row past the last full chunk.
    fn full_rows(&self, n: usize) -> usize {
        n / self.chunk_size.max(1) * self.chunk_size.max(1)
    }
}

impl PlantedBug for DroppedChunkRemainder {
    fn inner(&self) -> &dyn Kernel {
        &self.inner
    }

    fn chunk_size(&self) -> Option<usize> {
        Some(self.chunk_size)
    }

    fn corrupt_forward(&self, _: &Problem<'_>, shape: &Shape, _: Dtype, fo: &mut ForwardOutput) {
        for row in self.full_rows(shape.n)..shape.n {
            for (_, a) in fo.values.iter_mut() {
                a.row_mut(row).fill(0.0);
            }
        }
    }

    fn corrupt_backward(
        &self,
        _: &Problem<'_>,
        shape: &Shape,
        _: &Cotangents<'_>,
        grad: &mut Array2<f64>,
    ) {
        let full = self.full_rows(shape.n);
        grad.slice_mut(ndarray::s![full.., ..]).fill(0.0);
    }
}

/// `chunk_size` ignored: one chunk of all rows (same values, `N x V`
/// memory). It keeps declaring its nominal `chunk_size`'s workspace: the
/// memory property catches it.
pub struct IgnoredChunkSize {
    inner: CpuKernel,
    chunk_size: usize,
}

impl IgnoredChunkSize {
    /// Catalog name.
    pub const NAME: &'static str = "ignored-chunk-size";

    /// The bug around [`CpuKernel::chunked`] with a nominal `chunk_size`.
    pub fn new(chunk_size: usize) -> IgnoredChunkSize {
        IgnoredChunkSize {
            inner: CpuKernel::chunked(chunk_size),
            chunk_size,
        }
    }

    /// The one-chunk kernel actually run over `problem`'s `N` rows.
    fn one_chunk(&self, problem: &Problem<'_>) -> Result<CpuKernel, KernelError> {
        if self.chunk_size == 0 {
            return Err(SpecError::ZeroChunkSize.into());
        }
        Ok(CpuKernel::chunked(problem.logits.dim().0.max(1)))
    }
}

impl PlantedBug for IgnoredChunkSize {
    fn inner(&self) -> &dyn Kernel {
        &self.inner
    }

    fn chunk_size(&self) -> Option<usize> {
        Some(self.chunk_size)
    }

    fn forward(&self, problem: &Problem<'_>, out: Dtype) -> Result<ForwardOutput, KernelError> {
        self.one_chunk(problem)?.forward(problem, out)
    }

    fn backward(
        &self,
        problem: &Problem<'_>,
        cotangents: &Cotangents<'_>,
        out: Dtype,
    ) -> Result<Array2<f64>, KernelError> {
        self.one_chunk(problem)?.backward(problem, cotangents, out)
    }
}

/// Reduction order depends on the row's chunk: rows in odd-numbered chunks
/// are reduced in reverse column order (the real vocabulary reversed,
/// padding kept at the end).
pub struct ChunkDependentOrder {
    inner: CpuKernel,
    chunk_size: usize,
}

impl ChunkDependentOrder {
    /// Catalog name.
    pub const NAME: &'static str = "chunk-dependent-order";

    /// The bug around [`CpuKernel::chunked`] with `chunk_size` rows per chunk.
    pub fn new(chunk_size: usize) -> ChunkDependentOrder {
        ChunkDependentOrder {
            inner: CpuKernel::chunked(chunk_size),
            chunk_size,
        }
    }

    /// Rows in odd-numbered chunks (`(row / chunk_size) % 2 == 1`).
    fn odd_chunk_rows(&self, n: usize) -> Vec<usize> {
        (0..n)
            .filter(|r| (r / self.chunk_size.max(1)) % 2 == 1)
            .collect()
    }
}

impl PlantedBug for ChunkDependentOrder {
    fn inner(&self) -> &dyn Kernel {
        &self.inner
    }

    fn chunk_size(&self) -> Option<usize> {
        Some(self.chunk_size)
    }

    fn forward(&self, problem: &Problem<'_>, out: Dtype) -> Result<ForwardOutput, KernelError> {
        let mut fo = self.inner.forward(problem, out)?;
        let shape = problem.validate_shapes()?;
        let rows = self.odd_chunk_rows(shape.n);
        if rows.is_empty() {
            return Ok(fo);
        }
        let rv = Reversed::new(problem, &shape, &rows);
        let ro = self.inner.forward(&rv.problem(problem.options), out)?;
        for (i, &r) in rows.iter().enumerate() {
            for (o, a) in fo.values.iter_mut() {
                if let Some(b) = ro.values.get(o) {
                    a.row_mut(r).assign(&b.row(i));
                }
            }
        }
        Ok(fo)
    }

    fn backward(
        &self,
        problem: &Problem<'_>,
        cotangents: &Cotangents<'_>,
        out: Dtype,
    ) -> Result<Array2<f64>, KernelError> {
        let mut grad = self.inner.backward(problem, cotangents, out)?;
        let shape = problem.validate_shapes()?;
        let rows = self.odd_chunk_rows(shape.n);
        if rows.is_empty() {
            return Ok(grad);
        }
        let rv = Reversed::new(problem, &shape, &rows);
        let (g, h, gk) = (
            pick_rows1(cotangents.column(Output::LogProbs), &rows),
            pick_rows1(cotangents.column(Output::Entropy), &rows),
            pick_rows2(cotangents.get(Output::TopkLogProbs), &rows),
        );
        let c = Cotangents::default()
            .with_column(Output::LogProbs, g.as_ref().map(|a| a.view()))
            .with_column(Output::Entropy, h.as_ref().map(|a| a.view()))
            .with(Output::TopkLogProbs, gk.as_ref().map(|a| a.view()));
        let rg = self.inner.backward(&rv.problem(problem.options), &c, out)?;
        let v = shape.vocab_size;
        for (i, &r) in rows.iter().enumerate() {
            for j in 0..shape.v_total {
                let src = if j < v { v - 1 - j } else { j };
                grad[[r, j]] = rg[[i, src]];
            }
        }
        Ok(grad)
    }
}
