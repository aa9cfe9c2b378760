//! Registers and spills of each kernel as ptxas allocates them (NVRTC's `-Xptxas=-v` log,
//! no GPU needed), for tests that keep the kernels out of local memory and within the
//! register budgets their launch bounds promise.

use std::ffi::CString;

use cudarc::nvrtc::result;
use neagari_quant::GgmlType;

use super::{full_source, module_sources, nvrtc_options};
use crate::{BackendError, Result};

/// One kernel's resources for an architecture.
#[derive(Clone, Debug)]
pub struct KernelRegs {
    pub module: String,
    pub kernel: String,
    pub registers: u32,
    /// Bytes stored to local memory because registers ran out.
    pub spill_bytes: u32,
    /// Bytes of local memory a thread has, spills and arrays indexed at run time.
    pub stack_bytes: u32,
}

/// Every kernel of the modules `module_ptx` compiles for `arch` (a real one, e.g. `sm_90`):
/// the float-op and hybrid modules for `None`, else format `ty`'s (both layouts).
pub fn kernel_registers(arch: &str, ty: Option<GgmlType>) -> Result<Vec<KernelRegs>> {
    let mut out = Vec::new();
    for (name, defines, src) in module_sources(ty)? {
        let log = ptxas_log(&name, arch, &full_source(&defines, &src))?;
        out.extend(parse(&name, &log));
    }
    Ok(out)
}

fn ptxas_log(name: &str, arch: &str, src: &str) -> Result<String> {
    let err = |e: String| BackendError::Other(format!("NVRTC on {name}: {e}"));
    let csrc = CString::new(src).map_err(|e| err(e.to_string()))?;
    let prog = result::create_program(&csrc, None).map_err(|e| err(format!("{e:?}")))?;
    let mut opts = nvrtc_options(arch);
    opts.push("-Xptxas=-v".into());
    // SAFETY: `prog` is the live program made above, destroyed once below; the options
    // are NUL-free strings that outlive the call.
    let (compiled, log) = unsafe {
        let compiled = result::compile_program(prog, &opts);
        let log = result::get_program_log(prog);
        let _ = result::destroy_program(prog);
        (compiled, log)
    };
    let log = log.map_err(|e| err(format!("{e:?}")))?;
    let log: Vec<u8> = log
        .iter()
        .map(|&c| c as u8)
        .take_while(|&c| c != 0)
        .collect();
    let log = String::from_utf8_lossy(&log).into_owned();
    compiled.map_err(|e| err(format!("{e:?}: {log}")))?;
    Ok(log)
}

/// ptxas's lines per kernel: "Compiling entry function 'k' for 'sm_90'", then "N bytes
/// stack frame, S bytes spill stores, …", then "Used R registers, …".
fn parse(module: &str, log: &str) -> Vec<KernelRegs> {
    let mut out = Vec::new();
    let (mut cur, mut spill, mut stack) = (None::<String>, 0u32, 0u32);
    let number_before = |line: &str, mark: &str| -> Option<u32> {
        let head = &line[..line.find(mark)?];
        head.split([' ', ','])
            .rfind(|t| !t.is_empty())?
            .parse()
            .ok()
    };
    for line in log.lines() {
        if let Some(i) = line.find("Compiling entry function '") {
            cur = line[i + 26..].split('\'').next().map(String::from);
            (spill, stack) = (0, 0);
        } else if let Some(s) = number_before(line, " bytes spill stores") {
            spill = s;
            stack = number_before(line, " bytes stack frame").unwrap_or(0);
        } else if let (Some(r), true) = (number_before(line, " registers"), line.contains("Used "))
        {
            if let Some(kernel) = cur.take() {
                out.push(KernelRegs {
                    module: module.to_string(),
                    kernel,
                    registers: r,
                    spill_bytes: spill,
                    stack_bytes: stack,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn reads_ptxas_lines() {
        let log = "ptxas info    : Compiling entry function 'mvs_8' for 'sm_90'\n\
                   ptxas info    : Function properties for mvs_8\n\
                   \x20   168 bytes stack frame, 160 bytes spill stores, 160 bytes spill loads\n\
                   ptxas info    : Used 80 registers, used 1 barriers, 32896 bytes smem\n\
                   ptxas info    : Compiling entry function 'add' for 'sm_90'\n\
                   ptxas info    : Used 16 registers, used 0 barriers\n";
        let k = parse("m", log);
        assert_eq!(k.len(), 2);
        assert_eq!(
            (
                k[0].kernel.as_str(),
                k[0].registers,
                k[0].spill_bytes,
                k[0].stack_bytes
            ),
            ("mvs_8", 80, 160, 168)
        );
        assert_eq!(
            (
                k[1].kernel.as_str(),
                k[1].registers,
                k[1].spill_bytes,
                k[1].stack_bytes
            ),
            ("add", 16, 0, 0)
        );
    }
}
