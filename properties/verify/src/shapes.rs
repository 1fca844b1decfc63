//! The row shapes users have: `logits [N, V]` with per-row tensors `[N]`,
//! or `logits [B, T, V]` (batch, sequence) with per-row tensors `[B, T]`.
//! The dump is read as `N = B * T` rows in row-major order (row
//! `r = b * T + t`), and reports name a row `(b, t)`.
//!
//! Also here: the shape rule of cotangents under `cotangent_reduction=sum`
//! (a `[]` or `[1]` cotangent broadcast to every row) and the decoding of
//! `0`/`1` flag tensors (`row_mask`, `sampling_mask`).

use safetensors::Dtype as StDtype;

use crate::dump::DumpError;

/// The leading (row) dimensions of a dump: `[N]` or `[B, T]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowShape {
    /// `(B, T)` for `[B, T, V]` logits, `None` for `[N, V]`.
    pub batch: Option<(usize, usize)>,
    /// Rows `N` (`B * T`).
    pub n: usize,
}

impl RowShape {
    /// The row shape and `V` of a `logits` tensor of shape `[N, V]` or
    /// `[B, T, V]`.
    ///
    /// Checked before anything sized by `N` is allocated or walked: with
    /// `V >= 1` every row holds at least one logit in the file, so `N` is
    /// bounded by the file's bytes (safetensors checks `prod(shape) *
    /// size(dtype)` against them).
    ///
    /// # Errors
    /// [`DumpError::BadShape`] for any other rank, for `V = 0` (no
    /// vocabulary: `[H, 0]` would declare any number of rows in no bytes),
    /// or when `B * T` or `N * V` overflows.
    pub fn of_logits(shape: &[usize]) -> Result<(Self, usize), DumpError> {
        Self::of_rows("logits", "V", shape)
    }

    /// The row shape and last dimension (`letter`: `V` for `logits`, `H`
    /// for `hidden`) of a tensor `[N, X]` or `[B, T, X]`, as
    /// [`RowShape::of_logits`] checks `logits` (`X >= 1`).
    ///
    /// # Errors
    /// As [`RowShape::of_logits`], naming `tensor`.
    pub fn of_rows(
        tensor: &'static str,
        letter: &str,
        shape: &[usize],
    ) -> Result<(Self, usize), DumpError> {
        let bad = |why: &str| DumpError::BadShape {
            tensor,
            found: shape.to_vec(),
            expected: format!("[N, {letter}] or [B, T, {letter}] {why}"),
        };
        let (batch, n, v) = match *shape {
            [n, v] => (None, n, v),
            [b, t, v] => {
                let n = b
                    .checked_mul(t)
                    .ok_or_else(|| bad("(B * T overflows usize)"))?;
                (Some((b, t)), n, v)
            }
            _ => return Err(bad("(2-D or 3-D)")),
        };
        if v == 0 {
            return Err(bad(&format!(
                "with {letter} >= 1 ({letter} = 0 holds any number of rows in no bytes)"
            )));
        }
        if n.checked_mul(v).is_none() {
            return Err(bad(&format!("(N * {letter} overflows usize)")));
        }
        Ok((RowShape { batch, n }, v))
    }

    /// The row dimensions with their letters: `[('N', n)]` or
    /// `[('B', b), ('T', t)]`.
    pub fn dims(&self) -> Vec<(char, usize)> {
        match self.batch {
            None => vec![('N', self.n)],
            Some((b, t)) => vec![('B', b), ('T', t)],
        }
    }

    /// Checks that `found` is the row dimensions followed by `extra`
    /// (e.g. `[('V', v)]`).
    ///
    /// # Errors
    /// [`DumpError::BadShape`] naming the expected shape in letters and
    /// numbers, e.g. `[B, T, V] = [2, 4, 32000]`.
    pub fn expect(
        &self,
        tensor: &'static str,
        found: &[usize],
        extra: &[(char, usize)],
    ) -> Result<(), DumpError> {
        let dims: Vec<(char, usize)> = self
            .dims()
            .into_iter()
            .chain(extra.iter().copied())
            .collect();
        if found.len() == dims.len() && found.iter().zip(&dims).all(|(f, (_, d))| f == d) {
            return Ok(());
        }
        Err(DumpError::BadShape {
            tensor,
            found: found.to_vec(),
            expected: letters(&dims),
        })
    }

    /// `K` of a tensor of shape `[rows..., K]`.
    ///
    /// # Errors
    /// [`DumpError::BadShape`] for any other shape, or when `N * K`
    /// overflows.
    pub fn trailing(&self, tensor: &'static str, found: &[usize]) -> Result<usize, DumpError> {
        let rank = self.dims().len();
        match found.split_last() {
            Some((&k, rows)) if rows.len() == rank && self.expect(tensor, rows, &[]).is_ok() => {
                if self.n.checked_mul(k).is_none() {
                    return Err(DumpError::BadShape {
                        tensor,
                        found: found.to_vec(),
                        expected: "[N, K] with N * K within usize".into(),
                    });
                }
                Ok(k)
            }
            _ => Err(DumpError::BadShape {
                tensor,
                found: found.to_vec(),
                expected: {
                    let mut d: Vec<String> =
                        self.dims().iter().map(|(c, _)| c.to_string()).collect();
                    let mut v: Vec<String> =
                        self.dims().iter().map(|(_, n)| n.to_string()).collect();
                    d.push("K".into());
                    v.push("K".into());
                    format!("[{}] = [{}]", d.join(", "), v.join(", "))
                },
            }),
        }
    }

