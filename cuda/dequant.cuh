// Device decoders of the block weight formats (src/formats/mod.rs `WeightFormat`), prepended after
// common.cuh to the files whose kernels take weights (linear.cu, lm_small.cu, lm_attention.cu,
// moe.cu), after the lookup tables that src/backend/cuda/kernels.rs emits from src/formats/tables.rs
// (IQ2XXS_GRID, IQ2XS_GRID, IQ3XXS_GRID, IQ1S_GRID, KSIGNS_IQ2XS, KVALUES_IQ4NL, KVALUES_MXFP4 as
// `__device__ const` arrays, IQ1_DELTA as a float literal): one source of truth for the tables.
// Global memory, not __constant__: the lanes of a warp look up different entries, which the
// constant cache serves one address at a time, while L1 serves a warp's gather in one pass per
// 128-byte line (ggml's CUDA backend keeps its grids in global memory for the same reason).
//
// Every format is row-local and a row is a whole number of blocks (the host checks cols), so a
// flat element index idx of a [rows, cols] matrix is value idx % QK of block idx / QK: the GEMM's
// element offsets (w_row(c) + kk) address block formats unchanged.
//
// Each value is the same f32 as the CPU lane's `crate::formats::decode_row`, i.e. ggml's
// dequantize_row_* (ggml/src/ggml-quants.c, llama.cpp v0.5.0): the same operations in the same
// order, each rounded on its own. NVRTC contracts a * b - c into one fma by default, which would
// round once where ggml rounds twice, so every float operation here is an explicit
// round-to-nearest intrinsic (__fmul_rn, __fadd_rn, __fsub_rn), which the compiler never fuses.
// Blocks are not aligned (34, 17, 129, ... bytes), so multi-byte fields are assembled from bytes.

// Format codes: the compile-time FMT of load_w and the GEMM (0 f32, 1 bf16, 2 f16 in common.cuh),
// equal to the position of the format in `WeightFormat::ALL` (a unit test in
// src/backend/cuda/tests.rs checks the codes and the block geometry below).
#define WF_Q8_0 3
#define WF_Q2_K 4
#define WF_Q3_K 5
#define WF_Q4_K 6
#define WF_Q5_K 7
#define WF_Q6_K 8
#define WF_IQ1_S 9
#define WF_IQ1_M 10
#define WF_IQ2_XXS 11
#define WF_IQ2_XS 12
#define WF_IQ3_XXS 13
#define WF_IQ4_XS 14
#define WF_MXFP4 15
#define WF_FP8_E4M3_B128_E8M0 16
#define WF_FP8_E4M3_B128_F32 17

// X(kernel-name suffix, format code) for every block format: the kernel files instantiate their
// weight kernels with it (`linear_q8_0`, ...; the suffix is the format's name in lower case). The
// host defines it first for each compilation unit (common.cuh): empty in a base unit, one format
// in a block unit; this list is what the emulator, which compiles everything at once, gets.
#ifndef FOR_EACH_BLOCK_FORMAT
#define FOR_EACH_BLOCK_FORMAT(X)                                                                            \
    X(q8_0, WF_Q8_0)                                                                                        \
    X(q2_k, WF_Q2_K)                                                                                        \
    X(q3_k, WF_Q3_K)                                                                                        \
    X(q4_k, WF_Q4_K)                                                                                        \
    X(q5_k, WF_Q5_K)                                                                                        \
    X(q6_k, WF_Q6_K)                                                                                        \
    X(iq1_s, WF_IQ1_S)                                                                                      \
    X(iq1_m, WF_IQ1_M)                                                                                      \
    X(iq2_xxs, WF_IQ2_XXS)                                                                                  \
    X(iq2_xs, WF_IQ2_XS)                                                                                    \
    X(iq3_xxs, WF_IQ3_XXS)                                                                                  \
    X(iq4_xs, WF_IQ4_XS)                                                                                    \
    X(mxfp4, WF_MXFP4)                                                                                      \
    X(fp8_e4m3_b128_e8m0, WF_FP8_E4M3_B128_E8M0)                                                            \
    X(fp8_e4m3_b128_f32, WF_FP8_E4M3_B128_F32)
#endif

// Block geometry (WBlock, declared in common.cuh): values (QK) and bytes (BYTES) per block, and
// the alignment dq_run8's word loads need of a matrix base (ALIGN; 1 where it reads bytes).
#define WBLOCK(FMT, QK_, BYTES_, ALIGN_)                                                                    \
    template <>                                                                                             \
    struct WBlock<FMT> {                                                                                    \
        static constexpr unsigned int QK = QK_, BYTES = BYTES_, ALIGN = ALIGN_;                             \
        static_assert(BYTES_ % ALIGN_ == 0u, "every block of an aligned base is aligned");                  \
    };
WBLOCK(WF_Q8_0, 32, 34, 2)
WBLOCK(WF_Q2_K, 256, 84, 4)
WBLOCK(WF_Q3_K, 256, 110, 1)
WBLOCK(WF_Q4_K, 256, 144, 1)
WBLOCK(WF_Q5_K, 256, 176, 1)
WBLOCK(WF_Q6_K, 256, 210, 1)
WBLOCK(WF_IQ1_S, 256, 50, 1)
WBLOCK(WF_IQ1_M, 256, 56, 1)
WBLOCK(WF_IQ2_XXS, 256, 66, 1)
WBLOCK(WF_IQ2_XS, 256, 74, 1)
WBLOCK(WF_IQ3_XXS, 256, 98, 1)
WBLOCK(WF_IQ4_XS, 256, 136, 1)
WBLOCK(WF_MXFP4, 32, 17, 1)
WBLOCK(WF_FP8_E4M3_B128_E8M0, 128, 129, 1)
WBLOCK(WF_FP8_E4M3_B128_F32, 128, 132, 4)

