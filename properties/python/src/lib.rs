//! `logprobe._native`: the Rust half of the `logprobe` Python package.
//!
//! Tensors come in through DLPack ([`import`]), are judged by
//! `logprobe-verify` ([`logprobe_verify::tensors::verify_tensors`]: the dump
//! reader and verify engine of `logprobe verify`) with the GIL released, and
//! go back as the report's JSON (the `verify --json` layout of one file)
//! and its table (the CLI's). The Python layer (`python/logprobe`) turns
//! torch / numpy / ml_dtypes inputs into DLPack producers and the JSON into
//! a `Report`.

mod fuzz;
mod fuzz_linear;
mod import;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use logprobe_reference::spec::Dtype;
use logprobe_verify::names::{closest, Kind, NAMES};
use logprobe_verify::tensors::{keyword_names, to_dump_bytes, verify_tensors, TensorBytes};
use logprobe_verify::tolerance::{Order, DEFAULT_C};
use logprobe_verify::verify::{
    render_table, verify_file as verify_path, FileOutcome, FileReport, RowSelection, VerifyConfig,
};

pyo3::create_exception!(
    logprobe,
    BadInputError,
    PyValueError,
    "Bad input: a tensor, shape, dtype, metadata value or row that cannot be verified. \
     The message names the tensor (and row / column), as `logprobe verify` does for a dump."
);

/// Settings of one verification, from the Python keywords.
fn config(
    model: &str,
    accumulation: Option<&str>,
    rows: Option<&str>,
    worst: usize,
    statistical_c: Option<f64>,
    (form, k3_form): (&str, &str),
) -> PyResult<VerifyConfig> {
    let model: Order = model
        .parse()
        .map_err(|e: String| PyValueError::new_err(format!("model={model:?}: {e}")))?;
    let form: logprobe_reference::spec::Shift = form
        .parse()
        .map_err(|e: String| PyValueError::new_err(format!("form={form:?}: {e}")))?;
    let k3_form: logprobe_verify::tolerance::K3Form = k3_form
        .parse()
        .map_err(|e: String| PyValueError::new_err(format!("k3_form={k3_form:?}: {e}")))?;
    let accumulation = accumulation
        .map(|a| {
            Dtype::ALL
                .into_iter()
                .find(|d| d.name() == a.trim())
                .ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "accumulation={a:?}: expected \"f64\", \"f32\", \"bf16\" or \"f16\""
                    ))
                })
        })
        .transpose()?;
    let rows = match rows {
        None => RowSelection::All,
        Some(s) => s
            .parse()
            .map_err(|e: String| PyValueError::new_err(e.replace("--rows", "rows=")))?,
    };
    if let Some(c) = statistical_c {
        if !(c.is_finite() && c >= 0.0) {
            return Err(PyValueError::new_err(format!(
                "statistical_c={c}: a number >= 0, or None (no SUSPECT tier)"
            )));
        }
    }
    Ok(VerifyConfig {
        model,
        form,
        k3_form,
        accumulation,
        rows,
        worst,
        progress: false,
        statistical_c,
        ..VerifyConfig::default()
    })
}

fn report_out(report: &FileReport) -> PyResult<(String, String)> {
    let json = serde_json::to_string(report)
        .map_err(|e| PyValueError::new_err(format!("cannot serialise the report: {e}")))?;
    Ok((json, render_table(report)))
}

