// Each kernel of cuda/ (through cuda_emu.h) against a plain reference; see run.sh.
#include "cuda_emu.h"
#include "all_kernels.inc"

#include <cctype>
#include <cstring>
#include <cstdio>
#include <random>
#include <tuple>
#include <string>

// The GEMM kernels' NMSE bound: f32 products (1e-10, the op harness's REDUCTION bound), or, in
// the fast build (-DFOVEA_FAST=1), one f16 rounding (to nearest) of each operand. A value with
// significand m in [1, 2) moves by at most 2^-11 / m relative, uniformly: E[δ²] = 2^-22/3 ·
// E[1/m²] = 2^-22/6 ≈ 4e-8 per operand, 8e-8 per product; independent across the k terms, so
// the NMSE of each dot product is about 8e-8. Bound 3.2e-7 (4x). The experts chain two GEMMs
// through the clamped SwiGLU: the up GEMM's error reaches gate and up (≈ 1.6e-7, up to twice that
// through silu's slope), the down GEMM adds its own 8e-8: ≈ 4e-7, bound 1.6e-6. The op harness
// uses the same derivation (tests/ops.rs, tests/common/mod.rs).
static const double GEMM_NMSE = FOVEA_FAST ? 3.2e-7 : 1e-10;
static const double MOE_NMSE = FOVEA_FAST ? 1.6e-6 : 1e-10;

static std::mt19937 rng(42);
static int failures = 0;

static std::vector<float> randv(size_t n, float s) {
    std::uniform_real_distribution<float> d(-s, s);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

static void check(const char* name, const std::vector<float>& got, const std::vector<float>& want, double bound) {
    double num = 0, den = 0;
    size_t bad_nan = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        if (std::isnan(want[i]) || std::isnan(got[i])) {
            bad_nan += std::isnan(want[i]) != std::isnan(got[i]);
            continue;
        }
        num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
        den += double(want[i]) * want[i];
    }
    double e = num / (den > 0 ? den : 1e-300);
    bool ok = e <= bound && bad_nan == 0 && got.size() == want.size();
    std::printf("%-44s nmse %.2e (bound %.0e)%s %s\n", name, e, bound, bad_nan ? " NaN mismatch" : "", ok ? "ok" : "FAIL");
    failures += !ok;
}

static void checki(const char* name, const std::vector<int>& got, const std::vector<int>& want);

static unsigned blocks1d(size_t total) {
    size_t b = (total + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > (1u << 20) ? (1u << 20) : b);
}

// gemm_block's grid (common.cuh): (column blocks, row tiles) for cols columns, rows rows.
static dim3 gemm_grid(unsigned rows, unsigned cols) {
    if (rows <= GEMV_ROWS) return dim3{(cols + 1) / 2, 1};
    return dim3{(cols + 63) / 64, (rows + 63) / 64};
}

// The host's expert row tiles (src/backend/cuda/moe.rs): of GEMV_ROWS rows for at most GEMV_ROWS
// tokens, else of 64; and its bound on their count for `slots` slots over `experts` experts.
static unsigned moe_tile_rows(unsigned n) { return n <= GEMV_ROWS ? GEMV_ROWS : 64; }
static unsigned moe_max_tiles(unsigned n, unsigned slots, unsigned experts) {
    const unsigned tile = moe_tile_rows(n);
    return std::min(slots, (slots + tile - 1) / tile + experts);
}

static float f16_ref(uint16_t h) {
    _Float16 f;
    std::memcpy(&f, &h, 2);
    return (float)f;
}

// The f16 nearest to v (ties to even, inf past the range) as bits: the compiler's conversion.
static unsigned f16_bits_rn(float v) {
    const _Float16 h = (_Float16)v;
    uint16_t b;
    std::memcpy(&b, &h, 2);
    return b;
}

static void test_f16_decode() {
    int bad = 0;
    for (unsigned h = 0; h < 65536; ++h) {
        float a = f16_to_f32(h), b = f16_ref((uint16_t)h);
        uint32_t ua, ub;
        std::memcpy(&ua, &a, 4);
        std::memcpy(&ub, &b, 4);
        if (std::isnan(b) ? !std::isnan(a) : ua != ub) ++bad;
    }
    std::printf("%-44s %d of 65536 differ %s\n", "f16_to_f32 exhaustive", bad, bad ? "FAIL" : "ok");
    failures += bad != 0;
}

static void test_elementwise() {
    size_t n = 1000;
    auto a = randv(n, 1), b = randv(n, 1);
    std::vector<float> y(n), want(n);
    emu_launch(add_f32, {blocks1d(n)}, {256}, 0, (const float*)a.data(), (const float*)b.data(), y.data(), (unsigned)n);
    for (size_t i = 0; i < n; ++i) want[i] = a[i] + b[i];
    check("add_f32 [1000]", y, want, 0);

    unsigned rows = 21, h = 27;
    auto x = randv(rows * 2 * h, 4);
    std::vector<float> s(rows * h), sw(rows * h);
    emu_launch(swiglu_f32, {blocks1d(rows * h)}, {256}, 0, (const float*)x.data(), s.data(), rows, h);
    for (unsigned r = 0; r < rows; ++r)
        for (unsigned c = 0; c < h; ++c) {
            float g = x[r * 2 * h + c], u = x[r * 2 * h + h + c];
            sw[r * h + c] = g / (1.0f + std::exp(-g)) * u;
        }
    check("swiglu_f32 [21,2x27]", s, sw, 1e-12);

    auto gx = randv(533, 6);
    gx[0] = -9.0f;
    std::vector<float> g(533), gw(533);
    emu_launch(gelu_erf_f32, {blocks1d(533)}, {256}, 0, (const float*)gx.data(), g.data(), 533u);
    for (size_t i = 0; i < 533; ++i) gw[i] = float(0.5 * gx[i] * (1.0 + std::erf(gx[i] / std::sqrt(2.0))));
    check("gelu_erf_f32 [533]", g, gw, 1e-12);

    // f32_to_f16, weight_f16_f32 and weight_f16_bf16 (cuBLASLt's f16 operands): value i rounded
    // to the nearest f16 (ties to even) in half i % 2 of word i / 2; past ±65504 an inf
    auto fx = randv(1024, 3);
    fx[5] = 70000.0f, fx[6] = -1e-9f, fx[7] = 65519.0f;
    std::vector<uint16_t> fb(1024);
    for (size_t i = 0; i < 1024; ++i) fb[i] = uint16_t(__float_as_uint(fx[i]) >> 16);
    std::vector<unsigned> fh(512), ww(512), wb(512);
    emu_launch(f32_to_f16, {blocks1d(256)}, {256}, 0, (const float*)fx.data(), (f16x4_words*)fh.data(), 256u);
    emu_launch(weight_f16_f32, {blocks1d(128)}, {256}, 0, (const float*)fx.data(), (gemv_u4*)ww.data(), 128u);
    emu_launch(weight_f16_bf16, {blocks1d(128)}, {256}, 0, (const unsigned short*)fb.data(), (gemv_u4*)wb.data(), 128u);
    int bad16 = 0;
    for (size_t i = 0; i < 1024; ++i) {
        const auto half = [&](const std::vector<unsigned>& v) { return (v[i / 2] >> (16 * (i % 2))) & 0xffffu; };
        const unsigned want = f16_bits_rn(fx[i]), want_b = f16_bits_rn(__uint_as_float(unsigned(fb[i]) << 16));
        bad16 += (half(fh) != want) + (half(ww) != want) + (half(wb) != want_b);
    }
    std::printf("%-44s %d of 3072 differ %s\n", "f32_to_f16, weight_f16_f32/_bf16 [1024]", bad16, bad16 ? "FAIL" : "ok");
    failures += bad16 != 0;
}

static void test_copy() {
    unsigned rows = 19, cols = 30, start = 7, len = 13;
    auto x = randv(rows * cols, 1);
    std::vector<float> y(rows * len), w(rows * len);
    emu_launch(slice_cols_f32, {blocks1d(rows * len)}, {256}, 0, (const float*)x.data(), y.data(), rows, len, cols, start);
    for (unsigned r = 0; r < rows; ++r)
        for (unsigned c = 0; c < len; ++c) w[r * len + c] = x[r * cols + start + c];
    check("slice_cols_f32 [19,30] 7..20", y, w, 0);

    unsigned m = 6, d = 11;
    auto src = randv(m * d, 1);
    std::vector<int> idx = {5, 0, 0, 3, 2, 5, 1, 4, 4, -1, 6};
    std::vector<float> gy(idx.size() * d), gw(idx.size() * d);
    emu_launch(gather_rows_f32, {blocks1d(gy.size())}, {256}, 0, (const float*)src.data(), (const int*)idx.data(),
               gy.data(), (unsigned)idx.size(), d, m);
    for (size_t r = 0; r < idx.size(); ++r)
        for (unsigned c = 0; c < d; ++c)
            gw[r * d + c] = (idx[r] < 0 || idx[r] >= (int)m) ? NAN : src[idx[r] * d + c];
    check("gather_rows_f32 with repeats and 2 bad ids", gy, gw, 0);

    // concat_rows_u32: both parts, either one empty, and one block striding over 1 000 words
    unsigned parts[][2] = {{45, 27}, {0, 27}, {45, 0}, {600, 400}};
    for (auto& pw : parts) {
        std::vector<int> ca(pw[0]), cb(pw[1]);
        for (auto& v : ca) v = (int)rng();
        for (auto& v : cb) v = (int)rng();
        unsigned total = pw[0] + pw[1];
        std::vector<int> cy(total, -1), cw(ca);
        cw.insert(cw.end(), cb.begin(), cb.end());
        emu_launch(concat_rows_u32, {pw[0] == 600 ? 1u : blocks1d(total)}, {256}, 0, (const unsigned*)ca.data(),
                   (const unsigned*)cb.data(), (unsigned*)cy.data(), pw[0], total);
        char name[64];
        std::snprintf(name, sizeof name, "concat_rows_u32 %u + %u words", pw[0], pw[1]);
        checki(name, cy, cw);
    }

    unsigned shapes[][4] = {{5, 7, 6, 3}, {6, 6, 4, 3}, {1, 4, 3, 2}, {23, 17, 5, 2}};
    for (auto& sh : shapes) {
        unsigned H = sh[0], W = sh[1], C = sh[2], R = sh[3];
        unsigned gh = (H + R - 1) / R, gw_ = (W + R - 1) / R, feat = C * R * R;
        auto ux = randv(H * W * C, 1);
        std::vector<float> uy(gh * gw_ * feat), uw(gh * gw_ * feat, 0.0f);
        emu_launch(unfold_f32, {blocks1d(uy.size())}, {256}, 0, (const float*)ux.data(), uy.data(), C, H, W, R, gw_,
                   gh * gw_);
        for (unsigned by = 0; by < gh; ++by)
            for (unsigned bx = 0; bx < gw_; ++bx)
                for (unsigned dy = 0; dy < R; ++dy)
                    for (unsigned dx = 0; dx < R; ++dx) {
                        unsigned yy = by * R + dy, xx = bx * R + dx;
                        if (yy >= H || xx >= W) continue;
                        for (unsigned ch = 0; ch < C; ++ch)
                            uw[(by * gw_ + bx) * feat + ch * R * R + dy * R + dx] = ux[(yy * W + xx) * C + ch];
                    }
        char name[64];
        std::snprintf(name, sizeof name, "unfold_f32 %ux%ux%u r=%u", H, W, C, R);
        check(name, uy, uw, 0);
    }
}

static void test_norm() {
    unsigned shapes[][2] = {{33, 50}, {5, 1000}, {1, 7}};
    for (auto& sh : shapes) {
        unsigned n = sh[0], d = sh[1];
        auto x = randv(n * d, 2), w = randv(d, 1.5);
        std::vector<float> y(n * d), want(n * d);
        emu_launch(rms_norm_f32, {n}, {256}, 0, (const float*)x.data(), (const float*)w.data(), y.data(), n, d, 1e-6f);
        for (unsigned i = 0; i < n; ++i) {
            float s = 0;
            for (unsigned j = 0; j < d; ++j) s += x[i * d + j] * x[i * d + j];
            float inv = 1.0f / std::sqrt(s / d + 1e-6f);
            for (unsigned j = 0; j < d; ++j) want[i * d + j] = x[i * d + j] * inv * w[j];
        }
        char name[64];
        std::snprintf(name, sizeof name, "rms_norm_f32 [%u,%u]", n, d);
        check(name, y, want, 1e-10);
    }
    // fewer blocks than rows: the row loop grid-strides
    unsigned n = 9, d = 40;
    auto x = randv(n * d, 2), w = randv(d, 1.5);
    std::vector<float> y(n * d), want(n * d);
    emu_launch(rms_norm_f32, {4}, {256}, 0, (const float*)x.data(), (const float*)w.data(), y.data(), n, d, 1e-6f);
    for (unsigned i = 0; i < n; ++i) {
        float s = 0;
        for (unsigned j = 0; j < d; ++j) s += x[i * d + j] * x[i * d + j];
        float inv = 1.0f / std::sqrt(s / d + 1e-6f);
        for (unsigned j = 0; j < d; ++j) want[i * d + j] = x[i * d + j] * inv * w[j];
    }
    check("rms_norm_f32 [9,40] on 4 blocks", y, want, 1e-10);
}

static void test_rope() {
    unsigned heads = 3, hd = 64, gh = 4, gw = 9, n = gh * gw, half = hd / 2, quarter = hd / 4;
    float theta = 10000.0f;
    std::vector<float> tab(2 * n * half);
    for (unsigned p = 0; p < n; ++p)
        for (unsigned d = 0; d < half; ++d) {
            float inv = 1.0f / std::pow(theta, float(2 * (d % quarter)) / half);
            float a = (d < quarter ? float(p / gw) : float(p % gw)) * inv;
            tab[p * half + d] = std::cos(a);
            tab[n * half + p * half + d] = std::sin(a);
        }
    auto x = randv(n * heads * hd, 1);
    std::vector<float> y(x.size()), want(x.size());
    emu_launch(rope_2d_f32, {blocks1d(n * heads * half)}, {256}, 0, (const float*)x.data(), (const float*)tab.data(),
               y.data(), n, heads, hd);
    for (unsigned p = 0; p < n; ++p)
        for (unsigned h = 0; h < heads; ++h)
            for (unsigned d = 0; d < half; ++d) {
                size_t base = p * heads * hd + h * hd;
                float c = tab[p * half + d], s = tab[n * half + p * half + d];
                float a = x[base + d], b = x[base + d + half];
                want[base + d] = a * c - b * s;
                want[base + d + half] = b * c + a * s;
            }
    check("rope_2d_f32 3x64 grid 4x9", y, want, 1e-12);
}

// Dynamic shared memory of the flash kernels (the layouts in cuda/attention.cu, lm_attention.cu).
static unsigned fa_ld_host(unsigned hd) {
    unsigned s = (hd + 3) & ~3u;
    return s % 8 == 0 ? s + 4 : s;
}
static size_t att_smem_bytes(unsigned hd) {
    return ((2 * ATT_ROWS + 2 * ATT_KEYS) * fa_ld_host(hd) + 2 * ATT_ROWS * ATT_KEYS + 2 * ATT_ROWS) * 4;
}

// softmax(q·kᵀ · scale) v per head, in f32 as the CPU lane orders it.
static std::vector<float> attention_reference(const std::vector<float>& q, const std::vector<float>& k,
                                              const std::vector<float>& v, unsigned n, unsigned heads, unsigned hd) {
    const unsigned cols = heads * hd;
    const float scale = 1.0f / std::sqrt(float(hd));
    std::vector<float> want(size_t(n) * cols, 0.0f), s(n);
    for (unsigned i = 0; i < n; ++i)
        for (unsigned h = 0; h < heads; ++h) {
            float mx = -INFINITY;
            for (unsigned j = 0; j < n; ++j) {
                float dot = 0;
                for (unsigned d = 0; d < hd; ++d) dot += q[i * cols + h * hd + d] * k[j * cols + h * hd + d];
                s[j] = dot * scale;
                mx = std::max(mx, s[j]);
            }
            float den = 0;
            for (unsigned j = 0; j < n; ++j) den += (s[j] = std::exp(s[j] - mx));
            for (unsigned j = 0; j < n; ++j)
                for (unsigned d = 0; d < hd; ++d) want[i * cols + h * hd + d] += s[j] / den * v[j * cols + h * hd + d];
        }
    return want;
}

// The case with a NaN in one query row: exactly that head row (hd outputs) is NaN.
static void check_one_nan_row(const char* name, const std::vector<float>& y, unsigned hd) {
    size_t nans = 0;
    for (float x : y) nans += std::isnan(x);
    if (nans != hd) {
        std::printf("%-44s %zu NaN outputs, want %u FAIL\n", name, nans, hd);
        ++failures;
    }
}

// {n, heads, hd}: one query, n not a multiple of the query tile or key chunk, hd not a multiple of
// 4 (7, 3, 33) or of 8, hd above the block size (200); the n = 97 case has a NaN in one query.
static const unsigned ATTENTION_SHAPES[][3] = {{1, 1, 16}, {45, 3, 16}, {130, 4, 32}, {300, 2, 72}, {129, 1, 200},
                                               {33, 2, 7},  {70, 1, 3},  {65, 3, 33}, {97, 2, 64}};

static void test_attention() {
    for (auto& sh : ATTENTION_SHAPES) {
        unsigned n = sh[0], heads = sh[1], hd = sh[2], cols = heads * hd;
        bool with_nan = n == 97;
        auto q = randv(n * cols, 1.5), k = randv(n * cols, 1.5), v = randv(n * cols, 1);
        if (with_nan) q[40 * cols + 1 * hd + 5] = NAN;
        std::vector<float> y(n * cols);
        float scale = 1.0f / std::sqrt(float(hd));
        emu_launch(attention_f32, {(n + ATT_ROWS - 1) / ATT_ROWS, heads}, {ATT_THREADS}, att_smem_bytes(hd),
                   (const float*)q.data(), (const float*)k.data(), (const float*)v.data(), y.data(), n, heads, hd,
                   scale);
        char name[64];
        std::snprintf(name, sizeof name, "attention_f32 n=%u %ux%u%s", n, heads, hd, with_nan ? " one NaN" : "");
        check(name, y, attention_reference(q, k, v, n, heads, hd), 1e-10);
        if (with_nan) check_one_nan_row(name, y, hd);
    }
}

