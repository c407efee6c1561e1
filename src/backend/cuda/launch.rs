//! Kernel launches: cudarc's argument list, and programmatic dependent launch where asked for
//! (`Options::dependent_launch`, on unless `FOVEA_PDL=0`) and the device has it (sm_90+).
//!
//! A decode step is some 1 800 small kernels in one stream; each waits for the one before it,
//! and between them the device spends a launch's setup (the grid's scheduling, its blocks
//! starting) on nothing. With the programmatic-stream-serialization attribute the device may
//! launch the next kernel while the previous one runs; every kernel of `cuda/` begins with
//! `grid_wait()` (cuda/common.cuh): `griddepcontrol.wait`, which holds its threads until the
//! previous kernel has completed and its writes are visible, so every memory access stays in
//! stream order, then `griddepcontrol.launch_dependents`, which lets the next kernel launch and
//! wait in its own `grid_wait` while this one works. cudarc's launcher takes no attributes, hence this one: the same
//! argument list (device addresses and plain values, in the kernel's order), `cuLaunchKernelEx`
//! with the attribute, or `cuLaunchKernel` as cudarc calls it without. The lane turns cudarc's
//! events off (`disable_event_tracking`), so cudarc would record nothing around a launch either.
//! Measured on an H100 (twenty-fourth sitting): a decode step of 36 of the q2 model's 43 layers
//! 12.8 → 11.2 ms, the conformance executables passing with it.

use std::ffi::c_void;
use std::marker::PhantomData;

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, CudaView, DevicePtr, DriverError, LaunchConfig};
use cudarc::driver::{result, sys};

/// The most arguments a kernel of `cuda/` may take (the longest, `sink_attention_f32`, has 15).
const MAX_ARGS: usize = 24;

/// One kernel parameter: a device address, or a plain value (by pointer to the caller's value).
enum Param {
    Addr(u64),
    Value(*const c_void),
}

/// The arguments of one launch, in the kernel's parameter order; scalars are borrowed for `'a`.
pub(super) struct KernelArgs<'a> {
    stream: &'a CudaStream,
    func: &'a CudaFunction,
    params: Vec<Param>,
    _borrows: PhantomData<&'a ()>,
}

/// What a kernel parameter can be: a device buffer (its address is passed) or a plain value.
pub(super) trait KernelArg {
    /// The device address this argument passes, or `None` for a plain value (passed by pointer
    /// to `self`).
    fn device_addr(&self, stream: &CudaStream) -> Option<u64>;
}

impl<T> KernelArg for CudaSlice<T> {
    fn device_addr(&self, stream: &CudaStream) -> Option<u64> {
        Some(self.device_ptr(stream).0)
    }
}

impl<T> KernelArg for CudaView<'_, T> {
    fn device_addr(&self, stream: &CudaStream) -> Option<u64> {
        Some(self.device_ptr(stream).0)
    }
}

macro_rules! value_arg {
    ($($t:ty),*) => {$(
        impl KernelArg for $t {
            fn device_addr(&self, _: &CudaStream) -> Option<u64> {
                None
            }
        }
    )*};
}
// u64: a pointer argument the kernel may take as null (0)
value_arg!(u32, i32, f32, u64);

impl<'a> KernelArgs<'a> {
    pub(super) fn new(stream: &'a CudaStream, func: &'a CudaFunction) -> Self {
        KernelArgs { stream, func, params: Vec::with_capacity(MAX_ARGS), _borrows: PhantomData }
    }

    /// Append the next parameter.
    pub(super) fn arg<A: KernelArg>(&mut self, a: &'a A) -> &mut Self {
        self.params.push(match a.device_addr(self.stream) {
            Some(addr) => Param::Addr(addr),
            None => Param::Value(a as *const A as *const c_void),
        });
        self
    }

    /// Launch on the stream: with the programmatic-stream-serialization attribute
    /// (`cuLaunchKernelEx`) when `pdl`, else as cudarc launches (`cuLaunchKernel`, which every
    /// driver has).
    ///
    /// # Safety
    /// The arguments must match the kernel's parameters in number, order and type, every buffer
    /// must hold what the kernel reads and writes for `cfg`, and (with `pdl`) the kernel must
    /// begin with `grid_wait()`.
    pub(super) unsafe fn launch(&mut self, cfg: LaunchConfig, pdl: bool) -> Result<(), DriverError> {
        let stream = self.stream;
        stream.context().bind_to_thread()?;
        // the kernel's parameter array: a pointer to each value; the addresses live in `addrs`,
        // every pointer into it taken from one base pointer after all are written
        let n = self.params.len();
        assert!(n <= MAX_ARGS, "a kernel of cuda/ takes at most {MAX_ARGS} arguments");
        let mut addrs = [0u64; MAX_ARGS];
        for (slot, p) in addrs.iter_mut().zip(&self.params) {
            if let Param::Addr(a) = p {
                *slot = *a;
            }
        }
        let base = addrs.as_mut_ptr();
        let mut ptrs: Vec<*mut c_void> = (self.params.iter().enumerate())
            .map(|(i, p)| match p {
                // SAFETY: i < n <= MAX_ARGS, inside `addrs`
                Param::Addr(_) => unsafe { base.add(i) }.cast::<c_void>(),
                Param::Value(v) => *v as *mut c_void,
            })
            .collect();
        if !pdl {
            // SAFETY: the caller's contract; `ptrs` points at live values, one per parameter.
            return unsafe {
                result::launch_kernel(
                    self.func.cu_function(),
                    cfg.grid_dim,
                    cfg.block_dim,
                    cfg.shared_mem_bytes,
                    stream.cu_stream(),
                    &mut ptrs,
                )
            };
        }
        // SAFETY: zero is a valid bit pattern of this plain C struct (an id and a union of ints).
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: the caller's contract; `ptrs` points at live values, one per parameter.
        unsafe {
            sys::cuLaunchKernelEx(&config, self.func.cu_function(), ptrs.as_mut_ptr(), std::ptr::null_mut()).result()
        }
    }
}