typedef unsigned char u8;

__device__ __forceinline__ unsigned int dq_u16(const u8* p) { return p[0] | ((unsigned int)p[1] << 8); }
__device__ __forceinline__ unsigned int dq_u32(const u8* p) {
    return p[0] | ((unsigned int)p[1] << 8) | ((unsigned int)p[2] << 16) | ((unsigned int)p[3] << 24);
}
// An f16 field (ggml_half) as f32, exactly (GGML_FP16_TO_FP32).
__device__ __forceinline__ float dq_f16(const u8* p) { return f16_to_f32(dq_u16(p)); }
// Byte j (0 = least significant) of a grid entry: ggml reads the entries as byte arrays on a
// little-endian host.
__device__ __forceinline__ unsigned int dq_byte(unsigned long long v, unsigned int j) {
    return (unsigned int)(v >> (8u * j)) & 0xffu;
}
// ksigns_iq2xs bit j set: value j of the group is negated (kmask_iq2xs[j] = 1 << j).
__device__ __forceinline__ float dq_sign(unsigned int signs, unsigned int j) {
    return (signs >> j) & 1u ? -1.0f : 1.0f;
}

// ggml_e8m0_to_fp32_half (MXFP4: kvalues_mxfp4 are twice the e2m1 values, so the scale is halved):
// 2^(e-128), subnormal for e < 2.
__device__ __forceinline__ float dq_e8m0_half(unsigned int e) {
    return __uint_as_float(e < 2u ? 0x00200000u << e : (e - 1u) << 23);
}
// E8M0 as 2^(e-127) (ggml_e8m0_to_fp32; e = 0 is the subnormal 2^-127), e = 255 NaN (the MX
// encoding; 2^128 does not fit an f32), as the CPU lane's e8m0_to_f32.
__device__ __forceinline__ float dq_e8m0(unsigned int e) {
    if (e == 0u) return __uint_as_float(0x00400000u);
    return e == 255u ? QUIET_NAN : __uint_as_float(e << 23);
}
// FP8 e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 subnormal (m * 2^-9),
// no infinity, S.1111.111 NaN. Exact in f32.
__device__ __forceinline__ float dq_e4m3(unsigned int c) {
    const unsigned int sign = (c & 0x80u) << 24, e = (c >> 3) & 0xfu, m = c & 7u;
    float mag;
    if (e == 15u && m == 7u) mag = QUIET_NAN;
    else if (e == 0u) mag = __fmul_rn((float)m, __uint_as_float((127u - 9u) << 23));
    else mag = __uint_as_float(((e + 120u) << 23) | (m << 20));
    return __uint_as_float(__float_as_uint(mag) | sign);
}

// ---- one value j (< QK) of block b, per format (ggml's field names and operation order) ----

// Q8_0: d f16, qs[32] i8. y = qs[j] * d.
__device__ __forceinline__ float dq_q8_0(const u8* b, unsigned int j) {
    return __fmul_rn((float)(signed char)b[2 + j], dq_f16(b));
}

// Q2_K: scales[16], qs[64], d f16, dmin f16. Value j: 16-group j / 16 (its scale byte: low nibble
// scale, high nibble min), 2-bit code at bit 2 ((j % 128) / 32) of qs[32 (j / 128) + j % 32].
// y = (d * sc) * q - dmin * m.
__device__ __forceinline__ float dq_q2_k(const u8* b, unsigned int j) {
    const unsigned int sc = b[j / 16u];
    const unsigned int q = (b[16u + 32u * (j / 128u) + j % 32u] >> (2u * ((j % 128u) / 32u))) & 3u;
    const float dl = __fmul_rn(dq_f16(b + 80), (float)(sc & 15u));
    const float ml = __fmul_rn(dq_f16(b + 82), (float)(sc >> 4));
    return __fsub_rn(__fmul_rn(dl, (float)q), ml);
}

// Q3_K: hmask[32], qs[64], scales[12] (16 6-bit scales), d f16. Value j: scale j / 16, 2 low bits
// as Q2_K, high bit (j / 32) of hmask[j % 32] (clear: subtract 4). y = (d * (s - 32)) * q.
__device__ __forceinline__ float dq_q3_k(const u8* b, unsigned int j) {
    const u8* sc = b + 96;
    const unsigned int is = j / 16u;
    const unsigned int lo = is < 8u ? sc[is] & 15u : sc[is - 8u] >> 4;
    const unsigned int hi = (sc[8u + is % 4u] >> (2u * (is / 4u))) & 3u;
    const int s = (int)(lo | (hi << 4)) - 32;
    const int q2 = (b[32u + 32u * (j / 128u) + j % 32u] >> (2u * ((j % 128u) / 32u))) & 3u;
    const int q = q2 - ((b[j % 32u] >> (j / 32u)) & 1u ? 0 : 4);
    return __fmul_rn(__fmul_rn(dq_f16(b + 108), (float)s), (float)q);
}