// attention_kv_f16 + attention_fast_d*: f16 operands (q, k, v and the probabilities), f32
// softmax. tests/ops.rs derives NMSE ≈ FAST_GEMM_NMSE · (1 + var(s)) = 8e-8 · (1 + 0.5625) for
// these inputs (uniform ±1.5: var(q) = var(k) = 0.75, so var(s) = 0.75²); gated at 4×, 5e-7. Head
// widths up to 128 (the widest instantiation): each pads to the next of 16, 32, 64, 128.
static void test_attention_fast() {
    for (auto& sh : ATTENTION_SHAPES) {
        unsigned n = sh[0], heads = sh[1], hd = sh[2], cols = heads * hd;
        if (hd > 128) continue;
        bool with_nan = n == 97;
        auto q = randv(n * cols, 1.5), k = randv(n * cols, 1.5), v = randv(n * cols, 1);
        if (with_nan) q[40 * cols + 1 * hd + 5] = NAN;
        std::vector<float> y(n * cols);
        float scale = 1.0f / std::sqrt(float(hd));
        const unsigned hdp = hd <= 16 ? 16 : hd <= 32 ? 32 : hd <= 64 ? 64 : 128;
        auto kernel = hdp == 16   ? attention_fast_d16
                      : hdp == 32 ? attention_fast_d32
                      : hdp == 64 ? attention_fast_d64
                                  : attention_fast_d128;
        const unsigned np = (n + FA_KEYS - 1) / FA_KEYS * FA_KEYS;
        const size_t words = size_t(heads) * np * (hdp / 2);
        // f16 NaN pairs: a word the first kernel skipped would turn the outputs NaN (p = 0 times NaN)
        std::vector<unsigned> kv16(2 * words, 0x7e007e00u);
        emu_launch(attention_kv_f16, {blocks1d(2 * words)}, {256}, 0, (const float*)k.data(), (const float*)v.data(),
                   kv16.data(), n, heads, hd, hdp, np);
        const size_t smem = 2 * (FA_KEYS * (hdp / 2 + 4) + hdp * (FA_KEYS / 2 + 4)) * 4;
        emu_launch(kernel, {(n + 16 * FA_WARPS - 1) / (16 * FA_WARPS), heads}, {32 * FA_WARPS}, smem,
                   (const float*)q.data(), (const unsigned*)kv16.data(), y.data(), n, heads, hd, np, scale);
        char name[64];
        std::snprintf(name, sizeof name, "attention_fast n=%u %ux%u%s", n, heads, hd, with_nan ? " one NaN" : "");
        check(name, y, attention_reference(q, k, v, n, heads, hd), 5e-7);
        if (with_nan) check_one_nan_row(name, y, hd);
    }
}

// attention_qkv_rope_f16 against its composition, bit for bit: rope_2d_f32 of q and of k (out of
// qkv's columns), then attention_kv_f16 of the rotated k and v. Head widths padded to 16, 32, 64
// and 128 (72: past half the padded width); n not a multiple of a block's 64 rows but for n = 64.
static void test_attention_qkv_rope() {
    const unsigned SHAPES[][3] = {{1, 1, 16}, {45, 3, 16}, {64, 1, 64}, {130, 4, 32}, {97, 2, 64}, {300, 2, 72}};
    for (auto& sh : SHAPES) {
        unsigned n = sh[0], heads = sh[1], hd = sh[2], cols = heads * hd, half = hd / 2;
        const unsigned hdp = hd <= 16 ? 16 : hd <= 32 ? 32 : hd <= 64 ? 64 : 128;
        const unsigned np = (n + FA_KEYS - 1) / FA_KEYS * FA_KEYS;
        const size_t words = size_t(heads) * np * (hdp / 2);
        auto qkv = randv(size_t(n) * 3 * cols, 1.5);
        // a table with every row and dim its own (rope_2d's cos, then sin)
        auto tab = randv(size_t(2) * n * half, 1);
        std::vector<float> q(size_t(n) * cols), k(q.size()), v(q.size());
        for (unsigned j = 0; j < n; ++j)
            for (unsigned c = 0; c < cols; ++c) {
                q[j * cols + c] = qkv[size_t(j) * 3 * cols + c];
                k[j * cols + c] = qkv[size_t(j) * 3 * cols + cols + c];
                v[j * cols + c] = qkv[size_t(j) * 3 * cols + 2 * cols + c];
            }
        std::vector<float> q_rot(q.size()), k_rot(q.size());
        emu_launch(rope_2d_f32, {blocks1d(n * heads * half)}, {256}, 0, (const float*)q.data(),
                   (const float*)tab.data(), q_rot.data(), n, heads, hd);
        emu_launch(rope_2d_f32, {blocks1d(n * heads * half)}, {256}, 0, (const float*)k.data(),
                   (const float*)tab.data(), k_rot.data(), n, heads, hd);
        std::vector<unsigned> want(2 * words, 0x7e007e00u), got(2 * words, 0x7e007e00u);
        emu_launch(attention_kv_f16, {blocks1d(2 * words)}, {256}, 0, (const float*)k_rot.data(),
                   (const float*)v.data(), want.data(), n, heads, hd, hdp, np);
        std::vector<float> q_got(q.size(), NAN);
        emu_launch(attention_qkv_rope_f16, {np / FA_KEYS, heads}, {QKV_THREADS}, 0, (const float*)qkv.data(),
                   (const float*)tab.data(), q_got.data(), got.data(), n, heads, hd, hdp, np);
        char name[64];
        std::snprintf(name, sizeof name, "attention_qkv_rope_f16 n=%u %ux%u q", n, heads, hd);
        size_t q_diff = 0, kv_diff = 0;
        for (size_t i = 0; i < q.size(); ++i) q_diff += std::memcmp(&q_got[i], &q_rot[i], 4) != 0;
        for (size_t i = 0; i < got.size(); ++i) kv_diff += got[i] != want[i];
        std::printf("%-44s %zu of %zu differ, kv16 %zu of %zu %s\n", name, q_diff, q.size(), kv_diff, got.size(),
                    q_diff + kv_diff == 0 ? "ok" : "FAIL");
        failures += q_diff + kv_diff != 0;
    }
}

// rms_norm_f16 and swiglu_f16 (cuBLASLt's f16 operands written by the op before the GEMM)
// against their compositions, bit for bit: rms_norm_f32 / swiglu_f32, then f32_to_f16. Rows of
// one block's width and past it, gates large both ways (exp over- and underflow), a NaN.
static void test_f16_operands() {
    const auto same_words = [](const char* name, const std::vector<unsigned>& got, const std::vector<unsigned>& want) {
        size_t diff = 0;
        for (size_t i = 0; i < got.size(); ++i) diff += got[i] != want[i];
        std::printf("%-44s %zu of %zu differ %s\n", name, diff, got.size(), diff ? "FAIL" : "ok");
        failures += diff != 0;
    };
    const unsigned NORMS[][2] = {{1, 8}, {3, 1024}, {70, 40}, {5, 2104}};
    for (auto& sh : NORMS) {
        unsigned n = sh[0], d = sh[1];
        auto x = randv(n * d, 2), w = randv(d, 1.5);
        if (n == 70) x[3 * d + 5] = NAN;
        std::vector<float> y(n * d);
        std::vector<unsigned> want(n * d / 2, 0x7e007e00u), got(n * d / 2, 0x7e007e00u);
        emu_launch(rms_norm_f32, {n}, {256}, 0, (const float*)x.data(), (const float*)w.data(), y.data(), n, d, 1e-6f);
        emu_launch(f32_to_f16, {blocks1d(n * d / 4)}, {256}, 0, (const float*)y.data(), (f16x4_words*)want.data(),
                   n * d / 4);
        emu_launch(rms_norm_f16, {n}, {256}, 0, (const float*)x.data(), (const float*)w.data(),
                   (f16x4_words*)got.data(), n, d, 1e-6f);
        char name[64];
        std::snprintf(name, sizeof name, "rms_norm_f16 [%u,%u]", n, d);
        same_words(name, got, want);
    }
    const unsigned GATES[][2] = {{1, 4}, {21, 56}, {9, 1024}};
    for (auto& sh : GATES) {
        unsigned rows = sh[0], h = sh[1];
        auto x = randv(rows * 2 * h, 4);
        x[0] = 120.0f, x[1] = -120.0f; // silu's exp under- and overflows
        if (rows > 1) x[2 * h + 3] = NAN;
        std::vector<float> y(rows * h);
        std::vector<unsigned> want(rows * h / 2, 0x7e007e00u), got(rows * h / 2, 0x7e007e00u);
        emu_launch(swiglu_f32, {blocks1d(rows * h)}, {256}, 0, (const float*)x.data(), y.data(), rows, h);
        emu_launch(f32_to_f16, {blocks1d(rows * h / 4)}, {256}, 0, (const float*)y.data(), (f16x4_words*)want.data(),
                   rows * h / 4);
        emu_launch(swiglu_f16, {blocks1d(rows * h / 4)}, {256}, 0, (const float*)x.data(), (f16x4_words*)got.data(),
                   rows, h);
        char name[64];
        std::snprintf(name, sizeof name, "swiglu_f16 [%u,2x%u]", rows, h);
        same_words(name, got, want);
    }
}

static void test_linear() {
    // n <= 8 takes gemv_cols: one row, eight (the bound), odd counts; k % 8 == 0 takes its runs of
    // 8 (16-byte loads), other k single elements
    unsigned shapes[][3] = {{1, 7, 5},    {37, 70, 45}, {130, 96, 67}, {70, 300, 33}, {65, 33, 129},
                            {8, 300, 45}, {3, 70, 17},  {9, 40, 9},   {2, 40, 1029}, {1, 2048, 7},
                            {8, 96, 10},  {5, 1064, 3}};
    for (int fmt = 0; fmt < 3; ++fmt)
        for (auto& sh : shapes) {
            unsigned n = sh[0], k = sh[1], o = sh[2];
            auto x = randv(n * k, 1), b = randv(o, 0.5), wf = randv(o * k, std::sqrt(3.0f / k));
            if (fmt == 2) // some f16 subnormals, signed zeros
                for (size_t i = 0; i < wf.size(); i += 7) wf[i] = (i % 2 ? -1.0f : 1.0f) * 1e-6f * float(i % 61);
            std::vector<uint16_t> w16(o * k);
            std::vector<float> wdec(o * k);
            for (size_t i = 0; i < wf.size(); ++i) {
                if (fmt == 0) wdec[i] = wf[i];
                if (fmt == 1) {
                    uint32_t u;
                    std::memcpy(&u, &wf[i], 4);
                    w16[i] = uint16_t(u >> 16);
                    uint32_t back = uint32_t(w16[i]) << 16;
                    std::memcpy(&wdec[i], &back, 4);
                }
                if (fmt == 2) {
                    _Float16 h = (_Float16)wf[i];
                    std::memcpy(&w16[i], &h, 2);
                    wdec[i] = (float)h;
                }
            }
            bool bias = n % 2;
            std::vector<float> y(n * o), want(n * o);
            dim3 grid = gemm_grid(n, o), block{128};
            const float* bp = bias ? b.data() : nullptr;
            if (fmt == 0)
                emu_launch(linear_f32, grid, block, 0, (const float*)x.data(), (const float*)wf.data(), bp, y.data(),
                           (float*)nullptr, n, k, o, (unsigned)bias, 0u);
            if (fmt == 1)
                emu_launch(linear_bf16, grid, block, 0, (const float*)x.data(), (const unsigned short*)w16.data(), bp,
                           y.data(), (float*)nullptr, n, k, o, (unsigned)bias, 0u);
            if (fmt == 2)
                emu_launch(linear_f16, grid, block, 0, (const float*)x.data(), (const unsigned short*)w16.data(), bp,
                           y.data(), (float*)nullptr, n, k, o, (unsigned)bias, 0u);
            for (unsigned i = 0; i < n; ++i)
                for (unsigned c = 0; c < o; ++c) {
                    float dot = 0;
                    for (unsigned j = 0; j < k; ++j) dot += x[i * k + j] * wdec[c * k + j];
                    want[i * o + c] = dot + (bias ? b[c] : 0.0f);
                }
            char name[64];
            std::snprintf(name, sizeof name, "linear_%s x[%u,%u] W[%u,%u]%s", fmt == 0 ? "f32" : fmt == 1 ? "bf16" : "f16",
                          n, k, o, k, bias ? " +b" : "");
            check(name, y, want, GEMM_NMSE);
        }
}

// ---- language-model kernels (cuda/lm_attention.cu, cuda/moe.cu) ------------------------------

// Non-finite entries must match bit for bit (−inf masks, NaN heads); NMSE over the finite rest.
static void check_masked(const char* name, const std::vector<float>& got, const std::vector<float>& want,
                         double bound) {
    size_t bad = got.size() != want.size();
    std::vector<float> g, w;
    for (size_t i = 0; i < want.size() && !bad; ++i) {
        if (!std::isfinite(want[i]) || !std::isfinite(got[i])) {
            bool same = std::isnan(want[i]) ? std::isnan(got[i]) : got[i] == want[i];
            bad += !same;
            continue;
        }
        g.push_back(got[i]);
        w.push_back(want[i]);
    }
    if (bad) {
        std::printf("%-44s %zu non-finite mismatch(es) FAIL\n", name, bad);
        ++failures;
        return;
    }
    check(name, g, w, bound);
}

// A weight in format fmt (0 f32, 1 bf16, 2 f16): the raw 16-bit words and the decoded values.
static void make_weight(int fmt, const std::vector<float>& wf, std::vector<uint16_t>& w16, std::vector<float>& wdec) {
    w16.assign(wf.size(), 0);
    wdec.assign(wf.size(), 0.0f);
    for (size_t i = 0; i < wf.size(); ++i) {
        if (fmt == 0) wdec[i] = wf[i];
        if (fmt == 1) {
            uint32_t u;
            std::memcpy(&u, &wf[i], 4);
            w16[i] = uint16_t(u >> 16);
            uint32_t back = uint32_t(w16[i]) << 16;
            std::memcpy(&wdec[i], &back, 4);
        }
        if (fmt == 2) {
            _Float16 h = (_Float16)wf[i];
            std::memcpy(&w16[i], &h, 2);
            wdec[i] = (float)h;
        }
    }
}
static const char* fmt_name(int fmt) { return fmt == 0 ? "f32" : fmt == 1 ? "bf16" : "f16"; }

// The fused aligner layer against unfold_f32 (copy.cu) then a plain dot product, bias and GELU:
// grids that pad on both edges, on one, on none; r = 3 (the model's) and 2.
static void test_unfold_linear_gelu() {
    struct Shape { unsigned h, w, c, r, o; } shapes[] = {{7, 5, 6, 3, 70}, {6, 9, 4, 3, 33}, {23, 17, 5, 2, 65},
                                                          {1, 1, 3, 3, 9}};
    for (int fmt = 0; fmt < 3; ++fmt)
        for (auto sh : shapes) {
            const unsigned h = sh.h, w = sh.w, c = sh.c, r = sh.r, o = sh.o;
            const unsigned cw = (w + r - 1) / r, cells = (h + r - 1) / r * cw, k = c * r * r;
            auto x = randv(h * w * c, 2), b = randv(o, 0.5), wf = randv(o * k, std::sqrt(3.0f / k));
            std::vector<uint16_t> w16;
            std::vector<float> wdec;
            make_weight(fmt, wf, w16, wdec);
            std::vector<float> cellsv(cells * k), y(cells * o), want(cells * o);
            emu_launch(unfold_f32, {blocks1d(cells * k)}, {256}, 0, (const float*)x.data(), cellsv.data(), c, h, w, r,
                       cw, cells);
            const bool bias = fmt != 1;
            const float* bp = bias ? b.data() : nullptr;
            dim3 grid{(o + 63) / 64, (cells + 63) / 64}, block{128};
            if (fmt == 0)
                emu_launch(unfold_linear_gelu_f32, grid, block, 0, (const float*)x.data(), (const float*)wf.data(), bp,
                           y.data(), c, h, w, r, cw, cells, o, (unsigned)bias);
            else
                emu_launch(fmt == 1 ? unfold_linear_gelu_bf16 : unfold_linear_gelu_f16, grid, block, 0,
                           (const float*)x.data(), (const unsigned short*)w16.data(), bp, y.data(), c, h, w, r, cw,
                           cells, o, (unsigned)bias);
            for (unsigned m = 0; m < cells; ++m)
                for (unsigned col = 0; col < o; ++col) {
                    double dot = bias ? b[col] : 0.0;
                    for (unsigned j = 0; j < k; ++j) dot += (double)cellsv[m * k + j] * wdec[col * k + j];
                    want[m * o + col] = float(0.5 * dot * std::erfc(-dot / std::sqrt(2.0)));
                }
            char name[80];
            std::snprintf(name, sizeof name, "unfold_linear_gelu_%s %ux%ux%u r=%u ->%u%s", fmt_name(fmt), h, w, c, r, o,
                          bias ? " +b" : "");
            check(name, y, want, GEMM_NMSE);
        }
}


// The CPU lane's sink_attention (src/backend/cpu/lm.rs), NaN heads for bad operands.
static std::vector<float> sink_ref(const std::vector<float>& q, const std::vector<float>& kv, const std::vector<int>& win,
                                   const std::vector<float>& comp, const std::vector<int>& idx,
                                   const std::vector<float>& sinks, unsigned n, unsigned heads, unsigned hd, unsigned m,
                                   unsigned kk, unsigned c_rows) {
    unsigned cols = heads * hd;
    std::vector<float> out(n * cols, 0.0f);
    float scale = 1.0f / std::sqrt(float(hd));
    for (unsigned i = 0; i < n; ++i) {
        int lo = win[2 * i], hi = win[2 * i + 1];
        bool bad = lo <= hi && (lo < 0 || hi >= (int)m);
        for (unsigned s = 0; s < kk; ++s) bad = bad || idx[i * kk + s] < -1 || idx[i * kk + s] >= (int)c_rows;
        std::vector<const float*> keys;
        if (!bad && lo <= hi)
            for (int j = lo; j <= hi; ++j) keys.push_back(&kv[j * hd]);
        for (unsigned s = 0; s < kk && !bad; ++s)
            if (idx[i * kk + s] >= 0) keys.push_back(&comp[idx[i * kk + s] * hd]);
        for (unsigned h = 0; h < heads; ++h) {
            float* o = &out[i * cols + h * hd];
            if (bad) {
                for (unsigned d = 0; d < hd; ++d) o[d] = NAN;
                continue;
            }
            std::vector<float> p(keys.size());
            float mx = sinks[h];
            for (size_t j = 0; j < keys.size(); ++j) {
                float dot = 0;
                for (unsigned d = 0; d < hd; ++d) dot += q[i * cols + h * hd + d] * keys[j][d];
                p[j] = dot * scale;
                mx = std::max(mx, p[j]);
            }
            float den = std::exp(sinks[h] - mx);
            for (auto& v : p) den += (v = std::exp(v - mx));
            for (size_t j = 0; j < keys.size(); ++j)
                for (unsigned d = 0; d < hd; ++d) o[d] += p[j] / den * keys[j][d];
        }
    }
    return out;
}

static size_t sink_smem_bytes(unsigned hd) {
    return ((2 * SA_HEADS + SA_KEYS) * fa_ld_host(hd) + 2 * SA_HEADS * SA_KEYS + 2 * SA_HEADS + SA_KEYS) * 4;
}