    /// Checks a cotangent's shape: the full shape (rows then `extra`), or,
    /// under `cotangent_reduction=sum` (`sum`), `[]` or `[1]`, broadcast to
    /// every element. Returns whether it is such a scalar.
    ///
    /// # Errors
    /// [`DumpError::BadShape`]; a scalar without `sum` says that it needs
    /// `cotangent_reduction=sum`.
    pub fn cotangent(
        &self,
        tensor: &'static str,
        found: &[usize],
        extra: &[(char, usize)],
        sum: bool,
    ) -> Result<bool, DumpError> {
        let full = self.expect(tensor, found, extra);
        if full.is_ok() {
            return Ok(false);
        }
        let scalar = found.is_empty() || found == [1];
        match (scalar, sum, full) {
            (true, true, _) => Ok(true),
            (true, false, Err(DumpError::BadShape { expected, .. })) => Err(DumpError::BadShape {
                tensor,
                found: found.to_vec(),
                expected: format!(
                    "{expected} (a [] or [1] cotangent is broadcast only under metadata cotangent_reduction=\"sum\")"
                ),
            }),
            (_, _, e) => e.map(|_| false),
        }
    }

    /// The name of row `r` in reports: `r` for `[N, V]` logits, `(b, t)`
    /// for `[B, T, V]`.
    pub fn position(&self, r: usize) -> Option<(usize, usize)> {
        self.batch.map(|(_, t)| (r / t.max(1), r % t.max(1)))
    }
}

fn letters(dims: &[(char, usize)]) -> String {
    let l: Vec<String> = dims.iter().map(|(c, _)| c.to_string()).collect();
    let v: Vec<String> = dims.iter().map(|(_, d)| d.to_string()).collect();
    format!("[{}] = [{}]", l.join(", "), v.join(", "))
}

/// Decodes a `bool` or `u8` flag tensor (`row_mask`): every byte 0 or 1.
///
/// # Errors
/// [`DumpError::BadDtype`] for another dtype; [`DumpError::BadFlag`] for a
/// byte other than 0 or 1, with its flat index.
pub fn decode_flags(
    tensor: &'static str,
    dtype: StDtype,
    data: &[u8],
) -> Result<Vec<bool>, DumpError> {
    if !matches!(dtype, StDtype::BOOL | StDtype::U8) {
        return Err(DumpError::BadDtype {
            tensor,
            found: format!("{dtype:?}"),
            expected: "BOOL or U8",
        });
    }
    data.iter()
        .enumerate()
        .map(|(index, &b)| match b {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(DumpError::BadFlag {
                tensor,
                index,
                value,
            }),
        })
        .collect()
}

/// The rows of `rows` that `row_mask` (`[N]`, flattened) keeps.
pub fn unmasked_rows(rows: Vec<usize>, row_mask: Option<&[bool]>) -> Vec<usize> {
    match row_mask {
        None => rows,
        Some(m) => rows.into_iter().filter(|&r| m[r]).collect(),
    }
}

/// Wraps an error of one row in its `(b, t)` position (when the logits are
/// `[B, T, V]`).
pub fn at_position(e: DumpError, position: Option<(usize, usize)>) -> DumpError {
    match position {
        None => e,
        Some((b, t)) => DumpError::AtPosition {
            b,
            t,
            source: Box::new(e),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_rows_are_named_b_t() {
        let (s, v) = RowShape::of_logits(&[2, 3, 7]).unwrap();
        assert_eq!((s.n, v, s.batch), (6, 7, Some((2, 3))));
        assert_eq!(s.position(4), Some((1, 1)));
        assert!(s.expect("tokens", &[2, 3], &[]).is_ok());
        assert!(s.expect("tokens", &[6], &[]).is_err());
        assert_eq!(s.trailing("topk_ids", &[2, 3, 5]).unwrap(), 5);
        assert!(RowShape::of_logits(&[7]).is_err());
        assert!(RowShape::of_logits(&[usize::MAX, 2, 1]).is_err());
    }

    #[test]
    fn no_vocabulary_or_overflow_is_rejected_before_rows() {
        for shape in [
            &[1usize << 62, 0][..],
            &[65536, 65536, 0],
            &[0, 0],
            &[usize::MAX, 2],
            &[1 << 40, 1 << 40, 1],
        ] {
            let e = RowShape::of_logits(shape).unwrap_err();
            assert!(
                matches!(
                    e,
                    DumpError::BadShape {
                        tensor: "logits",
                        ..
                    }
                ),
                "{shape:?}: {e}"
            );
        }
        assert!(RowShape::of_logits(&[0, 7]).is_ok());
    }

    #[test]
    fn scalar_cotangents_need_sum() {
        let (s, _) = RowShape::of_logits(&[4, 9]).unwrap();
        assert!(s.cotangent("grad_log_probs", &[], &[], true).unwrap());
        assert!(s.cotangent("grad_log_probs", &[1], &[], true).unwrap());
        assert!(!s.cotangent("grad_log_probs", &[4], &[], false).unwrap());
        let e = s.cotangent("grad_log_probs", &[], &[], false).unwrap_err();
        assert!(e.to_string().contains("cotangent_reduction"), "{e}");
        assert!(s.cotangent("grad_log_probs", &[3], &[], true).is_err());
    }
}
