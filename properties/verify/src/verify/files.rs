//! The file-level entry points: one dump file (with the LM head's
//! weights file it names, [`crate::dump::weights_file`]), several, and a
//! tensor-parallel set's files as the one dump they split
//! ([`crate::dump::tp_set`]).

use std::path::{Path, PathBuf};

use crate::dump::tp_set::{Planned, TpSet, TpSetError};
use crate::dump::{weights_file, weights_generator, Dump, DumpError, DumpFile, Header};

use super::{verify_dump, FileOutcome, FileReport, TpSetReport, VerifyConfig};

/// Opens, parses and verifies `path`, with the LM head's weights file it
/// names, if any ([`crate::dump::weights_file`]).
///
/// # Errors
/// [`DumpError`] for bad input: unreadable, malformed or truncated files,
/// missing or misshapen tensors, bad metadata, no candidate, and the spec's
/// value errors (NaN / `+inf` logits, tokens out of range, ...), naming
/// tensor, row and column.
pub fn verify_file(path: &Path, config: &VerifyConfig) -> Result<FileReport, DumpError> {
    let file = DumpFile::open(path)?;
    let header = Header::read(file.bytes())?;
    // The LM head in a file of its own: read in place beside the dump.
    let Some((weights_path, weights)) = weights_file::open(&header.meta, path)? else {
        return verify_header(header, path, config);
    };
    let (tensors, meta) = weights_file::resolve(&header, &weights_path, &weights)?;
    let views: Vec<_> = tensors
        .iter()
        .map(|(n, t)| (n.as_str(), t.dtype(), t.shape(), t.data()))
        .collect();
    verify_dump(&Dump::from_memory(&views, meta)?, path, config)
}

/// Verifies a dump's header, with the LM head it generates, if any
/// ([`crate::dump::weights_generator`]).
///
/// # Errors
/// As [`verify_file`].
pub(crate) fn verify_header(
    header: Header<'_>,
    path: &Path,
    config: &VerifyConfig,
) -> Result<FileReport, DumpError> {
    let Some((generator, bytes)) = weights_generator::open(&header)? else {
        return verify_dump(&Dump::from_header(header, true)?, path, config);
    };
    let (tensors, meta) = weights_generator::join(&header, &generator, &bytes);
    let views: Vec<_> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), *d, s.as_slice(), *b))
        .collect();
    verify_dump(&Dump::from_memory(&views, meta)?, path, config)
}

/// Verifies each file in turn (rows in parallel within a file); bad input
/// in one file does not stop the others. The files of one tensor-parallel
/// set are verified together
/// ([`super::verify_set`]): one outcome per set, or one per distinct copy
/// of its global outputs.
pub fn verify_files(paths: &[PathBuf], config: &VerifyConfig) -> Vec<FileOutcome> {
    let mut out = Vec::with_capacity(paths.len());
    let planned = crate::dump::tp_set::plan(paths);
    let in_sets = |but: &[PathBuf]| -> Vec<PathBuf> {
        let sets = planned.iter().filter_map(|p| match p {
            Planned::Set(v) if v.as_slice() != but => Some(v.clone()),
            _ => None,
        });
        sets.flatten().collect()
    };
    for planned in planned.iter().cloned() {
        match planned {
            Planned::One(p) => out.push(match verify_file(&p, config) {
                Ok(r) => FileOutcome::Report(r),
                Err(error) => FileOutcome::BadInput { path: p, error },
            }),
            Planned::Set(ps) => match verify_set(&ps, config) {
                Ok(reports) => out.extend(reports.into_iter().map(FileOutcome::Report)),
                Err(mut error) => {
                    // Name the rank dumps that did not join an incomplete set.
                    if let DumpError::TpSet(TpSetError::MissingRanks { others, .. }) = &mut error {
                        *others = in_sets(&ps);
                    }
                    out.push(FileOutcome::BadInput {
                        path: ps[0].clone(),
                        error,
                    })
                }
            },
        }
    }
    out
}

/// Verifies the files of one tensor-parallel set (one rank each, any
/// order) as the dump they split: one report for every distinct copy of
/// the global outputs, the first rank 0's, each under the file of the
/// first rank holding it.
///
/// # Errors
/// [`DumpError::Io`] for a file that cannot be read,
/// [`DumpError::TpSet`] for ranks that do not form a set (naming the file,
/// tensor or key), and the assembled dump's own errors as
/// [`verify_dump`] gives them.
pub fn verify_set(paths: &[PathBuf], config: &VerifyConfig) -> Result<Vec<FileReport>, DumpError> {
    let files = paths
        .iter()
        .map(|p| Ok((p.clone(), DumpFile::open(p)?)))
        .collect::<Result<Vec<_>, DumpError>>()?;
    let set = TpSet::open(&files)?;
    let mut reports = Vec::new();
    for ranks in set.copies() {
        let (tensors, meta) = set.assemble(ranks[0]);
        let views: Vec<_> = tensors
            .iter()
            .map(|(n, d, s, b)| (n.as_str(), *d, s.as_slice(), b.as_ref()))
            .collect();
        let dump = Dump::from_memory(&views, meta)?;
        let mut report = verify_dump(&dump, set.path(ranks[0]), config)?;
        report.tp_set = Some(TpSetReport {
            files: set.paths(),
            ranks,
        });
        reports.push(report);
    }
    Ok(reports)
}
