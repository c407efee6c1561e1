// Each kernel of cuda/ (through cuda_emu.h) against a plain reference; see run.sh.
#include "cuda_emu.h"
#include "all_kernels.inc"

#include <cstdio>
#include <random>

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

static unsigned blocks1d(size_t total) {
    size_t b = (total + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > (1u << 20) ? (1u << 20) : b);
}

static float f16_ref(uint16_t h) {
    _Float16 f;
    std::memcpy(&f, &h, 2);
    return (float)f;
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

static void test_attention() {
    unsigned shapes[][3] = {{1, 1, 16}, {45, 3, 16}, {130, 4, 32}, {300, 2, 72}, {129, 1, 200}};
    for (auto& sh : shapes) {
        unsigned n = sh[0], heads = sh[1], hd = sh[2], cols = heads * hd;
        auto q = randv(n * cols, 1.5), k = randv(n * cols, 1.5), v = randv(n * cols, 1);
        std::vector<float> y(n * cols), want(n * cols, 0.0f);
        float scale = 1.0f / std::sqrt(float(hd));
        emu_launch(attention_f32, {n, heads}, {128}, 2 * hd * 4, (const float*)q.data(), (const float*)k.data(),
                   (const float*)v.data(), y.data(), n, heads, hd, scale);
        std::vector<float> s(n);
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
        char name[64];
        std::snprintf(name, sizeof name, "attention_f32 n=%u %ux%u", n, heads, hd);
        check(name, y, want, 1e-10);
    }
}

static void test_linear() {
    unsigned shapes[][3] = {{1, 7, 5}, {37, 70, 45}, {130, 96, 67}, {70, 300, 33}};
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
            dim3 grid{(o + 15) / 16, (n + 15) / 16}, block{16, 16};
            const float* bp = bias ? b.data() : nullptr;
            if (fmt == 0)
                emu_launch(linear_f32, grid, block, 0, (const float*)x.data(), (const float*)wf.data(), bp, y.data(), n, k,
                           o, (unsigned)bias);
            if (fmt == 1)
                emu_launch(linear_bf16, grid, block, 0, (const float*)x.data(), (const unsigned short*)w16.data(), bp,
                           y.data(), n, k, o, (unsigned)bias);
            if (fmt == 2)
                emu_launch(linear_f16, grid, block, 0, (const float*)x.data(), (const unsigned short*)w16.data(), bp,
                           y.data(), n, k, o, (unsigned)bias);
            for (unsigned i = 0; i < n; ++i)
                for (unsigned c = 0; c < o; ++c) {
                    float dot = 0;
                    for (unsigned j = 0; j < k; ++j) dot += x[i * k + j] * wdec[c * k + j];
                    want[i * o + c] = dot + (bias ? b[c] : 0.0f);
                }
            char name[64];
            std::snprintf(name, sizeof name, "linear_%s x[%u,%u] W[%u,%u]%s", fmt == 0 ? "f32" : fmt == 1 ? "bf16" : "f16",
                          n, k, o, k, bias ? " +b" : "");
            check(name, y, want, 1e-10);
        }
}

int main() {
    test_f16_decode();
    test_elementwise();
    test_copy();
    test_norm();
    test_rope();
    test_attention();
    test_linear();
    std::printf("%s: %d failure(s)\n", failures ? "FAILED" : "all ok", failures);
    return failures != 0;
}