// sink_attention_f32 with `splits` key splits (and the merge kernel when splits > 1).
static std::vector<float> sink_run(const std::vector<float>& q, const std::vector<float>& kv, const std::vector<int>& win,
                                   const std::vector<float>& comp, const std::vector<int>& idx,
                                   const std::vector<float>& sinks, unsigned n, unsigned heads, unsigned hd, unsigned m,
                                   unsigned kk, unsigned c, unsigned splits) {
    unsigned cols = heads * hd;
    std::vector<float> y(n * cols, 123.0f), part(splits > 1 ? size_t(n) * heads * splits * (2 + hd) : 1, 0.0f);
    float scale = 1.0f / std::sqrt(float(hd));
    emu_launch(sink_attention_f32, {n, (heads + SA_HEADS - 1) / SA_HEADS, splits}, {SA_THREADS}, sink_smem_bytes(hd),
               (const float*)q.data(), (const float*)kv.data(), (const int*)win.data(), (const float*)comp.data(),
               (const int*)idx.data(), (const float*)sinks.data(), y.data(), part.data(), n, heads, hd, m, kk, c,
               scale);
    if (splits > 1)
        emu_launch(sink_attention_merge_f32, {blocks1d(n * cols)}, {256}, 0, (const float*)part.data(),
                   (const float*)sinks.data(), y.data(), n * cols, heads, hd, splits);
    return y;
}

// The inputs of sink_attention case `which` (n, heads, hd, m raw keys, c compressed rows, kk
// slots): windows of varying length (query 1's empty, and every slot of query 1 −1: it sees no
// key), every fifth slot −1, a −inf sink (cases 1 and 4); with bad_ops a window past m (query 2)
// and an index ≥ c (query 3), NaN heads; with with_nan a NaN element in query 2, head 17.
struct SinkCase {
    std::vector<float> q, kv, comp, sinks;
    std::vector<int> win, idx;
};
static SinkCase sink_case(unsigned n, unsigned heads, unsigned hd, unsigned m, unsigned c, unsigned kk, int which,
                          bool bad_ops, bool with_nan) {
    const unsigned cols = heads * hd;
    SinkCase s{randv(n * cols, 1.5), randv(m * hd, 1.5), randv(std::max(c, 1u) * hd, 1.5), randv(heads, 2), {}, {}};
    if (which == 1 || which == 4) s.sinks[1] = -INFINITY;
    if (with_nan) s.q[2 * cols + 17 * hd + 3] = NAN; // query 2, head 17 (second head group of 16)
    s.win.assign(2 * n, 0);
    s.idx.assign(std::max(n * kk, 1u), -1);
    for (unsigned i = 0; i < n; ++i) {
        int lo = (int)(i * 37 % m), len = (int)((i * 53 + which * 11 + (n == 1 ? m : 0)) % (m + 1));
        s.win[2 * i] = lo;
        s.win[2 * i + 1] = std::min(lo + len - 1, (int)m - 1);
    }
    if (n > 1) s.win[2 * 1] = 5, s.win[2 * 1 + 1] = 4; // query 1: empty window
    for (unsigned j = 0; j < n * kk; ++j) s.idx[j] = (j % 5 == 1) ? -1 : (int)(rng() % c);
    if (kk && n > 1) // query 1 sees nothing at all (empty window, every slot −1): zeros
        for (unsigned k = 0; k < kk; ++k) s.idx[1 * kk + k] = -1;
    if (bad_ops) {
        s.win[2 * 2 + 1] = (int)m;
        s.idx[3 * kk + kk - 1] = (int)c;
    }
    return s;
}

// A query without keys (query 1) gets zeros, whatever its sinks.
static void check_query1_zeros(const char* name, const std::vector<float>& y, unsigned n, unsigned cols) {
    bool zeros = true;
    for (unsigned d = 0; d < cols && n > 1; ++d) zeros = zeros && y[1 * cols + d] == 0.0f;
    if (!zeros) {
        std::printf("%-44s query without keys not zero FAIL\n", name);
        ++failures;
    }
}

static void test_sink_attention() {
    // n, heads, hd, m, c, kk, splits: hd not a multiple of 4 (33, 7) and above the block size
    // (130), heads not a multiple of SA_HEADS (3, 20) and below it, key counts across several
    // chunks (windows up to 300 keys, 150 slots), empty windows, all slots −1, −inf sinks, no
    // compressed entries (kk = 0), a NaN query element (one NaN head), bad operands, and split
    // keys (decode: n = 1 with all of LM's 64 heads, and more splits than chunks).
    struct Shape { unsigned n, heads, hd, m, c, kk, splits; } shapes[] = {
        {7, 3, 20, 12, 5, 4, 1},     {5, 2, 130, 300, 9, 7, 1},  {6, 1, 16, 10, 0, 0, 1},
        {4, 2, 33, 200, 140, 150, 1}, {4, 20, 7, 90, 30, 40, 3}, {1, 64, 36, 140, 70, 100, 4},
        {3, 17, 12, 40, 9, 6, 9},     {4, 2, 33, 200, 140, 150, 5}};
    int which = 0;
    for (auto sh : shapes) {
        unsigned n = sh.n, heads = sh.heads, hd = sh.hd, m = sh.m, c = sh.c, kk = sh.kk, cols = heads * hd;
        bool bad_ops = which == 3 || which == 7, with_nan = which == 4;
        const SinkCase s = sink_case(n, heads, hd, m, c, kk, which, bad_ops, with_nan);
        auto y = sink_run(s.q, s.kv, s.win, s.comp, s.idx, s.sinks, n, heads, hd, m, kk, c, sh.splits);
        auto want = sink_ref(s.q, s.kv, s.win, s.comp, s.idx, s.sinks, n, heads, hd, m, kk, c);
        char name[96];
        std::snprintf(name, sizeof name, "sink_attention n=%u %ux%u m=%u c=%u k=%u split %u%s%s", n, heads, hd, m, c,
                      kk, sh.splits, bad_ops ? " bad ops" : "", with_nan ? " NaN" : "");
        check_query1_zeros(name, y, n, cols);
        check_masked(name, y, want, 1e-10);
        ++which;
    }
}

// sink_rows_f16 + sink_attention_fast_d*: f16 operands (q, the keys = values, the probabilities),
// f32 softmax, the bound of test_attention_fast (the same derivation, q and keys uniform ±1.5):
// 5e-7. Heads below, at and past one block's 64 (70: a second head group of 6), head widths padded
// to 128 (20, 36) and to 512 (130, 512), keys over several 64-key chunks, query 0 of the second
// case with its slots past the 20th −1 (its last two chunks have no key: skipped) and of the third
// with a chunk without keys between two with keys, query 1 without
// keys, a −inf sink, a NaN query element, bad operands, no compressed entries.
static void test_sink_attention_fast() {
    struct Shape { unsigned n, heads, hd, m, c, kk; } shapes[] = {
        {5, 3, 20, 150, 9, 7}, {4, 70, 36, 90, 30, 140}, {3, 64, 130, 200, 140, 150}, {3, 2, 512, 70, 0, 0}};
    int which = 0;
    for (auto sh : shapes) {
        unsigned n = sh.n, heads = sh.heads, hd = sh.hd, m = sh.m, c = sh.c, kk = sh.kk, cols = heads * hd;
        bool bad_ops = which == 1, with_nan = which == 2;
        SinkCase s = sink_case(n, heads, hd, m, c, kk, which, bad_ops, with_nan);
        if (which == 1)
            for (unsigned k = 20; k < kk; ++k) s.idx[k] = -1;
        if (which == 2) // query 0 (22 window keys): slots 42 .. 105 are keys 64 .. 127, a chunk with
            for (unsigned k = 42; k < 106; ++k) s.idx[k] = -1; // no key between two with keys

        const unsigned hdp = hd <= 128 ? 128 : 512, rw = hdp / 2;
        auto kernel = hdp == 128 ? sink_attention_fast_d128 : sink_attention_fast_d512;
        // f16 NaN pairs: a word sink_rows_f16 skipped would turn outputs NaN
        std::vector<unsigned> kv16(m * rw, 0x7e007e00u), comp16(std::max(c, 1u) * rw, 0x7e007e00u);
        emu_launch(sink_rows_f16, {blocks1d(m * rw)}, {256}, 0, (const float*)s.kv.data(), kv16.data(), m, hd, hdp);
        if (c)
            emu_launch(sink_rows_f16, {blocks1d(c * rw)}, {256}, 0, (const float*)s.comp.data(), comp16.data(), c, hd,
                       hdp);
        std::vector<float> y(n * cols, 123.0f);
        const size_t smem = (SF_HEADS * (rw + 4) + 2 * (SF_KEYS * (rw + 4) + SF_KEYS)) * 4;
        emu_launch(kernel, {n, (heads + SF_HEADS - 1) / SF_HEADS}, {32 * SF_WARPS}, smem, (const float*)s.q.data(),
                   (const unsigned*)kv16.data(), (const int*)s.win.data(), (const unsigned*)comp16.data(),
                   (const int*)s.idx.data(), (const float*)s.sinks.data(), y.data(), heads, hd, m, kk, c,
                   1.0f / std::sqrt(float(hd)));
        auto want = sink_ref(s.q, s.kv, s.win, s.comp, s.idx, s.sinks, n, heads, hd, m, kk, c);
        char name[96];
        std::snprintf(name, sizeof name, "sink_attention_fast n=%u %ux%u m=%u c=%u k=%u%s%s", n, heads, hd, m, c, kk,
                      bad_ops ? " bad ops" : "", with_nan ? " NaN" : "");
        check_query1_zeros(name, y, n, cols);
        check_masked(name, y, want, 5e-7);
        ++which;
    }
}

static void test_indexer_scores() {
    struct Shape { unsigned n, m, heads, hd, pos0, ratio; } shapes[] = {
        {11, 5, 3, 17, 5, 4}, {3, 600, 2, 40, 2000, 4}, {9, 7, 1, 5, 0, 1}, {2, 70, 300, 2, 8960, 128},
        {130, 100, 5, 33, 0, 1}}; // the last: the second key tile is invisible to queries < 64
    for (auto sh : shapes) {
        unsigned n = sh.n, m = sh.m, heads = sh.heads, hd = sh.hd, cols = heads * hd;
        auto q = randv(n * cols, 1), k = randv(m * hd, 1), w = randv(n * heads, 1);
        float scale = 0.37f;
        std::vector<float> y(n * m), want(n * m, -INFINITY);
        emu_launch(indexer_scores_f32, {(m + 63) / 64, n, 1}, {256}, 0, (const float*)q.data(), (const float*)k.data(),
                   (const float*)w.data(), y.data(), n, m, heads, hd, scale, sh.pos0, sh.ratio);
        for (unsigned i = 0; i < n; ++i) {
            unsigned vis = std::min((sh.pos0 + i + 1) / sh.ratio, m);
            for (unsigned j = 0; j < vis; ++j) {
                float s = 0;
                for (unsigned h = 0; h < heads; ++h) {
                    float dot = 0;
                    for (unsigned d = 0; d < hd; ++d) dot += q[i * cols + h * hd + d] * k[j * hd + d];
                    s += w[i * heads + h] * std::max(dot, 0.0f);
                }
                want[i * m + j] = s * scale;
            }
        }
        char name[80];
        std::snprintf(name, sizeof name, "indexer_scores n=%u m=%u %ux%u pos0 %u r=%u", n, m, heads, hd, sh.pos0,
                      sh.ratio);
        check_masked(name, y, want, 1e-10);
    }
}

static void test_compress_pool() {
    struct Shape { unsigned t, ratio, d; bool overlap; } shapes[] = {
        {14, 4, 13, false}, {14, 3, 11, true}, {3, 4, 5, true}, {300, 128, 7, true}, {8, 1, 300, false}};
    for (auto sh : shapes) {
        unsigned t = sh.t, r = sh.ratio, d = sh.d, w = sh.overlap ? 2 * d : d, n = t / r;
        auto kv = randv(t * w, 2), gate = randv(t * w, 3), ape = randv(r * w, 1);
        std::vector<float> y(std::max(n * d, 1u), 7.0f), want(std::max(n * d, 1u), 7.0f);
        emu_launch(compress_pool_f32, {blocks1d(n * d)}, {256}, 0, (const float*)kv.data(), (const float*)gate.data(),
                   (const float*)ape.data(), y.data(), n * d, d, w, r, (unsigned)sh.overlap);
        for (unsigned i = 0; i < n; ++i)
            for (unsigned c = 0; c < d; ++c) {
                std::vector<std::pair<float, float>> vals;
                if (sh.overlap && i > 0)
                    for (unsigned tt = (i - 1) * r; tt < i * r; ++tt)
                        vals.push_back({kv[tt * w + c], gate[tt * w + c] + ape[(tt % r) * w + c]});
                unsigned off = sh.overlap ? d : 0;
                for (unsigned tt = i * r; tt < (i + 1) * r; ++tt)
                    vals.push_back({kv[tt * w + off + c], gate[tt * w + off + c] + ape[(tt % r) * w + off + c]});
                float mx = -INFINITY, den = 0, acc = 0;
                for (auto& v : vals) mx = std::max(mx, v.second);
                for (auto& v : vals) den += std::exp(v.second - mx);
                for (auto& v : vals) acc += std::exp(v.second - mx) / den * v.first;
                want[i * d + c] = acc;
            }
        char name[80];
        std::snprintf(name, sizeof name, "compress_pool T=%u r=%u d=%u%s", t, r, d, sh.overlap ? " overlap" : "");
        check(name, y, want, 1e-12);
    }
}

static void test_grouped_linear() {
    struct Shape { unsigned n, g, k, r; } shapes[] = {{9, 3, 21, 5},  {2, 4, 30, 11}, {33, 2, 40, 17},
                                                      {1, 8, 7, 3},   {70, 2, 45, 67}, {8, 2, 45, 67},
                                                      {1, 3, 100, 9}};
    for (int fmt = 0; fmt < 3; ++fmt)
        for (auto sh : shapes) {
            unsigned n = sh.n, g = sh.g, k = sh.k, r = sh.r;
            auto x = randv(n * g * k, 1), wf = randv(g * r * k, 0.5f);
            std::vector<uint16_t> w16;
            std::vector<float> wdec;
            make_weight(fmt, wf, w16, wdec);
            const unsigned tiles = gemm_grid(n, r).x;
            dim3 grid{g * tiles, gemm_grid(n, r).y}, block{128};
            std::vector<float> y(n * g * r, 9.0f), want(n * g * r);
            if (fmt == 0)
                emu_launch(grouped_linear_f32, grid, block, 0, (const float*)x.data(), (const float*)wf.data(), y.data(),
                           n, k, r, g, tiles);
            else
                emu_launch(fmt == 1 ? grouped_linear_bf16 : grouped_linear_f16, grid, block, 0, (const float*)x.data(),
                           (const unsigned short*)w16.data(), y.data(), n, k, r, g, tiles);
            for (unsigned i = 0; i < n; ++i)
                for (unsigned o = 0; o < g * r; ++o) {
                    float dot = 0;
                    for (unsigned j = 0; j < k; ++j) dot += x[i * g * k + (o / r) * k + j] * wdec[o * k + j];
                    want[i * g * r + o] = dot;
                }
            char name[80];
            std::snprintf(name, sizeof name, "grouped_linear_%s x[%u,%ux%u] W[%ux%u,%u]", fmt_name(fmt), n, g, k, g, r, k);
            check(name, y, want, GEMM_NMSE);
        }
}

// The host side of moe_experts (src/backend/cuda/moe.rs) on the emulator: route (order and tile
// list, checked exactly), then one gate, one up and one down launch over all tiles with the
// experts' weights taken from address tables, then the combine. The up projection is in the next
// format after the gate's (f32 -> bf16 -> f16 -> f32): gate and up in different formats, as GGUF
// mixes store them.
static void test_moe() {
    // skew: 3/4 of the slots on expert 0 (several row tiles), none on expert 1 (between others)
    // at most 8 tokens (n = 6, 1 and 4 here) take gemm_block's small-row path, in 8-row tiles
    struct Shape { unsigned n, d, h, e, k; bool skew; } shapes[] = {
        {6, 19, 13, 5, 3, false}, {90, 20, 17, 7, 6, false}, {1, 33, 40, 3, 2, false},
        {40, 70, 37, 3, 2, false}, {100, 24, 9, 5, 2, true}, {4, 50, 30, 6, 2, false}};
    int which = 0;
    for (int fmt = 0; fmt < 3; ++fmt)
        for (auto sh : shapes) {
            unsigned n = sh.n, d = sh.d, h = sh.h, E = sh.e, k = sh.k, slots = n * k;
            auto x = randv(n * d, 3), wt = randv(slots, 1);
            std::vector<int> ids(slots);
            for (unsigned s = 0; s < slots; ++s)
                ids[s] = sh.skew ? (rng() % 4 ? 0 : 2 + (int)(rng() % (E - 2))) // expert 1 unused
                                 : (int)(rng() % (E - 1));                      // expert E-1 unused
            if (which == 2) ids[slots - 1] = (int)E;                           // bad id: token n-1 → NaN row
            const int ufmt = (fmt + 1) % 3;
            std::vector<std::vector<uint16_t>> w1h(E), w3h(E), w2h(E);
            std::vector<std::vector<float>> w1d(E), w3d(E), w2d(E);
            std::vector<std::vector<float>> w1f(E), w3f(E), w2f(E);
            for (unsigned e = 0; e < E; ++e) {
                w1f[e] = randv(h * d, std::sqrt(3.0f / d));
                w3f[e] = randv(h * d, std::sqrt(3.0f / d));
                w2f[e] = randv(d * h, std::sqrt(3.0f / h));
                make_weight(fmt, w1f[e], w1h[e], w1d[e]);
                make_weight(ufmt, w3f[e], w3h[e], w3d[e]);
                make_weight(fmt, w2f[e], w2h[e], w2d[e]);
            }
            // the address tables (device addresses are host addresses here): every w1, every w3,
            // then every w2
            auto addr = [](int f, const std::vector<float>& wf, const std::vector<uint16_t>& wh) {
                return (unsigned long long)(uintptr_t)(f == 0 ? (const void*)wf.data() : (const void*)wh.data());
            };
            std::vector<unsigned long long> table(3 * E);
            for (unsigned e = 0; e < E; ++e) {
                table[e] = addr(fmt, w1f[e], w1h[e]);
                table[E + e] = addr(ufmt, w3f[e], w3h[e]);
                table[2 * E + e] = addr(fmt, w2f[e], w2h[e]);
            }
            // the host's tiles: of GEMV_ROWS rows for at most GEMV_ROWS tokens (n = 6, k = 3 is 18
            // slots in such tiles), else of 64; and its bound on their count
            const unsigned tile = moe_tile_rows(n), max_tiles = moe_max_tiles(n, slots, E);
            std::vector<int> order(slots, -5), tiles(1 + 3 * max_tiles, -5), cursor(E);
            emu_launch(moe_route, {1}, {MR_THREADS}, MR_WARPS * E * 4, (const int*)ids.data(), order.data(),
                       tiles.data(), cursor.data(), slots, E, tile);
            // the routing itself: stable grouping by expert, each expert's range cut into tiles
            std::vector<int> want_order, want_tiles{0};
            for (unsigned e = 0; e < E; ++e) {
                const int p0 = (int)want_order.size();
                for (unsigned s = 0; s < slots; ++s)
                    if (ids[s] == (int)e) want_order.push_back((int)s);
                const int end = (int)want_order.size();
                for (int p = p0; p < end; p += (int)tile, ++want_tiles[0])
                    want_tiles.insert(want_tiles.end(), {(int)e, p, end});
            }
            want_tiles.resize(tiles.size(), -5); // entries past the count stay unwritten
            bool route_ok = tiles == want_tiles && std::equal(want_order.begin(), want_order.end(), order.begin());
            // the skewed shape must cover what it is for: several tiles of expert 0, none of expert 1
            if (sh.skew) route_ok = route_ok && tiles[3] - tiles[2] > 2 * 64 && tiles[1 + 3 * 3] == 2;
            float limit = 0.8f;
            std::vector<float> hid(std::max(slots * h, 1u), 0.0f), ys(std::max(slots * d, 1u), 0.0f), out(n * d);
            dim3 gu{gemm_grid(tile, h).x, max_tiles}, gd{gemm_grid(tile, d).x, max_tiles}, block{128};
            const unsigned long long *t1 = table.data(), *t3 = table.data() + E, *t2 = table.data() + 2 * E;
            auto gate = fmt == 0 ? moe_gate_f32 : fmt == 1 ? moe_gate_bf16 : moe_gate_f16;
            auto up = ufmt == 0 ? moe_up_f32 : ufmt == 1 ? moe_up_bf16 : moe_up_f16;
            auto down = fmt == 0 ? moe_down_f32 : fmt == 1 ? moe_down_bf16 : moe_down_f16;
            emu_launch(gate, gu, block, 0, (const float*)x.data(), (const int*)order.data(), (const int*)tiles.data(), t1,
                       hid.data(), tile, d, h, k);
            emu_launch(up, gu, block, 0, (const float*)x.data(), (const int*)order.data(), (const int*)tiles.data(), t3,
                       hid.data(), tile, d, h, k, limit);
            emu_launch(down, gd, block, 0, (const float*)hid.data(), (const int*)order.data(), (const int*)tiles.data(),
                       t2, ys.data(), tile, d, h);
            emu_launch(moe_combine, {blocks1d(n * d)}, {256}, 0, (const float*)ys.data(), (const float*)wt.data(),
                       (const int*)ids.data(), out.data(), n * d, d, k, E);
            // reference: the CPU lane, one token at a time through its k experts
            std::vector<float> want(n * d, 0.0f), hh(h);
            for (unsigned i = 0; i < n; ++i) {
                bool bad = false;
                for (unsigned s = 0; s < k; ++s) bad = bad || ids[i * k + s] < 0 || ids[i * k + s] >= (int)E;
                for (unsigned s = 0; s < k && !bad; ++s) {
                    unsigned e = ids[i * k + s];
                    for (unsigned j = 0; j < h; ++j) {
                        float g = 0, u = 0;
                        for (unsigned c = 0; c < d; ++c) {
                            g += x[i * d + c] * w1d[e][j * d + c];
                            u += x[i * d + c] * w3d[e][j * d + c];
                        }
                        g = std::min(g, limit);
                        u = std::clamp(u, -limit, limit);
                        hh[j] = g / (1.0f + std::exp(-g)) * u;
                    }
                    for (unsigned c = 0; c < d; ++c) {
                        float y = 0;
                        for (unsigned j = 0; j < h; ++j) y += hh[j] * w2d[e][c * h + j];
                        want[i * d + c] += wt[i * k + s] * y;
                    }
                }
                if (bad)
                    for (unsigned c = 0; c < d; ++c) want[i * d + c] = NAN;
            }
            char name[80];
            std::snprintf(name, sizeof name, "moe_%s/%s n=%u d=%u h=%u %u experts k=%u%s", fmt_name(fmt),
                          fmt_name(ufmt), n, d, h, E, k, which == 2 ? " bad id" : sh.skew ? " skewed" : "");
            if (!route_ok) {
                std::printf("%-44s moe_route grouping or tile list differs FAIL\n", name);
                ++failures;
            }
            check_masked(name, out, want, MOE_NMSE);
            ++which;
        }
}

