//! Tensor-parallel sets (docs/dump-from-pytorch.md, "Tensor-parallel
//! ranks"): the dumps one step writes on every rank of a vocabulary-parallel
//! kernel, read as the one dump they split.
//!
//! Rank `r` of `tp_size` holds the global vocabulary columns
//! `[tp_vocab_start, tp_vocab_start + V_r)`: contiguous blocks in rank order,
//! as Megatron splits the vocabulary, uneven widths allowed. Those columns
//! of every `[.., V]` tensor (`logits`, `sampling_mask`, the soft
//! cross-entropy's teacher, `grad_logits`) and those rows of the LM head
//! (`lm_head_weight`, `lm_head_bias` and their gradients) are the rank's.
//! Every other tensor is global: an input (`tokens`, `hidden`, a cotangent)
//! is the same bytes on every rank, and an output (`loss`, `log_probs`,
//! `grad_hidden`, ...) is the all-reduced value the rank holds. A rank's
//! dump cannot be judged alone, since its global outputs depend on columns
//! it does not hold ([`TpSetError::Alone`]).
//!
//! [`TpSet::open`] checks the ranks against each other;
//! [`TpSet::assemble`] concatenates the shards in rank order (one copy of
//! the sharded tensors; the global ones are read in place) into tensors
//! that [`Dump::from_memory`](super::Dump::from_memory) parses. Ranks whose
//! global outputs differ from rank 0's are assembled each with its own copy
//! ([`TpSet::copies`]), so no rank's value goes unchecked.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use logprobe_reference::spec::{Columns, Output};
use safetensors::Dtype as StDtype;

use super::{DumpError, DumpFile, Header};
use crate::keys;
use crate::names::tensor;

/// A dump's place in a tensor-parallel set: its `tp_rank`, `tp_size` and
/// `tp_vocab_start` metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TpRank {
    /// This rank, `0 <= rank < size`.
    pub rank: u64,
    /// The ranks of the set.
    pub size: u64,
    /// The first global vocabulary column of this rank's shard.
    pub vocab_start: u64,
}

impl TpRank {
    /// The `tp_*` keys of `meta`; `None` when none is given.
    ///
    /// # Errors
    /// [`DumpError::BadMetadata`] for a value that is not an integer;
    /// [`TpSetError::Keys`] when only some of the three are given;
    /// [`TpSetError::RankOutOfRange`] when `tp_rank >= tp_size`.
    pub fn of(meta: &HashMap<String, String>) -> Result<Option<Self>, DumpError> {
        let rank = keys::TP_RANK.get(meta)?;
        let size = keys::TP_SIZE.get(meta)?;
        let vocab_start = keys::TP_VOCAB_START.get(meta)?;
        match (rank, size, vocab_start) {
            (None, None, None) => Ok(None),
            (Some(rank), Some(size), Some(vocab_start)) if rank < size => Ok(Some(TpRank {
                rank,
                size,
                vocab_start,
            })),
            (Some(rank), Some(size), Some(_)) => {
                Err(TpSetError::RankOutOfRange { rank, size }.into())
            }
            _ => Err(TpSetError::Keys.into()),
        }
    }

    /// Whether a dump with these keys is a whole problem on its own (a set
    /// of one rank holding the vocabulary from column 0).
    pub fn is_whole(&self) -> bool {
        self.size == 1 && self.vocab_start == 0
    }
}

/// Refuses one rank's dump of a set of more than one: it is judged with the
/// other ranks' dumps ([`TpSet`]), never alone.
///
/// # Errors
/// [`TpSetError::Alone`], and [`TpRank::of`]'s errors.
pub fn refuse_rank(meta: &HashMap<String, String>) -> Result<(), DumpError> {
    match TpRank::of(meta)? {
        Some(tp) if !tp.is_whole() => Err(TpSetError::Alone {
            rank: tp.rank,
            size: tp.size,
        }
        .into()),
        _ => Ok(()),
    }
}