// get_scale_min_k4 of Q4_K / Q5_K: 6-bit scale and min of 32-group g from scales[12].
__device__ __forceinline__ void dq_scale_min_k4(const u8* s, unsigned int g, unsigned int* sc, unsigned int* m) {
    if (g < 4u) {
        *sc = s[g] & 63u;
        *m = s[g + 4u] & 63u;
    } else {
        *sc = (s[g + 4u] & 15u) | ((s[g - 4u] >> 6) << 4);
        *m = (s[g + 4u] >> 4) | ((s[g] >> 6) << 4);
    }
}

// Q4_K: d f16, dmin f16, scales[12], qs[128]. Value j: 32-group j / 32; code = the low (even
// group) or high (odd group) nibble of qs[32 (j / 64) + j % 32]. y = (d * sc) * q - dmin * m.
__device__ __forceinline__ float dq_q4_k(const u8* b, unsigned int j) {
    unsigned int sc, m;
    dq_scale_min_k4(b + 4, j / 32u, &sc, &m);
    const unsigned int q = (b[16u + 32u * (j / 64u) + j % 32u] >> (4u * ((j / 32u) & 1u))) & 15u;
    const float d1 = __fmul_rn(dq_f16(b), (float)sc), m1 = __fmul_rn(dq_f16(b + 2), (float)m);
    return __fsub_rn(__fmul_rn(d1, (float)q), m1);
}

// Q5_K: d, dmin, scales[12], qh[32], qs[128]. As Q4_K, plus 16 when bit j / 32 of qh[j % 32] is
// set.
__device__ __forceinline__ float dq_q5_k(const u8* b, unsigned int j) {
    unsigned int sc, m;
    dq_scale_min_k4(b + 4, j / 32u, &sc, &m);
    const unsigned int lo = (b[48u + 32u * (j / 64u) + j % 32u] >> (4u * ((j / 32u) & 1u))) & 15u;
    const unsigned int q = lo + ((b[16u + j % 32u] >> (j / 32u)) & 1u ? 16u : 0u);
    const float d1 = __fmul_rn(dq_f16(b), (float)sc), m1 = __fmul_rn(dq_f16(b + 2), (float)m);
    return __fsub_rn(__fmul_rn(d1, (float)q), m1);
}

// Q6_K: ql[128], qh[64], scales[16] i8, d f16. Value j: half h = j / 128, quarter t = (j % 128)
// / 32, l = j % 32: 4 low bits = nibble t / 2 of ql[64 h + l + 32 (t % 2)], 2 high bits at bit 2t
// of qh[32 h + l], scale scales[8 h + l / 16 + 2t]. y = (d * sc) * (q - 32).
__device__ __forceinline__ float dq_q6_k(const u8* b, unsigned int j) {
    const unsigned int h = j / 128u, t = (j % 128u) / 32u, l = j % 32u;
    const unsigned int lo = (b[64u * h + l + 32u * (t & 1u)] >> (4u * (t >> 1))) & 15u;
    const unsigned int hi = (b[128u + 32u * h + l] >> (2u * t)) & 3u;
    const int q = (int)(lo | (hi << 4)) - 32;
    const int sc = (signed char)b[192u + 8u * h + l / 16u + 2u * t];
    return __fmul_rn(__fmul_rn(dq_f16(b + 208), (float)sc), (float)q);
}

// IQ1_S: d f16, qs[32], qh u16[8]. 32-group g = j / 32: qh[g] holds the 3 high index bits of
// each 8-run (bits 3l..3l+2), the scale (bits 12..14) and the delta sign (bit 15).
// y = (d * (2 s + 1)) * (grid + delta), grid = int8 byte j % 8 of iq1s_grid[index].
__device__ __forceinline__ float dq_iq1_s(const u8* b, unsigned int j) {
    const unsigned int g = j / 32u, l = (j % 32u) / 8u;
    const unsigned int qh = dq_u16(b + 34u + 2u * g);
    const float dl = __fmul_rn(dq_f16(b), (float)(2u * ((qh >> 12) & 7u) + 1u));
    const float delta = qh & 0x8000u ? -IQ1_DELTA : IQ1_DELTA;
    const unsigned int idx = b[2u + 4u * g + l] | (((qh >> (3u * l)) & 7u) << 8);
    const float v = (float)(signed char)dq_byte(IQ1S_GRID[idx], j % 8u);
    return __fmul_rn(dl, __fadd_rn(v, delta));
}

// IQ1_M: qs[32], qh[16], scales[8] (u16[4]; their top nibbles are the f16 super-scale). 32-group
// g = j / 32, 8-run l = (j % 32) / 8: index low bits qs[4g + l], high bits and delta sign in the
// low (l even) or high (l odd) nibble of qh[2g + l / 2]; 3-bit scale at bit 6 (g % 2) + 3 (l / 2)
// of u16 scales[g / 2]. y = (d * (2 s + 1)) * (grid + delta).
__device__ __forceinline__ float dq_iq1_m(const u8* b, unsigned int j) {
    const u8* sc = b + 48;
    const unsigned int d16 = (dq_u16(sc) >> 12) | ((dq_u16(sc + 2) >> 8) & 0x00f0u) |
                             ((dq_u16(sc + 4) >> 4) & 0x0f00u) | (dq_u16(sc + 6) & 0xf000u);
    const unsigned int g = j / 32u, l = (j % 32u) / 8u;
    const unsigned int s = (dq_u16(sc + 2u * (g / 2u)) >> (6u * (g % 2u) + 3u * (l / 2u))) & 7u;
    const float dl = __fmul_rn(f16_to_f32(d16), (float)(2u * s + 1u));
    const unsigned int qh = b[32u + 2u * g + l / 2u];
    const unsigned int idx = b[4u * g + l] | ((qh << (l % 2u ? 4u : 8u)) & 0x700u);
    const float delta = qh & (l % 2u ? 0x80u : 0x08u) ? -IQ1_DELTA : IQ1_DELTA;
    const float v = (float)(signed char)dq_byte(IQ1S_GRID[idx], j % 8u);
    return __fmul_rn(dl, __fadd_rn(v, delta));
}