// ---- common.cuh's GEMM: the exact bf16 splits and non-finite activations ----------------------

static bool same_bits(float a, float b) {
    uint32_t ua, ub;
    std::memcpy(&ua, &a, 4);
    std::memcpy(&ub, &b, 4);
    return ua == ub;
}

// hi + mid + lo == x exactly for |x| >= 2^-110 and within 2^-133 below (bf16 subnormals), over
// random bit patterns of the whole f32 range; hi + lo == w exactly for every f16 value; inf stays
// whole in hi, NaN stays NaN.
static void test_gemm_split() {
    size_t bad = 0;
    auto check3 = [&](float x) {
        unsigned hi, mid, lo;
        split_bf16x3(x, &hi, &mid, &lo);
        const float sum = (emu_bf16(hi) + emu_bf16(mid)) + emu_bf16(lo);
        if (std::isnan(x)) bad += !std::isnan(emu_bf16(hi)) || mid || lo;
        else if (std::isinf(x)) bad += !same_bits(emu_bf16(hi), x) || mid || lo;
        else if (std::fabs(x) >= std::ldexp(1.0f, -110)) bad += sum != x;
        else bad += std::fabs(double(sum) - double(x)) >= std::ldexp(1.0, -133);
    };
    for (int i = 0; i < 2000000; ++i) {
        const uint32_t u = (uint32_t)rng();
        float x;
        std::memcpy(&x, &u, 4);
        check3(x);
    }
    // zeros, subnormals, the smallest exact magnitude with all 24 bits set, the largest finite,
    // inf, a NaN whose payload sits in the low 16 bits only, a negative NaN
    for (float x : {0.0f, -0.0f, 1.0f, -3.0f, 1e-45f, -1e-40f, std::ldexp(-16777215.0f, -133), 3.4028235e38f,
                    -3.4028235e38f, INFINITY, -INFINITY, __uint_as_float(0x7f800001u), __uint_as_float(0xffc00000u)})
        check3(x);
    std::printf("%-44s %zu of 2000012 wrong %s\n", "split_bf16x3 (x = hi + mid + lo)", bad, bad ? "FAIL" : "ok");
    failures += bad != 0;
    bad = 0;
    for (unsigned h = 0; h < 65536; ++h) {
        const float w = f16_to_f32(h);
        unsigned hi, lo;
        split_bf16x2(w, &hi, &lo);
        if (std::isnan(w)) bad += !std::isnan(emu_bf16(hi)) || lo;
        else if (std::isinf(w)) bad += !same_bits(emu_bf16(hi), w) || lo;
        else bad += emu_bf16(hi) + emu_bf16(lo) != w || emu_bf16(hi) * 0.0f != 0.0f;
    }
    std::printf("%-44s %zu of 65536 wrong %s\n", "split_bf16x2 (every f16 = hi + lo)", bad, bad ? "FAIL" : "ok");
    failures += bad != 0;
}

// inf and NaN in x (and a huge finite value, which a rounding split would overflow) propagate as in
// the f32 dot product: each format, rows with specials next to plain rows.
// n = 5 takes gemv_cols, n = 13 the tile
static void test_gemm_specials() {
    const unsigned k = 40, o = 9;
    for (unsigned n : {5u, 13u}) {
        for (int fmt = 0; fmt < 3; ++fmt) {
            auto x = randv(n * k, 1), wf = randv(o * k, 0.5f);
            x[0 * k + 3] = INFINITY;
            x[1 * k + 17] = NAN;
            x[2 * k + 0] = -INFINITY;
            x[2 * k + 39] = INFINITY; // +inf and -inf in one row: NaN
            // (fast precision rounds operands to f16, whose largest finite value is 65504: past it
            // a value becomes inf by design, so the fast build checks a large f16 value instead)
            x[3 * k + 5] = FOVEA_FAST ? 6.0e4f : 3.0e38f;
            x[4 * k + 7] = 1.0f; // exact in bf16 (mid = lo = 0) against an infinite weight
            wf[3 * k + 7] = -INFINITY;
            std::vector<uint16_t> w16;
            std::vector<float> wdec;
            make_weight(fmt, wf, w16, wdec);
            std::vector<float> y(n * o), want(n * o);
            dim3 grid = gemm_grid(n, o), block{128};
            if (fmt == 0)
                emu_launch(linear_f32, grid, block, 0, (const float*)x.data(), (const float*)wf.data(), (const float*)nullptr,
                           y.data(), (float*)nullptr, n, k, o, 0u, 0u);
            else
                emu_launch(fmt == 1 ? linear_bf16 : linear_f16, grid, block, 0, (const float*)x.data(),
                           (const unsigned short*)w16.data(), (const float*)nullptr, y.data(), (float*)nullptr, n, k, o,
                           0u, 0u);
            for (unsigned i = 0; i < n; ++i)
                for (unsigned c = 0; c < o; ++c) {
                    float dot = 0;
                    for (unsigned j = 0; j < k; ++j) dot += x[i * k + j] * wdec[c * k + j];
                    want[i * o + c] = dot;
                }
            char name[64];
            std::snprintf(name, sizeof name, "linear_%s x[%u,40] inf/NaN x, inf w, huge x", fmt_name(fmt), n);
            check_masked(name, y, want, GEMM_NMSE);
        }
    }
}

// ---- cuda/lm_small.cu: each kernel against a port of its CPU reference (src/backend/cpu/lm.rs) ----

static void checki(const char* name, const std::vector<int>& got, const std::vector<int>& want) {
    size_t diff = 0;
    for (size_t i = 0; i < want.size() && i < got.size(); ++i) diff += got[i] != want[i];
    bool ok = diff == 0 && got.size() == want.size();
    std::printf("%-44s %zu index(es) differ %s\n", name, diff, ok ? "ok" : "FAIL");
    failures += !ok;
}

// `check` over the entries finite in `want`; the others (inf, NaN) must match exactly.
static void check_nf(const char* name, const std::vector<float>& got, const std::vector<float>& want, double bound) {
    std::vector<float> g, w;
    size_t bad = got.size() != want.size();
    for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
        if (std::isfinite(want[i])) {
            g.push_back(got[i]);
            w.push_back(want[i]);
        } else if (std::isnan(want[i]) ? !std::isnan(got[i]) : got[i] != want[i]) {
            ++bad;
        }
    }
    if (bad) {
        std::printf("%-44s %zu non-finite value(s) differ FAIL\n", name, bad);
        ++failures;
    }
    check(name, g, w, bound);
}

static float sigm(float x) { return 1.0f / (1.0f + std::exp(-x)); }

static void test_lm_elementwise() {
    // embed_rows: every format, repeats, last row, sentinels >= vocab, a negative id (NaN row)
    for (unsigned fmt = 0; fmt < 3; ++fmt) {
        unsigned vocab = 23, d = 37;
        std::vector<int> ids = {3, 22, 0, 23, 3, 1000, 7, -2, 22, 5};
        unsigned n = ids.size();
        auto wf = randv(vocab * d, 2);
        std::vector<uint16_t> w16(vocab * d);
        std::vector<float> wdec(vocab * d);
        for (size_t i = 0; i < wf.size(); ++i) {
            if (fmt == 0) wdec[i] = wf[i];
            if (fmt == 1) {
                uint32_t u;
                std::memcpy(&u, &wf[i], 4);
                w16[i] = uint16_t(u >> 16);
                uint32_t back = uint32_t(w16[i]) << 16;
                std::memcpy(&wdec[i], &back, 4);
            }
            if (fmt == 2) {
                _Float16 h = (_Float16)(i % 11 == 0 ? wf[i] * 1e-6f : wf[i]);
                std::memcpy(&w16[i], &h, 2);
                wdec[i] = (float)h;
            }
        }
        std::vector<float> y(n * d, -7.0f), want(n * d);
        const void* tab = fmt == 0 ? (const void*)wf.data() : (const void*)w16.data();
        emu_launch(embed_rows_f32, {blocks1d(n * d)}, {256}, 0, tab, (const int*)ids.data(), y.data(), n, d, vocab, fmt);
        for (unsigned r = 0; r < n; ++r)
            for (unsigned c = 0; c < d; ++c)
                want[r * d + c] = ids[r] < 0 ? NAN : ids[r] >= (int)vocab ? 0.0f : wdec[ids[r] * d + c];
        char name[64];
        std::snprintf(name, sizeof name, "embed_rows_f32 fmt %u [23,37] sentinels", fmt);
        check(name, y, want, 0);
    }
    {
        unsigned n = 7, d = 19, hc = 4;
        auto x = randv(n * d, 1);
        std::vector<float> y(n * hc * d), want;
        emu_launch(hc_expand_f32, {2}, {256}, 0, (const float*)x.data(), y.data(), n, d, hc); // 2 blocks: grid-stride
        for (unsigned i = 0; i < n; ++i)
            for (unsigned k = 0; k < hc; ++k) want.insert(want.end(), x.begin() + i * d, x.begin() + (i + 1) * d);
        check("hc_expand_f32 [7,19] hc=4 on 2 blocks", y, want, 0);
    }
    // w rows of hc (the head's weights) and of (2 + hc) * hc (hc_split's output, pre first)
    for (unsigned wc : {4u, 24u}) {
        unsigned n = 9, d = 21, hc = 4;
        auto x = randv(n * hc * d, 2), w = randv(n * wc, 1);
        std::vector<float> y(n * d), want(n * d, 0.0f);
        emu_launch(hc_pre_f32, {blocks1d(n * d)}, {256}, 0, (const float*)x.data(), (const float*)w.data(), y.data(), n,
                   d, hc, wc);
        for (unsigned t = 0; t < n; ++t)
            for (unsigned i = 0; i < hc; ++i)
                for (unsigned j = 0; j < d; ++j) want[t * d + j] += w[t * wc + i] * x[t * hc * d + i * d + j];
        char name[64];
        std::snprintf(name, sizeof name, "hc_pre_f32 [9,4x21] w [9,%u]", wc);
        check(name, y, want, 1e-12);
    }
    {
        // split [n, pre hc | post hc | comb hc * hc], hc_split's layout
        unsigned n = 6, d = 13, hc = 4, cols = hc * d, sw = (2 + hc) * hc;
        auto x = randv(n * cols, 2), f = randv(n * d, 2), split = randv(n * sw, 2);
        std::vector<float> y(n * cols), want(n * cols);
        emu_launch(hc_post_f32, {blocks1d(n * cols)}, {256}, 0, (const float*)x.data(), (const float*)f.data(),
                   (const float*)split.data(), y.data(), n, d, hc);
        for (unsigned t = 0; t < n; ++t)
            for (unsigned dst = 0; dst < hc; ++dst)
                for (unsigned j = 0; j < d; ++j) {
                    float o = split[t * sw + hc + dst] * f[t * d + j];
                    for (unsigned src = 0; src < hc; ++src)
                        o += split[t * sw + 2 * hc + src * hc + dst] * x[t * cols + src * d + j];
                    want[t * cols + dst * d + j] = o;
                }
        check("hc_post_f32 [6,4x13]", y, want, 1e-12);
    }
    {
        unsigned n = 11, hc = 4;
        auto mix = randv(n * hc, 3), scale = randv(1, 2), base = randv(hc, 1);
        float eps = 1e-6f;
        unsigned eb;
        std::memcpy(&eb, &eps, 4);
        std::vector<float> y(n * hc), want(n * hc);
        emu_launch(hc_head_weights_f32, {1}, {256}, 0, (const float*)mix.data(), (const float*)scale.data(),
                   (const float*)base.data(), y.data(), n * hc, hc, eb);
        for (unsigned i = 0; i < n * hc; ++i) want[i] = sigm(mix[i] * scale[0] + base[i % hc]) + eps;
        check("hc_head_weights_f32 [11,4]", y, want, 1e-12);
    }
    {
        auto x = randv(13 * 29, 30);
        x[0] = 20.0f, x[1] = 20.5f, x[2] = -100.0f, x[3] = NAN, x[4] = INFINITY, x[5] = -INFINITY;
        unsigned n = x.size();
        std::vector<float> y(n), want(n);
        emu_launch(sqrt_softplus_f32, {blocks1d(n)}, {256}, 0, (const float*)x.data(), y.data(), n);
        for (unsigned i = 0; i < n; ++i) want[i] = std::sqrt(x[i] > 20.0f ? x[i] : std::log1p(std::exp(x[i])));
        check_nf("sqrt_softplus_f32 [13,29] wide, nan, inf", y, want, 1e-12);
    }
    {
        unsigned vocab = 10, k = 3, e = 16;
        std::vector<int> ids = {0, 9, 10, 4, 12345, 9, 3, 10, -1};
        unsigned n = ids.size();
        std::vector<int> table(vocab * k), fb(n * k), y(n * k), want(n * k);
        for (auto& v : table) v = rng() % e;
        for (auto& v : fb) v = rng() % e;
        emu_launch(hash_route_i32, {blocks1d(n * k)}, {256}, 0, (const int*)table.data(), (const int*)ids.data(),
                   (const int*)fb.data(), y.data(), n, k, vocab);
        for (unsigned i = 0; i < n; ++i)
            for (unsigned j = 0; j < k; ++j)
                want[i * k + j] = ids[i] >= 0 && ids[i] < (int)vocab ? table[ids[i] * k + j] : fb[i * k + j];
        checki("hash_route_i32 vocab 10 k=3 image ids", y, want);
    }
    {
        unsigned n = 7, e = 19, k = 6;
        std::vector<float> s(n * e);
        for (auto& v : s) v = 0.01f + float(rng() % 1000) * 0.003f;
        std::vector<int> ids(n * k);
        for (auto& v : ids) v = rng() % e;
        ids[2 * k + 1] = e; // row 2 holds an id outside 0..e: NaN row
        float scale = 2.5f;
        unsigned sb;
        std::memcpy(&sb, &scale, 4);
        std::vector<float> y(n * k), want(n * k);
        emu_launch(route_weights_f32, {blocks1d(n * k)}, {256}, 0, (const float*)s.data(), (const int*)ids.data(),
                   y.data(), n, k, e, sb);
        for (unsigned i = 0; i < n; ++i) {
            bool bad = false;
            float sum = 0;
            for (unsigned j = 0; j < k; ++j) {
                if (ids[i * k + j] < 0 || ids[i * k + j] >= (int)e) bad = true;
                else sum += s[i * e + ids[i * k + j]];
            }
            sum += 1e-20f;
            for (unsigned j = 0; j < k; ++j) want[i * k + j] = bad ? NAN : s[i * e + ids[i * k + j]] / sum * scale;
        }
        check("route_weights_f32 [7,19] k=6, one bad row", y, want, 1e-12);
    }
    {
        unsigned n = 15, h = 23;
        auto gate = randv(n * h, 12), up = randv(n * h, 12);
        gate[1] = NAN, up[2] = NAN, up[3] = INFINITY, gate[4] = -INFINITY;
        float lim = 7.0f;
        unsigned lb;
        std::memcpy(&lb, &lim, 4);
        std::vector<float> y(n * h), want(n * h);
        emu_launch(swiglu_clamp_f32, {blocks1d(n * h)}, {256}, 0, (const float*)gate.data(), (const float*)up.data(),
                   y.data(), n, h, lb);
        for (unsigned i = 0; i < n * h; ++i) {
            float g = gate[i], u = up[i];
            g = std::isnan(g) ? lim : std::min(g, lim); // f32::min ignores NaN
            if (u < -lim) u = -lim;                      // f32::clamp keeps NaN
            if (u > lim) u = lim;
            want[i] = g / (1.0f + std::exp(-g)) * u;
        }
        check_nf("swiglu_clamp_f32 [15,23] limit 7, nan/inf", y, want, 1e-12);
    }
}

