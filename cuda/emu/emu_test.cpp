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

static void test_sink_attention() {
    // n, heads, hd, m, c, kk: hd > SA_THREADS, key counts across chunk boundaries (> 128 keys),
    // empty windows, all slots −1, −inf sinks, no compressed entries (kk = 0).
    struct Shape { unsigned n, heads, hd, m, c, kk; } shapes[] = {
        {7, 3, 20, 12, 5, 4}, {5, 2, 130, 300, 9, 7}, {6, 1, 16, 10, 0, 0}, {4, 2, 33, 200, 140, 150}};
    int which = 0;
    for (auto sh : shapes) {
        unsigned n = sh.n, heads = sh.heads, hd = sh.hd, m = sh.m, c = sh.c, kk = sh.kk, cols = heads * hd;
        auto q = randv(n * cols, 1.5), kv = randv(m * hd, 1.5), comp = randv(std::max(c, 1u) * hd, 1.5);
        auto sinks = randv(heads, 2);
        if (which == 1) sinks[1] = -INFINITY;
        std::vector<int> win(2 * n), idx(std::max(n * kk, 1u), -1);
        for (unsigned i = 0; i < n; ++i) {
            int lo = (int)(i * 37 % m), len = (int)((i * 53 + which * 11) % (m + 1));
            int hi = std::min(lo + len - 1, (int)m - 1);
            win[2 * i] = lo;
            win[2 * i + 1] = hi;
        }
        win[2 * 1] = 5, win[2 * 1 + 1] = 4; // query 1: empty window
        for (unsigned j = 0; j < n * kk; ++j) idx[j] = (j % 5 == 1) ? -1 : (int)(rng() % c);
        if (kk) // query 1 sees nothing at all (empty window, every slot −1): zeros
            for (unsigned s = 0; s < kk; ++s) idx[1 * kk + s] = -1;
        if (which == 3) { // bad operands: window past m (query 2), index ≥ c (query 3): NaN heads
            win[2 * 2 + 1] = (int)m;
            idx[3 * kk + kk - 1] = (int)c;
        }
        std::vector<float> y(n * cols, 123.0f);
        float scale = 1.0f / std::sqrt(float(hd));
        emu_launch(sink_attention_f32, {n, heads}, {128}, 2 * hd * 4, (const float*)q.data(), (const float*)kv.data(),
                   (const int*)win.data(), (const float*)comp.data(), (const int*)idx.data(),
                   (const float*)sinks.data(), y.data(), n, heads, hd, m, kk, c, scale);
        auto want = sink_ref(q, kv, win, comp, idx, sinks, n, heads, hd, m, kk, c);
        bool zeros = true;
        for (unsigned d = 0; d < cols; ++d) zeros = zeros && y[1 * cols + d] == 0.0f;
        char name[80];
        std::snprintf(name, sizeof name, "sink_attention n=%u %ux%u m=%u c=%u k=%u%s", n, heads, hd, m, c, kk,
                      which == 3 ? " bad ops" : "");
        if (!zeros) {
            std::printf("%-44s query without keys not zero FAIL\n", name);
            ++failures;
        }
        check_masked(name, y, want, 1e-10);
        ++which;
    }
}