// IQ2_XXS: d f16, then per 32-group g two u32: the four 8-run grid indices (bytes) and
// signs/scale (7 sign bits per run, scale in bits 28..31). y = ((d * (0.5 + s)) * 0.25) * grid * ±1.
__device__ __forceinline__ float dq_iq2_xxs(const u8* b, unsigned int j) {
    const unsigned int g = j / 32u, l = (j % 32u) / 8u;
    const u8* q = b + 2u + 8u * g;
    const unsigned int aux1 = dq_u32(q + 4);
    const float db = __fmul_rn(__fmul_rn(dq_f16(b), __fadd_rn(0.5f, (float)(aux1 >> 28))), 0.25f);
    const float grid = (float)dq_byte(IQ2XXS_GRID[q[l]], j % 8u);
    const unsigned int signs = KSIGNS_IQ2XS[(aux1 >> (7u * l)) & 127u];
    return __fmul_rn(__fmul_rn(db, grid), dq_sign(signs, j % 8u));
}

// IQ2_XS: d f16, qs u16[32] (9-bit grid index, 7-bit sign pattern index), scales[8] (a nibble per
// 16 values). y = ((d * (0.5 + s)) * 0.25) * grid * ±1.
__device__ __forceinline__ float dq_iq2_xs(const u8* b, unsigned int j) {
    const unsigned int g = j / 32u, l = (j % 32u) / 8u;
    const unsigned int q = dq_u16(b + 2u + 2u * (4u * g + l));
    const unsigned int s = (b[66u + g] >> (4u * (l / 2u))) & 15u;
    const float db = __fmul_rn(__fmul_rn(dq_f16(b), __fadd_rn(0.5f, (float)s)), 0.25f);
    const float grid = (float)dq_byte(IQ2XS_GRID[q & 511u], j % 8u);
    return __fmul_rn(__fmul_rn(db, grid), dq_sign(KSIGNS_IQ2XS[q >> 9], j % 8u));
}

// IQ3_XXS: d f16, qs[64] grid indices (a 4-value entry each), then a u32 per 32-group (7 sign
// bits per 8-run, scale in bits 28..31). y = ((d * (0.5 + s)) * 0.5) * grid * ±1.
__device__ __forceinline__ float dq_iq3_xxs(const u8* b, unsigned int j) {
    const unsigned int g = j / 32u, l = (j % 32u) / 8u, r = j % 8u;
    const unsigned int aux = dq_u32(b + 66u + 4u * g);
    const float db = __fmul_rn(__fmul_rn(dq_f16(b), __fadd_rn(0.5f, (float)(aux >> 28))), 0.5f);
    const unsigned int idx = b[2u + 8u * g + 2u * l + r / 4u];
    const float grid = (float)dq_byte(IQ3XXS_GRID[idx], r % 4u);
    const unsigned int signs = KSIGNS_IQ2XS[(aux >> (7u * l)) & 127u];
    return __fmul_rn(__fmul_rn(db, grid), dq_sign(signs, r));
}

// IQ4_XS: d f16, scales_h u16, scales_l[4], qs[128]. 32-group g: 6-bit scale = nibble g % 2 of
// scales_l[g / 2] | bits 2g..2g+1 of scales_h << 4; code = low (j % 32 < 16) or high nibble of
// qs[16 g + j % 16]. y = (d * (s - 32)) * kvalues_iq4nl[code].
__device__ __forceinline__ float dq_iq4_xs(const u8* b, unsigned int j) {
    const unsigned int g = j / 32u;
    const unsigned int ls = ((b[4u + g / 2u] >> (4u * (g % 2u))) & 15u) | (((dq_u16(b + 2) >> (2u * g)) & 3u) << 4);
    const float dl = __fmul_rn(dq_f16(b), (float)((int)ls - 32));
    const unsigned int code = (b[8u + 16u * g + j % 16u] >> (4u * ((j % 32u) / 16u))) & 15u;
    return __fmul_rn(dl, (float)KVALUES_IQ4NL[code]);
}

// MXFP4: E8M0 e, qs[16]: values 0..15 in the low nibbles, 16..31 in the high ones.
// y = kvalues_mxfp4[code] * 2^(e-128).
__device__ __forceinline__ float dq_mxfp4(const u8* b, unsigned int j) {
    const unsigned int code = (b[1u + j % 16u] >> (4u * (j / 16u))) & 15u;
    return __fmul_rn((float)KVALUES_MXFP4[code], dq_e8m0_half(b[0]));
}

// FP8 e4m3 with its 128-value block's scale in front: E8M0 (1 byte) or f32 LE (4 bytes).
// y = e4m3(w[j]) * scale.
__device__ __forceinline__ float dq_fp8_e8m0(const u8* b, unsigned int j) {
    return __fmul_rn(dq_e4m3(b[1u + j]), dq_e8m0(b[0]));
}
__device__ __forceinline__ float dq_fp8_f32(const u8* b, unsigned int j) {
    return __fmul_rn(dq_e4m3(b[4u + j]), __uint_as_float(dq_u32(b)));
}