static void test_rope_tail() {
    unsigned configs[][3] = {{0, 1, 0}, {8191, 3, 1}, {5, 3, 0}};
    for (auto& cf : configs) {
        unsigned n = 9, heads = 3, hd = 22, half_rd = 6, rd = 2 * half_rd, cols = heads * hd;
        unsigned pos0 = cf[0], stride = cf[1], inverse = cf[2];
        auto x = randv(n * cols, 1);
        std::vector<float> f(half_rd);
        for (unsigned j = 0; j < half_rd; ++j) f[j] = std::pow(10000.0f, -float(j) / 6.0f) * (0.9f + 0.03f * j);
        std::vector<float> y(n * cols), want = x;
        emu_launch(rope_tail_f32, {blocks1d(n * cols)}, {256}, 0, (const float*)x.data(), (const float*)f.data(),
                   y.data(), n, cols, hd, rd, pos0, stride, inverse);
        for (unsigned i = 0; i < n; ++i) {
            float p = float(pos0 + i * stride);
            for (unsigned j = 0; j < half_rd; ++j) {
                float a = p * f[j];
                float c = std::cos(a), s = inverse ? -std::sin(a) : std::sin(a);
                for (unsigned h = 0; h < heads; ++h) {
                    unsigned k = i * cols + h * hd + hd - rd + 2 * j;
                    want[k] = x[k] * c - x[k + 1] * s;
                    want[k + 1] = x[k + 1] * c + x[k] * s;
                }
            }
        }
        char name[64];
        std::snprintf(name, sizeof name, "rope_tail_f32 [9,3x22] rd=12 pos %u+%ui%s", pos0, stride, inverse ? " inv" : "");
        check(name, y, want, 1e-12);
    }
    // rd = hd (whole head rotates), rd = 0 (a copy)
    for (unsigned half_rd : {4u, 0u}) {
        unsigned n = 5, heads = 2, hd = 8, rd = 2 * half_rd, cols = heads * hd;
        auto x = randv(n * cols, 1);
        std::vector<float> f = {1.0f, 0.5f, 0.25f, 0.125f};
        std::vector<float> y(n * cols), want = x;
        emu_launch(rope_tail_f32, {1}, {256}, 0, (const float*)x.data(), (const float*)f.data(), y.data(), n, cols, hd,
                   rd, 2u, 1u, 0u);
        for (unsigned i = 0; i < n; ++i)
            for (unsigned j = 0; j < half_rd; ++j) {
                float a = float(2 + i) * f[j], c = std::cos(a), s = std::sin(a);
                for (unsigned h = 0; h < heads; ++h) {
                    unsigned k = i * cols + h * hd + hd - rd + 2 * j;
                    want[k] = x[k] * c - x[k + 1] * s;
                    want[k + 1] = x[k + 1] * c + x[k] * s;
                }
            }
        check(half_rd ? "rope_tail_f32 rd = hd" : "rope_tail_f32 rd = 0 (copy)", y, want, 1e-12);
    }
    // rope_tail_at_f32 at the positions rope_tail_f32 gives its rows: the same bits
    for (unsigned inverse : {0u, 1u}) {
        unsigned n = 9, heads = 3, hd = 22, rd = 12, cols = heads * hd, pos0 = 8191, stride = 3;
        auto x = randv(n * cols, 1);
        std::vector<float> f(rd / 2);
        for (unsigned j = 0; j < rd / 2; ++j) f[j] = std::pow(10000.0f, -float(j) / 6.0f);
        std::vector<int> pos(n);
        for (unsigned i = 0; i < n; ++i) pos[i] = int(pos0 + i * stride);
        std::vector<float> y(n * cols), want(n * cols);
        emu_launch(rope_tail_f32, {blocks1d(n * cols)}, {256}, 0, (const float*)x.data(), (const float*)f.data(),
                   want.data(), n, cols, hd, rd, pos0, stride, inverse);
        emu_launch(rope_tail_at_f32, {blocks1d(n * cols)}, {256}, 0, (const float*)x.data(), (const float*)f.data(),
                   (const int*)pos.data(), y.data(), n, cols, hd, rd, inverse);
        check(inverse ? "rope_tail_at_f32 = rope_tail_f32 (inverse)" : "rope_tail_at_f32 = rope_tail_f32", y, want, 0.0);
    }
}

static void hc_split_ref(const float* m, const float* s, const float* b, float* o, unsigned hc, unsigned iters,
                         float eps) {
    for (unsigned i = 0; i < hc; ++i) {
        o[i] = sigm(m[i] * s[0] + b[i]) + eps;
        o[hc + i] = 2.0f * sigm(m[hc + i] * s[1] + b[hc + i]);
    }
    float* c = o + 2 * hc;
    for (unsigned src = 0; src < hc; ++src) {
        float* row = c + src * hc;
        for (unsigned dst = 0; dst < hc; ++dst) row[dst] = m[2 * hc + src * hc + dst] * s[2] + b[2 * hc + src * hc + dst];
        float mx = -INFINITY;
        for (unsigned dst = 0; dst < hc; ++dst) mx = std::fmax(mx, row[dst]);
        for (unsigned dst = 0; dst < hc; ++dst) row[dst] = std::exp(row[dst] - mx);
        float sum = 0;
        for (unsigned dst = 0; dst < hc; ++dst) sum += row[dst];
        for (unsigned dst = 0; dst < hc; ++dst) row[dst] = row[dst] / sum + eps;
    }
    auto norm_src = [&] {
        for (unsigned dst = 0; dst < hc; ++dst) {
            float sum = 0;
            for (unsigned src = 0; src < hc; ++src) sum += c[src * hc + dst];
            sum += eps;
            for (unsigned src = 0; src < hc; ++src) c[src * hc + dst] /= sum;
        }
    };
    auto norm_dst = [&] {
        for (unsigned src = 0; src < hc; ++src) {
            float sum = 0;
            for (unsigned dst = 0; dst < hc; ++dst) sum += c[src * hc + dst];
            sum += eps;
            for (unsigned dst = 0; dst < hc; ++dst) c[src * hc + dst] /= sum;
        }
    };
    norm_src();
    for (unsigned it = 1; it < iters; ++it) {
        norm_dst();
        norm_src();
    }
}

static void test_hc_split() {
    // hc * hc <= 32 takes a warp per token, hc = 6 one thread per token
    unsigned configs[][4] = {{1, 4, 1, 1}, {13, 4, 20, 1}, {300, 4, 20, 0}, {5, 3, 0, 1}, {7, 4, 2, 1}, {9, 6, 20, 1}};
    for (auto& cf : configs) {
        unsigned n = cf[0], hc = cf[1], iters = cf[2], w = (2 + hc) * hc;
        auto mix = randv(n * w, 2), scale = randv(3, 1.5), base = randv(w, 1);
        float eps = 1e-6f;
        unsigned eb;
        std::memcpy(&eb, &eps, 4);
        std::vector<float> y(n * w), want(n * w);
        // cf[3] = 1: enough blocks (32 threads per token, as the lane launches); 0: one block of
        // 256 threads grid-strides over 300 tokens
        unsigned blocks = cf[3] ? blocks1d(32 * n) : 1;
        emu_launch(hc_split_f32, {blocks}, {256}, 0, (const float*)mix.data(), (const float*)scale.data(),
                   (const float*)base.data(), y.data(), n, hc, iters, eb);
        for (unsigned t = 0; t < n; ++t) hc_split_ref(&mix[t * w], scale.data(), base.data(), &want[t * w], hc, iters, eps);
        char name[64];
        std::snprintf(name, sizeof name, "hc_split_f32 [%u,%u] hc=%u iters %u", n, w, hc, iters);
        check(name, y, want, 0); // same operations in the same order: bit-exact on the host
    }
}

// hc_mix_partials_f32 + hc_mix_split_f32 against the composition in plain C++ (the row's RMS norm,
// the mix's dot products in double, hc_split_ref): f32, bf16 and f16 mixes; k not a multiple of
// the column range (the last range short) and a range longer than the block; 2 blocks of the
// split kernel for 20 tokens (warps past n idle, the token loop grid-strides), a block a token and
// a warp a token; 64 tokens of 4 x 4096 (the most a decode batch gives a block a token); and the
// prefill's partials, four rows a block, before the warp-a-token split
static void test_hc_mix_split() {
    unsigned configs[][4] = {{1, 4, 1100, 0}, {20, 4, 700, 1}, {3, 4, 16384, 2}, {5, 3, 333, 0}, {64, 4, 16384, 0}};
    for (auto& cf : configs) {
        unsigned n = cf[0], hc = cf[1], k = cf[2], fmt = cf[3], w = (2 + hc) * hc, iters = 20, span = 512;
        unsigned splits = (k + span - 1) / span;
        auto x = randv(n * k, 2), mf = randv(w * k, 0.05f), scale = randv(3, 1.5), base = randv(w, 1);
        std::vector<uint16_t> m16;
        std::vector<float> mdec;
        make_weight(fmt, mf, m16, mdec);
        const void* mix = fmt == 0 ? (const void*)mf.data() : (const void*)m16.data();
        float eps = 1e-6f, norm_eps = 1e-6f;
        unsigned eb;
        std::memcpy(&eb, &eps, 4);
        std::vector<float> part(n * splits * (w + 1)), y(n * w), want(n * w), m(w);
        emu_launch(hc_mix_partials_f32, {splits, n}, {256}, 0, (const float*)x.data(), mix, part.data(), n, k, w,
                   splits, fmt);
        // a block a token (8 warps) and a warp a token, each over 2 blocks (tokens grid-stride)
        std::vector<float> y1(n * w);
        emu_launch(hc_mix_split_f32, {2}, {256}, 0, (const float*)part.data(), (const float*)scale.data(),
                   (const float*)base.data(), y.data(), n, k, hc, splits, iters, eb, norm_eps, 8u);
        emu_launch(hc_mix_split_f32, {2}, {256}, 0, (const float*)part.data(), (const float*)scale.data(),
                   (const float*)base.data(), y1.data(), n, k, hc, splits, iters, eb, norm_eps, 1u);
        for (unsigned t = 0; t < n; ++t) {
            double ss = 0;
            for (unsigned c = 0; c < k; ++c) ss += double(x[t * k + c]) * x[t * k + c];
            const double inv = 1.0 / std::sqrt(ss / k + norm_eps);
            for (unsigned o = 0; o < w; ++o) {
                double dot = 0;
                for (unsigned c = 0; c < k; ++c) dot += x[t * k + c] * inv * mdec[o * k + c];
                m[o] = float(dot);
            }
            hc_split_ref(m.data(), scale.data(), base.data(), &want[t * w], hc, iters, eps);
        }
        char name[80];
        std::snprintf(name, sizeof name, "hc_mix_split [%u,%u] %s hc=%u, a block a token", n, k, fmt_name(fmt), hc);
        check(name, y, want, 1e-10);
        std::snprintf(name, sizeof name, "hc_mix_split [%u,%u] %s hc=%u, a warp a token", n, k, fmt_name(fmt), hc);
        check(name, y1, want, 1e-10);
        // a decode step's split and norm in one launch (hc_pre_norm_f32's block: 1024 threads from
        // d = 4096, else 256; 2 blocks, tokens grid-stride): hc_mix_split_f32 (a block a token)
        // then hc_pre_norm_f32, bit for bit (not the 64-token case: 1024-thread blocks are slow here)
        if (n <= 20) {
            const unsigned d = k / hc, rt = d >= 4096 ? 1024 : 256;
            auto norm = randv(d, 1);
            std::vector<float> pre(n * d), fused_split(n * w, 7.0f), fused_pre(n * d, 7.0f);
            emu_launch(hc_pre_norm_f32, {2}, {rt}, 0, (const float*)x.data(), (const float*)y.data(),
                       (const float*)norm.data(), pre.data(), n, d, hc, w, norm_eps);
            emu_launch(hc_mix_split_pre_norm_f32, {2}, {rt}, 0, (const float*)part.data(), (const float*)scale.data(),
                       (const float*)base.data(), fused_split.data(), (const float*)x.data(),
                       (const float*)norm.data(), fused_pre.data(), n, k, hc, splits, iters, eb, norm_eps, d);
            std::snprintf(name, sizeof name, "hc_mix_split_pre_norm [%u,%u] %s hc=%u split", n, k, fmt_name(fmt), hc);
            check(name, fused_split, y, 0);
            std::snprintf(name, sizeof name, "hc_mix_split_pre_norm [%u,%u] %s hc=%u norm", n, k, fmt_name(fmt), hc);
            check(name, fused_pre, pre, 0);
        }
        // a prefill chunk's partials: four rows a block (the last group short where n % 4 != 0),
        // ranges of 4096, 2 row blocks grid-striding
        const unsigned splits4 = (k + 4095) / 4096;
        std::vector<float> part4(n * splits4 * (w + 1)), y4(n * w);
        emu_launch(hc_mix_partials_rows4_f32, {splits4, 2}, {256}, 0, (const float*)x.data(), mix, part4.data(), n,
                   k, w, splits4, fmt);
        emu_launch(hc_mix_split_f32, {2}, {256}, 0, (const float*)part4.data(), (const float*)scale.data(),
                   (const float*)base.data(), y4.data(), n, k, hc, splits4, iters, eb, norm_eps, 1u);
        std::snprintf(name, sizeof name, "hc_mix_split [%u,%u] %s hc=%u, four rows a block", n, k, fmt_name(fmt), hc);
        check(name, y4, want, 1e-10);
    }
}

// hc_post_mix_partials_f32 (a sublayer's post and the next one's partial sums in one launch)
// against hc_post_f32 then hc_mix_partials_f32, bit for bit in both outputs: the released width
// (hc 4, d 4096, an f16 mix) on one row and three; a width whose last column range is short (f32),
// hc = 3 with a bf16 mix; 2 row blocks for 3 rows (rows grid-stride)
static void test_hc_post_mix_partials() {
    unsigned configs[][4] = {{1, 4, 4096, 2}, {3, 4, 4096, 2}, {2, 4, 275, 0}, {5, 3, 111, 1}};
    for (auto& cf : configs) {
        unsigned n = cf[0], hc = cf[1], d = cf[2], fmt = cf[3], k = hc * d, w = (2 + hc) * hc, span = 512;
        unsigned splits = (k + span - 1) / span, rows = n < 2 ? n : 2;
        auto x = randv(n * k, 2), f = randv(n * d, 2), split = randv(n * w, 1), mf = randv(w * k, 0.05f);
        std::vector<uint16_t> m16;
        std::vector<float> mdec;
        make_weight(fmt, mf, m16, mdec);
        const void* mix = fmt == 0 ? (const void*)mf.data() : (const void*)m16.data();
        std::vector<float> xp(n * k), part(n * splits * (w + 1)), xp2(n * k, 7.0f), part2(part.size(), 7.0f);
        emu_launch(hc_post_f32, {4}, {256}, 0, (const float*)x.data(), (const float*)f.data(),
                   (const float*)split.data(), xp.data(), n, d, hc);
        emu_launch(hc_mix_partials_f32, {splits, n}, {256}, 0, (const float*)xp.data(), mix, part.data(), n, k, w,
                   splits, fmt);
        emu_launch(hc_post_mix_partials_f32, {splits, rows}, {256}, 0, (const float*)x.data(), (const float*)f.data(),
                   (const float*)split.data(), xp2.data(), mix, part2.data(), n, d, hc, w, splits, fmt);
        char name[80];
        std::snprintf(name, sizeof name, "hc_post_mix_partials [%u,%ux%u] %s residual", n, hc, d, fmt_name(fmt));
        check(name, xp2, xp, 0);
        std::snprintf(name, sizeof name, "hc_post_mix_partials [%u,%ux%u] %s partial sums", n, hc, d, fmt_name(fmt));
        check(name, part2, part, 0);
    }
}

static void test_rms_norm_heads() {
    unsigned shapes[][3] = {{5, 3, 29}, {3, 1, 300}, {4, 2, 1000}, {1, 1, 1}};
    for (auto& sh : shapes) {
        unsigned n = sh[0], heads = sh[1], hd = sh[2], segs = n * heads;
        auto x = randv(n * heads * hd, 3);
        float eps = 1e-6f;
        std::vector<float> y(x.size()), want(x.size());
        for (unsigned blocks : {segs, 2u}) {
            emu_launch(rms_norm_heads_f32, {blocks}, {256}, 0, (const float*)x.data(), y.data(), segs, hd, eps);
            for (unsigned g = 0; g < segs; ++g) {
                float s = 0;
                for (unsigned c = 0; c < hd; ++c) s += x[g * hd + c] * x[g * hd + c];
                float inv = 1.0f / std::sqrt(s / hd + eps);
                for (unsigned c = 0; c < hd; ++c) want[g * hd + c] = x[g * hd + c] * inv;
            }
            char name[64];
            std::snprintf(name, sizeof name, "rms_norm_heads_f32 [%u,%ux%u] %u blocks", n, heads, hd, blocks);
            check(name, y, want, 1e-10);
        }
    }
}

// The fused norms against the composition of their parts' kernels: hc_pre_norm_f32 sums the
// squares in another order than rms_norm_f32 (1e-12), rms_norm_rope_f32 normalises as
// rms_norm_heads_f32 / rms_norm_f32 and rotates as rope_tail_at_f32 (the same bits).
static void test_fused_norms() {
    const float eps = 1e-6f;
    // hc_pre_norm_f32: row blocks of 256 and, for a row of >= 4096, 1024 threads (the host's
    // row_threads); 2 blocks for 9 rows: the row loop grid-strides
    unsigned hp[][5] = {{9, 21, 4, 2, 256}, {1, 21, 24, 1, 256}, {2, 4101, 24, 2, 1024}};
    for (auto& c : hp) {
        unsigned n = c[0], d = c[1], wc = c[2], blocks = c[3], threads = c[4], hc = 4;
        auto x = randv(n * hc * d, 2), w = randv(n * wc, 1), g = randv(d, 1.5);
        std::vector<float> y(n * d), pre(n * d), want(n * d);
        emu_launch(hc_pre_norm_f32, {blocks}, {threads}, 0, (const float*)x.data(), (const float*)w.data(),
                   (const float*)g.data(), y.data(), n, d, hc, wc, eps);
        emu_launch(hc_pre_f32, {blocks1d(n * d)}, {256}, 0, (const float*)x.data(), (const float*)w.data(), pre.data(),
                   n, d, hc, wc);
        emu_launch(rms_norm_f32, {n}, {threads}, 0, (const float*)pre.data(), (const float*)g.data(), want.data(), n, d,
                   eps);
        char name[80];
        std::snprintf(name, sizeof name, "hc_pre_norm_f32 [%u,4x%u] w [%u,%u] %u blocks", n, d, n, wc, blocks);
        check(name, y, want, 1e-12);
    }
    // rms_norm_rope_f32: 3 heads of 23 (the unrotated part odd), no weight; one weighted head of
    // 520 (wider than the block); 2 blocks: the segment loop grid-strides
    unsigned rn[][3] = {{3, 23, 0}, {1, 520, 1}};
    for (auto& c : rn) {
        unsigned n = 9, heads = c[0], hd = c[1], weighted = c[2], rd = 12, cols = heads * hd, segs = n * heads;
        auto x = randv(n * cols, 3), g = randv(hd, 1.5);
        std::vector<float> f(rd / 2);
        for (unsigned j = 0; j < rd / 2; ++j) f[j] = std::pow(10000.0f, -float(j) / 6.0f);
        std::vector<int> pos = {8191, 0, 17, 4, 8000, 5, 63, 1, 640};
        std::vector<float> y(n * cols), normed(n * cols), want(n * cols);
        emu_launch(rms_norm_rope_f32, {2}, {256}, 0, (const float*)x.data(), (const float*)g.data(),
                   (const float*)f.data(), (const int*)pos.data(), y.data(), segs, heads, hd, rd, weighted, eps);
        if (weighted)
            emu_launch(rms_norm_f32, {n}, {256}, 0, (const float*)x.data(), (const float*)g.data(), normed.data(), n,
                       hd, eps);
        else
            emu_launch(rms_norm_heads_f32, {segs}, {256}, 0, (const float*)x.data(), normed.data(), segs, hd, eps);
        emu_launch(rope_tail_at_f32, {blocks1d(n * cols)}, {256}, 0, (const float*)normed.data(),
                   (const float*)f.data(), (const int*)pos.data(), want.data(), n, cols, hd, rd, 0u);
        char name[80];
        std::snprintf(name, sizeof name, "rms_norm_rope_f32 [9,%ux%u]%s", heads, hd, weighted ? " weighted" : "");
        check(name, y, want, 0.0);
    }
}

