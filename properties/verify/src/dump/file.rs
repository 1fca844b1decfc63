//! [`DumpFile`]: the bytes of one dump, memory-mapped or owned.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::*;

/// The bytes of one dump: a read-only memory map of the file, or an owned
/// buffer (tests, generated dumps).
pub struct DumpFile {
    bytes: Bytes,
    path: Option<PathBuf>,
}

enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl DumpFile {
    /// Memory-maps `path` read-only.
    ///
    /// # Errors
    /// [`DumpError::Io`] when the file cannot be opened or mapped.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, DumpError> {
        let path = path.as_ref().to_path_buf();
        let io = |source| DumpError::Io {
            path: path.clone(),
            source,
        };
        if path.is_dir() {
            return Err(DumpError::IsDirectory { path });
        }
        let file = File::open(&path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        // A zero-length mapping is an error on some platforms: keep it owned.
        let bytes = if len == 0 {
            Bytes::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only; a file truncated or rewritten by
            // another process while we read it is outside this tool's
            // contract (as for every mmap-based safetensors reader).
            Bytes::Mapped(unsafe { memmap2::Mmap::map(&file) }.map_err(io)?)
        };
        Ok(DumpFile {
            bytes,
            path: Some(path),
        })
    }

    /// A dump held in memory (the bytes of a `.safetensors` file).
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        DumpFile {
            bytes: Bytes::Owned(bytes),
            path: None,
        }
    }

    /// The file's path, when it was opened from one.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The raw bytes.
    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }

    /// Parses and checks the dump (header, dtypes, shapes, metadata, that a
    /// candidate exists, that each candidate has the inputs it needs).
    /// Values (NaN logits, token ranges) are checked per row, on
    /// [`Dump::row`]'s result, by [`RowInputs::validate`] through the spec's
    /// `validate_row`.
    ///
    /// # Errors
    /// Every [`DumpError`] variant but `Io` and `BadMaskValue`.
    pub fn parse(&self) -> Result<Dump<'_>, DumpError> {
        Dump::parse(self.bytes())
    }
}