// out[0 .. n) = values idx .. idx + n of a block-format matrix starting at w (idx a flat element
// index; the run lies in one block: the tile decodes pairs (idx even, QK even), the small-row path
// runs of 8 at multiples of 8 (every QK, 32, 128 or 256, is a multiple of 8), others single values).
// FMT is a compile-time constant, so each instantiation is one format's code, no branching on it.
// Value j (< QK) of block b of format FMT: FMT is a compile-time constant, so each instantiation is
// one format's decoder, no branching on it.
template <int FMT>
__device__ __forceinline__ float dq_value(const u8* b, unsigned int j) {
    if constexpr (FMT == WF_Q8_0) return dq_q8_0(b, j);
    else if constexpr (FMT == WF_Q2_K) return dq_q2_k(b, j);
    else if constexpr (FMT == WF_Q3_K) return dq_q3_k(b, j);
    else if constexpr (FMT == WF_Q4_K) return dq_q4_k(b, j);
    else if constexpr (FMT == WF_Q5_K) return dq_q5_k(b, j);
    else if constexpr (FMT == WF_Q6_K) return dq_q6_k(b, j);
    else if constexpr (FMT == WF_IQ1_S) return dq_iq1_s(b, j);
    else if constexpr (FMT == WF_IQ1_M) return dq_iq1_m(b, j);
    else if constexpr (FMT == WF_IQ2_XXS) return dq_iq2_xxs(b, j);
    else if constexpr (FMT == WF_IQ2_XS) return dq_iq2_xs(b, j);
    else if constexpr (FMT == WF_IQ3_XXS) return dq_iq3_xxs(b, j);
    else if constexpr (FMT == WF_IQ4_XS) return dq_iq4_xs(b, j);
    else if constexpr (FMT == WF_MXFP4) return dq_mxfp4(b, j);
    else if constexpr (FMT == WF_FP8_E4M3_B128_E8M0) return dq_fp8_e8m0(b, j);
    else if constexpr (FMT == WF_FP8_E4M3_B128_F32) return dq_fp8_f32(b, j);
    else static_assert(FMT < 0, "dq_value: not a block format");
}

// out[0 .. n) = values idx .. idx + n of a block-format matrix starting at w (idx a flat element
// index; the run lies in one block: the tile decodes pairs (idx even, QK even), others single
// values).
template <int FMT>
__device__ __forceinline__ void dq_run(const void* w, u64 idx, float* out, unsigned int n) {
    constexpr unsigned int QK = WBlock<FMT>::QK;
    const u8* b = (const u8*)w + idx / QK * WBlock<FMT>::BYTES;
    const unsigned int j0 = (unsigned int)(idx % QK);
    for (unsigned int i = 0; i < n; ++i) out[i] = dq_value<FMT>(b, j0 + i);
}

// out[0 .. 8) = values idx .. idx + 7, idx a multiple of 8 (the small-row path's runs; every QK is a
// multiple of 8, so a run lies in one block and in one 8-run of every format's sub-groups). The
// values are dq_run's, bit for bit. With j = (r << 3) | i the compiler sees that j / 8, j / 16,
// j / 32, ... are the same for the eight values (the low three bits never reach them) and decodes a
// run's shared fields (scales, grid entry, sign pattern, super-block scale) once instead of eight
// times; dq_run's j0 + i hides that. Q8_0, Q2_K and FP8 with an f32 scale, whose codes are one byte
// per value at an offset their block alignment keeps aligned, load the run's codes in words.
// (Building the small integers into floats by bits instead of integer-to-float conversions, and
// IQ2_XXS's signs into the bits, changed nothing measurable: the expert GEMVs took 37.1 / 38.3 /
// 35.8 us against 35.9 / 37.4 / 35.0, Nsight on an H200, 2026-12-02.)
template <int FMT>
__device__ __forceinline__ void dq_run8(const void* w, u64 idx, float* out) {
    constexpr unsigned int QK = WBlock<FMT>::QK;
    const u8* b = (const u8*)w + idx / QK * WBlock<FMT>::BYTES;
    const unsigned int r = (unsigned int)(idx % QK) / 8u;
    if constexpr (FMT == WF_Q8_0) {
        // 34-byte blocks start on 2 bytes: d and the codes (at 2 + 8r) are 2-byte aligned
        const unsigned short* h = reinterpret_cast<const unsigned short*>(b);
        const float d = f16_to_f32(h[0]);
        const unsigned int c[4] = {h[1u + 4u * r], h[2u + 4u * r], h[3u + 4u * r], h[4u + 4u * r]};
#pragma unroll
        for (unsigned int i = 0; i < 8u; ++i)
            out[i] = __fmul_rn((float)(signed char)((c[i / 2u] >> (8u * (i % 2u))) & 0xffu), d);
    } else if constexpr (FMT == WF_Q2_K) {
        // 84-byte blocks start on 4 bytes: the codes (at 16 + 32 (j / 128) + j % 32) and d, dmin
        // (at 80) are 4-byte aligned; the run shares one scale byte and one code shift
        const unsigned int j0 = r << 3;
        const unsigned int* cw = reinterpret_cast<const unsigned int*>(b + 16u + 32u * (j0 / 128u) + j0 % 32u);
        const unsigned int c[2] = {cw[0], cw[1]};
        const unsigned int dd = *reinterpret_cast<const unsigned int*>(b + 80);
        const unsigned int sc = b[j0 / 16u], shift = 2u * ((j0 % 128u) / 32u);
        const float dl = __fmul_rn(f16_to_f32(dd & 0xffffu), (float)(sc & 15u));
        const float ml = __fmul_rn(f16_to_f32(dd >> 16), (float)(sc >> 4));
#pragma unroll
        for (unsigned int i = 0; i < 8u; ++i) {
            const unsigned int q = (c[i / 4u] >> (8u * (i % 4u) + shift)) & 3u;
            out[i] = __fsub_rn(__fmul_rn(dl, (float)q), ml);
        }
    } else if constexpr (FMT == WF_FP8_E4M3_B128_F32) {
        // 132-byte blocks start on 4 bytes: the f32 scale and the codes (at 4 + 8r) are aligned
        const unsigned int* wd = reinterpret_cast<const unsigned int*>(b);
        const float s = __uint_as_float(wd[0]);
        const unsigned int c[2] = {wd[1u + 2u * r], wd[2u + 2u * r]};
#pragma unroll
        for (unsigned int i = 0; i < 8u; ++i) out[i] = __fmul_rn(dq_e4m3((c[i / 4u] >> (8u * (i % 4u))) & 0xffu), s);
    } else {
#pragma unroll
        for (unsigned int i = 0; i < 8u; ++i) out[i] = dq_value<FMT>(b, (r << 3) | i);
    }
}