/// What is wrong with a tensor-parallel set. Each names the file (and
/// tensor, key or element) at fault.
#[derive(Debug, thiserror::Error)]
pub enum TpSetError {
    /// Some of `tp_rank`, `tp_size` and `tp_vocab_start`, not all three.
    #[error("a tensor-parallel rank's dump needs all three of `tp_rank`, `tp_size` and `tp_vocab_start`")]
    Keys,
    /// `tp_rank >= tp_size`.
    #[error("metadata `tp_rank` = {rank} is not below `tp_size` = {size}")]
    RankOutOfRange {
        /// `tp_rank`.
        rank: u64,
        /// `tp_size`.
        size: u64,
    },
    /// One rank's dump given where a whole problem is needed (one file, or
    /// tensors in memory).
    #[error("this dump is rank {rank} of a tensor-parallel set of {size}: its all-reduced outputs depend on vocabulary columns it does not hold, so it is verified together with the other ranks' dumps (`logprobe verify` on all of their files)")]
    Alone {
        /// `tp_rank`.
        rank: u64,
        /// `tp_size`.
        size: u64,
    },
    /// Ranks of the set were not given.
    #[error("ranks {missing:?}{} of {size} are missing (given: {}){}", if (size - given.len() as u64) as usize > missing.len() { " and more" } else { "" }, list(given), others_hint(others))]
    MissingRanks {
        /// `tp_size`.
        size: u64,
        /// The first ranks not given (at most [`MISSING_LISTED`]).
        missing: Vec<u64>,
        /// The files given, in rank order.
        given: Vec<PathBuf>,
        /// Rank dumps given beside the set that did not join it (another
        /// folder, name, `tp_size` or set of tensors).
        others: Vec<PathBuf>,
    },
    /// Two files claim one rank.
    #[error("rank {rank} is given twice, by {} and {}: verify one set per run, or keep each set in a folder of its own", first.display(), second.display())]
    RankTwice {
        /// The rank.
        rank: u64,
        /// The first file.
        first: PathBuf,
        /// The second.
        second: PathBuf,
    },
    /// A rank's shard does not start where the ranks before it end.
    #[error("{}: metadata `tp_vocab_start` = {found}, but ranks 0..{rank} hold the first {expected} columns", path.display())]
    VocabStart {
        /// The file.
        path: PathBuf,
        /// Its rank.
        rank: u64,
        /// Its `tp_vocab_start`.
        found: u64,
        /// The columns of the ranks before it.
        expected: u64,
    },
    /// Neither `logits` nor `lm_head_weight`: no vocabulary to split.
    #[error("{}: a rank's dump needs `logits` or `lm_head_weight`, whose vocabulary columns are its shard", path.display())]
    NoVocabulary {
        /// The file.
        path: PathBuf,
    },
    /// A metadata value other than the `tp_*` keys differs from rank 0's.
    #[error("{}: metadata `{key}` is {}, rank 0's is {}: a set shares its metadata", path.display(), shown(found), shown(rank0))]
    Metadata {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// Its value (`None`: absent).
        found: Option<String>,
        /// Rank 0's.
        rank0: Option<String>,
    },
    /// A tensor in one rank's dump and not in another's.
    #[error("{}: tensor `{tensor}` is {} rank 0's dump: every rank gives the same tensors", path.display(), if *extra { "not in" } else { "only in" })]
    Tensors {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The tensor is in this file but not in rank 0's (else the reverse).
        extra: bool,
    },
    /// A tensor whose dtype or shape does not fit rank 0's and the shard.
    #[error("{}: tensor `{tensor}` is {found}, expected {expected}", path.display())]
    Layout {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its dtype and shape.
        found: String,
        /// What rank 0's and the rank's shard width imply.
        expected: String,
    },
    /// A global input whose bytes differ from rank 0's.
    #[error("{}: tensor `{tensor}` differs from rank 0's at element {index}: an input that is not split over the vocabulary is the same on every rank", path.display())]
    InputDiffers {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The first element (row-major) that differs.
        index: usize,
    },
    /// A rank's dump naming a weights file (`lm_head_weight_file`) or a
    /// generator (`lm_head_weight_generator`).
    #[error("{}: a rank's dump holds its shard of the LM head itself: `lm_head_weight_file` and `lm_head_weight_generator` are not read in a tensor-parallel set", path.display())]
    WeightsFile {
        /// The file.
        path: PathBuf,
    },
    /// A rank's dump is bad input on its own terms.
    #[error("{}: {source}", path.display())]
    Rank {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        source: Box<DumpError>,
    },
}

