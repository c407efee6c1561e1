// rms_norm_f32: x [n, d], weight [d] -> out [n, d], out = (x * (1 / sqrt(mean(x^2) + eps))) * weight.
// One block (256 threads, 1024 for long rows: the host's row_threads) per row, rows grid-strided;
// the sum of squares is a block reduction.

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
