//! Programmatic dependent launch (PDL, cuda/mod.rs `launch_raw`) lets a kernel start while
//! the previous one still runs; it is correct only if every kernel waits for its
//! predecessor (`gdc_wait()`, kernels/common.cuh) before it touches global memory. These
//! tests keep that true as kernels are added: a scan of the kernel sources (no CUDA
//! needed), and the PTX NVRTC makes (where NVRTC is present).
#![cfg(feature = "cuda")]

use std::io::Write;
use std::path::Path;

use neagari_quant::GgmlType;

/// (file, signature, body) of every `extern "C" __global__` kernel in `src` — the
/// signature is the text up to the body's `{`, the body the text up to its matching `}`
/// (kernels defined by macros included).
fn kernels(file: &str, src: &str) -> Vec<(String, String, String)> {
    const MARK: &str = "extern \"C\" __global__";
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = src[at..].find(MARK).map(|i| i + at) {
        let open = i + src[i..]
            .find('{')
            .unwrap_or_else(|| panic!("{file}: no body"));
        let mut depth = 0usize;
        let mut end = None;
        for (j, c) in src[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(open + j);
                        break;
                    }
                }
                _ => {}
            }
        }
        let end = end.unwrap_or_else(|| panic!("{file}: unbalanced body after {i}"));
        let sig = src[i..open]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        out.push((file.to_string(), sig, src[open + 1..end].to_string()));
        at = end;
    }
    out
}

/// The body with `//` and `/* */` comments removed, so a commented-out call does not count.
fn strip_comments(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("//") {
            rest = r.find('\n').map_or("", |n| &r[n..]);
        } else if let Some(r) = rest.strip_prefix("/*") {
            rest = r.find("*/").map_or("", |n| &r[n + 2..]);
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

#[test]
fn every_kernel_waits_for_its_predecessor() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cuda/kernels");
    let mut all = Vec::new();
    for e in std::fs::read_dir(&dir).expect("kernels dir") {
        let p = e.expect("entry").path();
        let ext = p.extension().and_then(|e| e.to_str());
        if matches!(ext, Some("cu") | Some("cuh")) {
            let src = std::fs::read_to_string(&p).expect("read kernel source");
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            all.extend(kernels(&name.unwrap_or_default(), &src));
        }
    }
    // The sources define more than 30 kernels (ops, hybrid, GEMV macros): a scan that
    // finds few has stopped matching them.
    assert!(all.len() >= 30, "found only {} kernels", all.len());
    let missing: Vec<String> = all
        .iter()
        .filter(|(_, _, body)| !strip_comments(body).contains("gdc_wait()"))
        .map(|(f, sig, _)| format!("{f}: {sig}"))
        .collect();
    assert!(
        missing.is_empty(),
        "kernels that do not call gdc_wait() (kernels/common.cuh) before touching global \
         memory; with PDL they may read their inputs before the previous kernel wrote them:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_scan_sees_a_kernel_without_the_wait() {
    let src = "extern \"C\" __global__ void a(float* x) {\n    gdc_wait();\n    x[0] = 1;\n}\n\
               #define M(N) \\\n    extern \"C\" __global__ void N(float* x) { \\\n        \
               if (x) { x[0] = 2; } /* gdc_wait(); */ \\\n    }\nM(b)\n";
    let k = kernels("t.cu", src);
    assert_eq!(k.len(), 2);
    assert!(strip_comments(&k[0].2).contains("gdc_wait()"));
    assert!(!strip_comments(&k[1].2).contains("gdc_wait()"));
    assert!(k[1].1.contains("N(float* x)"), "{}", k[1].1);
}

/// The wait compiles to `griddepcontrol.wait` in every kernel for Hopper (a guard on
/// `__CUDA_ARCH__` that NVRTC did not define would drop it silently and leave PDL racy),
/// and to nothing for an older architecture.
#[test]
fn every_kernel_entry_waits_in_hopper_ptx() {
    if !neagari_backend::cuda::nvrtc_present() {
        let _ = writeln!(
            std::io::stderr(),
            "note: skipping the PTX check: libnvrtc.so not found"
        );
        return;
    }
    for ty in [
        None,
        Some(GgmlType::Q4_K),
        Some(GgmlType::F16),
        Some(GgmlType::Q1_0),
    ] {
        for ptx in neagari_backend::cuda::module_ptx("sm_90", ty).expect("sm_90") {
            let entries: Vec<&str> = ptx.split(".entry ").skip(1).collect();
            assert!(!entries.is_empty(), "{ty:?}: no kernels in the PTX");
            for e in entries {
                let name = e.split('(').next().unwrap_or("?").trim();
                assert!(
                    e.contains("griddepcontrol.wait"),
                    "{ty:?}: {name} does not wait in sm_90 PTX"
                );
            }
        }
        for ptx in neagari_backend::cuda::module_ptx("sm_80", ty).expect("sm_80") {
            assert!(!ptx.contains("griddepcontrol"), "{ty:?}: sm_80 PTX has PDL");
        }
    }
}
