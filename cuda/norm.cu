// rms_norm_f32: x [n, d], weight [d] -> out [n, d], out = (x * (1 / sqrt(mean(x^2) + eps))) * weight.
// One block (256 threads) per row, rows grid-strided; the sum of squares is a block reduction.

// __restrict__: out never aliases x or weight (the lane allocates every output), which lets the
// compiler batch the loads of the scaling loop instead of waiting on each store.
extern "C" __global__ void rms_norm_f32(const float* __restrict__ x, const float* __restrict__ weight,
                                        float* __restrict__ out, unsigned int n, unsigned int d, float eps) {
    __shared__ float red[32];
    for (unsigned int row = blockIdx.x; row < n; row += gridDim.x) {
        const float* xr = x + (u64)row * d;
        float* yr = out + (u64)row * d;
        const float s = block_sum_squares(xr, d, red);
        const float inv = 1.0f / sqrtf(s / (float)d + eps);
        if (d % 4u == 0u && (((u64)xr | (u64)yr | (u64)weight) & 15u) == 0u) {
            const fa_f4 *x4 = reinterpret_cast<const fa_f4*>(xr), *w4 = reinterpret_cast<const fa_f4*>(weight);
            fa_f4* y4 = reinterpret_cast<fa_f4*>(yr);
            for (unsigned int c = threadIdx.x; c < d / 4u; c += blockDim.x) {
                const fa_f4 v = x4[c], g = w4[c];
                y4[c] = fa_f4{(v.x * inv) * g.x, (v.y * inv) * g.y, (v.z * inv) * g.z, (v.w * inv) * g.w};
            }
        } else {
            for (unsigned int c = threadIdx.x; c < d; c += blockDim.x) yr[c] = (xr[c] * inv) * weight[c];
        }
    }
}
