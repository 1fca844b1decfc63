//! The dump reader on random and mutated bytes, and on headers declaring
//! huge shapes: always a clean `Ok` or a typed error, never a panic, never
//! an allocation larger than the file justifies.
//!
//! One test in its own binary: the counting allocator below sees only this
//! test's allocations. Depth scales with `PROPTEST_CASES`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;

use logprobe_reference::spec::Dtype;
use logprobe_verify::dump::{serialize_dump, Dump, DumpError, DumpTensor};
use logprobe_verify::keys;
use logprobe_verify::verify::{verify_dump, VerifyConfig};

/// Counts live bytes and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Parses `bytes` and validates every row; returns the result and the peak
/// extra bytes allocated meanwhile.
fn read_measured(bytes: &[u8]) -> (Result<usize, DumpError>, usize) {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let res = (|| {
        let dump = Dump::parse(bytes)?;
        for r in 0..dump.n() {
            dump.row(r)?.validate()?;
        }
        Ok(dump.n())
    })();
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    (res, peak)
}

/// What a file of `len` bytes may make the reader allocate: the header's
/// JSON maps, `[N]`/`[N, K]` tensors widened to 8 bytes per element (at
/// most 8x their 1-byte-per-element minimum), one decoded row; plus a
/// constant for the maps' fixed costs.
fn budget(len: usize) -> usize {
    16 * len + (256 << 10)
}

fn valid_dump(n: usize, v: usize, dtype: Dtype, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let logits: Vec<f64> = (0..n * v)
        .map(|_| (next() % 2000) as f64 / 100.0 - 10.0)
        .collect();
    let tokens: Vec<i64> = (0..n).map(|_| (next() % v as u64) as i64).collect();
    let mask: Vec<bool> = (0..n * v)
        .map(|i| i % v == tokens[i / v] as usize || next() % 4 != 0)
        .collect();
    let t = vec![
        ("logits", DumpTensor::floats(dtype, &[n, v], &logits)),
        ("tokens", DumpTensor::i64s(&[n], &tokens)),
        ("sampling_mask", DumpTensor::bools(&[n, v], &mask)),
        (
            "topk_ids",
            DumpTensor::i64s(
                &[n, 2],
                &tokens.iter().flat_map(|&t| [t, 0]).collect::<Vec<_>>(),
            ),
        ),
        (
            "log_probs",
            DumpTensor::floats(Dtype::Bf16, &[n], &vec![-1.0; n]),
        ),
        (
            "entropy",
            DumpTensor::floats(Dtype::F32, &[n], &vec![1.0; n]),
        ),
        (
            "topk_log_probs",
            DumpTensor::floats(Dtype::F16, &[n, 2], &vec![-2.0; 2 * n]),
        ),
        (
            "grad_log_probs",
            DumpTensor::floats(Dtype::F32, &[n], &vec![1.0; n]),
        ),
        (
            "grad_logits",
            DumpTensor::floats(Dtype::F32, &[n, v], &vec![0.0; n * v]),
        ),
    ];
    serialize_dump(
        &t,
        &[
            (keys::TEMPERATURE.name, "0.7"),
            (keys::VOCAB_SIZE.name, &v.to_string()),
        ],
    )
    .unwrap()
}

/// A header declaring `shape` for the logits with `data` bytes of data.
fn huge_header(dtype: &str, shape: &[u64], data: usize, extra: &str) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let header = format!(
        "{{\"logits\":{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[0,{data}]}}{extra}}}",
        dims.join(",")
    );
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend(header.as_bytes());
    b.extend(std::iter::repeat_n(0u8, data));
    b
}

#[derive(Clone, Debug)]
enum Input {
    Random(Vec<u8>),
    Mutated {
        n: usize,
        v: usize,
        dtype: usize,
        seed: u64,
        edits: Vec<(usize, u8)>,
        cut: usize,
    },
    Huge {
        dtype: &'static str,
        shape: Vec<u64>,
        data: usize,
        with_candidate: bool,
    },
    HugeLength(u64, Vec<u8>),
}

impl Input {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Input::Random(b) => b.clone(),
            Input::Mutated {
                n,
                v,
                dtype,
                seed,
                edits,
                cut,
            } => {
                let mut b = valid_dump(*n, *v, Dtype::ALL[*dtype], *seed);
                let len = b.len();
                for &(i, x) in edits {
                    // Bias edits towards the header, where they matter most.
                    let i = if i % 2 == 0 {
                        8 + i % 120.min(len - 8)
                    } else {
                        i % len
                    };
                    b[i] = x;
                }
                b.truncate(len - cut % (len + 1));
                b
            }
            Input::Huge {
                dtype,
                shape,
                data,
                with_candidate,
            } => {
                let extra = if *with_candidate {
                    format!(",\"log_probs\":{{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[{data},{data}]}}")
                } else {
                    String::new()
                };
                huge_header(dtype, shape, *data, &extra)
            }
            Input::HugeLength(n, rest) => {
                let mut b = n.to_le_bytes().to_vec();
                b.extend(rest);
                b
            }
        }
    }
}

fn dim() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(3),
        Just(1 << 31),
        Just(1 << 40),
        Just(1 << 62),
        Just(u64::MAX),
        Just(usize::MAX as u64 / 2 + 1),
        0u64..100,
    ]
}

fn input() -> impl Strategy<Value = Input> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..300).prop_map(Input::Random),
        (
            1usize..4,
            1usize..9,
            0usize..4,
            any::<u64>(),
            proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6),
            prop_oneof![Just(0usize), 1usize..64]
        )
            .prop_map(|(n, v, dtype, seed, edits, cut)| Input::Mutated {
                n,
                v,
                dtype,
                seed,
                edits,
                cut
            }),
        (
            prop_oneof![
                Just("F32"),
                Just("BF16"),
                Just("F64"),
                Just("BOOL"),
                Just("F4")
            ],
            proptest::collection::vec(dim(), 0..4),
            0usize..64,
            any::<bool>()
        )
            .prop_map(|(dtype, shape, data, with_candidate)| Input::Huge {
                dtype,
                shape,
                data,
                with_candidate
            }),
        (any::<u64>(), proptest::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(n, r)| Input::HugeLength(n, r)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: ProptestConfig::default().cases.max(256), ..ProptestConfig::default() })]

    #[test]
    fn reader_never_panics_nor_overallocates(inp in input()) {
        let bytes = inp.bytes();
        let (res, peak) = read_measured(&bytes);
        prop_assert!(peak <= budget(bytes.len()), "peak {} bytes for a {}-byte file ({:?})", peak, bytes.len(), res.as_ref().err());
        match res {
            Ok(n) => {
                // A readable dump verifies to a report or a typed error, never a panic.
                if n <= 4 {
                    let dump = Dump::parse(&bytes).unwrap();
                    let _ = verify_dump(&dump, Path::new("fuzz"), &VerifyConfig::default());
                }
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}