// ---- int8 activations: one token's GEMVs in fast precision (moe.cu, linear.cu: *_q8x_*) ----
// q8x_dot32<FMT>(row, g, xq) = Σ_{i<32} w[32 g + i] · q_i: W row `row` (its first byte; a row is
// whole blocks, so it has the matrix base's alignment), its 32-value group g (QK is a multiple of
// 32, so a group lies in one block), and the group's int8 activations q_i (byte i % 4 of word
// xq[i / 4], signed). The caller scales the result by the group's activation scale. The formats
// of the published Q2-class mix (IQ2_XXS, Q2_K, Q8_0) and MXFP4 (the official checkpoint's
// experts, llama.cpp's MXFP4_MOE) take integer dot products of their codes with q (__dp4a, four
// products a lane-instruction) and apply their block scales in f32 once a group or 16-group
// (ggml's CUDA vec_dot_*_q8_1 do the same); the values are ggml's dequantized ones up to the
// rounding of each scale × code product, which the sum no longer takes.

// Bits 0..3 of s as byte masks: byte j is 0xff where bit j is set (bit j lands on bit 8j of the
// product; no two products of the four bits overlap).
__device__ __forceinline__ unsigned int q8x_byte_mask4(unsigned int s) {
    return ((s & 15u) * 0x00204081u & 0x01010101u) * 0xffu;
}

// KVALUES_MXFP4 (the e2m1 values doubled: 0, 1, 2, 3, 4, 6, 8, 12, then their negatives) as four
// words of int8, entry 4i + j in byte j of word i (the emulator checks them against the table).
#define Q8X_MXFP4_T0 0x03020100u
#define Q8X_MXFP4_T1 0x0C080604u
#define Q8X_MXFP4_T2 0xFDFEFF00u
#define Q8X_MXFP4_T3 0xF4F8FAFCu

// Two words of int8 (no vector-type header under NVRTC).
struct q8x_w2 {
    int x, y;
};

// The eight 4-bit codes of q4 (nibble n = code of byte n / 2, low nibble first) looked up in
// KVALUES_MXFP4 as two words of int8: .x the low nibbles' values (byte j: byte j of q4's low
// nibble), .y the high nibbles'. ggml's get_int_from_table_16: byte permutes pick each code's
// value among the table's low eight and high eight entries, its bit 3 chooses between the two,
// then two more put the low and the high nibbles' values apart. The first two permutes take the
// raw codes as selectors: __byte_perm reads 3 bits of each selector nibble (CUDA's documentation;
// ggml's IQ4_NL and MXFP4 kernels rely on it), where an inline `prmt` would take bit 3 as its
// sign-replicate flag and get codes 10..15 wrong.
__device__ __forceinline__ q8x_w2 q8x_mxfp4_values(unsigned int q4) {
    const unsigned int pick = 0x32103210u | ((q4 & 0x88888888u) >> 1);
    unsigned int t[2];
#pragma unroll
    for (unsigned int i = 0; i < 2u; ++i) {
        const unsigned int sh = 16u * i;
        const unsigned int lo = __byte_perm(Q8X_MXFP4_T0, Q8X_MXFP4_T1, q4 >> sh);
        const unsigned int hi = __byte_perm(Q8X_MXFP4_T2, Q8X_MXFP4_T3, q4 >> sh);
        t[i] = __byte_perm(lo, hi, pick >> sh);
    }
    return {(int)__byte_perm(t[0], t[1], 0x6420u), (int)__byte_perm(t[0], t[1], 0x7531u)};
}

