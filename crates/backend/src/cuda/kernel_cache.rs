//! The PTX NVRTC makes, kept on disk between runs: compiling the kernel modules a model
//! needs takes seconds at every start (each format's module is large), and the result only
//! depends on the source, the flags, the architecture and the NVRTC version. The driver
//! keeps its own cache of what it builds from the PTX (~/.nv/ComputeCache).
//!
//! A file is `<module>-<arch>-<key>.ptx`, the key the SHA-256 of everything that went into
//! the compile; its first and last lines repeat the key, so a file cut short or written by
//! something else is not used (it is compiled again and replaced). Files are written to a
//! temporary name and renamed, so a reader never sees half of one. Any failure to read or
//! write the cache only costs the compile.
//!
//! Where: NEAGARI_KERNEL_CACHE (a directory; `0` or `off` turns the cache off), else
//! `$XDG_CACHE_HOME/neagari/kernels`, else `$HOME/.cache/neagari/kernels`.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The cache directory, if there is one (it may not exist yet).
pub fn dir() -> Option<PathBuf> {
    match std::env::var_os("NEAGARI_KERNEL_CACHE") {
        Some(v) if v == "0" || v == "off" => None,
        Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|v| !v.is_empty())
                    .map(|h| PathBuf::from(h).join(".cache"))
            })
            .map(|d| d.join("neagari").join("kernels")),
    }
}

/// SHA-256 (hex) of a compile's inputs: the full source, the NVRTC flags, the NVRTC
/// version.
pub(super) fn key(source: &str, options: &[String], nvrtc: Option<(i32, i32)>) -> String {
    let mut h = Sha256::new();
    h.update(source.as_bytes());
    for o in options {
        h.update([0u8]);
        h.update(o.as_bytes());
    }
    h.update(format!("\0nvrtc {nvrtc:?}").as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn path(dir: &Path, module: &str, arch: &str, key: &str) -> PathBuf {
    dir.join(format!("{module}-{arch}-{}.ptx", &key[..32]))
}

fn head(key: &str) -> String {
    format!("// neagari kernel cache {key}\n")
}

fn tail(key: &str) -> String {
    format!("\n// end {key}\n")
}

/// The cached PTX of a compile, if a whole file with this key is there.
pub(super) fn load(dir: &Path, module: &str, arch: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(path(dir, module, arch, key)).ok()?;
    let body = text.strip_prefix(&head(key))?.strip_suffix(&tail(key))?;
    Some(body.to_string())
}

/// Keeps a compile's PTX (best effort: a read-only or full disk just means no cache), and
/// removes the module's other versions for this arch, so the cache holds one version of each
/// module (about 20 MB for every format and both layouts) however often the source changes.
pub(super) fn store(dir: &Path, module: &str, arch: &str, key: &str, ptx: &str) {
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let fin = path(dir, module, arch, key);
        // Unique per process and module, so concurrent runs never share a temporary.
        let tmp = fin.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, format!("{}{ptx}{}", head(key), tail(key)))?;
        std::fs::rename(&tmp, &fin).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
        let keep = fin.file_name();
        let prefix = format!("{module}-{arch}-");
        for e in std::fs::read_dir(dir)?.flatten() {
            let name = e.file_name();
            let old = name.to_str().is_some_and(|n| {
                n.strip_prefix(&prefix)
                    .and_then(|r| r.strip_suffix(".ptx"))
                    .is_some_and(|k| k.len() == 32 && k.bytes().all(|b| b.is_ascii_hexdigit()))
            });
            if old && Some(name.as_os_str()) != keep {
                let _ = std::fs::remove_file(e.path());
            }
        }
        Ok(())
    };
    let _ = write();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("neagari-kc-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn round_trip_and_keys() {
        let d = scratch("rt");
        let opts = vec!["--gpu-architecture=sm_90".to_string()];
        let k = key("src", &opts, Some((13, 0)));
        assert_eq!(k.len(), 64);
        // Each input changes the key.
        assert_ne!(k, key("src ", &opts, Some((13, 0))));
        assert_ne!(
            k,
            key("src", &["--gpu-architecture=sm_80".into()], Some((13, 0)))
        );
        assert_ne!(k, key("src", &opts, Some((13, 1))));
        assert_eq!(load(&d, "ops", "sm_90", &k), None, "empty cache");
        let ptx = "//\n.version 9.0\n.target sm_90\n";
        store(&d, "ops", "sm_90", &k, ptx);
        assert_eq!(load(&d, "ops", "sm_90", &k).as_deref(), Some(ptx));
        // Another module, arch or key is another file.
        assert_eq!(load(&d, "hybrid", "sm_90", &k), None);
        assert_eq!(load(&d, "ops", "sm_80", &k), None);
        // A new version of a module replaces its old one, and only its own.
        store(&d, "ops", "sm_80", &k, ptx);
        store(&d, "ops_x", "sm_90", &k, ptx);
        let k2 = key("src2", &opts, Some((13, 0)));
        store(&d, "ops", "sm_90", &k2, ptx);
        assert_eq!(
            load(&d, "ops", "sm_90", &k),
            None,
            "the old version is gone"
        );
        assert_eq!(load(&d, "ops", "sm_90", &k2).as_deref(), Some(ptx));
        assert!(load(&d, "ops", "sm_80", &k).is_some(), "another arch stays");
        assert!(
            load(&d, "ops_x", "sm_90", &k).is_some(),
            "another module stays"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_cut_or_foreign_file_is_not_used() {
        let d = scratch("bad");
        let k = key("src", &[], None);
        store(&d, "ops", "sm_90", &k, ".version 9.0\n");
        let p = path(&d, "ops", "sm_90", &k);
        let whole = std::fs::read_to_string(&p).expect("written");
        // Cut short (no trailer), or the trailer of another key.
        std::fs::write(&p, &whole[..whole.len() - 10]).expect("write");
        assert_eq!(load(&d, "ops", "sm_90", &k), None);
        let other = key("other", &[], None);
        std::fs::write(&p, whole.replace(&tail(&k), &tail(&other))).expect("write");
        assert_eq!(load(&d, "ops", "sm_90", &k), None);
        // A rewrite replaces it.
        store(&d, "ops", "sm_90", &k, ".version 9.0\n");
        assert_eq!(
            load(&d, "ops", "sm_90", &k).as_deref(),
            Some(".version 9.0\n")
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn an_unwritable_cache_is_only_a_miss() {
        // A file where the directory should be: create_dir_all fails, nothing panics.
        let f = std::env::temp_dir().join(format!("neagari-kc-file-{}", std::process::id()));
        std::fs::write(&f, "x").expect("write");
        let k = key("src", &[], None);
        store(&f, "ops", "sm_90", &k, "ptx");
        assert_eq!(load(&f, "ops", "sm_90", &k), None);
        let _ = std::fs::remove_file(&f);
    }
}
