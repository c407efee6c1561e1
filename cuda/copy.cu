// Data movement, one output element per loop step (grid-stride).
//   concat_rows_u32: a [a_words], b [total - a_words] -> out [total], 4-byte elements of either
//                    dtype: both parts in one launch where two device-to-device copies were two (a
//                    decode step concatenates each layer's kept keys and compressor rows with the
//                    step's new ones, some 170 times; the host issued a copy in ~4 us, a launch in ~3)
//   slice_cols_f32:  src [rows, src_cols] -> out [rows, len], out[r, c] = src[r, start + c]
//   gather_rows_f32: src [m, d], idx i32 [rows] -> out [rows, d], out[r] = src[idx[r]]; an index
//                    outside 0..m writes a row of NaN (loud downstream, never reads out of bounds)
//   unfold_f32:      src [h*w, c] -> out [ceil(h/r)*ceil(w/r), c*r*r], feature ch*r*r + dy*r + dx,
//                    cells row-major, zero padding bottom/right

extern "C" __global__ void slice_cols_f32(const float* src, float* out, unsigned int rows, unsigned int len,
                                          unsigned int src_cols, unsigned int start) {
    grid_wait();
    const u64 total = (u64)rows * len;
    for (u64 i = flat_index(); i < total; i += flat_stride()) {
        const u64 r = i / len, c = i % len;
        out[i] = src[r * src_cols + start + c];
    }
}

extern "C" __global__ void concat_rows_u32(const unsigned int* a, const unsigned int* b, unsigned int* out,
                                           unsigned int a_words, unsigned int total) {
    grid_wait();
    for (u64 i = flat_index(); i < total; i += flat_stride()) out[i] = i < a_words ? a[i] : b[i - a_words];
}

extern "C" __global__ void gather_rows_f32(const float* src, const int* idx, float* out, unsigned int rows,
                                           unsigned int d, unsigned int m) {
    grid_wait();
    const u64 total = (u64)rows * d;
    for (u64 i = flat_index(); i < total; i += flat_stride()) {
        const u64 r = i / d, c = i % d;
        const int j = idx[r];
        out[i] = (j < 0 || (unsigned int)j >= m) ? QUIET_NAN : src[(u64)j * d + c];
    }
}

extern "C" __global__ void unfold_f32(const float* src, float* out, unsigned int c, unsigned int h, unsigned int w,
                                      unsigned int r, unsigned int cells_w, unsigned int cells) {
    grid_wait();
    const u64 feat = (u64)c * r * r;
    const u64 total = (u64)cells * feat;
    for (u64 i = flat_index(); i < total; i += flat_stride()) {
        const u64 cell = i / feat, f = i % feat;
        const u64 ch = f / ((u64)r * r), rem = f % ((u64)r * r);
        const u64 dy = rem / r, dx = rem % r;
        const u64 y = (cell / cells_w) * r + dy;
        const u64 x = (cell % cells_w) * r + dx;
        out[i] = (y < h && x < w) ? src[(y * w + x) * c + ch] : 0.0f;
    }
}