/// A metadata value as the error shows it: quoted, or `absent`.
fn shown(v: &Option<String>) -> String {
    v.as_ref()
        .map_or_else(|| "absent".into(), |v| format!("{v:?}"))
}

/// How many missing ranks [`TpSetError::MissingRanks`] lists.
pub const MISSING_LISTED: usize = 8;

fn others_hint(others: &[PathBuf]) -> String {
    if others.is_empty() {
        return String::new();
    }
    format!(
        "; rank dumps given beside it that are not in this set: {} (a set's files share a folder, `tp_size` and tensors, and their names differ only in the rank number, which is their `tp_rank`)",
        list(others)
    )
}

fn list(paths: &[PathBuf]) -> String {
    let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    names.join(", ")
}

/// The axis of `name`'s tensor that is split over the vocabulary, if any:
/// the last of a `[.., V]` tensor, the first of the LM head's.
fn vocab_axis(name: &str, ndim: usize) -> Option<usize> {
    let last = ndim.checked_sub(1);
    match name {
        tensor::LOGITS
        | tensor::SAMPLING_MASK
        | tensor::TEACHER_PROBS
        | tensor::TEACHER_LOG_PROBS => last,
        tensor::LM_HEAD_WEIGHT
        | tensor::LM_HEAD_BIAS
        | tensor::GRAD_LM_HEAD_WEIGHT
        | tensor::GRAD_LM_HEAD_BIAS => Some(0),
        _ => Output::ALL
            .iter()
            .any(|o| o.name() == name && o.columns() == Columns::Vocabulary)
            .then_some(last)
            .flatten(),
    }
}

/// Whether `name` is a candidate output (judged), rather than an input.
fn is_output(name: &str) -> bool {
    name == tensor::GRAD_HIDDEN || Output::ALL.iter().any(|o| o.name() == name)
}

/// Which set a file belongs to: its folder, its name without the rank
/// ([`name_without_rank`]), `tp_size` and its tensor names.
type SetKey = (PathBuf, String, u64, Vec<String>);

/// The set `path` belongs to, from its header alone; `None` for a file
/// without `tp_*` keys, one whose header does not read (verified alone, it
/// reports its own error), and anything but a regular file.
fn set_key(path: &Path) -> Option<SetKey> {
    // Only regular files: a pipe or FIFO is read once, by its own verify.
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return None;
    }
    let (meta, names) = read_header(path)?;
    let tp = TpRank::of(&meta).ok()??;
    // The folder as the file system names it (`./d/x`, `d//x` and `/abs/d/x`
    // are one folder).
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let dir = std::fs::canonicalize(if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        &dir
    })
    .unwrap_or(dir);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Some((dir, name_without_rank(&name, tp.rank), tp.size, names))
}

/// The largest safetensors header [`read_header`] reads (safetensors'
/// own limit).
const MAX_HEADER: u64 = 100_000_000;

/// The `__metadata__` and the sorted tensor names of the safetensors file
/// at `path`, from its header alone (the data is not read: grouping costs
/// a few kB per file, whatever the dump's size); `None` when the header
/// does not read (verified alone, the file reports its own error).
fn read_header(path: &Path) -> Option<(HashMap<String, String>, Vec<String>)> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).ok()?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).ok()?;
    let len = u64::from_le_bytes(len);
    if len > MAX_HEADER {
        return None;
    }
    let mut text = vec![0u8; len as usize];
    file.read_exact(&mut text).ok()?;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&text).ok()?;
    let mut meta = HashMap::new();
    let mut names = Vec::new();
    for (k, v) in header {
        if k == "__metadata__" {
            for (mk, mv) in v.as_object()? {
                meta.insert(mk.clone(), mv.as_str()?.to_string());
            }
        } else {
            names.push(k);
        }
    }
    names.sort_unstable();
    Some((meta, names))
}