static void test_indexer_scores() {
    struct Shape { unsigned n, m, heads, hd, pos0, ratio; } shapes[] = {
        {11, 5, 3, 17, 5, 4}, {3, 600, 2, 40, 2000, 4}, {9, 7, 1, 5, 0, 1}, {2, 1, 300, 2, 0, 128}};
    for (auto sh : shapes) {
        unsigned n = sh.n, m = sh.m, heads = sh.heads, hd = sh.hd, cols = heads * hd;
        auto q = randv(n * cols, 1), k = randv(m * hd, 1), w = randv(n * heads, 1);
        float scale = 0.37f;
        std::vector<float> y(n * m), want(n * m, -INFINITY);
        emu_launch(indexer_scores_f32, {n, 1}, {256}, (cols + heads) * 4, (const float*)q.data(), (const float*)k.data(),
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
    struct Shape { unsigned n, g, k, r; } shapes[] = {{9, 3, 21, 5}, {2, 4, 30, 11}, {33, 2, 40, 17}, {1, 8, 7, 3}};
    for (int fmt = 0; fmt < 3; ++fmt)
        for (auto sh : shapes) {
            unsigned n = sh.n, g = sh.g, k = sh.k, r = sh.r;
            auto x = randv(n * g * k, 1), wf = randv(g * r * k, 0.5f);
            std::vector<uint16_t> w16;
            std::vector<float> wdec;
            make_weight(fmt, wf, w16, wdec);
            unsigned tiles = (r + 15) / 16;
            dim3 grid{g * tiles, (n + 15) / 16}, block{16, 16};
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
            check(name, y, want, 1e-10);
        }
}

// The host side of moe_experts (src/backend/cuda/moe.rs) on the emulator: route, then per expert
// with slots an up and a down launch over its range, then the combine.
static void test_moe() {
    struct Shape { unsigned n, d, h, e, k; } shapes[] = {{6, 19, 13, 5, 3}, {90, 20, 17, 7, 6}, {1, 33, 40, 3, 2}};
    int which = 0;
    for (int fmt = 0; fmt < 3; ++fmt)
        for (auto sh : shapes) {
            unsigned n = sh.n, d = sh.d, h = sh.h, E = sh.e, k = sh.k, slots = n * k;
            auto x = randv(n * d, 3), wt = randv(slots, 1);
            std::vector<int> ids(slots);
            for (unsigned s = 0; s < slots; ++s) ids[s] = (int)(rng() % (E - 1)); // expert E-1 unused
            if (which == 2) ids[slots - 1] = (int)E;                           // bad id: token n-1 → NaN row
            std::vector<std::vector<uint16_t>> w13h(E), w2h(E);
            std::vector<std::vector<float>> w13f(E), w2f(E), w13d(E), w2d(E);
            for (unsigned e = 0; e < E; ++e) {
                w13f[e] = randv(2 * h * d, std::sqrt(3.0f / d));
                w2f[e] = randv(d * h, std::sqrt(3.0f / h));
                make_weight(fmt, w13f[e], w13h[e], w13d[e]);
                make_weight(fmt, w2f[e], w2h[e], w2d[e]);
            }
            std::vector<int> offsets(E + 1, -5), order(slots, -5), cursor(E);
            emu_launch(moe_route, {1}, {256}, 0, (const int*)ids.data(), offsets.data(), order.data(), cursor.data(),
                       slots, E);
            // the routing itself: stable grouping by expert
            std::vector<int> want_order;
            std::vector<int> want_off(E + 1, 0);
            for (unsigned e = 0; e < E; ++e) {
                want_off[e] = (int)want_order.size();
                for (unsigned s = 0; s < slots; ++s)
                    if (ids[s] == (int)e) want_order.push_back((int)s);
            }
            want_off[E] = (int)want_order.size();
            bool route_ok = offsets == want_off && std::equal(want_order.begin(), want_order.end(), order.begin());
            float limit = 0.8f;
            std::vector<float> hid(std::max(slots * h, 1u), 0.0f), ys(std::max(slots * d, 1u), 0.0f), out(n * d);
            for (unsigned e = 0; e < E; ++e) {
                unsigned p0 = offsets[e], cnt = offsets[e + 1] - offsets[e];
                if (cnt == 0) continue;
                dim3 gu{(h + 15) / 16, (cnt + 15) / 16}, gd{(d + 15) / 16, (cnt + 15) / 16}, block{16, 16};
                if (fmt == 0) {
                    emu_launch(moe_up_f32, gu, block, 0, (const float*)x.data(), (const int*)order.data(),
                               (const float*)w13f[e].data(), hid.data(), p0, cnt, d, h, k, limit);
                    emu_launch(moe_down_f32, gd, block, 0, (const float*)hid.data(), (const int*)order.data(),
                               (const float*)w2f[e].data(), ys.data(), p0, cnt, d, h);
                } else {
                    emu_launch(fmt == 1 ? moe_up_bf16 : moe_up_f16, gu, block, 0, (const float*)x.data(),
                               (const int*)order.data(), (const unsigned short*)w13h[e].data(), hid.data(), p0, cnt, d,
                               h, k, limit);
                    emu_launch(fmt == 1 ? moe_down_bf16 : moe_down_f16, gd, block, 0, (const float*)hid.data(),
                               (const int*)order.data(), (const unsigned short*)w2h[e].data(), ys.data(), p0, cnt, d, h);
                }
            }
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
                            g += x[i * d + c] * w13d[e][j * d + c];
                            u += x[i * d + c] * w13d[e][(h + j) * d + c];
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
            std::snprintf(name, sizeof name, "moe_%s n=%u d=%u h=%u %u experts k=%u%s", fmt_name(fmt), n, d, h, E, k,
                          which == 2 ? " bad id" : "");
            if (!route_ok) {
                std::printf("%-44s moe_route grouping differs FAIL\n", name);
                ++failures;
            }
            check_masked(name, out, want, 1e-10);
            ++which;
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
    test_sink_attention();
    test_indexer_scores();
    test_compress_pool();
    test_grouped_linear();
    test_moe();
    std::printf("%s: %d failure(s)\n", failures ? "FAILED" : "all ok", failures);
    return failures != 0;
}