/// Verifies named tensors and metadata (see `logprobe.verify`).
///
/// `tensors`: `(name, producer, dtype16, explicit)`, the producer an object
/// with `__dlpack__` on the CPU, `dtype16` `"bfloat16"` / `"float16"` for a
/// uint16 array holding those bits. `metadata`: `(key, value)` strings as a
/// dump's `__metadata__` holds them. Returns `(json, table)`.
///
/// # Errors
/// `BadInputError` (a `ValueError`) naming tensor, row and column;
/// `ValueError` for a bad `model` / `rows` / `accumulation`.
#[pyfunction]
#[pyo3(signature = (tensors, metadata, *, name, model, accumulation=None, rows=None, worst=3, statistical_c=Some(DEFAULT_C), form="any", k3_form="any"))]
#[allow(clippy::too_many_arguments)]
fn verify(
    py: Python<'_>,
    tensors: Vec<(String, Bound<'_, PyAny>, Option<String>, bool)>,
    metadata: Vec<(String, String)>,
    name: String,
    model: &str,
    accumulation: Option<&str>,
    rows: Option<&str>,
    worst: usize,
    statistical_c: Option<f64>,
    form: &str,
    k3_form: &str,
) -> PyResult<(String, String)> {
    let config = config(
        model,
        accumulation,
        rows,
        worst,
        statistical_c,
        (form, k3_form),
    )?;
    let imported = import_side(&tensors)?;
    let views = views(&imported);
    let meta: Vec<(&str, &str)> = metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let result = py.detach(|| verify_tensors(&views, &meta, &name, &config));
    drop(views);
    drop(imported);
    match result {
        Ok(r) => report_out(&r),
        Err(e) => Err(BadInputError::new_err(e.to_string())),
    }
}

/// Verifies a dump file with the library call `logprobe verify` makes
/// (`logprobe_verify::verify::verify_file`); same keywords as `verify`.
/// Returns `(json, table)`.
///
/// # Errors
/// As `verify`.
#[pyfunction]
#[pyo3(signature = (path, *, model, accumulation=None, rows=None, worst=3, statistical_c=Some(DEFAULT_C), form="any", k3_form="any"))]
#[allow(clippy::too_many_arguments)]
fn verify_file(
    py: Python<'_>,
    path: std::path::PathBuf,
    model: &str,
    accumulation: Option<&str>,
    rows: Option<&str>,
    worst: usize,
    statistical_c: Option<f64>,
    form: &str,
    k3_form: &str,
) -> PyResult<(String, String)> {
    let config = config(
        model,
        accumulation,
        rows,
        worst,
        statistical_c,
        (form, k3_form),
    )?;
    match py.detach(|| verify_path(&path, &config)) {
        Ok(r) => report_out(&r),
        Err(e) => Err(BadInputError::new_err(e.to_string())),
    }
}

/// Verifies dump files with the library call `logprobe verify FILE...`
/// makes (`logprobe_verify::verify::verify_files`): the files of one
/// tensor-parallel set (`tp_rank`, `tp_size`, `tp_vocab_start`) are judged
/// as one dump. Same keywords as `verify`. Returns one `(json, table)` per
/// report, in the order of the files.
///
/// # Errors
/// `BadInputError` for the first file (or set) that is bad input, naming
/// it; `ValueError` for a bad keyword value.
#[pyfunction]
#[pyo3(signature = (paths, *, model, accumulation=None, rows=None, worst=3, statistical_c=Some(DEFAULT_C), form="any", k3_form="any"))]
#[allow(clippy::too_many_arguments)]
fn verify_files(
    py: Python<'_>,
    paths: Vec<std::path::PathBuf>,
    model: &str,
    accumulation: Option<&str>,
    rows: Option<&str>,
    worst: usize,
    statistical_c: Option<f64>,
    form: &str,
    k3_form: &str,
) -> PyResult<Vec<(String, String)>> {
    let config = config(
        model,
        accumulation,
        rows,
        worst,
        statistical_c,
        (form, k3_form),
    )?;
    py.detach(|| logprobe_verify::verify::verify_files(&paths, &config))
        .iter()
        .map(|o| match o {
            FileOutcome::Report(r) => report_out(r),
            FileOutcome::BadInput { path, error } => Err(BadInputError::new_err(format!(
                "{}: {error}",
                path.display()
            ))),
        })
        .collect()
}

/// Imports one side's tensors (see `verify`).
/// The bytes of a dump holding the tensors and metadata (as `verify` takes
/// them): `logprobe.save_dump` writes them, and `logprobe verify` judges the
/// file as `verify` judged the tensors.
///
/// # Errors
/// `BadInputError` for a tensor that cannot be imported, a name given twice
/// or unknown, a bad format option.
#[pyfunction]
fn dump_bytes<'py>(
    py: Python<'py>,
    tensors: Vec<(String, Bound<'py, PyAny>, Option<String>, bool)>,
    metadata: Vec<(String, String)>,
) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
    let imported = import_side(&tensors)?;
    let views = views(&imported);
    let meta: Vec<(&str, &str)> = metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let bytes = py
        .detach(|| to_dump_bytes(&views, &meta))
        .map_err(|e| BadInputError::new_err(e.to_string()))?;
    Ok(pyo3::types::PyBytes::new(py, &bytes))
}