/// `name` with its last run of digits that spells `rank` removed
/// (`loss_rank3_step13.safetensors` at rank 3: `loss_rank_step13.safetensors`),
/// so the ranks of one set, named alike, share it; unchanged when no run
/// spells it.
pub fn name_without_rank(name: &str, rank: u64) -> String {
    let rank = rank.to_string();
    let b = name.as_bytes();
    let mut runs = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let j = i + b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
        if j > i {
            runs.push((i, j));
            i = j;
        } else {
            i += 1;
        }
    }
    // A run of leading zeros (`rank03`) spells the rank too.
    match runs.iter().rev().find(|(i, j)| {
        let run = name[*i..*j].trim_start_matches('0');
        run == rank || (run.is_empty() && rank == "0")
    }) {
        Some(&(i, j)) => format!("{}{}", &name[..i], &name[j..]),
        None => name.to_string(),
    }
}

/// How `logprobe verify` takes its paths: alone, or as tensor-parallel sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Planned {
    /// A dump verified alone.
    One(PathBuf),
    /// The files of one set (given order).
    Set(Vec<PathBuf>),
}

/// Groups `paths` (in the order each group's first file appears): files
/// with `tp_*` keys in one folder whose names differ only in the rank
/// (`ce_rank0.safetensors`, `ce_rank1.safetensors`), with one `tp_size`
/// and the same tensor names, form a set.
pub fn plan(paths: &[PathBuf]) -> Vec<Planned> {
    let mut out = Vec::new();
    let mut sets: HashMap<SetKey, usize> = HashMap::new();
    for p in paths {
        match set_key(p) {
            Some(key) => match sets.get(&key) {
                Some(&i) => {
                    if let Planned::Set(v) = &mut out[i] {
                        v.push(p.clone());
                    }
                }
                None => {
                    sets.insert(key, out.len());
                    out.push(Planned::Set(vec![p.clone()]));
                }
            },
            None => out.push(Planned::One(p.clone())),
        }
    }
    out
}

/// One rank's dump.
struct RankDump<'a> {
    path: PathBuf,
    tp: TpRank,
    header: Header<'a>,
    /// Its vocabulary columns.
    width: usize,
}

/// The checked ranks of one set, in rank order.
pub struct TpSet<'a> {
    ranks: Vec<RankDump<'a>>,
    /// Rank 0's tensor names, sorted.
    names: Vec<String>,
}

/// Tensors assembled from a set: name, dtype, shape, bytes.
pub type Assembled<'a> = Vec<(String, StDtype, Vec<usize>, Cow<'a, [u8]>)>;

fn in_rank(path: &Path, e: DumpError) -> DumpError {
    TpSetError::Rank {
        path: path.to_path_buf(),
        source: Box::new(e),
    }
    .into()
}

fn layout(dtype: StDtype, shape: &[usize]) -> String {
    format!("{dtype:?} {shape:?}")
}

