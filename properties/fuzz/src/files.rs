//! Finding files on disk: each written atomically (a temporary file in the
//! same directory, then linked to its name, which never replaces a file),
//! under a name that no earlier finding holds (`<stem>-<hash>`, the hash of
//! the dump's bytes, with a counter after it when that name is taken by
//! other bytes).

use std::io::Write;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// Why finding files could not be written.
#[derive(Debug, Error)]
pub enum WriteError {
    /// The directory, a temporary file or the link failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path that failed.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A name of the set does not extend the first one's stem (a bug).
    #[error("finding file `{0}` does not share the stem of the first file")]
    Name(String),
    /// Every counter up to the limit is taken.
    #[error("{}: no free name for `{stem}` after {MAX_COUNTER} tries", dir.display())]
    NoFreeName {
        /// The directory.
        dir: PathBuf,
        /// The stem.
        stem: String,
    },
}

/// The largest counter tried.
const MAX_COUNTER: u32 = 10_000;

/// 64-bit FNV-1a of `bytes`.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Writes `files` (`(name, bytes)`; the first named `<stem>.safetensors`,
/// the others `<stem><rest>`, e.g. `-variant.safetensors`) into `dir`
/// (created) as `<stem>-<hash><rest>`, `<hash>` 8 hex digits of a hash of
/// the first file's bytes; when one of those names exists with other bytes,
/// as `<stem>-<hash>-<n><rest>` for the first `n` (2, 3, ...) whose names
/// are all free. A set already on disk with the same bytes is reused.
/// Returns the paths, in order.
///
/// # Errors
/// [`WriteError`]: the directory or a file cannot be written, a name that
/// does not extend the stem, no free name.
pub fn write_new(dir: &Path, files: &[(String, Vec<u8>)]) -> Result<Vec<PathBuf>, WriteError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| WriteError::Io { path, source }
    };
    let Some((first, first_bytes)) = files.first() else {
        return Ok(Vec::new());
    };
    let stem = first
        .strip_suffix(".safetensors")
        .ok_or_else(|| WriteError::Name(first.clone()))?;
    let rests = files
        .iter()
        .map(|(n, _)| {
            n.strip_prefix(stem)
                .ok_or_else(|| WriteError::Name(n.clone()))
        })
        .collect::<Result<Vec<&str>, _>>()?;
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let hash = fnv1a(first_bytes) as u32;
    'names: for n in 1..=MAX_COUNTER {
        let counter = if n == 1 {
            String::new()
        } else {
            format!("-{n}")
        };
        let paths: Vec<PathBuf> = rests
            .iter()
            .map(|r| dir.join(format!("{stem}-{hash:08x}{counter}{r}")))
            .collect();
        let same = paths
            .iter()
            .zip(files)
            .map(|(p, (_, b))| std::fs::read(p).ok().map(|on_disk| on_disk == *b));
        let same: Vec<Option<bool>> = same.collect();
        if same.iter().all(|s| *s == Some(true)) {
            return Ok(paths);
        }
        if same.iter().any(Option::is_some) {
            continue;
        }
        let mut linked: Vec<&PathBuf> = Vec::new();
        for (path, (_, bytes)) in paths.iter().zip(files) {
            let mut tmp = tempfile::Builder::new()
                .prefix(".logprobe-finding-")
                .suffix(".tmp")
                .tempfile_in(dir)
                .map_err(io(dir))?;
            tmp.write_all(bytes)
                .and_then(|()| tmp.as_file().sync_data())
                .map_err(io(tmp.path()))?;
            match tmp.persist_noclobber(path) {
                Ok(_) => linked.push(path),
                Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => {
                    // Taken meanwhile: undo this set, try the next counter.
                    for p in linked {
                        let _ = std::fs::remove_file(p);
                    }
                    continue 'names;
                }
                Err(e) => return Err(io(path)(e.error)),
            }
        }
        return Ok(paths);
    }
    Err(WriteError::NoFreeName {
        dir: dir.to_path_buf(),
        stem: stem.to_string(),
    })
}

/// A kernel name as a file name's stem: ASCII letters, digits and `-`
/// kept, anything else `-` (`mutant:x` -> `mutant-x`).
pub fn name_stem(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// `s` as one shell word: unchanged when it holds only characters no shell
/// treats specially, single-quoted otherwise.
pub fn shell_word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./,:=+@%".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_finding_of_the_same_stem_gets_its_own_name() {
        let dir = tempfile::tempdir().unwrap();
        let a = vec![("fuzz-x-seed1.safetensors".to_string(), b"first".to_vec())];
        let b = vec![("fuzz-x-seed1.safetensors".to_string(), b"second".to_vec())];
        let pa = write_new(dir.path(), &a).unwrap();
        let pb = write_new(dir.path(), &b).unwrap();
        assert_ne!(pa, pb);
        assert_eq!(std::fs::read(&pa[0]).unwrap(), b"first");
        assert_eq!(std::fs::read(&pb[0]).unwrap(), b"second");
        // The same bytes again: the same file, nothing new.
        assert_eq!(write_new(dir.path(), &a).unwrap(), pa);
        // A hash taken by other bytes: the counter.
        let name = pa[0].file_name().unwrap().to_str().unwrap().to_string();
        std::fs::write(&pa[0], b"changed").unwrap();
        let pc = write_new(dir.path(), &a).unwrap();
        assert!(
            pc[0].to_str().unwrap().ends_with("-2.safetensors"),
            "{pc:?}"
        );
        assert_eq!(std::fs::read(&pa[0]).unwrap(), b"changed", "{name}");
        // No temporary file is left.
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_pair_shares_its_name_and_a_stranger_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let files = vec![
            ("s.safetensors".to_string(), b"base".to_vec()),
            ("s-variant.safetensors".to_string(), b"variant".to_vec()),
        ];
        let p = write_new(dir.path(), &files).unwrap();
        let base = p[0].to_str().unwrap().strip_suffix(".safetensors").unwrap();
        assert_eq!(
            p[1].to_str().unwrap(),
            format!("{base}-variant.safetensors")
        );
        let bad = vec![
            ("s.safetensors".to_string(), b"base".to_vec()),
            ("t-variant.safetensors".to_string(), b"variant".to_vec()),
        ];
        assert!(matches!(
            write_new(dir.path(), &bad),
            Err(WriteError::Name(_))
        ));
    }

    #[test]
    fn shell_words_quote_what_a_shell_would_split() {
        assert_eq!(
            shell_word("fuzz-findings/a.safetensors"),
            "fuzz-findings/a.safetensors"
        );
        assert_eq!(shell_word("my dir/a b"), "'my dir/a b'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word("$(rm -rf x)"), "'$(rm -rf x)'");
        assert_eq!(shell_word(""), "''");
    }
}