static std::vector<int> topk_ref(const std::vector<float>& x, unsigned n, unsigned m, unsigned k) {
    std::vector<int> out(n * k, -1);
    for (unsigned i = 0; i < n; ++i) {
        std::vector<unsigned> cols;
        for (unsigned j = 0; j < m; ++j)
            if (std::isfinite(x[i * m + j])) cols.push_back(j);
        std::stable_sort(cols.begin(), cols.end(), [&](unsigned a, unsigned b) { return x[i * m + a] > x[i * m + b]; });
        for (unsigned s = 0; s < k && s < cols.size(); ++s) out[i * k + s] = cols[s];
    }
    return out;
}

static void test_topk() {
    // {n, m, k, blocks, values}: -inf / NaN / +inf / -0 / +0 entries in every row, fewer blocks
    // than rows (grid-stride over rows). values 0: quarters in [-2, 2) (ties everywhere: the long
    // rows' radix select runs down to the column digits); 1: mostly distinct values from 2^-150 to
    // 2^72, subnormals included (the select settles on the value digits); 2: as 0, with the first
    // row all non-finite and a third of the second's values at the ends of the f32 range (keys in
    // the select's last bin). m <= 2048 takes the sort; longer rows the radix select: m just past
    // the sort, the indexer's k = 512 at 16K-32K context (m = 4096, 8192), k = 1, k past 2048
    // (chunks of 2048 slots; k = m and k > m), and a row far past one pass of the block
    // (m = 40000), and one past 65 536 columns (m = 70000, ties everywhere: the column digits'
    // upper byte takes its own pass). The last row of a config keeps at most 3 finite values.
    unsigned configs[][5] = {{6, 300, 40, 6, 0},    {3, 5, 9, 3, 0},        {4, 1000, 7, 2, 0},
                             {2, 0, 3, 2, 0},       {5, 600, 600, 5, 0},    {3, 2048, 512, 2, 0},
                             {2, 1, 4, 2, 0},       {3, 2049, 7, 2, 0},     {3, 2049, 7, 2, 1},
                             {3, 4096, 512, 2, 0},  {2, 8192, 512, 1, 1},   {3, 8192, 1, 2, 2},
                             {3, 2500, 2500, 2, 2}, {1, 3000, 4500, 1, 1},  {2, 40000, 512, 2, 0},
                             {1, 40000, 512, 1, 1}, {1, 70000, 512, 1, 0}};
    for (auto& cf : configs) {
        unsigned n = cf[0], m = cf[1], k = cf[2], blocks = cf[3], values = cf[4];
        std::vector<float> x(n * m);
        for (auto& v : x) {
            if (values == 1) {
                const float mag = std::ldexp(float(rng() % (1u << 23)) + 1.0f, int(rng() % 200) - 150);
                v = rng() % 2 ? -mag : mag;
            } else {
                v = float(int(rng() % 16) - 8) * 0.25f;
            }
        }
        for (unsigned j = 0; j < x.size(); ++j) {
            if (j % 7 == 3) x[j] = -INFINITY;
            if (j % 53 == 11) x[j] = NAN;
            if (j % 97 == 5) x[j] = INFINITY;
            if (j % 89 == 7) x[j] = -0.0f;
            if (j % 89 == 8) x[j] = 0.0f;
        }
        if (values == 2 && n > 2) {
            for (unsigned j = 0; j < m; ++j) x[j] = j % 2 ? NAN : -INFINITY;
            const float ends[] = {3.4028235e38f, -3.4028235e38f, -3.0e38f, 1.0e-45f, -1.0e-45f, 1.17549435e-38f};
            for (unsigned j = 0; j < m; j += 3) x[m + j] = ends[(j / 3) % 6];
        }
        if (n > 2 && m > 3)
            for (unsigned j = 3; j < m; ++j) x[(n - 1) * m + j] = -INFINITY; // last row: at most 3 finite
        std::vector<int> y(n * k, 12345);
        emu_launch(topk_rows_i32, {blocks}, {256}, 0, (const float*)x.data(), y.data(), n, m, k);
        char name[80];
        std::snprintf(name, sizeof name, "topk_rows_i32 [%u,%u] k=%u on %u blocks, values %u", n, m, k, blocks, values);
        checki(name, y, topk_ref(x, n, m, k));
    }
}

// The router as the graph composed it before the fused kernel: sqrt_softplus, add(gather_rows(bias,
// kind)), topk_rows, hash_route, route_weights (this lane's NaN rows for a bad kind or id).
static void route_ref(const std::vector<float>& logits, const std::vector<float>& bias, const std::vector<int>& kind,
                      const std::vector<int>* table, const std::vector<int>& tok, unsigned n, unsigned e, unsigned k,
                      unsigned kinds, unsigned vocab, float scale, std::vector<int>& ids, std::vector<float>& w) {
    auto score = [](float v) { return std::sqrt(v > 20.0f ? v : std::log1p(std::exp(v))); };
    std::vector<float> s(n * e), biased(n * e);
    for (unsigned i = 0; i < n; ++i)
        for (unsigned j = 0; j < e; ++j) {
            s[i * e + j] = score(logits[i * e + j]);
            const bool ok = kind[i] >= 0 && kind[i] < (int)kinds;
            biased[i * e + j] = s[i * e + j] + (ok ? bias[kind[i] * e + j] : NAN);
        }
    ids = topk_ref(biased, n, e, k);
    if (table)
        for (unsigned i = 0; i < n; ++i)
            if (tok[i] >= 0 && tok[i] < (int)vocab)
                for (unsigned j = 0; j < k; ++j) ids[i * k + j] = (*table)[tok[i] * k + j];
    w.assign(n * k, 0.0f);
    for (unsigned i = 0; i < n; ++i) {
        bool bad = false;
        float sum = 0.0f;
        for (unsigned j = 0; j < k; ++j) {
            const int id = ids[i * k + j];
            if (id < 0 || id >= (int)e) bad = true;
            else sum += s[i * e + id];
        }
        sum += 1e-20f;
        for (unsigned j = 0; j < k; ++j) w[i * k + j] = bad ? NAN : s[i * e + ids[i * k + j]] / sum * scale;
    }
}

static void test_route_experts() {
    struct Config {
        unsigned n, e, k, blocks;
        bool hashed, ties;
        const char* what;
    };
    // full size (e 256, k 6); the vl-scenes fixture's hash layer (e 8, k 2) with image tokens;
    // k = e; k beyond one warp, and beyond the block; quantised logits and bias (ties); fewer
    // blocks than rows; n = 1;
    // more experts than the kernel's score cache (LMS_ROUTE_CACHE), which recomputes the scores
    const Config configs[] = {
        {7, 256, 6, 7, false, false, "full size"},   {9, 8, 2, 9, true, false, "hash, image ids"},
        {4, 8, 8, 4, false, false, "k = e"},         {3, 70, 40, 3, true, false, "k = 40, hash"},
        {6, 256, 6, 6, false, true, "ties"},         {11, 256, 6, 3, true, true, "hash, ties, 3 blocks"},
        {1, 5, 3, 1, false, false, "n = 1"},         {6, 1100, 5, 2, false, true, "e past the cache, ties"},
        {2, 300, 270, 2, false, false, "k beyond the block"},
    };
    const unsigned vocab = 10, kinds = 2;
    for (const auto& cf : configs) {
        const unsigned n = cf.n, e = cf.e, k = cf.k;
        std::vector<float> logits(n * e), bias(kinds * e);
        for (auto& v : logits) v = cf.ties ? float(int(rng() % 16) - 8) * 0.5f : randv(1, 6)[0];
        for (auto& v : bias) v = cf.ties ? float(rng() % 2) * 0.5f : randv(1, 0.3f)[0];
        // nan / +inf logits are never picked; -inf scores 0 and stays a candidate; 22 takes the linear branch
        logits[0] = NAN, logits[e > 2 ? 2 : 0] = INFINITY, logits[e - 1] = -INFINITY;
        if (e > 3) logits[3] = 22.0f;
        std::vector<int> kind(n), tok(n);
        for (unsigned i = 0; i < n; ++i) {
            kind[i] = int(i % 3 == 1);  // image rows use the bias_vl row
            tok[i] = i % 3 == 1 ? int(vocab + i) : int(rng() % vocab);
        }
        if (n > 2) kind[2] = 2;         // a kind outside the bias rows: NaN row (this lane's gather_rows)
        if (n > 5)                      // a row with fewer than k finite scores: -1 slots, NaN weights
            for (unsigned j = 1; j < e; ++j) logits[5 * e + j] = NAN;
        std::vector<int> table(vocab * k);
        for (auto& v : table) v = rng() % e;
        table[k] = e; // token 1's table row names an expert outside 0..e: NaN weights
        const float scale = 2.5f;
        unsigned sb;
        std::memcpy(&sb, &scale, 4);
        std::vector<int> ids(n * k, 12345), want_ids;
        std::vector<float> w(n * k, -7.0f), want_w;
        emu_launch(route_experts_f32, {cf.blocks}, {256}, 0, (const float*)logits.data(), (const float*)bias.data(),
                   (const int*)kind.data(), (const int*)table.data(), (const int*)tok.data(), ids.data(), w.data(), n,
                   e, k, kinds, (unsigned)cf.hashed, vocab, sb);
        route_ref(logits, bias, kind, cf.hashed ? &table : nullptr, tok, n, e, k, kinds, vocab, scale, want_ids,
                  want_w);
        char name[96];
        std::snprintf(name, sizeof name, "route_experts_f32 n=%u e=%u k=%u %s ids", n, e, k, cf.what);
        checki(name, ids, want_ids);
        std::snprintf(name, sizeof name, "route_experts_f32 n=%u e=%u k=%u %s w", n, e, k, cf.what);
        check_nf(name, w, want_w, 0.0);
    }
}


// ---- block formats (cuda/dequant.cuh) against llama.cpp's own decoded values -----------------
// fixtures/goldens/cuda/dequant_blocks.bin (fixtures/gen/cuda/dequant_goldens.py): per format,
// 8 blocks (5 with random normal scales, then zero, subnormal and largest scales) and the f32 bits
// llama.cpp's dequantize_row_* (or, for the re-laid FP8, the published formula) gives them.

struct GoldenBlocks {
    std::string name;
    unsigned bytes, qk, blocks;
    std::vector<unsigned char> raw;
    std::vector<float> values;
};

static std::vector<GoldenBlocks> load_golden_blocks() {
    std::vector<GoldenBlocks> out;
    FILE* f = std::fopen(DEQUANT_GOLDENS, "rb");
    if (!f) {
        std::printf("%-44s cannot open %s FAIL\n", "dequant goldens", DEQUANT_GOLDENS);
        ++failures;
        return out;
    }
    auto u32 = [&](unsigned* v) { return std::fread(v, 4, 1, f) == 1; };
    unsigned len;
    while (u32(&len)) {
        GoldenBlocks g;
        g.name.resize(len);
        bool ok = len < 64 && std::fread(g.name.data(), 1, len, f) == len && u32(&g.bytes) && u32(&g.qk) &&
                  u32(&g.blocks) && g.blocks < 64 && g.qk <= 256 && g.bytes <= 256;
        if (ok) {
            g.raw.resize(g.blocks * g.bytes);
            g.values.resize(g.blocks * g.qk);
            ok = std::fread(g.raw.data(), 1, g.raw.size(), f) == g.raw.size() &&
                 std::fread(g.values.data(), 4, g.values.size(), f) == g.values.size();
        }
        if (!ok) {
            std::printf("%-44s truncated or malformed record FAIL\n", "dequant goldens");
            ++failures;
            break;
        }
        out.push_back(std::move(g));
    }
    std::fclose(f);
    return out;
}

// fixtures/goldens/formats/<FORMAT>.safetensors (fixtures/gen/formats, the CPU decoders' goldens:
// quantized rows from ggml_quantize_chunk, edge and random blocks, llama.cpp's to_float values):
// tensors `blocks` U8 [rows, row bytes] and `values` U32 [rows, cols], read as one GoldenBlocks
// (rows are whole blocks). An empty name when the file cannot be read as that.
static GoldenBlocks load_format_goldens(const std::string& format, unsigned bytes, unsigned qk) {
    GoldenBlocks g{"", bytes, qk, 0, {}, {}};
    const std::string path = std::string(FORMAT_GOLDENS) + "/" + format + ".safetensors";
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return g;
    std::vector<unsigned char> file;
    unsigned char buf[65536];
    for (size_t got; (got = std::fread(buf, 1, sizeof buf, f)) > 0;) file.insert(file.end(), buf, buf + got);
    std::fclose(f);
    uint64_t hlen = 0;
    if (file.size() < 8) return g;
    std::memcpy(&hlen, file.data(), 8);
    if (hlen > file.size() - 8) return g;
    const std::string header(file.begin() + 8, file.begin() + 8 + hlen);
    auto tensor = [&](const char* key, unsigned long* rows, unsigned long* cols, unsigned long* a, unsigned long* b) {
        const size_t at = header.find(std::string("\"") + key + "\"");
        if (at == std::string::npos) return false;
        const size_t shape = header.find("\"shape\"", at), offs = header.find("\"data_offsets\"", at);
        return shape != std::string::npos && offs != std::string::npos &&
               std::sscanf(header.c_str() + shape, "\"shape\": [%lu, %lu]", rows, cols) == 2 &&
               std::sscanf(header.c_str() + offs, "\"data_offsets\": [%lu, %lu]", a, b) == 2;
    };
    unsigned long br, bc, ba, bb, vr, vc, va, vb;
    const size_t data = 8 + hlen;
    if (!tensor("blocks", &br, &bc, &ba, &bb) || !tensor("values", &vr, &vc, &va, &vb) || br != vr ||
        bc % bytes != 0 || vc != bc / bytes * qk || bb - ba != br * bc || vb - va != vr * vc * 4 ||
        data + bb > file.size() || data + vb > file.size())
        return g;
    g.raw.assign(file.begin() + data + ba, file.begin() + data + bb);
    g.values.resize(vr * vc);
    std::memcpy(g.values.data(), file.data() + data + va, vb - va);
    g.blocks = (unsigned)(br * (bc / bytes));
    g.name = format + " (fixtures/goldens/formats)";
    return g;
}

// Every value of every golden block through dq_run, one at a time and in pairs (the GEMM tile's
// runs), and through dq_run8 in runs of 8 (the small-row path's): bit-exact (NaN for NaN). The
// blocks are copied to a buffer aligned as the device's allocations are (dq_run8 loads words).
template <int FMT>
static void dequant_exact(const GoldenBlocks& g) {
    size_t bad = 0, n = g.values.size();
    bool geometry = WBlock<FMT>::QK == g.qk && WBlock<FMT>::BYTES == g.bytes && n % 8 == 0;
    std::vector<unsigned long long> aligned((g.raw.size() + 7) / 8);
    std::memcpy(aligned.data(), g.raw.data(), g.raw.size());
    for (size_t i = 0; geometry && i < n; i += 8) {
        float one[8], two[8], eight[8];
        for (size_t t = 0; t < 8; t += 2) {
            dq_run<FMT>(aligned.data(), i + t, &one[t], 1);
            dq_run<FMT>(aligned.data(), i + t + 1, &one[t + 1], 1);
            dq_run<FMT>(aligned.data(), i + t, &two[t], 2);
        }
        dq_run8<FMT>(aligned.data(), i, eight);
        for (int t = 0; t < 8; ++t) {
            const float want = g.values[i + t];
            auto same = [&](float v) { return std::isnan(want) ? std::isnan(v) : same_bits(v, want); };
            bad += !same(one[t]) + !same(two[t]) + !same(eight[t]);
        }
    }
    // weight_f16 (cuBLASLt's operand): every value rounded to the nearest f16; NaN stays NaN
    std::vector<unsigned> h16(geometry ? n / 2 : 0);
    if (geometry)
        emu_launch(weight_f16<FMT>, {blocks1d(n / 8)}, {256}, 0, (const void*)aligned.data(),
                   (gemv_u4*)h16.data(), (u64)(n / 8));
    for (size_t i = 0; geometry && i < n; ++i) {
        const unsigned got = (h16[i / 2] >> (16 * (i % 2))) & 0xffffu;
        const bool nan = (got & 0x7c00u) == 0x7c00u && (got & 0x3ffu) != 0u;
        bad += std::isnan(g.values[i]) ? !nan : got != f16_bits_rn(g.values[i]);
    }
    char name[96];
    std::snprintf(name, sizeof name, "dq_run/dq_run8/weight_f16 %s, %u blocks", g.name.c_str(), g.blocks);
    std::printf("%-44s %s%zu of %zu values differ %s\n", name, geometry ? "" : "block geometry differs, ", bad, 4 * n,
                bad || !geometry ? "FAIL" : "ok");
    failures += bad != 0 || !geometry;
}

// A [rows, k] matrix of golden blocks (each drawn at random from the 5 with normal scales, so the
// products stay finite and every row differs) and its decoded values.
static void golden_matrix(const GoldenBlocks& g, unsigned rows, unsigned k, std::vector<unsigned char>& w,
                          std::vector<float>& wdec) {
    const unsigned per_row = k / g.qk;
    w.clear();
    wdec.clear();
    for (unsigned b = 0; b < rows * per_row; ++b) {
        const unsigned src = rng() % 5;
        w.insert(w.end(), g.raw.begin() + src * g.bytes, g.raw.begin() + (src + 1) * g.bytes);
        wdec.insert(wdec.end(), g.values.begin() + src * g.qk, g.values.begin() + (src + 1) * g.qk);
    }
}

typedef void (*BlockLinear)(const float*, const void*, const float*, float*, float*, unsigned, unsigned, unsigned,
                            unsigned, unsigned);
typedef void (*BlockGrouped)(const float*, const void*, float*, unsigned, unsigned, unsigned, unsigned, unsigned);
typedef void (*BlockEmbed)(const void*, const int*, float*, unsigned, unsigned, unsigned);
typedef void (*BlockMoeGate)(const float*, const int*, const int*, const unsigned long long*, float*, unsigned,
                             unsigned, unsigned, unsigned);
