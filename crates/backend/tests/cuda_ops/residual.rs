//! The residual add and the norm's first half inside the 3–8-row GEMV that makes the add's
//! operand (`Addend::Matmul`, cuda/residual.rs) against the same call without the fold and
//! the CPU.

use crate::check_float_op;
use crate::cuda_common::{
    cpu, download, gpu, gpu_with, n_diff, random_mat, randv, rng, upload, vector,
};
use neagari_backend::cuda::CudaBackend;
use neagari_backend::{Addend, Backend, GluAct, HostTensor};
use neagari_quant::GgmlType;

/// What the GEMV after the norm is: projections, or gate and up with the SiLU GLU.
enum Then<'a> {
    Matmul(&'a [HostTensor]),
    Glu(&'a HostTensor, &'a HostTensor),
}

/// x after the add, the normed rows, the outputs (the projections, or g).
type ResOut = (Vec<f32>, Vec<f32>, Vec<f32>);

/// `x += wo · a`, its norm and what reads it, in one `add_rms_norm_*` call with the addend
/// a projection not yet run.
fn res_call<B: Backend>(
    be: &B,
    wo: &HostTensor,
    (a, x, w): (&[f32], &[f32], &[f32]),
    then: &Then,
) -> ResOut {
    let g = w.len();
    let n = x.len() / g;
    let wm = be.load_mat(wo).unwrap();
    let (ab, mut xb, wv) = (
        upload(be, a, n, a.len() / n),
        upload(be, x, n, g),
        vector(be, w),
    );
    let (mut y, mut xn) = (be.buf(1, 1).unwrap(), be.buf(1, 1).unwrap());
    let add = Addend::Matmul {
        w: &wm,
        a: &ab,
        y: &mut y,
    };
    let out = match then {
        Then::Matmul(mats) => {
            let ms: Vec<B::Mat> = mats.iter().map(|t| be.load_mat(t).unwrap()).collect();
            let refs: Vec<&B::Mat> = ms.iter().collect();
            let mut outs: Vec<B::Buf> = ms.iter().map(|_| be.buf(1, 1).unwrap()).collect();
            let mut orefs: Vec<&mut B::Buf> = outs.iter_mut().collect();
            be.add_rms_norm_matmul(&mut xb, add, &wv, 1e-6, &mut xn, &refs, &mut orefs)
                .unwrap();
            outs.iter().flat_map(|o| download(be, o)).collect()
        }
        Then::Glu(tg, tu) => {
            let (gm, um) = (be.load_mat(tg).unwrap(), be.load_mat(tu).unwrap());
            let (mut gb, mut ub) = (be.buf(1, 1).unwrap(), be.buf(1, 1).unwrap());
            be.add_rms_norm_matmul_glu(
                &mut xb,
                add,
                &wv,
                1e-6,
                &mut xn,
                (&gm, &um, &[]),
                GluAct::Silu,
                &mut gb,
                &mut ub,
            )
            .unwrap();
            download(be, &gb)
        }
    };
    (download(be, &xb), download(be, &xn), out)
}

/// `res_call` on a GPU, and the names of the kernels it launched.
fn res_call_named(
    be: &CudaBackend,
    wo: &HostTensor,
    axw: (&[f32], &[f32], &[f32]),
    then: &Then,
) -> (ResOut, Vec<String>) {
    be.profile_begin().unwrap();
    let out = res_call(be, wo, axw, then);
    let names = be
        .profile_end()
        .unwrap()
        .into_iter()
        .map(|k| k.name)
        .collect();
    (out, names)
}

