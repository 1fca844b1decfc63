//! Feature `cuda-host`: compiles `kernels/cuda/*.cu` for the host.
//!
//! Each `.cu` module becomes one C++ translation unit, exactly as NVRTC sees
//! it (`common.cuh`, then `// ---- <name>.cu`, then the file:
//! `source::program_text`), preceded by `cuda/host/lp_host.h` (what CUDA
//! gives a kernel) and wrapped in a namespace per build. Kernel names get a
//! per-build prefix (`lp_row_stats_f32` -> `lp_host_real__lp_row_stats_f32`),
//! so the real build and the planted mutants (`src/cuda/host/builds.rs`)
//! link side by side. Each unit ends with a table of its kernels (name, trampoline,
//! argument signature) that the launcher reads (`host_entries.rs`).
//!
//! Flags: `-x c++ -std=c++17 -O2 -ffp-contract=off` (no contraction: the
//! device is compiled with `--fmad=false`, so every fused multiply-add is an
//! explicit `fmaf`), `-fno-strict-aliasing` (the kernels load tiles through
//! `float4` / `uint2` casts), `-fwrapv` (device integers wrap).

#[cfg(feature = "cuda-host")]
#[allow(dead_code)]
#[path = "src/cuda/host/builds.rs"]
mod builds;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "cuda-host")]
    host::build();
}

#[cfg(feature = "cuda-host")]
mod host {
    use super::builds::{MutantPatch, DYNAMIC_SHARED_BYTES, MUTANTS, REAL_BUILD, SOURCE_FILES};
    use std::fmt::Write as _;
    use std::path::{Path, PathBuf};

    /// One generated translation unit.
    struct Unit {
        build: &'static str,
        module: &'static str,
        path: PathBuf,
        kernels: Vec<String>,
    }

