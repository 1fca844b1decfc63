//! Offset views for the host build: a logical `[rows, stride]` tensor whose
//! rows lie at their true 64-bit element offsets from its base, without a
//! `rows * stride` buffer. Each row is its own small mapping at the exact
//! address `base + r * stride * elem`; with `stride` past 2^31 elements, row
//! 1 already sits past element 2^31 (8 GiB of f32 away), yet the view costs
//! a few pages.
//!
//! Each row whose offset does not fit 32 bits also gets a decoy mapping at
//! the address a 32-bit offset (`(int)(r * stride)`) reaches, so a kernel
//! with that bug reads or writes the decoy (detectably wrong values) instead
//! of faulting the test process.

use super::super::backend::DeviceElem;
use super::super::error::CudaError;

extern "C" {
    fn lp_host_map_at(addr: u64, bytes: usize) -> i32;
    fn lp_host_map_any(bytes: usize) -> u64;
    fn lp_host_unmap(addr: u64, bytes: usize);
    fn lp_host_page_bytes() -> usize;
}

/// See the module docs. Host addresses double as device addresses of the
/// host build, so [`OffsetView::base`] and [`OffsetView::row_ptr`] are
/// kernel arguments.
#[derive(Debug)]
pub struct OffsetView {
    base: u64,
    rows: usize,
    stride: usize,
    cols: usize,
    elem: usize,
    maps: Vec<(u64, usize)>,
}

/// `(addr, bytes)` ranges rounded out to pages and merged.
fn page_ranges(mut ranges: Vec<(u64, u64)>, page: u64) -> Vec<(u64, usize)> {
    for r in &mut ranges {
        r.0 -= r.0 % page;
        r.1 = r.1.div_ceil(page) * page;
    }
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.0 <= last.1 => last.1 = last.1.max(r.1),
            _ => out.push(r),
        }
    }
    out.into_iter()
        .map(|(a, b)| (a, (b - a) as usize))
        .collect()
}

impl OffsetView {
    /// Maps rows `0..rows` of `cols` elements of `elem` bytes each, row `r`
    /// at element offset `r * stride` from the base, plus the decoys (see
    /// the module docs). Everything is zero-filled.
    ///
    /// # Errors
    /// [`CudaError::Driver`] when a decoy would overlap a row, or no base
    /// address leaves every range free.
    pub fn new(rows: usize, stride: usize, cols: usize, elem: usize) -> Result<Self, CudaError> {
        // SAFETY: plain queries and mappings of fresh address ranges.
        let page = unsafe { lp_host_page_bytes() } as u64;
        let probe = unsafe { lp_host_map_any(page as usize) };
        if probe == 0 {
            return Err(CudaError::Driver {
                context: "offset view",
                message: "mmap failed".into(),
            });
        }
        // SAFETY: unmapping the probe page just mapped.
        unsafe { lp_host_unmap(probe, page as usize) };
        let span = (rows as u64) * (stride as u64) * elem as u64;
        // Below every mapping so far: the rows (up to `span` above the base)
        // and the decoys (up to 2^32 elements below) fall in free space.
        for step in 1..64u64 {
            let Some(base) = probe.checked_sub(span + step * (64u64 << 30)) else {
                break;
            };
            let base = base - base % page;
            if base < (elem as u64) << 33 {
                break;
            }
            let view = OffsetView {
                base,
                rows,
                stride,
                cols,
                elem,
                maps: Vec::new(),
            };
            let bytes = (cols * elem) as u64;
            let row_ranges: Vec<(u64, u64)> = (0..rows)
                .map(|r| (view.row_ptr(r), view.row_ptr(r) + bytes))
                .collect();
            let decoys: Vec<(u64, u64)> = (0..rows)
                .filter_map(|r| view.decoy_ptr(r).map(|d| (d, d + bytes)))
                .collect();
            if let Some(d) = decoys
                .iter()
                .find(|d| row_ranges.iter().any(|r| d.0 < r.1 && r.0 < d.1))
            {
                return Err(CudaError::Driver {
                    context: "offset view",
                    message: format!(
                        "stride {stride}: the decoy at {:#x} overlaps a row; pick another stride",
                        d.0
                    ),
                });
            }
            let wanted: Vec<(u64, u64)> = row_ranges.into_iter().chain(decoys).collect();
            let mut view = view;
            let mut ok = true;
            for (addr, bytes) in page_ranges(wanted, page) {
                // SAFETY: maps fresh memory only where nothing is mapped.
                if unsafe { lp_host_map_at(addr, bytes) } != 0 {
                    ok = false;
                    break;
                }
                view.maps.push((addr, bytes));
            }
            if ok {
                return Ok(view);
            }
        }
        Err(CudaError::Driver {
            context: "offset view",
            message: format!("no free address range for {rows} rows of stride {stride}"),
        })
    }

    /// Address of element 0 of row 0.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Address of row `r`: `base + r * stride * elem` (64-bit).
    pub fn row_ptr(&self, r: usize) -> u64 {
        self.base
            .wrapping_add((r as u64) * (self.stride as u64) * self.elem as u64)
    }

    /// Address a 32-bit row offset reaches for row `r`, when it differs.
    pub fn decoy_ptr(&self, r: usize) -> Option<u64> {
        let off = (r as i64) * (self.stride as i64);
        let wrapped = off as i32 as i64;
        (wrapped != off).then(|| self.base.wrapping_add((wrapped * self.elem as i64) as u64))
    }

    fn check(&self, addr: u64, len: usize) {
        let bytes = (len * self.elem) as u64;
        assert!(
            self.maps
                .iter()
                .any(|&(a, n)| addr >= a && addr + bytes <= a + n as u64),
            "{addr:#x} + {bytes} bytes is outside the view"
        );
    }

    /// Writes `data` at `addr` (a row or a decoy of this view).
    ///
    /// # Panics
    /// If the range is not mapped by this view, or `T` is not `elem` bytes.
    pub fn write<T: DeviceElem>(&self, addr: u64, data: &[T]) {
        assert_eq!(std::mem::size_of::<T>(), self.elem);
        self.check(addr, data.len());
        // SAFETY: inside one of this view's mappings (checked).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut T, data.len()) }
    }

    /// Reads `len` elements at `addr` (a row or a decoy of this view).
    ///
    /// # Panics
    /// As [`OffsetView::write`].
    pub fn read<T: DeviceElem>(&self, addr: u64, len: usize) -> Vec<T> {
        assert_eq!(std::mem::size_of::<T>(), self.elem);
        self.check(addr, len);
        let mut v = vec![T::default(); len];
        // SAFETY: inside one of this view's mappings (checked).
        unsafe { std::ptr::copy_nonoverlapping(addr as *const T, v.as_mut_ptr(), len) }
        v
    }

    /// Rows, stride (elements), columns, element bytes.
    pub fn shape(&self) -> (usize, usize, usize, usize) {
        (self.rows, self.stride, self.cols, self.elem)
    }
}

impl Drop for OffsetView {
    fn drop(&mut self) {
        for &(a, n) in &self.maps {
            // SAFETY: this view's own mappings.
            unsafe { lp_host_unmap(a, n) };
        }
    }
}