/// The 27B's residual (5,120 wide) after its ssm_out (6,144 → 5,120) and its ffn_down
/// (17,408 → 5,120: K in three parts for Q1_0, meeting through global memory, or in a
/// cluster with NEAGARI_CUDA_MVRT_CLUSTER=1), 8 and 3 rows into Q1_0 projections
/// (`mvrmt_4`) and gate/up with the GLU (`mvrtg_4`), one row (`mvs_R`, with
/// NEAGARI_CUDA_RES_FOLD_ONE=1) into the streaming GEMV (its 160 parts a row past
/// NrmStage's 32) and gate/up apart: the fold runs (the GEMV and no `add_norm_part`), x is
/// the unfolded call's bits (the same GEMV sums, the same add), the normed rows and the
/// outputs within float error of it (a row's parts are added in another order, so 1/rms
/// may move an ulp) and of the CPU's.
#[test]
fn residual_folded_into_gemv() {
    let Some(_) = gpu() else { return };
    let on = [
        ("NEAGARI_CUDA_RES_FOLD", "1"),
        ("NEAGARI_CUDA_NORM_FOLD", "1"),
        ("NEAGARI_CUDA_NORM_FOLD_ROWS", "1"),
        ("NEAGARI_CUDA_NORM_FOLD_TILE", "1"),
        ("NEAGARI_CUDA_NORM_FOLD_STREAM", "1"),
        ("NEAGARI_CUDA_RES_FOLD_ONE", "1"),
    ];
    let g = gpu_with(&on);
    let mut on_cl = on.to_vec();
    on_cl.push(("NEAGARI_CUDA_MVRT_CLUSTER", "1"));
    let g_cl = gpu_with(&on_cl);
    let g0 = gpu_with(&[("NEAGARI_CUDA_RES_FOLD", "0")]);
    let c = cpu();
    let mut r = rng();
    let cols = 5120;
    // One row's streaming GEMV finishes the norm only with a block a 32 values of the row.
    let mats = |r: &mut _, rows: &[usize]| -> Vec<HostTensor> {
        rows.iter()
            .map(|&m| random_mat(r, GgmlType::Q1_0, m, cols).0)
            .collect()
    };
    let proj = mats(&mut r, &[2048, 1024, 64, 64]);
    let proj1 = mats(&mut r, &[10240, 6144, 64, 64]);
    let (tg, tu) = (
        random_mat(&mut r, GgmlType::Q1_0, 2048, cols).0,
        random_mat(&mut r, GgmlType::Q1_0, 2048, cols).0,
    );
    let thens = [
        ("projections", Then::Matmul(&proj)),
        ("GLU", Then::Glu(&tg, &tu)),
    ];
    let thens1 = [
        ("projections", Then::Matmul(&proj1)),
        ("GLU", Then::Glu(&tg, &tu)),
    ];
    for (ty, k) in [
        (GgmlType::Q1_0, 6144),
        (GgmlType::Q1_0, 17408),
        (GgmlType::TQ2_0, 6144),
    ] {
        let wo = random_mat(&mut r, ty, cols, k).0;
        for n in [8, 3, 1] {
            let (a, x, w) = (
                randv(&mut r, n * k, 1.0),
                randv(&mut r, n * cols, 2.0),
                randv(&mut r, cols, 1.0),
            );
            let axw = (&a[..], &x[..], &w[..]);
            for (what, then) in if n == 1 { &thens1 } else { &thens } {
                let name = format!("{ty:?} {k} → {cols}, {n} rows, then {what}");
                let (cx, cn, co) = res_call(&c, &wo, axw, then);
                let ((x0, n0, o0), k0) = res_call_named(&g0, &wo, axw, then);
                assert!(
                    k0.iter().any(|k| k == "add_norm_part"),
                    "{name}: unfolded ran {k0:?}"
                );
                let bes = [("", &g), (" (cluster)", &g_cl)];
                for (how, be) in bes.iter().take(if k > 6144 && n > 1 { 2 } else { 1 }) {
                    let name = format!("{name}{how}");
                    let ((xf, nf, of), kf) = res_call_named(be, &wo, axw, then);
                    let gemv = if n == 1 { "mvs_" } else { "mvrt_" };
                    let folded = kf.iter().any(|k| k.starts_with(gemv))
                        && !kf
                            .iter()
                            .any(|k| k == "add_norm_part" || k.starts_with("add_rms"));
                    assert!(folded, "{name}: the fold did not run: {kf:?}");
                    assert_eq!(n_diff(&xf, &x0), 0, "{name}: x");
                    check_float_op(
                        &format!("{name}: normed rows"),
                        1e-6,
                        n0.clone(),
                        nf.clone(),
                    );
                    check_float_op(&format!("{name}: outputs"), 1e-5, o0.clone(), of.clone());
                    check_float_op(&format!("{name}: x vs CPU"), 1e-5, cx.clone(), xf);
                    check_float_op(&format!("{name}: normed rows vs CPU"), 1e-5, cn.clone(), nf);
                    check_float_op(&format!("{name}: outputs vs CPU"), 3e-2, co.clone(), of);
                }
            }
        }
    }
}
