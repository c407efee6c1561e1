// Elementwise ops on f32 tensors, one element per loop step (grid-stride).
//   add_f32:      a [n], b [n] -> out [n]
//   swiglu_f32:   x [rows, 2h] -> out [rows, h], out = silu(gate) * up, gate = first half
//   gelu_erf_f32: x [n] -> out [n], out = x/2 * (1 + erf(x/sqrt2)) written as x/2 * erfc(-x/sqrt2),
//                 which is the same function without the cancellation of 1 + erf for x << 0
//   sum_splits_f32: part [splits, total], bias [cols] (if has_bias) -> out [total], the sum over
//                 s in order + bias[i % cols]: the small-row linear's split over k (linear.cu)
//   f32_to_f16:   x [4 quads] -> out [quads] two words of packed f16 each (value 2i in the low half
//                 of word i), every value rounded to the nearest f16 (ties to even) as the fast
//                 tiles' f16x2_rn rounds their A operand: fast precision's cuBLASLt GEMMs take
//                 their A operand so (src/backend/cuda/blas.rs). x on 16 bytes: every tensor is an allocation
//                 of its own (256-byte aligned).
//   swiglu_f16:   x [rows, 2h] -> out [rows, h/4 quads] as f32_to_f16 writes them, bit for bit swiglu_f32
//                 then f32_to_f16 (h a multiple of 4): fast precision's cuBLASLt operand of the
//                 projection that follows (swiglu_linear_add), without an f32 pass between

extern "C" __global__ void add_f32(const float* a, const float* b, float* out, unsigned int n) {
    grid_wait();
    for (u64 i = flat_index(); i < n; i += flat_stride()) out[i] = a[i] + b[i];
}

extern "C" __global__ void swiglu_f32(const float* x, float* out, unsigned int rows, unsigned int h) {
    grid_wait();
    const u64 total = (u64)rows * h;
    for (u64 i = flat_index(); i < total; i += flat_stride()) {
        const u64 r = i / h, c = i % h;
        const float g = x[r * 2 * h + c];
        const float u = x[r * 2 * h + h + c];
        out[i] = g / (1.0f + expf(-g)) * u;
    }
}

extern "C" __global__ void gelu_erf_f32(const float* x, float* out, unsigned int n) {
    grid_wait();
    for (u64 i = flat_index(); i < n; i += flat_stride()) {
        const float v = x[i];
        out[i] = 0.5f * v * erfcf(-v * 0.70710678118654752f);
    }
}

extern "C" __global__ void sum_splits_f32(const float* part, const float* bias, float* out, unsigned int total,
                                          unsigned int cols, unsigned int splits, unsigned int has_bias) {
    grid_wait();
    for (u64 i = flat_index(); i < total; i += flat_stride()) {
        float v = 0.0f;
        for (unsigned int s = 0; s < splits; ++s) v += part[(u64)s * total + i];
        out[i] = v + (has_bias ? bias[i % cols] : 0.0f);
    }
}

extern "C" __global__ void f32_to_f16(const float* x, f16x4_words* out, unsigned int quads) {
    grid_wait();
    for (u64 i = flat_index(); i < quads; i += flat_stride()) {
        const fa_f4 v = reinterpret_cast<const fa_f4*>(x)[i];
        out[i] = {f16x2_rn(v.x, v.y), f16x2_rn(v.z, v.w)};
    }
}

extern "C" __global__ void swiglu_f16(const float* x, f16x4_words* out, unsigned int rows, unsigned int h) {
    grid_wait();
    const unsigned int hq = h / 4u;
    const u64 total = (u64)rows * hq;
    for (u64 i = flat_index(); i < total; i += flat_stride()) {
        const u64 r = i / hq, c = i % hq;
        const fa_f4 g = reinterpret_cast<const fa_f4*>(x + r * 2u * h)[c];
        const fa_f4 u = reinterpret_cast<const fa_f4*>(x + r * 2u * h + h)[c];
        out[i] = {f16x2_rn(g.x / (1.0f + expf(-g.x)) * u.x, g.y / (1.0f + expf(-g.y)) * u.y),
                  f16x2_rn(g.z / (1.0f + expf(-g.z)) * u.z, g.w / (1.0f + expf(-g.w)) * u.w)};
    }
}
