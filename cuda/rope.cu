// rope_2d_f32: x [n, heads*hd] -> out [n, heads*hd], rotate-half pairs (d, d + hd/2) of every head.
// The angle table comes from the host in f32 (the reference's own recipe, see rope_2d_tables):
// tab[r*half + d] = cos, tab[n*half + r*half + d] = sin, half = hd/2. One pair per loop step.

extern "C" __global__ void rope_2d_f32(const float* x, const float* tab, float* out, unsigned int n,
                                       unsigned int heads, unsigned int hd) {
    grid_wait();
    const unsigned int half = hd / 2;
    const u64 total = (u64)n * heads * half;
    const u64 cols = (u64)heads * hd;
    for (u64 i = flat_index(); i < total; i += flat_stride()) {
        const u64 r = i / ((u64)heads * half), rem = i % ((u64)heads * half);
        const u64 h = rem / half, d = rem % half;
        const float* row = x + r * cols + h * hd;
        const float *c = tab + r * half, *s = tab + (u64)n * half + r * half;
        float* o = out + r * cols + h * hd;
        o[d] = rope_2d_at(row, c, s, (unsigned int)d, half, hd);
        o[d + half] = rope_2d_at(row, c, s, (unsigned int)(d + half), half, hd);
    }
}
