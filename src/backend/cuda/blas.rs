//! cuBLASLt for fast precision's dense GEMMs: `linear` over many rows (a ViT layer's linears, a
//! prefill chunk's projections) as one f16 × f16 → f32 matmul, the bias in cuBLASLt's epilogue,
//! and `grouped_linear` (the grouped output projection) as a strided batch of them.
//! The library is opened at run time like the driver (cudarc `dynamic-loading`), so builds stay
//! free of the CUDA toolkit; where `libcublasLt.so.13` is not found (nor on `LD_LIBRARY_PATH`)
//! the lane keeps its own tiles. Issue 14 allows it for plain dense linears in fast mode where it
//! measures faster; the routed experts' GEMMs, the aligner's gathered GEMM and attention stay ours.
//!
//! Operands: x rounded to f16 by `f32_to_f16` (cuda/elementwise.cu), W decoded and rounded to f16
//! by `weight_f16_<format>` (cuda/linear.cu; an f16 weight as it is): the rounding of the fast
//! tiles (`f16x2_rn` in cuda/common.cuh), so the two paths multiply the same f16 values and differ
//! only in the order of the f32 sums (`CUBLAS_COMPUTE_32F`): the op harness's fast tolerances hold
//! both. Both f16 copies are activations of the call (the pool's buffers), never kept.
//!
//! Layouts. cuBLASLt is column-major: y `[n, out]` row-major is yᵀ `[out, n]` column-major, so the
//! matmul is yᵀ = W · xᵀ with m = out, n = n, k = k: A = W `[out, k]` row-major, i.e. `[k, out]`
//! column-major taken transposed (`TRANSA`); B = x `[n, k]` row-major, i.e. `[k, n]` column-major
//! as it is; D = yᵀ `[out, n]`, leading dimension out. The bias (`[out]`, f32) is added per row of
//! D (`CUBLASLT_EPILOGUE_BIAS`), i.e. per output column of y.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::cublaslt::result::{self as lt, CublasError};
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use crate::error::{Error, Result};

/// Workspace cuBLASLt may use (NVIDIA's recommendation for Hopper; 4 MiB suffice before it).
const WORKSPACE_BYTES: usize = 32 << 20;

/// What every cuBLASLt error adds: how to run without it.
const WITHOUT: &str = "FOVEA_CUDA_BLAS=0 runs the lane's own GEMMs instead";

fn blas_err(what: impl std::fmt::Display, e: CublasError) -> Error {
    Error::Device(format!("cuBLASLt: {what}: {e:?} ({WITHOUT})"))
}

/// The cuBLASLt this process can use: `None` where no `libcublasLt` opens (cudarc panics on the
/// first call into a missing library, so this runs first), else its version as "13.1.0"
/// (cuBLASLt encodes major·10000 + minor·100 + patch) and whether it is a CUDA 13 one, the
/// bindings' (cudarc also opens the unversioned and older names).
pub(super) fn probe() -> Option<(String, bool)> {
    // SAFETY: only tries to dlopen the library under its usual names.
    if !unsafe { sys::is_culib_present() } {
        return None;
    }
    // SAFETY: a plain query of the library just found.
    let v = unsafe { sys::cublasLtGetVersion() };
    Some((format!("{}.{}.{}", v / 10000, v % 10000 / 100, v % 100), v / 10000 == 13))
}

/// Shapes whose plans `Blas` keeps; past it the cache starts again (each image size and each
/// prefill chunk length is a shape: a long-running server sees many).
const MAX_PLANS: usize = 256;

/// One matmul shape's descriptors and the algorithm cuBLASLt's heuristic picked for it.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: created by `Blas::plan`, destroyed once; errors at teardown are ignored.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.d);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

/// A matmul's shape: y `[n, groups·r]` = x `[n, groups·k]` by W `[groups·r, k]`, group j taking
/// x's columns j·k.. and W's rows j·r.. into y's columns j·r.. (one group: a plain linear, k and
/// out = r; several: the grouped output projection, a strided batch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Shape {
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) r: usize,
    pub(super) groups: usize,
}

/// A shape, with a bias or not.
type PlanKey = (Shape, bool);

/// A cuBLASLt handle on the lane's stream, its workspace, and the plans of the shapes seen.
pub(super) struct Blas {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    plans: Mutex<HashMap<PlanKey, Plan>>,
}

// SAFETY: the handle and descriptors are used under `plans`' lock (or by `&mut self` in drop);
// cuBLASLt handles may be used from any thread, one call at a time.
unsafe impl Send for Blas {}
unsafe impl Sync for Blas {}