impl<'a> TpSet<'a> {
    /// Reads and checks the ranks of one set: each rank once, shards
    /// contiguous in rank order, the same metadata (but for `tp_rank` and
    /// `tp_vocab_start`), tensors, dtypes and shapes (but for the shard's
    /// width), and the same bytes for every global input.
    ///
    /// # Errors
    /// [`TpSetError`] naming the file, tensor or key at fault, or a rank's
    /// own [`DumpError`] ([`TpSetError::Rank`]).
    pub fn open(files: &'a [(PathBuf, DumpFile)]) -> Result<Self, DumpError> {
        let mut ranks: Vec<RankDump<'a>> = Vec::with_capacity(files.len());
        for (path, file) in files {
            let header = Header::read(file.bytes()).map_err(|e| in_rank(path, e))?;
            if header.meta.contains_key(keys::LM_HEAD_WEIGHT_FILE.name)
                || header
                    .meta
                    .contains_key(keys::LM_HEAD_WEIGHT_GENERATOR.name)
            {
                return Err(TpSetError::WeightsFile { path: path.clone() }.into());
            }
            let tp = TpRank::of(&header.meta)
                .map_err(|e| in_rank(path, e))?
                .ok_or_else(|| in_rank(path, TpSetError::Keys.into()))?;
            let width = match (
                header.st.tensor(tensor::LOGITS),
                header.st.tensor(tensor::LM_HEAD_WEIGHT),
            ) {
                (Some(l), _) => l.shape().last().copied(),
                (None, Some(w)) => w.shape().first().copied(),
                (None, None) => None,
            }
            .ok_or_else(|| TpSetError::NoVocabulary { path: path.clone() })?;
            if let Some(other) = ranks.iter().find(|r| r.tp.rank == tp.rank) {
                return Err(TpSetError::RankTwice {
                    rank: tp.rank,
                    first: other.path.clone(),
                    second: path.clone(),
                }
                .into());
            }
            ranks.push(RankDump {
                path: path.clone(),
                tp,
                header,
                width,
            });
        }
        ranks.sort_by_key(|r| r.tp.rank);
        let size = ranks.first().map_or(0, |r| r.tp.size);
        // The first few missing ranks (`tp_size` may be huge: never
        // enumerated past them).
        let missing: Vec<u64> = (0..size)
            .filter(|k| ranks.iter().all(|r| r.tp.rank != *k))
            .take(MISSING_LISTED)
            .collect();
        if !missing.is_empty() {
            return Err(TpSetError::MissingRanks {
                size,
                missing,
                given: ranks.iter().map(|r| r.path.clone()).collect(),
                others: Vec::new(),
            }
            .into());
        }
        let names = ranks[0]
            .header
            .st
            .names()
            .into_iter()
            .map(String::from)
            .collect();
        let set = TpSet { ranks, names };
        let mut start = 0u64;
        for r in &set.ranks {
            if r.tp.vocab_start != start {
                return Err(TpSetError::VocabStart {
                    path: r.path.clone(),
                    rank: r.tp.rank,
                    found: r.tp.vocab_start,
                    expected: start,
                }
                .into());
            }
            start += r.width as u64;
            set.check_against_rank0(r)?;
        }
        Ok(set)
    }

    fn check_against_rank0(&self, r: &RankDump<'a>) -> Result<(), DumpError> {
        let r0 = &self.ranks[0];
        let tp_keys = [keys::TP_RANK.name, keys::TP_VOCAB_START.name];
        for key in r.header.meta.keys().chain(r0.header.meta.keys()) {
            let (found, rank0) = (r.header.meta.get(key), r0.header.meta.get(key));
            if !tp_keys.contains(&key.as_str()) && found != rank0 {
                return Err(TpSetError::Metadata {
                    path: r.path.clone(),
                    key: key.clone(),
                    found: found.cloned(),
                    rank0: rank0.cloned(),
                }
                .into());
            }
        }
        let names = r.header.st.names();
        if let Some(n) = names.iter().find(|n| !self.names.iter().any(|m| m == *n)) {
            return Err(self.tensors_error(r, n, true));
        }
        if let Some(n) = self.names.iter().find(|m| !names.contains(&m.as_str())) {
            return Err(self.tensors_error(r, n, false));
        }
        for name in &self.names {
            let (t, t0) = (self.view(r, name), self.view(r0, name));
            let mut expected = t0.shape().to_vec();
            if let Some(a) = vocab_axis(name, expected.len()) {
                expected[a] = r.width;
            }
            if t.dtype() != t0.dtype() || t.shape() != expected.as_slice() {
                return Err(TpSetError::Layout {
                    path: r.path.clone(),
                    tensor: name.clone(),
                    found: layout(t.dtype(), t.shape()),
                    expected: layout(t0.dtype(), &expected),
                }
                .into());
            }
            let global_input = vocab_axis(name, expected.len()).is_none() && !is_output(name);
            if global_input && t.data() != t0.data() {
                let size = (t.dtype().bitsize() / 8).max(1);
                let byte = t
                    .data()
                    .iter()
                    .zip(t0.data())
                    .take_while(|(a, b)| a == b)
                    .count();
                return Err(TpSetError::InputDiffers {
                    path: r.path.clone(),
                    tensor: name.clone(),
                    index: byte / size,
                }
                .into());
            }
        }
        Ok(())
    }

