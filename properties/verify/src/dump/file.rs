//! [`DumpFile`]: the bytes of one dump, read from a file or a stream, or
//! owned.
//!
//! A file is read, not memory-mapped: a dump truncated by another process
//! while it is read is then a short read (reported by the parser as a
//! truncated file), never a SIGBUS. A regular file is read in one buffer of
//! its size (peak memory: the file's bytes). A FIFO, a pipe or a process
//! substitution (`verify <(cat d.safetensors)`) is read as a stream: its
//! header first, then exactly the data the header declares (and one byte
//! more, to report trailing bytes), each wait for data bounded by
//! [`STREAM_IDLE_TIMEOUT`], so a FIFO that no process writes is an error
//! after that time, never a block.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;

/// Longest wait for the next bytes of a stream (a FIFO without a writer,
/// a writer that stalls): then [`DumpError::Io`] with `TimedOut`.
pub const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// safetensors' limit on the JSON header (bytes); a longer one is
/// malformed before it is read.
const MAX_HEADER: u64 = 100_000_000;

/// The bytes of one dump: read from a file or stream, or given (tests,
/// generated dumps).
pub struct DumpFile {
    bytes: Vec<u8>,
    path: Option<PathBuf>,
}

impl DumpFile {
    /// Reads `path`: a regular file whole, anything else (FIFO, pipe,
    /// `/dev/fd/N`, character device) as a stream bounded by its header
    /// (see the module docs).
    ///
    /// # Errors
    /// [`DumpError::IsDirectory`]; [`DumpError::Io`] when the file cannot
    /// be opened or read, when its size cannot be allocated, or when a
    /// stream sends nothing for [`STREAM_IDLE_TIMEOUT`];
    /// [`DumpError::Malformed`] for a stream whose header length exceeds
    /// safetensors' 100 MB limit.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, DumpError> {
        let path = path.as_ref().to_path_buf();
        let io = |source| DumpError::Io {
            path: path.clone(),
            source,
        };
        if path.is_dir() {
            return Err(DumpError::IsDirectory { path });
        }
        // Non-blocking: opening a FIFO that no process writes returns at
        // once (a blocking open would wait for a writer forever).
        let mut file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        let bytes = if meta.file_type().is_file() {
            read_regular(&mut file, meta.len()).map_err(io)?
        } else {
            read_stream(&mut file, &path)?
        };
        Ok(DumpFile {
            bytes,
            path: Some(path),
        })
    }

    /// A dump held in memory (the bytes of a `.safetensors` file).
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        DumpFile { bytes, path: None }
    }

    /// The file's path, when it was opened from one.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The raw bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
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

fn no_memory(bytes: u64) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::OutOfMemory,
        format!("cannot allocate {bytes} bytes to read it"),
    )
}

/// A regular file of `len` bytes, read into one buffer of that size. A
/// file truncated meanwhile gives fewer bytes; one that grows, its first
/// `len`.
fn read_regular(file: &mut File, len: u64) -> std::io::Result<Vec<u8>> {
    let cap = usize::try_from(len).map_err(|_| no_memory(len))?;
    let mut v = Vec::new();
    v.try_reserve_exact(cap).map_err(|_| no_memory(len))?;
    // A regular file never returns WouldBlock: O_NONBLOCK has no effect.
    file.take(len).read_to_end(&mut v)?;
    Ok(v)
}

/// Waits until `file` has bytes to read (or its writer has closed it).
fn wait_readable(file: &File, path: &Path) -> Result<(), DumpError> {
    let mut fd = libc::pollfd {
        fd: file.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = STREAM_IDLE_TIMEOUT.as_millis() as libc::c_int;
    loop {
        // SAFETY: one valid pollfd for the duration of the call.
        let r = unsafe { libc::poll(&mut fd, 1, ms) };
        match r {
            0 => {
                return Err(DumpError::Io {
                    path: path.to_path_buf(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "a stream (FIFO or pipe) that sent no data for {} s: no process is writing it",
                            STREAM_IDLE_TIMEOUT.as_secs()
                        ),
                    ),
                })
            }
            r if r > 0 => return Ok(()),
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(DumpError::Io {
                        path: path.to_path_buf(),
                        source: e,
                    });
                }
            }
        }
    }
}

/// Appends up to `want` bytes of the stream to `v` (fewer at its end).
/// Returns whether the stream ended.
fn read_some(file: &mut File, path: &Path, v: &mut Vec<u8>, want: u64) -> Result<bool, DumpError> {
    let io = |source| DumpError::Io {
        path: path.to_path_buf(),
        source,
    };
    let target = (v.len() as u64).saturating_add(want);
    let mut chunk = vec![0u8; 1 << 16];
    while (v.len() as u64) < target {
        wait_readable(file, path)?;
        let room = (target - v.len() as u64).min(chunk.len() as u64) as usize;
        match file.read(&mut chunk[..room]) {
            Ok(0) => return Ok(true),
            Ok(k) => {
                // Geometric growth, bounded by what the stream declared.
                if v.capacity() - v.len() < k {
                    let left = target - v.len() as u64;
                    let grow = left.min((v.len() as u64).max(1 << 20)).max(k as u64);
                    v.try_reserve_exact(grow as usize)
                        .map_err(|_| io(no_memory(grow)))?;
                }
                v.extend_from_slice(&chunk[..k]);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(io(e)),
        }
    }
    Ok(false)
}

/// The data bytes a safetensors header declares: the largest end offset.
/// `None` for a header that is not such JSON (the parser says why).
fn declared_data(header: &[u8]) -> Option<u64> {
    let h: serde_json::Value = serde_json::from_slice(header).ok()?;
    Some(
        h.as_object()?
            .iter()
            .filter_map(|(_, info)| info.get("data_offsets")?.get(1)?.as_u64())
            .max()
            .unwrap_or(0),
    )
}

/// A stream: the 8-byte header length, the header, the data it declares
/// and one byte more (trailing bytes are then reported by the parser).
fn read_stream(file: &mut File, path: &Path) -> Result<Vec<u8>, DumpError> {
    let mut v = Vec::new();
    if read_some(file, path, &mut v, 8)? {
        return Ok(v);
    }
    let n = u64::from_le_bytes(v[..8].try_into().expect("8 bytes read"));
    if n > MAX_HEADER {
        return Err(DumpError::Malformed {
            reason: format!(
                "the header length field declares {n} bytes, more than safetensors' limit of {MAX_HEADER}"
            ),
        });
    }
    if read_some(file, path, &mut v, n)? {
        return Ok(v);
    }
    let Some(data) = declared_data(&v[8..]) else {
        return Ok(v);
    };
    if read_some(file, path, &mut v, data)? {
        return Ok(v);
    }
    // One byte past the declared data: present only in a malformed stream.
    // A writer that holds the stream open without sending more is done.
    match read_some(file, path, &mut v, 1) {
        Err(DumpError::Io { source, .. }) if source.kind() == std::io::ErrorKind::TimedOut => {}
        r => {
            r?;
        }
    }
    Ok(v)
}
