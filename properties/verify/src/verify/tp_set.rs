//! A tensor-parallel set's files verified as the one dump they split
//! ([`crate::dump::tp_set`]).

use std::path::PathBuf;

use crate::dump::tp_set::TpSet;
use crate::dump::{Dump, DumpError, DumpFile};

use super::{verify_dump, FileReport, TpSetReport, VerifyConfig};

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