typedef void (*BlockMoeUp)(const float*, const int*, const int*, const unsigned long long*, float*, unsigned, unsigned,
                           unsigned, unsigned, float);
typedef void (*BlockMoeDown)(const float*, const int*, const int*, const unsigned long long*, float*, unsigned, unsigned,
                             unsigned);
typedef void (*BlockUnfold)(const float*, const void*, const float*, float*, unsigned, unsigned, unsigned, unsigned,
                            unsigned, unsigned, unsigned, unsigned);
struct BlockKernels {
    BlockLinear linear;
    BlockUnfold unfold;
    BlockGrouped grouped;
    BlockEmbed embed;
    BlockMoeGate gate;
    BlockMoeUp up;
    BlockMoeDown down;
};

// E experts from golden blocks: the gate w1[e] [h, d] in g1's format, the up w3[e] [h, d] in
// g3's, the down w2[e] [d, h] in g2's, their decoded values, and the kernels' table of their
// addresses (every w1, then every w3, then every w2).
struct GoldenExperts {
    std::vector<std::vector<unsigned char>> w1, w3, w2;
    std::vector<std::vector<float>> w1d, w3d, w2d;
    std::vector<unsigned long long> table;
    GoldenExperts(const GoldenBlocks& g1, const GoldenBlocks& g3, const GoldenBlocks& g2, unsigned E, unsigned d,
                  unsigned h)
        : w1(E), w3(E), w2(E), w1d(E), w3d(E), w2d(E), table(3 * E) {
        for (unsigned e = 0; e < E; ++e) {
            golden_matrix(g1, h, d, w1[e], w1d[e]);
            golden_matrix(g3, h, d, w3[e], w3d[e]);
            golden_matrix(g2, d, h, w2[e], w2d[e]);
            table[e] = (unsigned long long)(uintptr_t)w1[e].data();
            table[E + e] = (unsigned long long)(uintptr_t)w3[e].data();
            table[2 * E + e] = (unsigned long long)(uintptr_t)w2[e].data();
        }
    }
};

// moe_route's slot order and tile list for ids [n, k] over E experts, with the host's tile rows
// and tile bound.
struct ExpertTiles {
    std::vector<int> order, tiles;
    unsigned tile, max_tiles;
    ExpertTiles(const std::vector<int>& ids, unsigned n, unsigned E)
        : order(ids.size()), tile(moe_tile_rows(n)), max_tiles(moe_max_tiles(n, (unsigned)ids.size(), E)) {
        const unsigned slots = (unsigned)ids.size();
        tiles.resize(1 + 3 * max_tiles);
        std::vector<int> cursor(E);
        emu_launch(moe_route, {1}, {MR_THREADS}, MR_WARPS * E * 4, (const int*)ids.data(), order.data(), tiles.data(),
                   cursor.data(), slots, E, tile);
    }
};

// The routed experts' kernels on golden matrices, the gate in g1's format, the up in g3's, the
// down in g2's (d = h = k, a whole number of blocks of each): the tile path (40 slots) and the
// small-row path (6 slots), against double-precision dot products of the decoded values.
static void block_moe(unsigned k, const GoldenBlocks& g1, BlockMoeGate gate, const GoldenBlocks& g3, BlockMoeUp up,
                      const GoldenBlocks& g2, BlockMoeDown down) {
    for (unsigned n : {20u, 3u}) {
        const unsigned d = k, h = k, E = 3, kk = 2, slots = n * kk;
        auto x = randv(n * d, 1), wt = randv(slots, 1);
        std::vector<int> ids(slots);
        for (unsigned s = 0; s < slots; ++s) ids[s] = (int)(rng() % E);
        const GoldenExperts ex(g1, g3, g2, E, d, h);
        const auto& [w1d, w3d, w2d, table] = std::tie(ex.w1d, ex.w3d, ex.w2d, ex.table);
        const ExpertTiles rt(ids, n, E);
        const auto& [order, tiles, tile, max_tiles] = std::tie(rt.order, rt.tiles, rt.tile, rt.max_tiles);
        const float limit = 1e30f; // no clamping: the check is of the GEMMs
        std::vector<float> hid(slots * h), ys(slots * d), out(n * d);
        const dim3 gu{gemm_grid(tile, h).x, max_tiles};
        emu_launch(gate, gu, {128}, 0, (const float*)x.data(), (const int*)order.data(), (const int*)tiles.data(),
                   (const unsigned long long*)table.data(), hid.data(), tile, d, h, kk);
        emu_launch(up, gu, {128}, 0, (const float*)x.data(), (const int*)order.data(), (const int*)tiles.data(),
                   (const unsigned long long*)table.data() + E, hid.data(), tile, d, h, kk, limit);
        emu_launch(down, dim3{gemm_grid(tile, d).x, max_tiles}, {128}, 0, (const float*)hid.data(),
                   (const int*)order.data(), (const int*)tiles.data(), (const unsigned long long*)table.data() + 2 * E,
                   ys.data(), tile, d, h);
        emu_launch(moe_combine, {blocks1d(n * d)}, {256}, 0, (const float*)ys.data(), (const float*)wt.data(),
                   (const int*)ids.data(), out.data(), n * d, d, kk, E);
        std::vector<float> want(n * d, 0.0f);
        std::vector<double> hh(h);
        for (unsigned i = 0; i < n; ++i)
            for (unsigned s = 0; s < kk; ++s) {
                const unsigned e = ids[i * kk + s];
                for (unsigned j = 0; j < h; ++j) {
                    double gg = 0, u = 0;
                    for (unsigned c = 0; c < d; ++c) {
                        gg += double(x[i * d + c]) * w1d[e][(size_t)j * d + c];
                        u += double(x[i * d + c]) * w3d[e][(size_t)j * d + c];
                    }
                    hh[j] = gg / (1.0 + std::exp(-gg)) * u;
                }
                for (unsigned c = 0; c < d; ++c) {
                    double yv = 0;
                    for (unsigned j = 0; j < h; ++j) yv += hh[j] * w2d[e][(size_t)c * h + j];
                    want[i * d + c] += float(wt[i * kk + s] * yv);
                }
            }
        char name[96];
        std::snprintf(name, sizeof name, "moe_%s/%s/%s n=%u d=h=%u 3 experts k=2", g1.name.c_str(), g3.name.c_str(),
                      g2.name.c_str(), n, k);
        check(name, out, want, MOE_NMSE);
    }
}

// The weight kernels of one block format on golden matrices against a double-precision dot
// product of the decoded values (k = 2 blocks, or 5 of Q8_0 / MXFP4's 32): f32 FMAs over at most a
// few hundred terms, so the NMSE bound of the f32 path, 1e-10, holds with orders to spare.
// Every format runs linear on both GEMM paths; the formats of `full` (one of each block size and
// family: the decoding is per format, the addressing is common) run every kernel, as the emulator
// is slow (a thread per CUDA thread).
static void block_gemms(const GoldenBlocks& g, const BlockKernels& kn) {
    const unsigned k = g.qk == 32 ? 160 : 2 * g.qk;
    const char* fn = g.name.c_str();
    bool full = false;
    for (const char* f : {"Q8_0", "Q4_K", "IQ2_XS", "MXFP4", "FP8_E4M3_B128_E8M0"}) full = full || g.name == f;
    // linear: small-row path (a block per column pair), tile, small-row over 1030 columns
    const unsigned shapes[][2] = {{3, 37}, {70, 45}, {2, 1030}};
    for (unsigned s = 0; s < (full ? 3u : 2u); ++s) {
        const unsigned n = shapes[s][0], o = shapes[s][1];
        std::vector<unsigned char> w;
        std::vector<float> wdec;
        golden_matrix(g, o, k, w, wdec);
        auto x = randv(n * k, 1), b = randv(o, 0.5);
        std::vector<float> y(n * o), want(n * o);
        emu_launch(kn.linear, gemm_grid(n, o), {128}, 0, (const float*)x.data(), (const void*)w.data(),
                   (const float*)b.data(), y.data(), (float*)nullptr, n, k, o, 1u, 0u);
        for (unsigned i = 0; i < n; ++i)
            for (unsigned c = 0; c < o; ++c) {
                double dot = b[c];
                for (unsigned j = 0; j < k; ++j) dot += double(x[i * k + j]) * wdec[(size_t)c * k + j];
                want[i * o + c] = float(dot);
            }
        char name[80];
        std::snprintf(name, sizeof name, "linear_%s x[%u,%u] W[%u,%u] +b", fn, n, k, o, k);
        check(name, y, want, GEMM_NMSE);
    }
    if (!full) return;
    // grouped_linear: 2 groups of k columns, r = 37 rows each; tile and small-row paths
    for (unsigned n : {9u, 4u}) {
        const unsigned gr = 2, r = 37;
        std::vector<unsigned char> w;
        std::vector<float> wdec;
        golden_matrix(g, gr * r, k, w, wdec);
        auto x = randv(n * gr * k, 1);
        const unsigned tiles = gemm_grid(n, r).x;
        std::vector<float> y(n * gr * r), want(n * gr * r);
        emu_launch(kn.grouped, dim3{gr * tiles, gemm_grid(n, r).y}, {128}, 0, (const float*)x.data(),
                   (const void*)w.data(), y.data(), n, k, r, gr, tiles);
        for (unsigned i = 0; i < n; ++i)
            for (unsigned o = 0; o < gr * r; ++o) {
                double dot = 0;
                for (unsigned j = 0; j < k; ++j) dot += double(x[i * gr * k + (o / r) * k + j]) * wdec[(size_t)o * k + j];
                want[i * gr * r + o] = float(dot);
            }
        char name[80];
        std::snprintf(name, sizeof name, "grouped_linear_%s x[%u,2x%u] W[2x37,%u]", fn, n, k, k);
        check(name, y, want, GEMM_NMSE);
    }
    block_moe(k, g, kn.gate, g, kn.up, g, kn.down);
    // unfold_linear_gelu (always the tile): c = k / 4 channels, r = 2, a 5 x 3 grid (padded cells)
    {
        const unsigned r = 2, c = k / 4, gh = 5, gw = 3, cw = 2, cells = 3 * cw, o = 21;
        std::vector<unsigned char> w;
        std::vector<float> wdec;
        golden_matrix(g, o, k, w, wdec);
        auto x = randv(gh * gw * c, 1), b = randv(o, 0.5);
        std::vector<float> y(cells * o), want(cells * o);
        emu_launch(kn.unfold, dim3{(o + 63) / 64, (cells + 63) / 64}, {128}, 0, (const float*)x.data(),
                   (const void*)w.data(), (const float*)b.data(), y.data(), c, gh, gw, r, cw, cells, o, 1u);
        for (unsigned m = 0; m < cells; ++m)
            for (unsigned oc = 0; oc < o; ++oc) {
                double dot = b[oc];
                for (unsigned f = 0; f < k; ++f) {
                    const unsigned ch = f / (r * r), dy = f % (r * r) / r, dx = f % r;
                    const unsigned yy = m / cw * r + dy, xx = m % cw * r + dx;
                    if (yy < gh && xx < gw) dot += double(x[(yy * gw + xx) * c + ch]) * wdec[(size_t)oc * k + f];
                }
                want[m * o + oc] = float(0.5 * dot * std::erfc(-dot / std::sqrt(2.0)));
            }
        char name[80];
        std::snprintf(name, sizeof name, "unfold_linear_gelu_%s 5x3x%u r=2 ->21 +b", fn, c);
        check(name, y, want, GEMM_NMSE);
    }
    // embed_rows: ids in range, past the vocabulary (zero row) and negative (NaN row)
    {
        const unsigned vocab = 7, n = 5;
        std::vector<unsigned char> w;
        std::vector<float> wdec;
        golden_matrix(g, vocab, k, w, wdec);
        const std::vector<int> ids = {3, 0, 9, -1, 6};
        std::vector<float> y(n * k), want(n * k);
        emu_launch(kn.embed, {blocks1d(n * k)}, {256}, 0, (const void*)w.data(), (const int*)ids.data(), y.data(), n, k,
                   vocab);
        for (unsigned i = 0; i < n; ++i)
            for (unsigned c = 0; c < k; ++c)
                want[i * k + c] = ids[i] < 0 ? NAN : ids[i] >= (int)vocab ? 0.0f : wdec[(size_t)ids[i] * k + c];
        char name[80];
        std::snprintf(name, sizeof name, "embed_rows_%s [7,%u] 5 ids", fn, k);
        check_masked(name, y, want, 0);
    }
}

static void test_dequant() {
    const auto goldens = load_golden_blocks();
    unsigned seen = 0;
#define DEQUANT_CASE(SFX, FMT)                                                                              \
    for (auto& g : goldens) {                                                                               \
        std::string lower = g.name;                                                                         \
        for (auto& ch : lower) ch = (char)std::tolower((unsigned char)ch);                                  \
        if (lower == #SFX) {                                                                                \
            dequant_exact<FMT>(g);                                                                          \
            const GoldenBlocks cpu = load_format_goldens(g.name, g.bytes, g.qk);                            \
            if (cpu.name.empty()) {                                                                         \
                std::printf("%-44s cannot read %s.safetensors FAIL\n", "format goldens", g.name.c_str());   \
                ++failures;                                                                                 \
            } else {                                                                                        \
                dequant_exact<FMT>(cpu);                                                                    \
            }                                                                                               \
            ++seen;                                                                                         \
        }                                                                                                   \
    }
    FOR_EACH_BLOCK_FORMAT(DEQUANT_CASE)
#undef DEQUANT_CASE
    std::printf("%-44s %u of 15 formats %s\n", "dequant goldens", seen, seen == 15 ? "ok" : "FAIL");
    failures += seen != 15;
}