    pub fn build() {
        let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
        let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
        let cuda = root.join("cuda");
        let host = cuda.join("host");
        for f in [
            "common.cuh",
            "host/lp_host.h",
            "host/runtime.cpp",
            "host/selftest.cu",
        ] {
            println!("cargo:rerun-if-changed={}", cuda.join(f).display());
        }
        println!("cargo:rerun-if-changed=src/cuda/host/builds.rs");
        let read = |p: &Path| {
            std::fs::read_to_string(p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
        };
        let prelude = read(&cuda.join("common.cuh"));
        let mut modules: Vec<(&'static str, String)> = SOURCE_FILES
            .iter()
            .map(|&m| {
                let p = cuda.join(format!("{m}.cu"));
                println!("cargo:rerun-if-changed={}", p.display());
                (m, read(&p))
            })
            .collect();
        let header = host.join("lp_host.h");
        let mut units = Vec::new();
        // The real build, plus the host self-test module (primitives and
        // dtype-conversion probes; not a CUDA source).
        modules.push(("selftest", read(&host.join("selftest.cu"))));
        for (m, text) in &modules {
            units.push(unit(&out, &header, REAL_BUILD, m, &prelude, text));
        }
        modules.pop();
        for patch in &MUTANTS {
            let patched_prelude = apply(patch, "common.cuh", &prelude);
            for (m, text) in &modules {
                let file = format!("{m}.cu");
                let patched = apply(patch, &file, text);
                if patched_prelude == prelude && patched == *text {
                    continue;
                }
                units.push(unit(
                    &out,
                    &header,
                    patch.build,
                    m,
                    &patched_prelude,
                    &patched,
                ));
            }
            let hits = usize::from(patch.file == "common.cuh")
                + modules
                    .iter()
                    .filter(|(m, _)| format!("{m}.cu") == patch.file)
                    .count();
            assert_eq!(
                hits, 1,
                "mutant {}: unknown file {}",
                patch.build, patch.file
            );
        }
        let mut b = cc::Build::new();
        b.cpp(true)
            .include(&host)
            .opt_level(2)
            .debug(false)
            .warnings(false)
            .define(
                "LP_HOST_DYN_SHARED_BYTES",
                DYNAMIC_SHARED_BYTES.to_string().as_str(),
            )
            .flag_if_supported("-std=c++17")
            .flag("-ffp-contract=off")
            .flag("-fno-strict-aliasing")
            .flag("-fwrapv")
            .flag("-fno-exceptions")
            .flag("-fno-rtti")
            .flag("-ftls-model=initial-exec")
            // `extern __shared__` arrays are `extern thread_local` declared
            // before their (static) definition: no TLS init wrapper calls
            // (GCC otherwise calls a weak, undefined one in PIE binaries).
            .flag_if_supported("-fno-extern-tls-init")
            .flag_if_supported("-Wno-unknown-pragmas");
        if std::env::var_os("LOGPROBE_CUDA_HOST_UCONTEXT").is_some() {
            // Forces the portable (slower, one syscall per switch) fiber
            // switch, to test it on x86-64.
            b.define("LP_HOST_FIBER_UCONTEXT", "1");
        }
        println!("cargo:rerun-if-env-changed=LOGPROBE_CUDA_HOST_UCONTEXT");
        b.file(host.join("runtime.cpp"));
        // The generated units are `.cu` text: compile them as C++ explicitly.
        let mut units_build = b.clone();
        units_build.flag("-x").flag("c++");
        for u in &units {
            units_build.file(&u.path);
        }
        b.compile("logprobe_cuda_host_runtime");
        units_build.compile("logprobe_cuda_host_kernels");
        write_entries(&out, &units);
    }

    /// `text` with `patch` applied when it targets `file`.
    fn apply(patch: &MutantPatch, file: &str, text: &str) -> String {
        if patch.file != file {
            return text.to_string();
        }
        let n = text.matches(patch.find).count();
        assert_eq!(
            n, 1,
            "mutant {}: `{}` occurs {n} times in {file} (must be once)",
            patch.build, patch.find
        );
        text.replacen(patch.find, patch.replace, 1)
    }

    /// Kernel names of a `.cu` text: `extern "C" __global__ void NAME(` at
    /// line start, and `LP_*(NAME, ...)` macro instances at line start (the
    /// same rule as `tests/cuda_compile.rs`).
    fn kernel_names(text: &str) -> Vec<String> {
        let mut names = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("extern \"C\" __global__ void ") {
                names.push(rest.split('(').next().unwrap_or("").trim().to_string());
            } else if let Some(rest) = line.strip_prefix("LP_") {
                if let Some(open) = rest.find('(') {
                    if rest.trim_end().ends_with(')') && !rest.contains('\\') {
                        let name = rest[open + 1..].split(',').next().unwrap_or("").trim();
                        names.push(name.to_string());
                    }
                }
            }
        }
        names.retain(|n| !n.is_empty());
        names
    }

    /// `(type, name)` of every `extern __shared__ TYPE NAME[];` (dynamic
    /// shared memory), defined per unit as a thread-local array.
    fn dynamic_shared(text: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for piece in text.split("extern __shared__ ").skip(1) {
            let decl = piece.split(';').next().unwrap_or("").trim();
            if let Some(decl) = decl.strip_suffix("[]") {
                if let Some(at) = decl.rfind(|c: char| !(c.is_alphanumeric() || c == '_')) {
                    let (ty, name) = decl.split_at(at + 1);
                    let pair = (ty.trim().to_string(), name.to_string());
                    if !out.contains(&pair) {
                        out.push(pair);
                    }
                }
            }
        }
        out
    }

    fn unit(
        out: &Path,
        header: &Path,
        build: &'static str,
        module: &'static str,
        prelude: &str,
        text: &str,
    ) -> Unit {
        let kernels = kernel_names(text);
        let mut s = String::new();
        let _ = writeln!(
            s,
            "// Generated by kernels/build.rs: build `{build}`, module `{module}`.\n#include \"{}\"",
            header.display()
        );
        for k in &kernels {
            let _ = writeln!(s, "#define {k} lp_host_{build}__{k}");
        }
        let _ = writeln!(s, "namespace lp_build_{build} {{");
        // The program NVRTC compiles (source::program_text).
        let _ = write!(s, "{prelude}\n// ---- {module}.cu\n{text}");
        let _ = writeln!(
            s,
            "\n// ---- host build: dynamic shared memory, kernel table"
        );
        for (ty, name) in dynamic_shared(text) {
            let _ = writeln!(
                s,
                "alignas(16) thread_local {ty} {name}[LP_HOST_DYN_SHARED_BYTES / sizeof({ty})];"
            );
        }
        let _ = writeln!(
            s,
            "extern \"C\" const LpHostEntry* lp_host_entries_{build}_{module}(size_t* count) {{"
        );
        let _ = writeln!(s, "    static const LpHostEntry entries[] = {{");
        for k in &kernels {
            let _ = writeln!(s, "        LP_HOST_ENTRY(\"{k}\", {k}),");
        }
        let _ = writeln!(s, "        {{nullptr, nullptr, nullptr}},\n    }};");
        let _ = writeln!(
            s,
            "    *count = sizeof(entries) / sizeof(entries[0]) - 1;\n    return entries;\n}}\n}}  // namespace lp_build_{build}"
        );
        let dir = out.join("cuda_host").join(build);
        std::fs::create_dir_all(&dir).expect("creating OUT_DIR/cuda_host");
        let path = dir.join(format!("{module}.cu"));
        // Rewrite only on change, so cc's objects stay fresh.
        if std::fs::read_to_string(&path).ok().as_deref() != Some(s.as_str()) {
            std::fs::write(&path, &s).expect("writing a generated unit");
        }
        Unit {
            build,
            module,
            path,
            kernels,
        }
    }

    /// `host_entries.rs`: the table functions of every unit, by build.
    fn write_entries(out: &Path, units: &[Unit]) {
        let mut s = String::from("// Generated by kernels/build.rs.\nextern \"C\" {\n");
        for u in units {
            let _ = writeln!(
                s,
                "    fn lp_host_entries_{}_{}(count: *mut usize) -> *const RawEntry;",
                u.build, u.module
            );
        }
        s.push_str("}\n\n/// Every unit's kernel table, by build: `(build, [(module, table)])`.\n");
        s.push_str("static UNITS: &[(&str, &str, TableFn)] = &[\n");
        for u in units {
            let _ = writeln!(
                s,
                "    (\"{b}\", \"{m}\", lp_host_entries_{b}_{m}), // {} kernels",
                u.kernels.len(),
                b = u.build,
                m = u.module
            );
        }
        s.push_str("];\n");
        std::fs::write(out.join("host_entries.rs"), s).expect("writing host_entries.rs");
    }
}