/// The generated bytes and the metadata pairs naming them.
type Generated<'py> = (Bound<'py, pyo3::types::PyByteArray>, Vec<(String, String)>);

/// `logprobe.generate_weights`' native half: the generated `lm_head_weight`
/// `[v, h]` as little-endian bytes and the metadata pairs naming it
/// (docs/dump-from-pytorch.md, "Generated weights"; the algorithm in
/// `logprobe_verify::dump::weights_generator`).
///
/// # Errors
/// `ValueError` for a bad distribution, scale or dtype, or a shape larger
/// than this machine's memory.
#[pyfunction]
fn generate_weights<'py>(
    py: Python<'py>,
    distribution: &str,
    seed: u64,
    scale: f64,
    v: usize,
    h: usize,
    dtype: &str,
) -> PyResult<Generated<'py>> {
    use logprobe_verify::dump::weights_generator::WeightsGenerator;
    use logprobe_verify::keys;
    let meta: std::collections::HashMap<String, String> = [
        (
            keys::LM_HEAD_WEIGHT_GENERATOR.name,
            distribution.to_string(),
        ),
        (keys::LM_HEAD_WEIGHT_SEED.name, seed.to_string()),
        (keys::LM_HEAD_WEIGHT_SCALE.name, keys::write_f64(scale)),
        (keys::LM_HEAD_WEIGHT_SHAPE.name, format!("{v},{h}")),
        (keys::LM_HEAD_WEIGHT_DTYPE.name, dtype.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let value_error =
        |e: &dyn std::fmt::Display| pyo3::exceptions::PyValueError::new_err(e.to_string());
    let generator = WeightsGenerator::of_meta(&meta)
        .map_err(|e| value_error(&e))?
        .expect("the generator key is given");
    let bytes = py
        .detach(|| generator.generate())
        .map_err(|e| value_error(&e))?;
    let pairs = generator
        .metadata(&bytes)
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    Ok((pyo3::types::PyByteArray::new(py, &bytes), pairs))
}

fn import_side(
    tensors: &[(String, Bound<'_, PyAny>, Option<String>, bool)],
) -> PyResult<Vec<import::Imported>> {
    let mut imported = Vec::with_capacity(tensors.len());
    for (tname, obj, dtype16, explicit) in tensors {
        let d16 = dtype16.as_deref().map(import::parse_dtype16).transpose()?;
        imported.push(import::import(tname, obj, d16, *explicit)?);
    }
    Ok(imported)
}

fn views(imported: &[import::Imported]) -> Vec<(&str, TensorBytes<'_>)> {
    imported
        .iter()
        .map(|t| {
            (
                t.name.as_str(),
                TensorBytes {
                    dtype: t.dtype,
                    shape: &t.shape,
                    data: t.bytes(),
                },
            )
        })
        .collect()
}

/// Compares two sides given as tensors and metadata (see
/// `logprobe.compare`; each side as `verify` takes its tensors) with
/// `logprobe_verify::compare::compare_tensors`, the engine of `logprobe
/// compare`. Returns `(json, table)`: the `compare --json` document and the
/// CLI's table.
///
/// # Errors
/// `BadInputError` naming the side, tensor and row; `ValueError` for a bad
/// `model` / `rows` / `accumulation` / `clip`.
#[pyfunction]
#[pyo3(signature = (a_tensors, a_metadata, b_tensors, b_metadata, *, name_a, name_b, model, clip=0.2, kl=true, accumulation=None, rows=None, worst=5))]
#[allow(clippy::too_many_arguments)]
fn compare(
    py: Python<'_>,
    a_tensors: Vec<(String, Bound<'_, PyAny>, Option<String>, bool)>,
    a_metadata: Vec<(String, String)>,
    b_tensors: Vec<(String, Bound<'_, PyAny>, Option<String>, bool)>,
    b_metadata: Vec<(String, String)>,
    name_a: String,
    name_b: String,
    model: &str,
    clip: f64,
    kl: bool,
    accumulation: Option<&str>,
    rows: Option<&str>,
    worst: usize,
) -> PyResult<(String, String)> {
    use logprobe_verify::compare::{compare_tensors, render_table as compare_table, CompareConfig};
    if !(clip.is_finite() && clip > 0.0 && clip < 1.0) {
        return Err(PyValueError::new_err(format!(
            "clip={clip}: the PPO clip range eps, in (0, 1)"
        )));
    }
    let verify = config(
        model,
        accumulation,
        rows,
        1,
        Some(DEFAULT_C),
        ("any", "any"),
    )?;
    let cfg = CompareConfig {
        rows: verify.rows,
        clip,
        kl,
        worst,
        verify,
    };
    let (ia, ib) = (import_side(&a_tensors)?, import_side(&b_tensors)?);
    let (va, vb) = (views(&ia), views(&ib));
    fn pairs(m: &[(String, String)]) -> Vec<(&str, &str)> {
        m.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
    }
    let (ma, mb) = (pairs(&a_metadata), pairs(&b_metadata));
    let result = py.detach(|| compare_tensors((&va, &ma), (&vb, &mb), &name_a, &name_b, &cfg));
    match result {
        Ok(r) => {
            let json = serde_json::to_string(&r)
                .map_err(|e| PyValueError::new_err(format!("cannot serialise the report: {e}")))?;
            Ok((json, compare_table(&r)))
        }
        Err(e) => Err(BadInputError::new_err(e.to_string())),
    }
}

/// The closest keyword (tensor or metadata name of the table) to `name`,
/// or `None`.
#[pyfunction]
fn closest_name(name: &str) -> Option<&'static str> {
    closest(name, Kind::Tensor, NAMES).or_else(|| closest(name, Kind::Meta, NAMES))
}

/// What the table says of `name`: `("tensor" | "metadata", built)`, or
/// `None` when it is not in the table (`built` is false for a version-2
/// name reserved but not supported yet).
#[pyfunction]
fn name_kind(name: &str) -> Option<(&'static str, bool)> {
    NAMES.iter().find(|n| n.name == name).map(|n| {
        let kind = match n.kind {
            Kind::Tensor => "tensor",
            Kind::Meta => "metadata",
        };
        (kind, n.built)
    })
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(verify, m)?)?;
    m.add_function(wrap_pyfunction!(verify_file, m)?)?;
    m.add_function(wrap_pyfunction!(verify_files, m)?)?;
    m.add_function(wrap_pyfunction!(compare, m)?)?;
    m.add_function(wrap_pyfunction!(dump_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(generate_weights, m)?)?;
    m.add_function(wrap_pyfunction!(closest_name, m)?)?;
    m.add_function(wrap_pyfunction!(name_kind, m)?)?;
    fuzz::register(m)?;
    m.add("BadInputError", m.py().get_type::<BadInputError>())?;
    m.add(
        "TENSOR_KEYWORDS",
        keyword_names(Kind::Tensor).collect::<Vec<_>>(),
    )?;
    m.add(
        "METADATA_KEYWORDS",
        keyword_names(Kind::Meta).collect::<Vec<_>>(),
    )?;
    m.add("DEFAULT_STATISTICAL_C", DEFAULT_C)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