// The weight kernels of every block format. Not among run.sh's sm_75 `gemm` tests: block formats
// take the FMA tile on every architecture, which the sm_90 build already runs.
static void test_block_formats() {
    const auto goldens = load_golden_blocks();
    unsigned seen = 0;
#define BLOCK_GEMM_CASE(SFX, FMT)                                                                           \
    for (auto& g : goldens) {                                                                               \
        std::string lower = g.name;                                                                         \
        for (auto& ch : lower) ch = (char)std::tolower((unsigned char)ch);                                  \
        if (lower == #SFX) {                                                                                \
            block_gemms(g, BlockKernels{linear_##SFX, unfold_linear_gelu_##SFX, grouped_linear_##SFX,       \
                                        embed_rows_##SFX, moe_gate_##SFX, moe_up_##SFX, moe_down_##SFX});   \
            ++seen;                                                                                         \
        }                                                                                                   \
    }
    FOR_EACH_BLOCK_FORMAT(BLOCK_GEMM_CASE)
#undef BLOCK_GEMM_CASE
    std::printf("%-44s %u of 15 formats %s\n", "block-format kernels", seen, seen == 15 ? "ok" : "FAIL");
    failures += seen != 15;
    // gate and up in different block formats, as the unsloth mixes store them (IQ1_S gate, IQ1_M
    // up), down in a third; 512 = 2 blocks of 256 = 16 of Q8_0's 32
    auto find = [&](const char* name) -> const GoldenBlocks* {
        for (auto& g : goldens)
            if (g.name == name) return &g;
        return nullptr;
    };
    const GoldenBlocks *s1 = find("IQ1_S"), *m1 = find("IQ1_M"), *q8 = find("Q8_0");
    if (s1 && m1 && q8) {
        block_moe(512, *s1, moe_gate_iq1_s, *m1, moe_up_iq1_m, *q8, moe_down_q8_0);
    } else {
        std::printf("%-44s IQ1_S, IQ1_M or Q8_0 goldens missing FAIL\n", "moe mixed block formats");
        ++failures;
    }
}

// x quantized as the q8x kernels quantize it (cuda/dequant.cuh q8x_quantize, ggml's q8_1 rule): per 32
// values the scale dx = amax / 127 and q = round(x / dx) (x times the f32 inverse, as the kernel
// rounds it); returns q · dx, the activations those kernels multiply.
static std::vector<double> q8x_rounded(const float* x, unsigned k) {
    std::vector<double> out(k);
    for (unsigned g = 0; g < k / 32; ++g) {
        float amax = 0.0f;
        for (unsigned i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(x[32 * g + i]));
        const float dx = amax / 127.0f, inv = dx != 0.0f ? 1.0f / dx : 0.0f;
        for (unsigned i = 0; i < 32; ++i) out[32 * g + i] = double(std::round(x[32 * g + i] * inv)) * dx;
    }
    return out;
}

typedef void (*Q8xGate)(const float*, const int*, const int*, const unsigned long long*, float*, unsigned, unsigned,
                        unsigned, unsigned);
typedef void (*Q8xUp)(const float*, const int*, const int*, const unsigned long long*, float*, unsigned, unsigned,
                      unsigned, unsigned, float);
typedef void (*Q8xDown)(const float*, const int*, const int*, const unsigned long long*, float*, unsigned, unsigned,
                        unsigned);

// The one-token experts on int8 activations (moe_{gate,up,down}_q8x_*, fast precision's decode
// step: the host launches them for one token) on golden matrices, gate in g1's format, up in g3's,
// down in g2's, d = h = k: each launch against double-precision dot products of the decoded values
// with its own input quantized as the kernel quantizes it (the up's SwiGLU from the kernel's
// gate, the down from the kernel's hidden row), so only f32 summation and the scales' rounding
// separate them: the exact GEMM bound. One token's 3 slots over 3 experts, expert 2 twice (one
// tile of two rows, quantized and summed one after the other).
static void q8x_moe(unsigned k, const GoldenBlocks& g1, Q8xGate gate, const GoldenBlocks& g3, Q8xUp up,
                    const GoldenBlocks& g2, Q8xDown down) {
    const unsigned n = 1, d = k, h = k, E = 3, kk = 3, slots = n * kk;
    auto x = randv(d, 1);
    const std::vector<int> ids = {2, 0, 2};
    const GoldenExperts ex(g1, g3, g2, E, d, h);
    const auto& [w1d, w3d, w2d, table] = std::tie(ex.w1d, ex.w3d, ex.w2d, ex.table);
    const ExpertTiles rt(ids, n, E);
    const auto& [order, tiles, tile, max_tiles] = std::tie(rt.order, rt.tiles, rt.tile, rt.max_tiles);
    const float limit = 1e30f; // no clamping: the check is of the products
    std::vector<float> hid(slots * h), gates, ys(slots * d);
    const size_t smem = k + k / 8; // the int8 row and its scales (q8x_shared_bytes)
    const unsigned cols_a_block = 32; // Q8X_WARPS * Q8X_COLS
    emu_launch(gate, dim3{h / cols_a_block, max_tiles}, {256}, smem, (const float*)x.data(), (const int*)order.data(),
               (const int*)tiles.data(), (const unsigned long long*)table.data(), hid.data(), tile, d, h, kk);
    gates = hid;
    emu_launch(up, dim3{h / cols_a_block, max_tiles}, {256}, smem, (const float*)x.data(), (const int*)order.data(),
               (const int*)tiles.data(), (const unsigned long long*)table.data() + E, hid.data(), tile, d, h, kk, limit);
    emu_launch(down, dim3{d / cols_a_block, max_tiles}, {256}, smem, (const float*)hid.data(), (const int*)order.data(),
               (const int*)tiles.data(), (const unsigned long long*)table.data() + 2 * E, ys.data(), tile, d, h);
    const auto xq = q8x_rounded(x.data(), d);
    std::vector<float> want_g(slots * h), want_h(slots * h), want_y(slots * d);
    // hid row p is slot order[p]'s (the slots in expert order); ys row s is slot s's
    for (unsigned p = 0; p < slots; ++p) {
        const unsigned s = order[p], e = ids[s];
        for (unsigned j = 0; j < h; ++j) {
            double gg = 0, u = 0;
            for (unsigned c = 0; c < d; ++c) {
                gg += xq[c] * w1d[e][(size_t)j * d + c];
                u += xq[c] * w3d[e][(size_t)j * d + c];
            }
            const double gk = gates[p * h + j]; // the up's epilogue takes the kernel's gate
            want_g[p * h + j] = float(gg);
            want_h[p * h + j] = float(gk / (1.0 + std::exp(-gk)) * u);
        }
        const auto hq = q8x_rounded(hid.data() + p * h, h);
        for (unsigned c = 0; c < d; ++c) {
            double yv = 0;
            for (unsigned j = 0; j < h; ++j) yv += hq[j] * w2d[e][(size_t)c * h + j];
            want_y[s * d + c] = float(yv);
        }
    }
    const char* names[3] = {"gate", "up", "down"};
    const std::vector<float>* got[3] = {&gates, &hid, &ys};
    const std::vector<float>* want[3] = {&want_g, &want_h, &want_y};
    for (unsigned p = 0; p < 3; ++p) {
        char name[96];
        std::snprintf(name, sizeof name, "moe_%s_q8x %s/%s/%s k=%u one token", names[p], g1.name.c_str(),
                      g3.name.c_str(), g2.name.c_str(), k);
        check(name, *got[p], *want[p], 1e-10);
    }
}

typedef void (*Q8xLinear)(const float*, const void*, const float*, float*, unsigned, unsigned, unsigned, const float*,
                          float);

// The one-token linear on int8 activations (linear_q8x_*: fast precision, wide outputs) on a golden
// matrix, with and without a bias: against double dot products of the decoded values with x
// quantized as the kernel quantizes it (plus the bias), the exact GEMM bound. out = 40 columns: a
// block's 32 and a partial one (its last warp's columns past the end store nothing). Then with a
// norm (q_norm in wq_b's launch) against rms_norm_f32 (256 threads, the host's block for k < 4096)
// then the plain kernel, bit for bit.
static void q8x_linear(unsigned k, const GoldenBlocks& g, Q8xLinear linear) {
    const unsigned out = 40;
    std::vector<unsigned char> w;
    std::vector<float> wdec;
    golden_matrix(g, out, k, w, wdec);
    const auto x = randv(k, 1), b = randv(out, 0.5);
    const auto xq = q8x_rounded(x.data(), k);
    const size_t smem = k + k / 8;
    for (unsigned has_bias : {1u, 0u}) {
        std::vector<float> y(out + 8, NAN), want(out);
        emu_launch(linear, dim3{(out + 31) / 32}, {256}, smem, (const float*)x.data(), (const void*)w.data(),
                   (const float*)b.data(), y.data(), k, out, has_bias, (const float*)nullptr, 0.0f);
        for (unsigned c = 0; c < out; ++c) {
            double dot = has_bias ? b[c] : 0.0;
            for (unsigned j = 0; j < k; ++j) dot += xq[j] * wdec[(size_t)c * k + j];
            want[c] = float(dot);
        }
        const bool untouched = std::isnan(y[out]) && std::isnan(y[out + 7]);
        y.resize(out);
        char name[96];
        std::snprintf(name, sizeof name, "linear_q8x %s x[1,%u] W[%u,%u]%s", g.name.c_str(), k, out, k,
                      has_bias ? " + b" : "");
        check(name, y, want, 1e-10);
        if (!untouched) {
            std::printf("%-44s wrote past its %u outputs FAIL\n", name, out);
            ++failures;
        }
    }
    const auto norm = randv(k, 1.5);
    const float eps = 1e-6f;
    std::vector<float> xn(k), composed(out), fused(out, NAN);
    emu_launch(rms_norm_f32, {1}, {256}, 0, (const float*)x.data(), (const float*)norm.data(), xn.data(), 1u, k, eps);
    emu_launch(linear, dim3{(out + 31) / 32}, {256}, smem, (const float*)xn.data(), (const void*)w.data(),
               (const float*)b.data(), composed.data(), k, out, 1u, (const float*)nullptr, 0.0f);
    emu_launch(linear, dim3{(out + 31) / 32}, {256}, smem + 4 * k, (const float*)x.data(), (const void*)w.data(),
               (const float*)b.data(), fused.data(), k, out, 1u, (const float*)norm.data(), eps);
    char name[96];
    std::snprintf(name, sizeof name, "linear_q8x %s rms_norm(x)[1,%u] W[%u,%u] + b", g.name.c_str(), k, out, k);
    check(name, fused, composed, 0);
}

typedef void (*LinearRows)(const float*, const void*, const float*, float*, float*, unsigned, unsigned, unsigned,
                           unsigned, unsigned);
typedef void (*LinearPair)(const float*, const void*, const void*, float*, float*, unsigned, unsigned, unsigned,
                           unsigned);

// linear_pair_* (two weights of one format against the same few rows, one launch of the small-row
// path) against two unsplit launches of linear_* on the same operands, bit for bit: n rows of k,
// Wa [40, k] and Wb [23, k] (an odd count: the last pair's second column missing).
static void linear_pair_bits(const GoldenBlocks& g, unsigned n, unsigned k, LinearRows linear, LinearPair pair) {
    const unsigned out_a = 40, out_b = 23, pa = (out_a + 1) / 2, pb = (out_b + 1) / 2;
    std::vector<unsigned char> wa, wb;
    std::vector<float> da, db;
    golden_matrix(g, out_a, k, wa, da);
    golden_matrix(g, out_b, k, wb, db);
    const auto x = randv(n * k, 1);
    std::vector<float> ya(n * out_a, -1.0f), yb(n * out_b, -1.0f), pa_y(n * out_a, -2.0f), pb_y(n * out_b, -2.0f);
    const float* none = nullptr;
    emu_launch(linear, dim3{pa, 1}, {GEMM_THREADS}, 0, (const float*)x.data(), (const void*)wa.data(), none, ya.data(),
               (float*)nullptr, n, k, out_a, 0u, k);
    emu_launch(linear, dim3{pb, 1}, {GEMM_THREADS}, 0, (const float*)x.data(), (const void*)wb.data(), none, yb.data(),
               (float*)nullptr, n, k, out_b, 0u, k);
    emu_launch(pair, dim3{pa + pb}, {GEMM_THREADS}, 0, (const float*)x.data(), (const void*)wa.data(),
               (const void*)wb.data(), pa_y.data(), pb_y.data(), n, k, out_a, out_b);
    size_t differ = 0;
    for (size_t i = 0; i < ya.size(); ++i) differ += std::memcmp(&ya[i], &pa_y[i], 4) != 0;
    for (size_t i = 0; i < yb.size(); ++i) differ += std::memcmp(&yb[i], &pb_y[i], 4) != 0;
    char name[96];
    std::snprintf(name, sizeof name, "linear_pair %s x[%u,%u] W[%u|%u]", g.name.c_str(), n, k, out_a, out_b);
    std::printf("%-44s %zu of %zu values differ from two linears %s\n", name, differ, ya.size() + yb.size(),
                differ ? "FAIL" : "ok");
    failures += differ != 0;
}

static void test_q8x() {
    const auto goldens = load_golden_blocks();
    auto find = [&](const char* name) -> const GoldenBlocks* {
        for (auto& g : goldens)
            if (g.name == name) return &g;
        return nullptr;
    };
    const GoldenBlocks *q8 = find("Q8_0"), *q2 = find("Q2_K"), *iq2 = find("IQ2_XXS"), *mx = find("MXFP4");
    if (!q8 || !q2 || !iq2 || !mx) {
        std::printf("%-44s Q8_0, Q2_K, IQ2_XXS or MXFP4 goldens missing FAIL\n", "q8x experts");
        ++failures;
        return;
    }
    // MXFP4's int8 table, as q8x_mxfp4_values reads it, is KVALUES_MXFP4; and every code of a word
    // comes out where the lookup puts it (all 16 codes in every nibble position)
    const unsigned words[4] = {Q8X_MXFP4_T0, Q8X_MXFP4_T1, Q8X_MXFP4_T2, Q8X_MXFP4_T3};
    unsigned table_wrong = 0;
    for (unsigned i = 0; i < 16; ++i) table_wrong += (signed char)(words[i / 4] >> (8 * (i % 4))) != KVALUES_MXFP4[i];
    for (unsigned c = 0; c < 16; ++c)
        for (unsigned pos = 0; pos < 8; ++pos) {
            const unsigned q4 = (c << (4 * pos)) | ((15u - c) << (4 * ((pos + 3) % 8)));
            const q8x_w2 v = q8x_mxfp4_values(q4);
            for (unsigned b = 0; b < 4; ++b) {
                const unsigned lo = (q4 >> (8 * b)) & 15u, hi = (q4 >> (8 * b + 4)) & 15u;
                table_wrong += (signed char)(v.x >> (8 * b)) != KVALUES_MXFP4[lo];
                table_wrong += (signed char)(v.y >> (8 * b)) != KVALUES_MXFP4[hi];
            }
        }
    std::printf("%-44s %u wrong %s\n", "q8x_mxfp4_values = KVALUES_MXFP4[code]", table_wrong, table_wrong ? "FAIL" : "ok");
    failures += table_wrong != 0;
    q8x_moe(512, *q8, moe_gate_q8x_q8_0, *q8, moe_up_q8x_q8_0, *q8, moe_down_q8x_q8_0);
    q8x_moe(512, *q2, moe_gate_q8x_q2_k, *q2, moe_up_q8x_q2_k, *q2, moe_down_q8x_q2_k);
    q8x_moe(512, *iq2, moe_gate_q8x_iq2_xxs, *iq2, moe_up_q8x_iq2_xxs, *iq2, moe_down_q8x_iq2_xxs);
    // the published Q2-class mix: IQ2_XXS gate and up, Q2_K down
    q8x_moe(1024, *iq2, moe_gate_q8x_iq2_xxs, *iq2, moe_up_q8x_iq2_xxs, *q2, moe_down_q8x_q2_k);
    q8x_linear(1024, *q8, linear_q8x_q8_0);
    q8x_linear(1024, *q2, linear_q8x_q2_k);
    q8x_linear(1024, *iq2, linear_q8x_iq2_xxs);
    // MXFP4 (17-byte blocks: qs on every byte alignment along a row)
    q8x_moe(512, *mx, moe_gate_q8x_mxfp4, *mx, moe_up_q8x_mxfp4, *mx, moe_down_q8x_mxfp4);
    q8x_linear(1024, *mx, linear_q8x_mxfp4);
    for (unsigned n : {1u, 3u}) {
        linear_pair_bits(*q8, n, 1024, linear_q8_0, linear_pair_q8_0);
        linear_pair_bits(*iq2, n, 512, linear_iq2_xxs, linear_pair_iq2_xxs);
    }
}

// The small-row path over long rows (k = 4096 and 2048: several runs a thread) in the q2 mix's
// formats and Q4_K, one row and three, five columns (the last pair has one), whole and split over
// k as the host splits narrow outputs (linear.cu), and an f16 mix split five ways; the same for the
// tile path (13 rows; 70 rows of the mix), whose splits are gridDim.z.
static void test_gemv_long_rows() {
    const auto goldens = load_golden_blocks();
    unsigned seen = 0;
#define GEMV_LONG_CASE(SFX, FMT)                                                                            \
    for (auto& g : goldens) {                                                                               \
        if (g.name != "Q8_0" && g.name != "Q2_K" && g.name != "IQ2_XXS" && g.name != "Q4_K") continue;     \
        std::string lower = g.name;                                                                         \
        for (auto& ch : lower) ch = (char)std::tolower((unsigned char)ch);                                  \
        if (lower != #SFX) continue;                                                                        \
        ++seen;                                                                                             \
        for (unsigned k : {4096u, 2048u})                                                                   \
            for (unsigned n : {1u, 3u, 13u}) {                                                              \
                const unsigned o = 5;                                                                       \
                std::vector<unsigned char> w;                                                               \
                std::vector<float> wdec;                                                                    \
                golden_matrix(g, o, k, w, wdec);                                                            \
                auto x = randv(n * k, 1);                                                                   \
                auto b = randv(o, 0.5);                                                                     \
                std::vector<float> y(n * o), want(n * o);                                                   \
                emu_launch(linear_##SFX, gemm_grid(n, o), {128}, 0, (const float*)x.data(),                 \
                           (const void*)w.data(), (const float*)b.data(), y.data(), (float*)nullptr, n, k, o, 1u, 0u); \
                for (unsigned i = 0; i < n; ++i)                                                            \
                    for (unsigned c = 0; c < o; ++c) {                                                      \
                        double dot = b[c];                                                                  \
                        for (unsigned j = 0; j < k; ++j) dot += double(x[i * k + j]) * wdec[(size_t)c * k + j]; \
                        want[i * o + c] = float(dot);                                                       \
                    }                                                                                       \
                char name[80];                                                                              \
                std::snprintf(name, sizeof name, "linear_%s x[%u,%u] W[%u,%u] long rows", g.name.c_str(), n, k, o, k); \
                check(name, y, want, GEMM_NMSE);                                                            \
                /* split over k as the host does for narrow outputs: ranges of 1024, then sum_splits_f32 */ \
                const unsigned splits = k / 1024;                                                           \
                std::vector<float> part(splits * n * o, NAN), ys(n * o);                                    \
                const dim3 tiles = gemm_grid(n, o);                                                         \
                const dim3 sgrid = n <= 8 ? dim3{tiles.x, splits} : dim3{tiles.x, tiles.y, splits};         \
                emu_launch(linear_##SFX, sgrid, {128}, 0, (const float*)x.data(),                           \
                           (const void*)w.data(), (const float*)b.data(), ys.data(), part.data(), n, k, o, 1u, 1024u); \
                emu_launch(sum_splits_f32, {blocks1d(n * o)}, {256}, 0, (const float*)part.data(),          \
                           (const float*)b.data(), ys.data(), n * o, o, splits, 1u);                        \
                std::snprintf(name, sizeof name, "linear_%s x[%u,%u] W[%u,%u] %u k-splits", g.name.c_str(), n, k, o, k, splits); \
                check(name, ys, want, GEMM_NMSE);                                                           \
            }                                                                                               \
    }
    FOR_EACH_BLOCK_FORMAT(GEMV_LONG_CASE)
#undef GEMV_LONG_CASE
    // an f16 hyper-connection-like mix split over k: 24 columns of 5120 (five ranges, the last 1024),
    // for a decode step (2 rows) and a prefill chunk (70 rows: the tile path)
    for (const unsigned n : {2u, 70u}) {
        const unsigned k = 5120, o = 24, splits = 5;
        const auto wf = randv(o * k, 0.05f);
        std::vector<uint16_t> w16;
        std::vector<float> wdec;
        make_weight(2, wf, w16, wdec);
        auto x = randv(n * k, 1), b = randv(o, 0.5);
        std::vector<float> part(splits * n * o, NAN), y(n * o), want(n * o);
        const dim3 tiles = gemm_grid(n, o);
        const dim3 sgrid = n <= 8 ? dim3{tiles.x, splits} : dim3{tiles.x, tiles.y, splits};
        emu_launch(linear_f16, sgrid, {128}, 0, (const float*)x.data(), (const unsigned short*)w16.data(),
                   (const float*)b.data(), y.data(), part.data(), n, k, o, 1u, 1024u);
        emu_launch(sum_splits_f32, {blocks1d(n * o)}, {256}, 0, (const float*)part.data(), (const float*)b.data(),
                   y.data(), n * o, o, splits, 1u);
        for (unsigned i = 0; i < n; ++i)
            for (unsigned c = 0; c < o; ++c) {
                double dot = b[c];
                for (unsigned j = 0; j < k; ++j) dot += double(x[i * k + j]) * wdec[(size_t)c * k + j];
                want[i * o + c] = float(dot);
            }
        char name[64];
        std::snprintf(name, sizeof name, "linear_f16 x[%u,5120] W[24,5120] 5 k-splits", n);
        check(name, y, want, GEMM_NMSE);
    }
    std::printf("%-44s %u of 4 formats %s\n", "gemv long rows", seen, seen == 4 ? "ok" : "FAIL");
    failures += seen != 4;
}

// sh cuda/emu/run.sh [TEST ...]: only the tests named (test_attention is "attention"; `gemm` names
// the GEMM tests, which run.sh's second build, for devices below sm_80, runs alone).
int main(int argc, char** argv) {
    const std::pair<const char*, void (*)()> tests[] = {
        {"f16_decode", test_f16_decode},     {"gemm_split", test_gemm_split},
        {"elementwise", test_elementwise},
        {"copy", test_copy},                 {"norm", test_norm},
        {"f16_operands", test_f16_operands},
        {"rope", test_rope},                 {"attention", test_attention},
        {"attention_fast", test_attention_fast}, {"attention_qkv_rope", test_attention_qkv_rope},
        {"linear", test_linear},             {"sink_attention", test_sink_attention},
        {"sink_attention_fast", test_sink_attention_fast},
        {"indexer_scores", test_indexer_scores}, {"compress_pool", test_compress_pool},
        {"grouped_linear", test_grouped_linear}, {"moe", test_moe}, {"gemv_long_rows", test_gemv_long_rows},
        {"lm_elementwise", test_lm_elementwise}, {"rope_tail", test_rope_tail},
        {"hc_split", test_hc_split},         {"rms_norm_heads", test_rms_norm_heads},
        {"fused_norms", test_fused_norms},   {"hc_mix_split", test_hc_mix_split},
        {"hc_post_mix_partials", test_hc_post_mix_partials},
        {"topk", test_topk},                 {"route_experts", test_route_experts},
        {"gemm_specials", test_gemm_specials}, {"unfold_linear_gelu", test_unfold_linear_gelu},
        {"dequant", test_dequant},           {"block_formats", test_block_formats},
        {"q8x", test_q8x}};
    const char* gemm_tests[] = {"linear", "grouped_linear", "moe", "gemm_specials", "unfold_linear_gelu"};
    std::printf("__CUDA_ARCH__ %d\n", __CUDA_ARCH__);
    int ran = 0;
    for (auto& [name, run] : tests) {
        bool wanted = argc < 2;
        for (int a = 1; a < argc; ++a) {
            wanted = wanted || std::strcmp(argv[a], name) == 0;
            if (std::strcmp(argv[a], "gemm") == 0)
                for (const char* g : gemm_tests) wanted = wanted || std::strcmp(g, name) == 0;
        }
        if (wanted) run(), ++ran;
    }
    if (ran == 0) {
        std::printf("no test named so\n");
        return 2;
    }
    std::printf("%s: %d failure(s)\n", failures ? "FAILED" : "all ok", failures);
    return failures != 0;
}
