// rms_norm_f32: x [n, d], weight [d] -> out [n, d], out = (x * (1 / sqrt(mean(x^2) + eps))) * weight.
// One block (256 threads, 1024 for long rows: the host's row_threads) per row, rows grid-strided;
// the sum of squares is a block reduction.
// rms_norm_f16: the same rows rounded to f16 as f32_to_f16 writes them (out [n, d/2] words, d a
// multiple of 4, x and weight on 16 bytes): fast precision's cuBLASLt operand of the linear that
// follows (rms_norm_linear), without an f32 pass between. Bit for bit rms_norm_f32 then f32_to_f16.

extern "C" __global__ void rms_norm_f32(const float* x, const float* weight, float* out, unsigned int n,
                                        unsigned int d, float eps) {
    grid_wait();
    __shared__ float red[32];
    for (unsigned int row = blockIdx.x; row < n; row += gridDim.x) {
        const float* xr = x + (u64)row * d;
        float* yr = out + (u64)row * d;
        const float s = block_sum_squares(xr, d, red);
        const float inv = 1.0f / sqrtf(s / (float)d + eps);
        block_scale_row(xr, weight, yr, d, inv);
    }
}

extern "C" __global__ void rms_norm_f16(const float* x, const float* weight, f16x4_words* out, unsigned int n,
                                        unsigned int d, float eps) {
    grid_wait();
    __shared__ float red[32];
    const fa_f4* w4 = reinterpret_cast<const fa_f4*>(weight);
    for (unsigned int row = blockIdx.x; row < n; row += gridDim.x) {
        const float* xr = x + (u64)row * d;
        const fa_f4* x4 = reinterpret_cast<const fa_f4*>(xr);
        f16x4_words* yr = out + (u64)row * (d / 4u);
        const float s = block_sum_squares(xr, d, red);
        const float inv = 1.0f / sqrtf(s / (float)d + eps);
        for (unsigned int c = threadIdx.x; c < d / 4u; c += blockDim.x) {
            const fa_f4 v = x4[c], w = w4[c];
            yr[c] = {f16x2_rn((v.x * inv) * w.x, (v.y * inv) * w.y), f16x2_rn((v.z * inv) * w.z, (v.w * inv) * w.w)};
        }
    }
}