impl Drop for Blas {
    fn drop(&mut self) {
        self.plans.get_mut().unwrap_or_else(|e| e.into_inner()).clear();
        // SAFETY: created by `Blas::new`, destroyed once.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

impl Blas {
    /// A handle and its workspace on `stream` (`present()` checked by the caller).
    pub(super) fn new(stream: &Arc<CudaStream>) -> Result<Self> {
        let handle = lt::create_handle().map_err(|e| blas_err("creating a handle", e))?;
        let workspace = match stream.alloc_zeros::<u8>(WORKSPACE_BYTES) {
            Ok(w) => w,
            Err(e) => {
                // SAFETY: just created, not used.
                let _ = unsafe { lt::destroy_handle(handle) };
                return Err(Error::Device(format!("cuBLASLt: allocating its workspace: {e:?} ({WITHOUT})")));
            }
        };
        Ok(Blas { handle, workspace, plans: Mutex::default() })
    }

    /// The descriptors and algorithm of one shape.
    fn plan(&self, shape: Shape, bias: bool) -> std::result::Result<Plan, CublasError> {
        let Shape { n, k, r, groups } = shape;
        use sys::cublasLtMatmulDescAttributes_t as Desc;
        let set = |desc, attr, v: &i32| {
            // SAFETY: the attribute takes an int32 (cublasOperation_t, cublasLtEpilogue_t).
            unsafe { lt::set_matmul_desc_attribute(desc, attr, v as *const i32 as *const c_void, 4) }
        };
        let desc = lt::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType::CUDA_R_32F)?;
        let mut plan = Plan {
            desc,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
            algo: sys::cublasLtMatmulAlgo_t { data: [0; 8] },
        };
        // CUBLAS_OP_T = 1
        set(desc, Desc::CUBLASLT_MATMUL_DESC_TRANSA, &1)?;
        if bias {
            set(desc, Desc::CUBLASLT_MATMUL_DESC_EPILOGUE, &(sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS as i32))?;
        }
        let (n64, k64, r64) = (n as u64, k as u64, r as u64);
        // group j: W_j [k, r] (ld k) at j·r·k, x_j [k, n] (ld groups·k) at j·k, D_j [r, n] (ld groups·r) at j·r
        plan.a = lt::create_matrix_layout(sys::cudaDataType::CUDA_R_16F, k64, r64, k as i64)?;
        plan.b = lt::create_matrix_layout(sys::cudaDataType::CUDA_R_16F, k64, n64, (groups * k) as i64)?;
        plan.d = lt::create_matrix_layout(sys::cudaDataType::CUDA_R_32F, r64, n64, (groups * r) as i64)?;
        if groups > 1 {
            for (layout, stride) in [(plan.a, r * k), (plan.b, k), (plan.d, r)] {
                use sys::cublasLtMatrixLayoutAttribute_t as Layout;
                let count = groups as i32;
                // SAFETY: the batch count is an int32, the batch offset an int64 (elements).
                unsafe {
                    lt::set_matrix_layout_attribute(
                        layout,
                        Layout::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                        &count as *const i32 as *const c_void,
                        4,
                    )?;
                    lt::set_matrix_layout_attribute(
                        layout,
                        Layout::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                        &(stride as i64) as *const i64 as *const c_void,
                        8,
                    )?;
                }
            }
        }
        let pref = lt::create_matmul_pref()?;
        let heuristic = (|| {
            // SAFETY: the attribute takes a uint64.
            unsafe {
                lt::set_matmul_pref_attribute(
                    pref,
                    sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    &(WORKSPACE_BYTES as u64) as *const u64 as *const c_void,
                    8,
                )?;
                lt::get_matmul_algo_heuristic(self.handle, desc, plan.a, plan.b, plan.d, plan.d, pref)
            }
        })();
        // SAFETY: created above, not used after.
        let _ = unsafe { lt::destroy_matmul_pref(pref) };
        plan.algo = heuristic?.algo;
        Ok(plan)
    }

    /// y `[n, groups·r]` f32 = x16 `[n, groups·k]` by w16 `[groups·r, k]` group by group
    /// ([`Shape`]), + bias `[r]` f32 (one group only), + `add` `[n, groups·r]` f32 where given
    /// (C with β = 1; the bias epilogue comes after it), on `stream`.
    ///
    /// # Safety
    /// The buffers hold at least those elements (x16 and w16 as packed f16), all on this handle's
    /// device, and `stream` is the one the workspace was made on.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn matmul(
        &self,
        stream: &CudaStream,
        x16: &CudaSlice<u8>,
        w16: &CudaSlice<u8>,
        bias: Option<&CudaSlice<u8>>,
        add: Option<&CudaSlice<u8>>,
        y: &CudaSlice<u8>,
        shape: Shape,
    ) -> Result<()> {
        let Shape { n, k, r, groups } = shape;
        let what = || format!("the f16 matmul of {n} x {k} by {r} x {k} ({groups} group(s))");
        if bias.is_some() && groups > 1 {
            return Err(Error::Device(format!("cuBLASLt: {}: a bias with groups", what())));
        }
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if plans.len() >= MAX_PLANS && !plans.contains_key(&(shape, bias.is_some())) {
            plans.clear();
        }
        let plan = match plans.entry((shape, bias.is_some())) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(self.plan(shape, bias.is_some()).map_err(|e| blas_err(what(), e))?),
        };
        // the guards of `device_ptr` record events only with event tracking on (off in this lane)
        let ptr = |s: &CudaSlice<u8>| s.device_ptr(stream).0;
        if let Some(b) = bias {
            let p = ptr(b);
            // SAFETY: the attribute takes a device pointer (8 bytes).
            unsafe {
                lt::set_matmul_desc_attribute(
                    plan.desc,
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    &p as *const u64 as *const c_void,
                    8,
                )
            }
            .map_err(|e| blas_err(what(), e))?;
        }
        let (alpha, beta) = (1.0f32, if add.is_some() { 1.0f32 } else { 0.0 });
        let d = ptr(y) as *mut c_void;
        // C has D's layout: the addend, or D itself with beta = 0 (never read)
        let c = add.map_or(d, |a| ptr(a) as *mut c_void);
        // SAFETY: the caller's contract.
        unsafe {
            lt::matmul(
                self.handle,
                plan.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                ptr(w16) as *const c_void,
                plan.a,
                ptr(x16) as *const c_void,
                plan.b,
                c,
                plan.d,
                d,
                plan.d,
                &plan.algo,
                ptr(&self.workspace) as *mut c_void,
                WORKSPACE_BYTES,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(|e| blas_err(what(), e))
    }
}