template <int FMT>
__device__ __forceinline__ float q8x_dot32(const u8* row, unsigned int g, const int* xq) {
    if constexpr (FMT == WF_IQ2_XXS) {
        // 66-byte blocks start on 2 bytes: d, then per group four grid indices (bytes) and the
        // u32 of signs (7 bits a run of 8) and scale (bits 28..31)
        const unsigned short* h = reinterpret_cast<const unsigned short*>(row + (g >> 3) * 66u);
        const unsigned int gg = g & 7u;
        const unsigned int idx = h[1u + 4u * gg] | ((unsigned int)h[2u + 4u * gg] << 16);
        const unsigned int aux = h[3u + 4u * gg] | ((unsigned int)h[4u + 4u * gg] << 16);
        // Σ g·s·q = Σ g·q − 2 Σ_{s<0} g·q: grid bytes are 8, 25 or 43, positive as signed bytes
        int all = 0, neg = 0;
#pragma unroll
        for (unsigned int l = 0; l < 4u; ++l) {
            const unsigned long long grid = IQ2XXS_GRID[(idx >> (8u * l)) & 0xffu];
            const unsigned int signs = KSIGNS_IQ2XS[(aux >> (7u * l)) & 127u];
            const int lo = (int)(unsigned int)grid, hi = (int)(unsigned int)(grid >> 32);
            all = __dp4a(lo, xq[2u * l], all);
            all = __dp4a(hi, xq[2u * l + 1u], all);
            neg = __dp4a(lo & (int)q8x_byte_mask4(signs), xq[2u * l], neg);
            neg = __dp4a(hi & (int)q8x_byte_mask4(signs >> 4), xq[2u * l + 1u], neg);
        }
        const float db = __fmul_rn(__fmul_rn(f16_to_f32(h[0]), __fadd_rn(0.5f, (float)(aux >> 28))), 0.25f);
        return db * (float)(all - 2 * neg);
    } else if constexpr (FMT == WF_Q2_K) {
        // 84-byte blocks start on 4 bytes: scales[16], qs[64] (group G's codes: qs[32 (G / 4) ..]
        // at bit 2 (G % 4)), d and dmin. A 16-group's values are (d·sc)·code − dmin·m.
        const u8* b = row + (g >> 3) * 84u;
        const unsigned int G = g & 7u, shift = 2u * (G & 3u);
        const unsigned int* qw = reinterpret_cast<const unsigned int*>(b + 16u + 32u * (G >> 2));
        const unsigned int dd = *reinterpret_cast<const unsigned int*>(b + 80);
        const unsigned int sc = *reinterpret_cast<const unsigned short*>(b + 2u * G);
        const float d = f16_to_f32(dd & 0xffffu), dmin = f16_to_f32(dd >> 16);
        float sum = 0.0f;
#pragma unroll
        for (unsigned int s = 0; s < 2u; ++s) {
            int dot = 0, qsum = 0;
#pragma unroll
            for (unsigned int j = 0; j < 4u; ++j) {
                dot = __dp4a((int)((qw[4u * s + j] >> shift) & 0x03030303u), xq[4u * s + j], dot);
                qsum = __dp4a(0x01010101, xq[4u * s + j], qsum);
            }
            const unsigned int scb = (sc >> (8u * s)) & 0xffu;
            sum = fmaf(__fmul_rn(d, (float)(scb & 15u)), (float)dot, sum);
            sum = fmaf(-__fmul_rn(dmin, (float)(scb >> 4)), (float)qsum, sum);
        }
        return sum;
    } else if constexpr (FMT == WF_MXFP4) {
        // 17-byte blocks start on any byte: E8M0 e, then qs[16], byte j holding value j (low
        // nibble) and value j + 16 (high nibble); each word of qs gives values 4l.. and 16 + 4l..
        const u8* b = row + g * 17u;
        int dot = 0;
#pragma unroll
        for (unsigned int l = 0; l < 4u; ++l) {
            const u8* q = b + 1u + 4u * l;
            const unsigned int q4 = q[0] | ((unsigned int)q[1] << 8) | ((unsigned int)q[2] << 16) | ((unsigned int)q[3] << 24);
            const q8x_w2 v = q8x_mxfp4_values(q4);
            dot = __dp4a(v.x, xq[l], dot);
            dot = __dp4a(v.y, xq[4u + l], dot);
        }
        return dq_e8m0_half(b[0]) * (float)dot;
    } else if constexpr (FMT == WF_Q8_0) {
        // 34-byte blocks start on 2 bytes: d, then the 32 signed codes
        const unsigned short* h = reinterpret_cast<const unsigned short*>(row + g * 34u);
        int dot = 0;
#pragma unroll
        for (unsigned int j = 0; j < 8u; ++j)
            dot = __dp4a((int)(h[1u + 2u * j] | ((unsigned int)h[2u + 2u * j] << 16)), xq[j], dot);
        return f16_to_f32(h[0]) * (float)dot;
    } else {
        static_assert(FMT < 0, "q8x_dot32: no int8 path for this format (Q8X_IF_<format> names four)");
        return 0.0f;
    }
}

// ---- q8x_cols: one token's GEMV on int8 activations (moe.cu's experts, linear.cu's wide linears) ----
// The A row is quantized to int8 once a block (ggml's q8_1 rule: per 32 values the scale
// amax / 127 and round(x / scale)) into shared memory, and each lane takes one 32-value group of a
// W row at a time: integer dot products of its codes with the activations (q8x_dot32), the block
// scales applied once a group. Block Q8X_THREADS (Q8X_WARPS warps), each warp Q8X_COLS adjacent
// columns, the lanes striding over the groups: a block takes Q8X_WARPS · Q8X_COLS columns. Dynamic
// shared memory k + k / 8 bytes (the int8 row, then a float scale a group). k % 32 == 0 (every
// block format's QK is a multiple of 32).
//
// Q8X_IF_<format>(M) is M for the formats q8x_dot32 takes and nothing for the others: the one list
// the q8x kernels of moe.cu and linear.cu are instantiated from (the host's q8x_format).
#define Q8X_IF_q8_0(M) M
#define Q8X_IF_q2_k(M) M
#define Q8X_IF_iq2_xxs(M) M
#define Q8X_IF_q3_k(M)
#define Q8X_IF_q4_k(M)
#define Q8X_IF_q5_k(M)
#define Q8X_IF_q6_k(M)
#define Q8X_IF_iq1_s(M)
#define Q8X_IF_iq1_m(M)
#define Q8X_IF_iq2_xs(M)
#define Q8X_IF_iq3_xxs(M)
#define Q8X_IF_iq4_xs(M)
#define Q8X_IF_mxfp4(M) M
#define Q8X_IF_fp8_e4m3_b128_e8m0(M)
#define Q8X_IF_fp8_e4m3_b128_f32(M)
#define Q8X_WARPS 8
// even: a lane stores its columns in pairs (store2)
#define Q8X_COLS 4
#define Q8X_THREADS (32 * Q8X_WARPS)