    fn tensors_error(&self, r: &RankDump<'a>, name: &str, extra: bool) -> DumpError {
        TpSetError::Tensors {
            path: r.path.clone(),
            tensor: name.to_string(),
            extra,
        }
        .into()
    }

    fn view(&self, r: &RankDump<'a>, name: &str) -> safetensors::tensor::TensorView<'a> {
        r.header
            .st
            .tensor(name)
            .expect("every rank holds rank 0's tensors (checked)")
    }

    /// The files, in rank order.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.ranks.iter().map(|r| r.path.clone()).collect()
    }

    /// The distinct copies of the global outputs: each a list of the ranks
    /// holding it (bit for bit), the first list rank 0's. Judging one rank
    /// of each list judges every rank's values.
    pub fn copies(&self) -> Vec<Vec<u64>> {
        let outputs: Vec<&String> = self
            .names
            .iter()
            .filter(|n| {
                is_output(n) && vocab_axis(n, self.view(&self.ranks[0], n).shape().len()).is_none()
            })
            .collect();
        let mut copies: Vec<Vec<u64>> = Vec::new();
        for (i, r) in self.ranks.iter().enumerate() {
            let same = |c: &Vec<u64>| {
                let rep = &self.ranks[c[0] as usize];
                outputs
                    .iter()
                    .all(|n| self.view(rep, n).data() == self.view(r, n).data())
            };
            match copies.iter_mut().find(|c| same(c)) {
                Some(c) => c.push(i as u64),
                None => copies.push(vec![i as u64]),
            }
        }
        copies
    }

    /// The file of `rank`.
    pub fn path(&self, rank: u64) -> &Path {
        &self.ranks[rank as usize].path
    }

    /// The whole dump the set splits, with `rank`'s copy of the global
    /// outputs: every sharded tensor concatenated along its vocabulary axis
    /// in rank order (copied), every global one read in place, and rank 0's
    /// metadata without the `tp_*` keys.
    pub fn assemble(&self, rank: u64) -> (Assembled<'a>, HashMap<String, String>) {
        let rep = &self.ranks[rank as usize];
        let mut out: Assembled<'a> = Vec::with_capacity(self.names.len());
        for name in &self.names {
            let t0 = self.view(&self.ranks[0], name);
            let (dtype, mut shape) = (t0.dtype(), t0.shape().to_vec());
            let Some(axis) = vocab_axis(name, shape.len()) else {
                let from = if is_output(name) { rep } else { &self.ranks[0] };
                out.push((
                    name.clone(),
                    dtype,
                    shape,
                    Cow::Borrowed(self.view(from, name).data()),
                ));
                continue;
            };
            shape[axis] = self.ranks.iter().map(|r| r.width).sum();
            let elem = (dtype.bitsize() / 8).max(1);
            let inner: usize = shape[axis + 1..].iter().product::<usize>() * elem;
            let outer: usize = shape[..axis].iter().product();
            let mut bytes = Vec::with_capacity(outer * shape[axis] * inner);
            for o in 0..outer {
                for r in &self.ranks {
                    let block = r.width * inner;
                    bytes.extend_from_slice(&self.view(r, name).data()[o * block..(o + 1) * block]);
                }
            }
            out.push((name.clone(), dtype, shape, Cow::Owned(bytes)));
        }
        let mut meta = self.ranks[0].header.meta.clone();
        for k in [
            keys::TP_RANK.name,
            keys::TP_SIZE.name,
            keys::TP_VOCAB_START.name,
        ] {
            meta.remove(k);
        }
        (out, meta)
    }
}