// Four int8 words (one 16-byte shared-memory load).
struct alignas(16) q8x_i4 {
    int x, y, z, w;
};

// a [k] -> xq [k / 4] words (four int8 values each, value i in byte i % 4 of word i / 4) and xs
// [k / 32] scales, a thread a group. A group with an inf or NaN gets a NaN scale, so the sums it
// reaches are NaN as the f32 path's (fmaxf alone would drop a NaN).
__device__ __forceinline__ void q8x_quantize(const float* a, unsigned int k, int* xq, float* xs) {
    const bool vec = ((u64)a & 15u) == 0u;
    for (unsigned int g = threadIdx.x; g < k / 32u; g += blockDim.x) {
        float v[32];
        if (vec) {
            const fa_f4* a4 = reinterpret_cast<const fa_f4*>(a + 32u * g);
#pragma unroll
            for (unsigned int j = 0; j < 8u; ++j) {
                const fa_f4 f = a4[j];
                v[4u * j] = f.x, v[4u * j + 1u] = f.y, v[4u * j + 2u] = f.z, v[4u * j + 3u] = f.w;
            }
        } else {
#pragma unroll
            for (unsigned int i = 0; i < 32u; ++i) v[i] = a[32u * g + i];
        }
        float amax = 0.0f;
        bool finite = true;
#pragma unroll
        for (unsigned int i = 0; i < 32u; ++i) {
            amax = fmaxf(amax, fabsf(v[i]));
            finite = finite && fabsf(v[i]) <= 3.402823466e38f;
        }
        const float dx = amax / 127.0f, inv = dx != 0.0f ? 1.0f / dx : 0.0f;
#pragma unroll
        for (unsigned int j = 0; j < 8u; ++j) {
            unsigned int word = 0;
#pragma unroll
            for (unsigned int i = 0; i < 4u; ++i) {
                const int q = finite ? (int)roundf(v[4u * j + i] * inv) : 0;
                word |= ((unsigned int)q & 0xffu) << (8u * i);
            }
            xq[8u * g + j] = (int)word;
        }
        xs[g] = finite ? dx : QUIET_NAN;
    }
}

// The tile's rows m < rows (one each, A row quantized into shared memory) times the warp's
// columns of the weight, stored through the op's store2 (as gemv_cols stores).
template <int FMT, class Op>
__device__ __forceinline__ void q8x_cols(const Op& op, const void* w, unsigned int rows, unsigned int cols,
                                         unsigned int k) {
    extern __shared__ float smem[];
    int* xq = reinterpret_cast<int*>(smem);
    const float* xs = smem + k / 4u;
    const unsigned int lane = threadIdx.x % 32u, warp = threadIdx.x / 32u;
    const unsigned int c0 = (blockIdx.x * Q8X_WARPS + warp) * Q8X_COLS;
    const u8* wrow[Q8X_COLS];
#pragma unroll
    for (unsigned int j = 0; j < Q8X_COLS; ++j) {
        // a column past the last reads the last's row (in bounds); nothing stores its sum
        const unsigned int c = c0 + j < cols ? c0 + j : cols - 1u;
        wrow[j] = static_cast<const u8*>(w) + op.w_row(c) / WBlock<FMT>::QK * WBlock<FMT>::BYTES;
    }
    for (unsigned int m = 0; m < rows; ++m) {
        if (m) __syncthreads(); // every warp is done with the previous row
        q8x_quantize(op.a_row(m), k, xq, smem + k / 4u);
        __syncthreads();
        float acc[Q8X_COLS];
#pragma unroll
        for (unsigned int j = 0; j < Q8X_COLS; ++j) acc[j] = 0.0f;
        for (unsigned int g = lane; g < k / 32u; g += 32u) {
            const q8x_i4* q4 = reinterpret_cast<const q8x_i4*>(xq + 8u * g);
            const q8x_i4 qa = q4[0], qb = q4[1];
            const int x8[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
            const float dx = xs[g];
#pragma unroll
            for (unsigned int j = 0; j < Q8X_COLS; ++j) acc[j] = fmaf(dx, q8x_dot32<FMT>(wrow[j], g, x8), acc[j]);
        }
#pragma unroll
        for (unsigned int j = 0; j < Q8X_COLS; ++j)
            for (int o = 16; o > 0; o >>= 1) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], o);
        if (lane == 0u)
#pragma unroll
            for (unsigned int j = 0; j < Q8X_COLS; j += 2u)
                if (c0 + j < cols) op.store2(m, c0 + j, acc[j], acc[j + 1u]);
    }
}
