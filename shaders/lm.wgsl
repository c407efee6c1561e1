// Language-model ops (see the LM section of src/backend/mod.rs for shapes and semantics; each
// entry point mirrors its reference in src/backend/cpu/lm.rs).
// One fixed binding layout for every entry point (each binds only what it uses):
//   immediate P (16 words; f32 parameters are bit patterns), 1-3 f32 inputs a, b, c,
//   4-5 i32 inputs ia, ib, 6 f32 output out, 7 i32 output iout, 8 weight words w, 9 f32 input
//   comb, 10 i32 input ic.
// Weights: u0-style fields name the format (0 f32, 1 bf16, 2 f16 by integer decode), the row
// stride in words and the chunk's first row (a weight may be split into row chunks).
// No entry point is a weight product (those are linear's tiles and rows.wgsl's small rows): the
// lane runs every one from the exact build.
// Elementwise kernels: workgroup 256, element = (wg.y·gx + wg.x)·256 + lid.

struct P {
    u0: u32, u1: u32, u2: u32, u3: u32,
    u4: u32, u5: u32, u6: u32, u7: u32,
    u8: u32, u9: u32, u10: u32, u11: u32,
    u12: u32, u13: u32, u14: u32, u15: u32,
}

var<immediate> p: P; // the dispatch's immediate data (mod.rs, PARAM_BYTES)
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read> c: array<f32>;
@group(0) @binding(4) var<storage, read> ia: array<i32>;
@group(0) @binding(5) var<storage, read> ib: array<i32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;
@group(0) @binding(7) var<storage, read_write> iout: array<i32>;
@group(0) @binding(8) var<storage, read> w: array<u32>;
// a fourth f32 input (hc_post: comb, sink_attention: sinks)
@group(0) @binding(9) var<storage, read> comb: array<f32>;

fn flat(wg: vec3<u32>, nwg: vec3<u32>, li: u32) -> u32 {
    return (wg.y * nwg.x + wg.x) * 256u + li;
}

fn sigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

fn nan() -> f32 {
    return bitcast<f32>(0x7fc00000u);
}

// ln(1 + y) for y ≥ 0 to a few ulps. For y ≤ 1 through 2·atanh(s), s = y/(2+y) ≤ 1/3, as an odd
// series in basic arithmetic (GPU log near 1 is only absolutely accurate, 2⁻²¹ in Vulkan); above,
// log(1 + y) (relative 3 ulp away from 1).
fn log1p_pos(y: f32) -> f32 {
    if (y > 1.0) {
        return log(1.0 + y);
    }
    let s = y / (2.0 + y);
    let t = s * s;
    var q = 1.0 / 23.0;
    q = fma(q, t, 1.0 / 21.0);
    q = fma(q, t, 1.0 / 19.0);
    q = fma(q, t, 1.0 / 17.0);
    q = fma(q, t, 1.0 / 15.0);
    q = fma(q, t, 1.0 / 13.0);
    q = fma(q, t, 1.0 / 11.0);
    q = fma(q, t, 1.0 / 9.0);
    q = fma(q, t, 1.0 / 7.0);
    q = fma(q, t, 1.0 / 5.0);
    q = fma(q, t, 1.0 / 3.0);
    q = fma(q, t, 1.0);
    return 2.0 * s * q;
}

fn is_finite(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u;
}

// IEEE half bits (low 16 bits of h) → f32, exact (as linear_packed.wgsl).
fn half_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0u) {
        let mag = f32(m) * 5.9604644775390625e-8;
        return select(mag, -mag, sign != 0u);
    }
    if (e == 31u) {
        return bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

// Element `col` of weight row `r` (relative to the bound chunk), format fmt, stride words/row.
fn wload(fmt: u32, stride: u32, r: u32, col: u32) -> f32 {
    if (fmt == 0u) {
        return bitcast<f32>(w[r * stride + col]);
    }
    let u = w[r * stride + col / 2u];
    let h = select(u & 0xffffu, u >> 16u, (col & 1u) == 1u);
    if (fmt == 1u) {
        return bitcast<f32>(h << 16u);
    }
    return half_to_f32(h);
}

// sqrt_softplus: a [n] → out [n], sqrt(x > 20 ? x : ln(1 + eˣ)).   u0 = n
@compute @workgroup_size(256, 1, 1)
fn sqrt_softplus(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) li: u32) {
    let i = flat(wg, nwg, li);
    if (i >= p.u0) { return; }
    out[i] = sqrt_softplus_of(a[i]);
}

// The router's score, shared by sqrt_softplus and route_experts (so both give the same bits).
fn sqrt_softplus_of(v: f32) -> f32 {
    var s = v;
    if (!(v > 20.0)) {
        s = log1p_pos(exp(v));
    }
    return sqrt(s);
}

// swiglu_clamp: a = gate [n], b = up [n] → out [n] (elementwise).   u0 = n, u1 = limit
@compute @workgroup_size(256, 1, 1)
fn swiglu_clamp(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) li: u32) {
    let i = flat(wg, nwg, li);
    if (i >= p.u0) { return; }
    let lim = bitcast<f32>(p.u1);
    let g = min(a[i], lim);
    let u = clamp(b[i], -lim, lim);
    out[i] = g / (1.0 + exp(-g)) * u;
}

// hc_expand: a [n, d] → out [n, hc·d].   u0 = n·hc·d, u1 = d, u2 = hc
@compute @workgroup_size(256, 1, 1)
fn hc_expand(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) li: u32) {
    let i = flat(wg, nwg, li);
    if (i >= p.u0) { return; }
    let d = p.u1;
    let row = i / (p.u2 * d);
    out[i] = a[row * d + i % d];
}

// hc_head_weights: a = mix [n, hc], b = scale [1], c = base [hc] → σ(m·s + base) + eps.
//   u0 = n·hc, u1 = hc, u2 = eps
@compute @workgroup_size(256, 1, 1)
fn hc_head_weights(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) li: u32) {
    let i = flat(wg, nwg, li);
    if (i >= p.u0) { return; }
    out[i] = sigmoid(a[i] * b[0] + c[i % p.u1]) + bitcast<f32>(p.u2);
}

// hc_pre: a = X [n, hc·d], b = w [n, c] (its first hc columns: c = hc, or hc_split's output
// whose first hc are pre) → out [n, d], Σ_i w_i X_i (i ascending).
//   u0 = n·d, u1 = d, u2 = hc, u3 = c
@compute @workgroup_size(256, 1, 1)
fn hc_pre(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let i = flat(wg, nwg, li);
    if (i >= p.u0) { return; }
    let d = p.u1;
    let hc = p.u2;
    let t = i / d;
    let j = i % d;
    var s = 0.0;
    for (var k = 0u; k < hc; k++) {
        s += b[t * p.u3 + k] * a[t * hc * d + k * d + j];
    }
    out[i] = s;
}

// hc_post: a = X [n, hc·d], b = f [n, d], c = hc_split's output [n, pre hc | post hc | comb hc·hc]
// → out [n, hc·d], X'_dst = post_dst·f + Σ_src comb[src·hc + dst]·X_src.
//   u0 = n·hc·d, u1 = d, u2 = hc


@compute @workgroup_size(256, 1, 1)
fn hc_post(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) li: u32) {
    let i = flat(wg, nwg, li);
    if (i >= p.u0) { return; }
    let d = p.u1;
    let hc = p.u2;
    let t = i / (hc * d);
    let dst = (i / d) % hc;
    let j = i % d;
    let row = t * (2u + hc) * hc;
    var s = c[row + hc + dst] * b[t * d + j];
    for (var src = 0u; src < hc; src++) {
        s += c[row + 2u * hc + src * hc + dst] * a[t * hc * d + src * d + j];
    }
    out[i] = s;
}

// a third i32 input (hash_route: the fallback, route_experts: the hash table)
@group(0) @binding(10) var<storage, read> ic: array<i32>;

// hash_route: ia = table [vocab, k], ib = ids [n], ic = fallback [n, k] → iout [n, k].
//   u0 = n·k, u1 = k, u2 = vocab

@compute @workgroup_size(256, 1, 1)
fn hash_route(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) li: u32) {
    let i = flat(wg, nwg, li);
    if (i >= p.u0) { return; }
    let k = p.u1;
    let t = ib[i / k];
    if (t >= 0 && u32(t) < p.u2) {
        iout[i] = ia[u32(t) * k + i % k];
    } else {
        iout[i] = ic[i];
    }
}

// route_weights: a = scores [n, e], ia = ids [n, k] → out [n, k], scale·s/(Σ s + 1e-20).
// An id outside 0..e gives NaN. u0 = n·k, u1 = k, u2 = e, u3 = scale
@compute @workgroup_size(256, 1, 1)
fn route_weights(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) li: u32) {
    let i = flat(wg, nwg, li);
    if (i >= p.u0) { return; }
    let k = p.u1;
    let e = p.u2;
    let t = i / k;
    var sum = 0.0;
    var mine = 0.0;
    var bad = false;
    for (var j = 0u; j < k; j++) {
        let id = ia[t * k + j];
        if (id < 0 || u32(id) >= e) {
            bad = true;
            continue;
        }
        let v = a[t * e + u32(id)];
        sum += v;
        if (j == i % k) {
            mine = v;
        }
    }
    sum += 1e-20;
    out[i] = select(mine / sum * bitcast<f32>(p.u3), nan(), bad);
}

// route_experts: the router after the gate projection in one dispatch, the composition
// sqrt_softplus, add(bias[kind]), topk_rows, hash_route, route_weights bit for bit: a = logits
// [n, e], b = bias [kinds, e], ia = kind i32 [n], ib = token ids i32 [n] and ic = table i32
// [vocab, k] (hash layers) → iout = ids i32 [n, k], out = weights [n, k]. One workgroup a row:
// the scores once into workgroup memory (sqrt_softplus_of, as sqrt_softplus), k rounds of a
// workgroup argmax over s + bias[kind] (topk_rows' ranking, a strict order, so the reduction's
// order cannot change a pick; −1 once no finite score is left), the table row for a hashed text
// token, then route_weights' sum over the slots in order. A kind outside 0..kinds gives a NaN
// bias row (gather_rows'), an id outside 0..e a NaN weight row (route_weights'). A decode step's
// router took five dispatches. Ranking in one pass instead (each finite score counting the
// scores ranked before it, 256 workgroup-memory reads a thread) measured slower than the k
// rounds on an H100: 29 against 17 µs a dispatch (timed, 2026-12-07). e ≤ RE_CACHE,
// k ≤ RE_K_MAX (lm.rs composes the ops past them).
//   u0 = n, u1 = e, u2 = k, u3 = kinds, u4 = hashed, u5 = vocab, u6 = scale
const RE_THREADS: u32 = 256u;
const RE_CACHE: u32 = 1024u;
const RE_K_MAX: u32 = RE_THREADS; // a thread a slot
const RE_NONE: u32 = 0xffffffffu;
var<workgroup> re_raw: array<f32, RE_CACHE>;
var<workgroup> re_biased: array<f32, RE_CACHE>;
// the threads' candidates of a round, reduced in place to [0]
var<workgroup> re_v: array<f32, RE_THREADS>;
var<workgroup> re_c: array<u32, RE_THREADS>;
var<workgroup> re_ids: array<i32, RE_K_MAX>;

// Whether (v1, c1) ranks before (v2, c2): value descending, then column ascending (topk_rows').
fn ranks_before(v1: f32, c1: u32, v2: f32, c2: u32) -> bool {
    return v1 > v2 || (v1 == v2 && c1 < c2);
}

@compute @workgroup_size(256, 1, 1)
fn route_experts(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) li: u32) {
    let row = wg.y * nwg.x + wg.x; // uniform across the workgroup
    let live = row < p.u0;
    let r = min(row, p.u0 - 1u); // a workgroup past the rows (the 2-D grid's) reads the last
    let e = p.u1;
    let k = p.u2;
    let kd = ia[r];
    for (var j = li; j < e; j += RE_THREADS) {
        let s = sqrt_softplus_of(a[r * e + j]);
        re_raw[j] = s;
        if (kd >= 0 && u32(kd) < p.u3) {
            re_biased[j] = s + b[u32(kd) * e + j];
        } else {
            re_biased[j] = nan();
        }
    }
    workgroupBarrier();
    var pv = 0.0; // the previous round's pick (value, column)
    var pc = RE_NONE;
    for (var s = 0u; s < k; s++) {
        // this thread's best among its columns that rank after the previous pick
        var bv = 0.0;
        var bc = RE_NONE;
        if (s == 0u || pc != RE_NONE) {
            for (var j = li; j < e; j += RE_THREADS) {
                let v = re_biased[j];
                if (!is_finite(v) || (s > 0u && !ranks_before(pv, pc, v, j))) { continue; }
                if (bc == RE_NONE || ranks_before(v, j, bv, bc)) {
                    bv = v;
                    bc = j;
                }
            }
        }
        re_v[li] = bv;
        re_c[li] = bc;
        workgroupBarrier();
        for (var m = RE_THREADS / 2u; m > 0u; m >>= 1u) {
            if (li < m) {
                let ov = re_v[li + m];
                let oc = re_c[li + m];
                if (oc != RE_NONE && (re_c[li] == RE_NONE || ranks_before(ov, oc, re_v[li], re_c[li]))) {
                    re_v[li] = ov;
                    re_c[li] = oc;
                }
            }
            workgroupBarrier();
        }
        pv = re_v[0];
        pc = re_c[0]; // once none, every later round is none (nothing ranks after none)
        if (li == 0u) {
            re_ids[s] = select(i32(pc), -1, pc == RE_NONE);
        }
        workgroupBarrier(); // every thread read this round's pick before the next writes re_v
    }
    // hash layers: a text token takes its table row, an image token keeps the top-k
    var t = -1;
    if (p.u4 == 1u) {
        t = ib[r];
    }
    let hashed = t >= 0 && u32(t) < p.u5;
    var sum = 0.0;
    var bad = false;
    for (var s = 0u; s < k; s++) {
        let id = slot_id(s, hashed, t, k);
        if (id < 0 || u32(id) >= e) {
            bad = true;
            continue;
        }
        sum += re_raw[u32(id)];
    }
    sum += 1e-20;
    if (!live || li >= k) { return; }
    let id = slot_id(li, hashed, t, k);
    iout[r * k + li] = id;
    if (bad) {
        out[r * k + li] = nan();
    } else {
        out[r * k + li] = re_raw[u32(id)] / sum * bitcast<f32>(p.u6);
    }
}

// Slot s's expert: the hash table's row t for a hashed token, else the top-k pick.
fn slot_id(s: u32, hashed: bool, t: i32, k: u32) -> i32 {
    if (hashed) {
        return ic[u32(t) * k + s];
    }
    return re_ids[s];
}

// embed_rows (one weight chunk per dispatch): ia = ids [n], w = rows row0..row0+rows of the
// table → out [n, d]. The chunk holding the id writes the row; the first chunk writes zeros for
// ids ≥ vocab, NaN for negative ids.
//   u0 = n·d, u1 = d, u2 = vocab, u3 = row0, u4 = rows, u5 = fmt, u6 = stride words, u7 = first
@compute @workgroup_size(256, 1, 1)
fn embed_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) li: u32) {
    let i = flat(wg, nwg, li);
    if (i >= p.u0) { return; }
    let d = p.u1;
    let id = ia[i / d];
    if (id < 0) {
        if (p.u7 == 1u) { out[i] = nan(); }
        return;
    }
    let r = u32(id);
    if (r >= p.u2) {
        if (p.u7 == 1u) { out[i] = 0.0; }
        return;
    }
    if (r >= p.u3 && r < p.u3 + p.u4) {
        out[i] = wload(p.u5, p.u6, r - p.u3, i % d);
    }
}

// rms_norm_heads: one workgroup per (row, head) segment of hd elements.
//   u0 = segments, u1 = hd, u2 = eps
var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(256, 1, 1)
fn rms_norm_heads(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) li: u32) {
    let seg = wg.y * nwg.x + wg.x; // uniform across the workgroup
    let hd = p.u1;
    let base = seg * hd;
    let squares = segment_sum_squares(seg < p.u0, base, hd, li);
    if (seg >= p.u0) { return; }
    let inv = 1.0 / sqrt(squares / f32(hd) + bitcast<f32>(p.u2));
    // four groups of four elements loaded before any is stored (a store between loads keeps the
    // next load behind it: the 16 384-wide rows walked 16 latencies)
    for (var k = li; k < hd; k += 4096u) {
        var o: array<vec4<f32>, 4>;
        for (var g = 0u; g < 4u; g++) {
            o[g] = rnh_load4(base, min(k + g * 1024u, hd - 1u), hd) * inv;
        }
        for (var g = 0u; g < 4u; g++) {
            let kg = k + g * 1024u;
            if (kg < hd) {
                out[base + kg] = o[g].x;
                if (kg + 256u < hd) { out[base + kg + 256u] = o[g].y; }
                if (kg + 512u < hd) { out[base + kg + 512u] = o[g].z; }
                if (kg + 768u < hd) { out[base + kg + 768u] = o[g].w; }
            }
        }
    }
}

// Σ x² over the hd elements of a from base (0 unless `live`), summed as norm.wgsl's rms_norm sums
// a row (so the same bits): a thread's elements k, k + 256, k + 512, k + 768 as one group, four
// groups loaded together before they are summed in order (the hyper-connections' 16 384-wide
// rows are one workgroup each at decode: a group at a time, 16 load latencies), then a tree in
// `red`. Every thread of the workgroup calls it.
fn segment_sum_squares(live: bool, base: u32, hd: u32, li: u32) -> f32 {
    var s4 = vec4<f32>(0.0);
    if (live) {
        for (var k = li; k < hd; k += 4096u) {
            var v: array<vec4<f32>, 4>;
            for (var g = 0u; g < 4u; g++) {
                // a group past hd loads zeros (rnh_load4's lanes past hd) and adds nothing
                v[g] = select(vec4<f32>(0.0), rnh_load4(base, min(k + g * 1024u, hd - 1u), hd), k + g * 1024u < hd);
            }
            for (var g = 0u; g < 4u; g++) {
                s4 = fma(v[g], v[g], s4);
            }
        }
    }
    return workgroup_sum4(li, s4);
}

// The sum of every thread's s4 over a 256-thread workgroup, as norm.wgsl's rms_norm sums a row:
// each thread's lanes (x + y) + (z + w), then a tree in `red`. Every thread calls it (barriers).
fn workgroup_sum4(li: u32, s4: vec4<f32>) -> f32 {
    red[li] = (s4.x + s4.y) + (s4.z + s4.w);
    workgroupBarrier();
    for (var m = 128u; m > 0u; m >>= 1u) {
        if (li < m) {
            red[li] += red[li + m];
        }
        workgroupBarrier();
    }
    return red[0];
}

// rms_norm_rope: a = x [n, heads·hd], b = inv_freq [rd/2], c = weight [hd] (u4 = 1, one head),
// ia = positions i32 [n] → out [n, heads·hd]: each (row, head) segment RMS-normalised (with a
// weight as norm.wgsl's rms_norm, without as rms_norm_heads: each with the op's own inverse root,
// so the composition's bits), then its tail rotated forward as rope_tail_at rotates it. A decode
// step's queries and keys took two dispatches each. One workgroup per segment.
//   u0 = segments, u1 = hd, u2 = eps, u3 = heads, u4 = has weight, u5 = rd
@compute @workgroup_size(256, 1, 1)
fn rms_norm_rope(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) li: u32) {
    let seg = wg.y * nwg.x + wg.x; // uniform across the workgroup
    let hd = p.u1;
    let base = seg * hd;
    let squares = segment_sum_squares(seg < p.u0, base, hd, li);
    if (seg >= p.u0) { return; }
    let mean = squares / f32(hd) + bitcast<f32>(p.u2);
    let weighted = p.u4 == 1u;
    let inv = select(1.0 / sqrt(mean), inverseSqrt(mean), weighted);
    let pos = f32(u32(ia[seg / p.u3]));
    let plain = hd - p.u5; // the head's unrotated part
    for (var k = li; k < hd; k += 256u) {
        let v = normed(base, k, inv, weighted);
        if (k < plain) {
            out[base + k] = v;
            continue;
        }
        let t = k - plain;
        var pair = k - 1u;
        if ((t & 1u) == 0u) {
            pair = k + 1u;
        }
        out[base + k] = rotated(v, normed(base, pair, inv, weighted), t, pos, false);
    }
}

// Element k of the segment at base, normalised by inv (and weighted: norm.wgsl's (x·inv)·w).
fn normed(base: u32, k: u32, inv: f32, weighted: bool) -> f32 {
    if (weighted) {
        return (a[base + k] * inv) * c[k];
    }
    return a[base + k] * inv;
}

// Segment elements k, k + 256, k + 512, k + 768 of a (from base; 0 past hd).
fn rnh_load4(base: u32, k: u32, hd: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    v.x = a[base + k];
    if (k + 256u < hd) { v.y = a[base + k + 256u]; }
    if (k + 512u < hd) { v.z = a[base + k + 512u]; }
    if (k + 768u < hd) { v.w = a[base + k + 768u]; }
    return v;
}

// x − k·2π with 2π split Cody–Waite style into an 8-bit, two 12-bit and a rest part, so that
// k·C1 is exact for k < 2¹⁶ and k·C2, k·C3 for k < 2¹² (|x| < ~25 700 rad: error ~1 ulp of the
// result) without relying on fma being fused (lavapipe's is not exact); sin/cos then see |r| ≤ π
// (GPU sin/cos are only specified there).
fn reduce_2pi(x: f32) -> f32 {
    let k = round(x * 0.15915494309189535);
    var r = x - k * 6.28125;
    r = r - k * 0.0019350051879882812;
    r = r - k * 3.019813448190689e-07;
    r = r - k * 1.0253376273028358e-11;
    return r;
}

// Element i of a rope_tail row at position `pos`: the head part copied, tail pair (2j, 2j+1)
// rotated by ±f32(pos)·inv_freq[j] (inv_freq in b). Shared by rope_tail and rope_tail_at.
fn rotated_tail_element(i: u32, pos: f32, cols: u32, hd: u32, rd: u32, inverse: bool) -> f32 {
    let hc = (i % cols) % hd;
    if (hc < hd - rd) {
        return a[i];
    }
    let t = hc - (hd - rd);
    // the pair's element: an `if`, not `select`, which would load both neighbours (one past the
    // buffer's ends at its first or last element)
    var pair: f32;
    if ((t & 1u) == 0u) {
        pair = a[i + 1u];
    } else {
        pair = a[i - 1u];
    }
    return rotated(a[i], pair, t, pos, inverse);
}

// Tail element t (value v, its pair's value vp) rotated by ±pos·inv_freq[t/2] (inv_freq in b):
// shared by rope_tail, rope_tail_at and rms_norm_rope.
fn rotated(v: f32, vp: f32, t: u32, pos: f32, inverse: bool) -> f32 {
    let r = reduce_2pi(pos * b[t / 2u]);
    let cs = cos(r);
    var sn = sin(r);
    if (inverse) { sn = -sn; }
    if ((t & 1u) == 0u) {
        return v * cs - vp * sn;
    }
    return v * cs + vp * sn;
}

// rope_tail: a = x [n, cols], b = inv_freq [rd/2] → out [n, cols]; one thread per element.
//   u0 = n·cols, u1 = cols, u2 = hd, u3 = rd, u4 = pos0, u5 = stride, u6 = inverse
@compute @workgroup_size(256, 1, 1)
fn rope_tail(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) li: u32) {
    let i = flat(wg, nwg, li);
    if (i >= p.u0) { return; }
    let row = i / p.u1;
    out[i] = rotated_tail_element(i, f32(p.u4 + row * p.u5), p.u1, p.u2, p.u3, p.u6 == 1u);
}

// rope_tail_at: a = x [n, cols], b = inv_freq [rd/2], ia = positions i32 [n] → out [n, cols];
// one thread per element; row r at position positions[r] (≥ 0, as u32 so that it rounds to f32
// as rope_tail's does).
//   u0 = n·cols, u1 = cols, u2 = hd, u3 = rd, u4 = inverse
@compute @workgroup_size(256, 1, 1)
fn rope_tail_at(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) li: u32) {
    let i = flat(wg, nwg, li);
    if (i >= p.u0) { return; }
    let row = i / p.u1;
    out[i] = rotated_tail_element(i, f32(u32(ia[row])), p.u1, p.u2, p.u3, p.u4 == 1u);
}

// hc_split: a = mix [n, (2+hc)·hc], b = scale [3], c = base [(2+hc)·hc] → out (same shape). A
// row's hc×hc Sinkhorn block is spread over hc² threads, one element each (hc ≤ HC_MAX: lm.rs
// checks), HC_MAX² / hc² rows a workgroup: each normalisation step publishes the elements in
// workgroup memory and every thread sums its own row (or column) from there in the reference's
// order, so the sums are the one-thread loop's, bit for bit. (A thread a row looping over its
// block as an indexed hc×hc array took 0.08 ms a decode step's row on an H200; four streams' block
// in four vec4 registers, no array, is faster than the spread one: hc_sinkhorn4, u8 = 1.)
// Two buffers alternate, so one barrier a step keeps a step's reads before the next step's
// writes to the same buffer (a barrier lies between them).
//   u0 = n, u1 = hc, u2 = iters, u3 = eps; hc_mix_split's fused path: u4 = the partial sums'
//   slices (a = [slices, n, wd], comb = their sums of squares [slices, n]), u5 = the residual's
//   width, u6 = the norm's eps; u8 = 1: four streams' block in one invocation (hc_sinkhorn4)
const HC_MAX: u32 = 8u;
const HC_THREADS: u32 = HC_MAX * HC_MAX;

var<workgroup> hc_block: array<array<f32, HC_THREADS>, 2>;

// v published as this thread's element of hc_block[buf] (threads past HC_THREADS publish
// nothing), then the sum of the hc elements from `first`, `stride` apart (a row: 1, a column: hc),
// in order. Workgroup-uniform control flow only (a barrier).
fn hc_publish_sum(buf: u32, li: u32, v: f32, first: u32, stride: u32, hc: u32) -> f32 {
    if (li < HC_THREADS) { hc_block[buf][li] = v; }
    workgroupBarrier();
    var sum = 0.0;
    for (var j = 0u; j < hc; j++) { sum += hc_block[buf][first + j * stride]; }
    return sum;
}

// Element i of row t's mix: a[t·wd + i]; or, from hc_mix_split's partial sums (u4 = slices > 0:
// rows.wgsl's hc_mix_rows), inv · Σ_z a[(z·n + t)·wd + i], summed in slice order.
fn mix_of(t: u32, i: u32, inv: f32) -> f32 {
    let wd = (2u + p.u1) * p.u1;
    if (p.u4 == 0u) {
        return a[t * wd + i];
    }
    // eight loads in flight before their adds (a dependent load per slice made the fused path's
    // hc_split 15 → 23 µs on an H100); the adds stay in slice order
    let step = p.u0 * wd;
    var at = t * wd + i;
    var s = 0.0;
    var z = 0u;
    for (; z + 8u <= p.u4; z += 8u) {
        let v0 = a[at]; let v1 = a[at + step]; let v2 = a[at + 2u * step]; let v3 = a[at + 3u * step];
        let v4 = a[at + 4u * step]; let v5 = a[at + 5u * step]; let v6 = a[at + 6u * step];
        let v7 = a[at + 7u * step];
        s += v0; s += v1; s += v2; s += v3; s += v4; s += v5; s += v6; s += v7;
        at += 8u * step;
    }
    for (; z < p.u4; z++) {
        s += a[at];
        at += step;
    }
    return inv * s;
}

// rms_norm_heads' factor of row t, 1 / sqrt(mean(x²) + norm eps), from its slices' sums of
// squares comb[z·n + t] (u5 = the row's width, u6 = norm eps); 1 for a plain mix.
fn mix_norm(t: u32) -> f32 {
    if (p.u4 == 0u) {
        return 1.0;
    }
    // as mix_of: eight loads in flight, adds in slice order
    let step = p.u0;
    var at = t;
    var s = 0.0;
    var z = 0u;
    for (; z + 8u <= p.u4; z += 8u) {
        let v0 = comb[at]; let v1 = comb[at + step]; let v2 = comb[at + 2u * step];
        let v3 = comb[at + 3u * step]; let v4 = comb[at + 4u * step]; let v5 = comb[at + 5u * step];
        let v6 = comb[at + 6u * step]; let v7 = comb[at + 7u * step];
        s += v0; s += v1; s += v2; s += v3; s += v4; s += v5; s += v6; s += v7;
        at += 8u * step;
    }
    for (; z < p.u4; z++) {
        s += comb[at];
        at += step;
    }
    return 1.0 / sqrt(s / f32(p.u5) + bitcast<f32>(p.u6));
}

@compute @workgroup_size(64, 1, 1)
fn hc_split(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let hc = p.u1;
    let cells = hc * hc;
    let per_group = HC_THREADS / cells;
    let slot = li / cells;                // this thread's row in the workgroup
    let q = li % cells;                   // its element of the block: [src][dst]
    let src = q / hc;
    let dst = q % hc;
    let t = wg.x * per_group + slot;
    let live = slot < per_group && t < p.u0; // uniform per row; barriers below are for all
    let wd = (2u + hc) * hc;
    let eps = bitcast<f32>(p.u3);
    let o = t * wd;
    let cb = o + 2u * hc;
    // the block's first element in hc_block (a thread past the last whole block reads the last's)
    let row0 = min(slot, per_group - 1u) * cells;
    var v = 0.0;
    if (live) {
        let inv = mix_norm(t);
        if (q < hc) {
            out[o + q] = sigmoid(mix_of(t, q, inv) * b[0] + c[q]) + eps;
            out[o + hc + q] = 2.0 * sigmoid(mix_of(t, hc + q, inv) * b[1] + c[hc + q]);
        }
        v = mix_of(t, 2u * hc + q, inv) * b[2] + c[2u * hc + q];
    }
    // this thread's row and column in hc_block
    v = hc_sinkhorn(li, v, row0 + src * hc, row0 + dst, hc, eps);
    if (live) {
        out[cb + q] = v;
    }
}

// The Sinkhorn block of hc_split from this thread's element v (its block's row `row`, column
// `col` in hc_block): the softmax over each src row, then p.u2 rounds of column and row
// normalisation (the first without its row step; at least that one, as the CPU lane and CUDA
// run it: with 0 rounds the columns were left unnormalised here). Threads past HC_THREADS take
// part in the barriers only (their row and column in range, their result unused). Every thread
// calls it.
fn hc_sinkhorn(li: u32, v0: f32, row: u32, col: u32, hc: u32, eps: f32) -> f32 {
    if (hc == 4u && p.u8 == 1u) {
        return hc_sinkhorn4(li, v0, row, col, eps);
    }
    var v = v0;
    var buf = 0u;
    if (li < HC_THREADS) { hc_block[buf][li] = v; }
    workgroupBarrier();
    var mx = bitcast<f32>(0xff800000u);
    for (var j = 0u; j < hc; j++) { mx = max(mx, hc_block[buf][row + j]); }
    v = exp(v - mx);
    buf = 1u - buf;
    v = v / hc_publish_sum(buf, li, v, row, 1u, hc) + eps;
    for (var it = 0u; it < max(p.u2, 1u); it++) {
        if (it > 0u) {
            // rows (dst normalisation over each src row)
            buf = 1u - buf;
            v /= hc_publish_sum(buf, li, v, row, 1u, hc) + eps;
        }
        // columns (src normalisation for each dst)
        buf = 1u - buf;
        v /= hc_publish_sum(buf, li, v, col, hc, hc) + eps;
    }
    return v;
}

// hc_sinkhorn of four streams (u8 = 1: the lane's `sinkhorn_one_invocation`) in one invocation a
// block, its 4×4 elements in four vec4 registers (src rows) and every step's sums added in
// hc_sinkhorn's order ((x0 + x1) + x2) + x3 (lavapipe: the same bits; NVIDIA's driver rounds some
// divisions differently in the two shapes, tests/wgpu_lane.rs). hc_sinkhorn's 41 steps took a
// workgroup barrier each: hc_split_pre_norm 26 → 20 µs on an H200. The elements go through
// hc_block: published, the block's first thread (li == row == col) computes, then each thread
// reads its own back. Every thread calls it (two barriers).
fn hc_sinkhorn4(li: u32, v0: f32, row: u32, col: u32, eps: f32) -> f32 {
    if (li < HC_THREADS) { hc_block[0][li] = v0; }
    workgroupBarrier();
    if (li == row && li == col) {
        var r0 = vec4<f32>(hc_block[0][row], hc_block[0][row + 1u], hc_block[0][row + 2u], hc_block[0][row + 3u]);
        var r1 = vec4<f32>(hc_block[0][row + 4u], hc_block[0][row + 5u], hc_block[0][row + 6u], hc_block[0][row + 7u]);
        var r2 = vec4<f32>(hc_block[0][row + 8u], hc_block[0][row + 9u], hc_block[0][row + 10u], hc_block[0][row + 11u]);
        var r3 = vec4<f32>(hc_block[0][row + 12u], hc_block[0][row + 13u], hc_block[0][row + 14u], hc_block[0][row + 15u]);
        r0 = hc_softmax4(r0, eps);
        r1 = hc_softmax4(r1, eps);
        r2 = hc_softmax4(r2, eps);
        r3 = hc_softmax4(r3, eps);
        for (var it = 0u; it < max(p.u2, 1u); it++) {
            if (it > 0u) {
                r0 /= hc_sum4(r0) + eps;
                r1 /= hc_sum4(r1) + eps;
                r2 /= hc_sum4(r2) + eps;
                r3 /= hc_sum4(r3) + eps;
            }
            let cols = ((r0 + r1) + r2) + r3 + eps;
            r0 /= cols;
            r1 /= cols;
            r2 /= cols;
            r3 /= cols;
        }
        for (var j = 0u; j < 4u; j++) {
            hc_block[1][row + j] = r0[j];
            hc_block[1][row + 4u + j] = r1[j];
            hc_block[1][row + 8u + j] = r2[j];
            hc_block[1][row + 12u + j] = r3[j];
        }
    }
    workgroupBarrier();
    return select(0.0, hc_block[1][min(li, HC_THREADS - 1u)], li < HC_THREADS);
}

// The elements' sum in hc_sinkhorn's order.
fn hc_sum4(r: vec4<f32>) -> f32 {
    return ((r.x + r.y) + r.z) + r.w;
}

// A src row's softmax as hc_sinkhorn's first step: exp(v − max) / Σ + eps.
fn hc_softmax4(r: vec4<f32>, eps: f32) -> vec4<f32> {
    let e = exp(r - max(max(max(r.x, r.y), r.z), r.w));
    return e / hc_sum4(e) + eps;
}

// hc_split_pre_norm: hc_mix_split's fused split (hc_split from hc_mix_rows' partial sums) and
// hc_pre_norm of the residual by its pre weights in one dispatch, with the two dispatches' bits:
// a decode step ran hc_split then hc_pre_norm twice a layer. Two workgroups (256 threads) a row
// (at most 8 rows: grid (rows, 2)). Each stages the partial sums and the squares in workgroup
// memory in one round of loads, four a thread in flight (hc_split's threads walk their slices
// eight loads at a time, twice for pre and post), and sums the mix from there in slice order as
// mix_of and mix_norm sum it. The first writes pre and post, keeps pre in workgroup memory, and
// collapses the streams by pre and RMS-normalises them as norm.wgsl's hc_pre_norm (rows of at
// most HS_HELD·1024, held in registers); the second (wg.y = 1) runs the Sinkhorn block beside
// it (hc_sinkhorn: on the first hc² threads, or for four streams with u8 = 1 on thread 0). With
// the block after the norm in one workgroup a dispatch took 20.9 µs on an H100 (timed), beside
// it 16.3.
//   a = partial sums [slices, n, wd], comb = their squares [slices, n], b = scale [3],
//   c = base [wd], hx = X [n, hc·d], hw = the norm's weight [d] → out = split [n, wd],
//   hy = [n, d]. u0 = n, u1 = hc, u2 = iters, u3 = eps, u4 = slices, u5 = hc·d, u6 = the norms'
//   eps, u7 = d, u8 as hc_split's. lm.rs holds slices·(wd + 1) ≤ HS_STAGE and d ≤ HS_HELD·1024.
const HS_STAGE: u32 = 2048u;
const HS_HELD: u32 = 4u;
var<workgroup> hs_stage: array<f32, HS_STAGE>;
var<workgroup> hs_mix: array<f32, (2u + HC_MAX) * HC_MAX>;
var<workgroup> hs_pre: array<f32, HC_MAX>;
@group(0) @binding(11) var<storage, read> hx: array<f32>;
@group(0) @binding(12) var<storage, read> hw: array<f32>;
@group(0) @binding(13) var<storage, read_write> hy: array<f32>;

@compute @workgroup_size(256, 1, 1)
fn hc_split_pre_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let t = wg.x;
    let hc = p.u1;
    let wd = (2u + hc) * hc;
    let slices = p.u4;
    let sums = slices * wd; // the squares follow the partial sums in hs_stage
    let staged = sums + slices;
    for (var e = li; e < staged; e += 1024u) {
        var v: array<f32, 4>;
        for (var g = 0u; g < 4u; g++) {
            v[g] = hs_partial(t, min(e + g * 256u, staged - 1u), wd, sums);
        }
        for (var g = 0u; g < 4u; g++) {
            if (e + g * 256u < staged) { hs_stage[e + g * 256u] = v[g]; }
        }
    }
    workgroupBarrier();
    if (li < wd) {
        var sq = 0.0;
        for (var z = 0u; z < slices; z++) { sq += hs_stage[sums + z]; }
        let inv = 1.0 / sqrt(sq / f32(p.u5) + bitcast<f32>(p.u6));
        var s = 0.0;
        for (var z = 0u; z < slices; z++) { s += hs_stage[z * wd + li]; }
        hs_mix[li] = inv * s;
    }
    workgroupBarrier();
    let eps = bitcast<f32>(p.u3);
    let o = t * wd;
    if (wg.y == 1u) {
        // the row's second workgroup: the Sinkhorn block, thread q = src·hc + dst of the first
        // hc² (the others' row and column 0), beside the first's norm
        let cells = hc * hc;
        var v = 0.0;
        if (li < cells) {
            v = hs_mix[2u * hc + li] * b[2] + c[2u * hc + li];
        }
        let q = select(0u, li, li < cells);
        v = hc_sinkhorn(li, v, (q / hc) * hc, q % hc, hc, eps);
        if (li < cells) {
            out[o + 2u * hc + li] = v;
        }
        return;
    }
    if (li < hc) {
        let pre = sigmoid(hs_mix[li] * b[0] + c[li]) + eps;
        hs_pre[li] = pre;
        out[o + li] = pre;
        out[o + hc + li] = 2.0 * sigmoid(hs_mix[hc + li] * b[1] + c[hc + li]);
    }
    workgroupBarrier();
    // hc_pre_norm (norm.wgsl) of row t
    let d = p.u7;
    let xb = t * hc * d;
    let ob = t * d;
    // each stream's HS_HELD loads of this thread issued together (clamped indices, no branches),
    // then added in stream order as hc_pre_norm adds them
    var held: array<vec4<f32>, HS_HELD>;
    for (var k = 0u; k < hc; k++) {
        let pre = hs_pre[k];
        var x: array<vec4<f32>, HS_HELD>;
        for (var g = 0u; g < HS_HELD; g++) {
            x[g] = hs_load4(xb + k * d, li + g * 1024u, d);
        }
        for (var g = 0u; g < HS_HELD; g++) {
            held[g] += pre * x[g];
        }
    }
    var s4 = vec4<f32>(0.0);
    for (var g = 0u; g < HS_HELD; g++) {
        if (li + g * 1024u < d) {
            s4 = fma(held[g], held[g], s4);
        }
    }
    let inv = inverseSqrt(workgroup_sum4(li, s4) / f32(d) + bitcast<f32>(p.u6));
    for (var g = 0u; g < HS_HELD; g++) {
        let e = li + g * 1024u;
        if (e < d) {
            let wt = vec4<f32>(hw[e], hw[min(e + 256u, d - 1u)], hw[min(e + 512u, d - 1u)], hw[min(e + 768u, d - 1u)]);
            let y = (held[g] * inv) * wt;
            hy[ob + e] = y.x;
            if (e + 256u < d) { hy[ob + e + 256u] = y.y; }
            if (e + 512u < d) { hy[ob + e + 512u] = y.z; }
            if (e + 768u < d) { hy[ob + e + 768u] = y.w; }
        }
    }
}

// Element e of row t's staged partials: partial sum z = e / wd of column e % wd for e < sums,
// else slice e − sums's sum of squares.
fn hs_partial(t: u32, e: u32, wd: u32, sums: u32) -> f32 {
    if (e < sums) {
        return a[((e / wd) * p.u0 + t) * wd + e % wd];
    }
    return comb[(e - sums) * p.u0 + t];
}

// X's elements c, c + 256, c + 512, c + 768 of the d from base (0 past d), every load made (an
// index past d reads element d − 1).
fn hs_load4(base: u32, c: u32, d: u32) -> vec4<f32> {
    let at = c + vec4<u32>(0u, 256u, 512u, 768u);
    let j = min(at, vec4<u32>(d - 1u));
    let v = vec4<f32>(hx[base + j.x], hx[base + j.y], hx[base + j.z], hx[base + j.w]);
    return select(vec4<f32>(0.0), v, at < vec4<u32>(d));
}

// compress_pool: a = kv, b = gate [T, wd], c = ape [r, wd] → out [⌊T/r⌋, d]; one thread per
// (entry, channel).   u0 = n·d, u1 = d, u2 = wd, u3 = ratio, u4 = overlap
fn pool_row(q: u32, i: u32, ch: u32) -> vec2<f32> {
    // (value, logit) of pooled row q of entry i
    let r = p.u3;
    let wd = p.u2;
    var tt: u32;
    var col: u32;
    if (p.u4 == 1u && i > 0u && q < r) {
        tt = (i - 1u) * r + q;
        col = ch;
    } else {
        let q2 = select(q, q - r, p.u4 == 1u && i > 0u);
        tt = i * r + q2;
        col = select(ch, p.u1 + ch, p.u4 == 1u);
    }
    return vec2<f32>(a[tt * wd + col], b[tt * wd + col] + c[(tt % r) * wd + col]);
}

@compute @workgroup_size(256, 1, 1)
fn compress_pool(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) li: u32) {
    let x = flat(wg, nwg, li);
    if (x >= p.u0) { return; }
    let i = x / p.u1;
    let ch = x % p.u1;
    let len = select(p.u3, 2u * p.u3, p.u4 == 1u && i > 0u);
    var mx = bitcast<f32>(0xff800000u);
    for (var q = 0u; q < len; q++) { mx = max(mx, pool_row(q, i, ch).y); }
    var den = 0.0;
    for (var q = 0u; q < len; q++) { den += exp(pool_row(q, i, ch).y - mx); }
    var s = 0.0;
    for (var q = 0u; q < len; q++) {
        let v = pool_row(q, i, ch);
        s += exp(v.y - mx) / den * v.x;
    }
    out[x] = s;
}

// indexer_scores: a = q [n, heads·hd], b = k [m, hd], c = w [n, heads] → out [n, m];
// −inf unless j < min((pos0 + i + 1) / ratio, m).
//   u0 = n·m, u1 = m, u2 = heads, u3 = hd, u4 = scale, u5 = pos0, u6 = ratio
@compute @workgroup_size(256, 1, 1)
fn indexer_scores(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) li: u32) {
    let x = flat(wg, nwg, li);
    if (x >= p.u0) { return; }
    let i = x / p.u1;
    let j = x % p.u1;
    if (!indexer_visible(i, j)) {
        out[x] = bitcast<f32>(0xff800000u);
        return;
    }
    var s = 0.0;
    for (var h = 0u; h < p.u2; h++) {
        s += indexer_term(i, j, h);
    }
    out[x] = s * bitcast<f32>(p.u4);
}

// Whether entry j is complete for query row i: j < (pos0 + i + 1) / ratio.
fn indexer_visible(i: u32, j: u32) -> bool {
    return j < (p.u5 + i + 1u) / p.u6;
}

// Head h's term of score (i, j): w[i, h] · relu(q[i, h] · k[j]).
fn indexer_term(i: u32, j: u32, h: u32) -> f32 {
    let hd = p.u3;
    var dot = 0.0;
    for (var e = 0u; e < hd; e++) {
        dot += a[(i * p.u2 + h) * hd + e] * b[j * hd + e];
    }
    return c[i * p.u2 + h] * max(dot, 0.0);
}

// indexer_scores_tiles: indexer_scores as a tiled GEMM, for many query rows (a prefill chunk):
// a workgroup per tile of IT_ROWS queries × IT_COLS entries, a thread per IT_COLS / 16 outputs of
// one query. Head by head, the queries' and the entries' rows go through workgroup memory IT_DIMS
// dims at a time (the entries read once per tile and head rather than once per output and head:
// a thread an output took 34 ms a CSA layer's 2 048-token chunk on an H100 under Vulkan), each
// output's dot summed in dim order, then its weighted relu added in head order — the sum
// indexer_scores takes. A tile whose entries are all in its queries' future is −inf at once.
//   grid (⌈m / IT_COLS⌉, ⌈n / IT_ROWS⌉); the uniforms are indexer_scores'
const IT_ROWS: u32 = 16u;
const IT_COLS: u32 = 64u;
const IT_DIMS: u32 = 32u;
// outputs a thread takes: query li / 16, entries li % 16 + 16·t
const IT_OUTS: u32 = IT_COLS / 16u;
var<workgroup> it_q: array<f32, IT_ROWS * IT_DIMS>;
// [IT_COLS][IT_DIMS + 1] (a padded row: the threads of a subgroup read consecutive entries' same dim)
var<workgroup> it_k: array<f32, IT_COLS * (IT_DIMS + 1u)>;

@compute @workgroup_size(256, 1, 1)
fn indexer_scores_tiles(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let m = p.u1;
    let n = p.u0 / m;
    let heads = p.u2;
    let hd = p.u3;
    let i0 = wg.y * IT_ROWS;
    let j0 = wg.x * IT_COLS;
    let i = i0 + li / 16u;
    let tj = li % 16u;
    // every entry of the tile in the future of its last query: −inf (uniform)
    if (j0 >= min((p.u5 + min(i0 + IT_ROWS, n)) / p.u6, m)) {
        for (var t = 0u; t < IT_OUTS; t++) {
            let j = j0 + tj + 16u * t;
            if (i < n && j < m) { out[i * m + j] = bitcast<f32>(0xff800000u); }
        }
        return;
    }
    var s: array<f32, IT_OUTS>;
    for (var h = 0u; h < heads; h++) {
        var dot: array<f32, IT_OUTS>;
        for (var e0 = 0u; e0 < hd; e0 += IT_DIMS) {
            for (var r = 0u; r < IT_ROWS * IT_DIMS / 256u; r++) {
                let x = li + 256u * r;
                let qi = i0 + x / IT_DIMS;
                let e = e0 + x % IT_DIMS;
                it_q[x] = select(0.0, a[(min(qi, n - 1u) * heads + h) * hd + min(e, hd - 1u)], qi < n && e < hd);
            }
            for (var r = 0u; r < IT_COLS * IT_DIMS / 256u; r++) {
                let x = li + 256u * r;
                let j = j0 + x / IT_DIMS;
                let e = e0 + x % IT_DIMS;
                it_k[(x / IT_DIMS) * (IT_DIMS + 1u) + x % IT_DIMS] =
                    select(0.0, b[min(j, m - 1u) * hd + min(e, hd - 1u)], j < m && e < hd);
            }
            workgroupBarrier();
            for (var e = 0u; e < min(IT_DIMS, hd - e0); e++) {
                let qv = it_q[(li / 16u) * IT_DIMS + e];
                for (var t = 0u; t < IT_OUTS; t++) {
                    dot[t] += qv * it_k[(tj + 16u * t) * (IT_DIMS + 1u) + e];
                }
            }
            workgroupBarrier();
        }
        let wh = c[min(i, n - 1u) * heads + h];
        for (var t = 0u; t < IT_OUTS; t++) { s[t] += wh * max(dot[t], 0.0); }
    }
    for (var t = 0u; t < IT_OUTS; t++) {
        let j = j0 + tj + 16u * t;
        if (i < n && j < m) {
            out[i * m + j] = select(bitcast<f32>(0xff800000u), s[t] * bitcast<f32>(p.u4), indexer_visible(i, j));
        }
    }
}

// indexer_scores_rows: indexer_scores for few query rows (decode), one workgroup per output: a
// thread a head computes its dot product, and thread 0 adds the heads' terms in head order, the
// sum indexer_scores takes, so the scores are the same bits. A thread an output left a decode
// step's 1 024 entries to 4 workgroups each walking 64 · 128 products one after another: 1.1 ms
// a CSA layer on an H200 under Vulkan.
//   u0 = n·m, u1 = m, u2 = heads, u3 = hd, u4 = scale, u5 = pos0, u6 = ratio
const IS_THREADS: u32 = 64u;
var<workgroup> is_terms: array<f32, IS_THREADS>;

@compute @workgroup_size(64, 1, 1)
fn indexer_scores_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) li: u32) {
    let x = wg.y * nwg.x + wg.x; // uniform across the workgroup
    if (x >= p.u0) { return; }
    let i = x / p.u1;
    let j = x % p.u1;
    let heads = p.u2;
    if (!indexer_visible(i, j)) {
        if (li == 0u) { out[x] = bitcast<f32>(0xff800000u); }
        return;
    }
    var s = 0.0;
    for (var h0 = 0u; h0 < heads; h0 += IS_THREADS) {
        let h = h0 + li;
        if (h < heads) {
            is_terms[li] = indexer_term(i, j, h);
        }
        workgroupBarrier();
        if (li == 0u) {
            for (var t = 0u; t < min(IS_THREADS, heads - h0); t++) { s += is_terms[t]; }
        }
        workgroupBarrier();
    }
    if (li == 0u) { out[x] = s * bitcast<f32>(p.u4); }
}

// topk_rows: a = x [n, m] → iout [n, k]; one workgroup per row. The finite values ranked value
// descending, then column ascending; slot s is the column of rank s, −1 past the finite ones. As
// the CUDA lane's topk_rows_i32: every element has a 64-bit key (hi: the value, lo: the column)
// that orders the elements as the ranking does, so the top k are the k smallest keys in key
// order. Rows of at most TK_SORT columns are staged in workgroup memory as keys and
// bitonic-sorted. Longer rows go in chunks of TK_SORT slots: a radix select (an 8-bit digit a
// pass, its histogram in workgroup memory) finds the chunk's last key, one more pass over the row
// gathers the chunk's keys, and those are sorted.
//   u0 = n, u1 = m, u2 = k
const TK_THREADS: u32 = 256u;
const TK_SORT: u32 = 2048u;
// hi and lo of a non-finite element's key (and of the sort's padding): after every finite key
const TK_LAST: u32 = 0xffffffffu;
var<workgroup> tk_hi: array<u32, TK_SORT>;
var<workgroup> tk_lo: array<u32, TK_SORT>;
// the radix select's histogram (one bin a thread) and its inclusive prefix sum
var<workgroup> tk_hist: array<atomic<u32>, TK_THREADS>;
var<workgroup> tk_scan: array<u32, TK_THREADS>;
// the bin holding the wanted key, the keys in the bins below it, the keys in it
var<workgroup> tk_bin: u32;
var<workgroup> tk_under: u32;
var<workgroup> tk_in_bin: u32;
// finite keys counted (sort) or gathered (select) so far
var<workgroup> tk_count: atomic<u32>;

// The key's hi word of value v: larger v → smaller; −0 and +0 alike (they tie, as `>` and `==`
// see them); non-finite → TK_LAST. A finite one is never TK_LAST and never 0 (at least 0x00800000).
fn tk_key_hi(v: f32) -> u32 {
    if (!is_finite(v)) { return TK_LAST; }
    let u = bitcast<u32>(select(v, 0.0, v == 0.0));
    let ascending = select(u | 0x80000000u, ~u, (u & 0x80000000u) != 0u); // monotone in v
    return ~ascending;
}

fn tk_less(h1: u32, l1: u32, h2: u32, l2: u32) -> bool {
    return h1 < h2 || (h1 == h2 && l1 < l2);
}

// The 8-bit digit of key (h, l) at bit `shift` (0, 8, … 56).
fn tk_digit(h: u32, l: u32, shift: u32) -> u32 {
    if (shift >= 32u) { return (h >> (shift - 32u)) & 0xffu; }
    return (l >> shift) & 0xffu;
}

// Whether key (h, l) agrees with the prefix (ph, pl) on every bit above digit `shift`.
fn tk_in_prefix(h: u32, l: u32, ph: u32, pl: u32, shift: u32) -> bool {
    let top = shift + 8u; // the first bit above the digit
    if (top >= 64u) { return true; }
    if (top >= 32u) { return ((h ^ ph) >> (top - 32u)) == 0u; }
    return h == ph && ((l ^ pl) >> top) == 0u;
}

// tk_hi/tk_lo[0, p) ascending in place, p a power of two; the threads share each pass's pairs.
// Ends with a barrier.
fn tk_sort(li: u32, p: u32) {
    for (var size = 2u; size <= p; size *= 2u) {
        for (var stride = size / 2u; stride > 0u; stride /= 2u) {
            for (var i = li; i < p / 2u; i += TK_THREADS) {
                // the i-th pair (lo, hi) of this pass; ascending where lo & size == 0
                let lo = 2u * stride * (i / stride) + i % stride;
                let hi = lo + stride;
                let lo_after = tk_less(tk_hi[hi], tk_lo[hi], tk_hi[lo], tk_lo[lo]);
                if (lo_after == ((lo & size) == 0u)) {
                    let h = tk_hi[lo];
                    let l = tk_lo[lo];
                    tk_hi[lo] = tk_hi[hi];
                    tk_lo[lo] = tk_lo[hi];
                    tk_hi[hi] = h;
                    tk_lo[hi] = l;
                }
            }
            workgroupBarrier();
        }
    }
}

fn tk_by_sort(li: u32, row: u32, m: u32, k: u32) {
    var p = 1u;
    while (p < m) { p *= 2u; } // the sort's power-of-two length, padded with TK_LAST
    if (li == 0u) {
        atomicStore(&tk_count, 0u);
    }
    workgroupBarrier();
    for (var j = li; j < p; j += TK_THREADS) {
        var h = TK_LAST;
        if (j < m) {
            h = tk_key_hi(a[row * m + j]);
        }
        tk_hi[j] = h;
        tk_lo[j] = select(j, TK_LAST, h == TK_LAST);
        if (h != TK_LAST) {
            atomicAdd(&tk_count, 1u);
        }
    }
    workgroupBarrier();
    tk_sort(li, p);
    let picked = min(atomicLoad(&tk_count), k);
    for (var s = li; s < k; s += TK_THREADS) {
        var col = -1;
        if (s < picked) {
            col = i32(tk_lo[s]);
        }
        iout[row * k + s] = col;
    }
}

// The radix select of tk_by_select: a bound (hi, lo) such that exactly e = min(want, f) finite
// keys of the row are ≤ it, f being the row's finite count (returned as z; the bound means nothing
// when e = 0). Digit by digit from the top, each pass a histogram of the digit of the keys that
// share the prefix found so far: the bin holding the e-th key extends the prefix, until the keys
// below the bin plus the whole bin are exactly e (at the latest on the last digit: keys are
// unique); the bound is then the largest key in that bin (the prefix, ones below it).
fn tk_radix_bound(li: u32, row: u32, m: u32, want: u32) -> vec3<u32> {
    var ph = 0u; // the digits fixed so far, in place
    var pl = 0u;
    var below = 0u; // finite keys below the current bin
    var e = want;
    var f = 0u;
    for (var d = 0u; d < 8u; d++) {
        let shift = 56u - 8u * d;
        // every column is below m: a column digit above m's top bit is 0 in every key
        if (shift < 32u && ((m - 1u) >> shift) == 0u) { continue; }
        atomicStore(&tk_hist[li], 0u);
        workgroupBarrier();
        for (var j = li; j < m; j += TK_THREADS) {
            let h = tk_key_hi(a[row * m + j]);
            if (h != TK_LAST && tk_in_prefix(h, j, ph, pl, shift)) {
                atomicAdd(&tk_hist[tk_digit(h, j, shift)], 1u);
            }
        }
        workgroupBarrier();
        // inclusive prefix sum over the bins (thread b holds bin b)
        let c = atomicLoad(&tk_hist[li]);
        tk_scan[li] = c;
        workgroupBarrier();
        for (var o = 1u; o < TK_THREADS; o *= 2u) {
            var add = 0u;
            if (li >= o) {
                add = tk_scan[li - o];
            }
            workgroupBarrier();
            tk_scan[li] += add;
            workgroupBarrier();
        }
        let incl = tk_scan[li];
        let total = workgroupUniformLoad(&tk_scan[TK_THREADS - 1u]);
        if (d == 0u) { // the first pass counts every finite key
            f = total;
            e = min(want, total);
        }
        if (e == 0u) {
            return vec3<u32>(0u, 0u, f);
        }
        if (below + incl - c < e && e <= below + incl) { // exactly one bin
            tk_bin = li;
            tk_under = incl - c;
            tk_in_bin = c;
        }
        // each a barrier: tk_scan and the picks are rewritten two barriers on at the soonest
        let bin = workgroupUniformLoad(&tk_bin);
        let under = workgroupUniformLoad(&tk_under);
        let in_bin = workgroupUniformLoad(&tk_in_bin);
        below += under;
        if (shift >= 32u) {
            ph |= bin << (shift - 32u);
        } else {
            pl |= bin << shift;
        }
        if (below + in_bin == e) {
            if (shift >= 32u) {
                return vec3<u32>(ph | ((1u << (shift - 32u)) - 1u), 0xffffffffu, f);
            }
            return vec3<u32>(ph, pl | ((1u << shift) - 1u), f);
        }
    }
    return vec3<u32>(ph, pl, f); // not reached: the last digit's bin is one key
}

fn tk_by_select(li: u32, row: u32, m: u32, k: u32) {
    // the previous chunk's bound: below every finite key at first
    var prev_h = 0u;
    var prev_l = 0u;
    for (var s0 = 0u; s0 < k; s0 += TK_SORT) {
        let s1 = select(s0 + TK_SORT, k, k - s0 < TK_SORT);
        let bound = tk_radix_bound(li, row, m, s1);
        let f = bound.z;
        let picked = select(0u, min(f, s1) - s0, f > s0); // keys of this chunk
        if (li == 0u) {
            atomicStore(&tk_count, 0u);
        }
        workgroupBarrier();
        if (picked > 0u) {
            for (var j = li; j < m; j += TK_THREADS) {
                let h = tk_key_hi(a[row * m + j]);
                if (h != TK_LAST && tk_less(prev_h, prev_l, h, j) && !tk_less(bound.x, bound.y, h, j)) {
                    let at = atomicAdd(&tk_count, 1u);
                    tk_hi[at] = h;
                    tk_lo[at] = j;
                }
            }
        }
        var p = 1u;
        while (p < picked) { p *= 2u; } // the sort's power-of-two length, padded with TK_LAST
        for (var i = picked + li; i < p; i += TK_THREADS) {
            tk_hi[i] = TK_LAST;
            tk_lo[i] = TK_LAST;
        }
        workgroupBarrier();
        tk_sort(li, p);
        for (var s = s0 + li; s < s1; s += TK_THREADS) {
            var col = -1;
            if (s - s0 < picked) {
                col = i32(tk_lo[s - s0]);
            }
            iout[row * k + s] = col;
        }
        workgroupBarrier(); // the keys are read before the next chunk overwrites them
        prev_h = bound.x;
        prev_l = bound.y;
    }
}

@compute @workgroup_size(TK_THREADS, 1, 1)
fn topk_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) li: u32) {
    let row = wg.y * nwg.x + wg.x; // uniform across the workgroup
    if (row >= p.u0) { return; }
    if (p.u1 <= TK_SORT) {
        tk_by_sort(li, row, p.u1, p.u2);
    } else {
        tk_by_select(li, row, p.u1, p.u2);
    }
}

// topk_rows_rank: the same op for a few rows of at most TK_SORT columns (a decode step's indexer:
// one row, whose one workgroup sorting it alone left the GPU idle, 24 µs on an H200). The row's
// columns are split over workgroups of TR_COLS each; every workgroup reads the whole row in tiles
// of TK_THREADS keys and ranks its columns by counting the finite keys before each (keys are
// unique: the column breaks ties), so column j goes to slot rank(j) where that is below k.
// Workgroup 0 of a row also writes −1 into the slots past the row's finite count. Thread li ranks
// column x·TR_COLS + li % TR_COLS against part li / TR_COLS of each tile (TR_SPLIT parts).
// Grid (⌈m / TR_COLS⌉, n) workgroups of TK_THREADS; the uniforms are topk_rows'.
const TR_COLS: u32 = 64u;
const TR_SPLIT: u32 = TK_THREADS / TR_COLS;
// per column of the workgroup: finite keys before it (the parts' counts summed)
var<workgroup> tr_rank: array<atomic<u32>, TR_COLS>;
// finite keys of the row (the parts' counts summed)
var<workgroup> tr_finite: atomic<u32>;

@compute @workgroup_size(TK_THREADS, 1, 1)
fn topk_rows_rank(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = wg.y; // uniform across the workgroup
    let m = p.u1;
    let k = p.u2;
    if (row >= p.u0) { return; }
    let e = li % TR_COLS;
    let part = li / TR_COLS;
    let j = wg.x * TR_COLS + e;
    var h = TK_LAST;
    if (j < m) { h = tk_key_hi(a[row * m + j]); }
    if (li < TR_COLS) { atomicStore(&tr_rank[li], 0u); }
    if (li == 0u) { atomicStore(&tr_finite, 0u); }
    var before = 0u;
    var finite = 0u;
    for (var t0 = 0u; t0 < m; t0 += TK_THREADS) {
        workgroupBarrier(); // the previous tile read
        var th = TK_LAST;
        if (t0 + li < m) { th = tk_key_hi(a[row * m + t0 + li]); }
        tk_hi[li] = th;
        workgroupBarrier();
        for (var c = part * TR_COLS; c < (part + 1u) * TR_COLS; c++) {
            let ch = tk_hi[c];
            if (ch != TK_LAST) {
                finite += 1u;
                before += select(0u, 1u, tk_less(ch, t0 + c, h, j));
            }
        }
    }
    workgroupBarrier(); // the counters zeroed (with no tile at all)
    atomicAdd(&tr_rank[e], before);
    if (e == 0u) { atomicAdd(&tr_finite, finite); }
    workgroupBarrier();
    let rank = atomicLoad(&tr_rank[e]);
    if (part == 0u && h != TK_LAST && rank < k) {
        iout[row * k + rank] = i32(j);
    }
    if (wg.x == 0u) {
        for (var s = atomicLoad(&tr_finite) + li; s < k; s += TK_THREADS) { iout[row * k + s] = -1; }
    }
}

// sink_attention: a = q [n, heads·hd], b = kv [m, hd], c = comp [c, hd], ia = window [n, 2],
// ib = comp_idx [n, kk], comb = sinks [heads] → out [n, heads·hd]; one workgroup of SA_THREADS
// per (query, head). Key j of a query is window row lo + j for j < nwin, then compressed slot
// j − nwin (a −1 slot is no key). The keys go through in tiles of SA_TILE: a thread per key takes
// its logit (a serial dot over hd), thread 0 folds the max and then the denominator serially in
// key order, and each thread sums its own output dims over the keys in order; every value thus
// has the reference's (and the former one-thread-per-head kernel's) summation order. A thread's
// output dims (e = li + SA_THREADS·q, q < SA_DIMS: hd ≤ 1024, lm.rs checks) are summed in
// registers and written once (summed in place in `out`, each key's addition was a global-memory
// round trip). Past one
// tile the logits are taken again in each of the three passes (max, denominator, weighted sum).
// A window or compressed index out of range gives a NaN head (never an out-of-bounds read).
// Thread 0's loops grow with the keys (≈ 2 a key for its folds, ⌈hd/64⌉ + 3 for the values, the
// logits again per pass past one tile): the lane bounds them on software adapters (lm.rs,
// workgroup_attention_iterations), where lavapipe's loop limiter would cut them short.
//   u0 = n·heads, u1 = heads, u2 = hd, u3 = m, u4 = kk, u5 = c rows, u6 = 1/√hd
const SA_THREADS: u32 = 64u;
const SA_TILE: u32 = 1024u;
const SA_DIMS: u32 = 16u;
// per key of the tile: its logit, then exp(logit − max), then its weight
var<workgroup> sa_w: array<f32, SA_TILE>;
// per key of the tile: its row in kv (window keys) or comp (compressed keys), −1 for no key
var<workgroup> sa_row: array<i32, SA_TILE>;
var<workgroup> sa_bad_any: atomic<u32>;
var<workgroup> sa_bad: u32;
var<workgroup> sa_mx: f32;
var<workgroup> sa_den: f32;

fn sa_logit(qo: u32, key: u32, from_comp: bool) -> f32 {
    var s = 0.0;
    if (from_comp) {
        for (var e = 0u; e < p.u2; e++) { s += a[qo + e] * c[key * p.u2 + e]; }
    } else {
        for (var e = 0u; e < p.u2; e++) { s += a[qo + e] * b[key * p.u2 + e]; }
    }
    return s * bitcast<f32>(p.u6);
}

// Pair x = i·heads + h of sink_attention: its query i, head h, the offset of its q (and of its
// output) row, and its window's inclusive bounds.
struct SaPair {
    i: u32,
    h: u32,
    qo: u32,
    lo: i32,
    hi: i32,
}

// Whether the pair's window is non-empty and reaches outside kv's m rows (a NaN head).
fn sa_window_bad(pair: SaPair) -> bool {
    return pair.lo <= pair.hi && (pair.lo < 0 || pair.hi >= i32(p.u3));
}

fn sa_pair(x: u32) -> SaPair {
    let i = x / p.u1;
    let h = x % p.u1;
    return SaPair(i, h, i * p.u1 * p.u2 + h * p.u2, ia[2u * i], ia[2u * i + 1u]);
}

// acc plus wgt times the value row `row` (of comp when from_comp, else of kv) at the thread's
// dims e = li + SA_THREADS·q (the loops over q stop where e passes hd, as a loop over e would).
fn sa_add_value(acc: array<f32, SA_DIMS>, li: u32, row: u32, from_comp: bool, wgt: f32) -> array<f32, SA_DIMS> {
    var sum = acc;
    let vo = row * p.u2 + li;
    if (from_comp) {
        for (var q = 0u; q < SA_DIMS; q++) {
            if (li + q * SA_THREADS >= p.u2) { break; }
            sum[q] += wgt * c[vo + q * SA_THREADS];
        }
    } else {
        for (var q = 0u; q < SA_DIMS; q++) {
            if (li + q * SA_THREADS >= p.u2) { break; }
            sum[q] += wgt * b[vo + q * SA_THREADS];
        }
    }
    return sum;
}

// The thread's dims of acc into out[at + e].
fn sa_store(at: u32, li: u32, acc: array<f32, SA_DIMS>) {
    for (var q = 0u; q < SA_DIMS; q++) {
        if (li + q * SA_THREADS >= p.u2) { break; }
        out[at + li + q * SA_THREADS] = acc[q];
    }
}

// The tile's weights before normalising, exp(logit − mx), in place in sa_w (a thread per key;
// keys without a row untouched).
fn sa_tile_exp(li: u32, len: u32, mx: f32) {
    for (var j = li; j < len; j += SA_THREADS) {
        if (sa_row[j] >= 0) { sa_w[j] = exp(sa_w[j] - mx); }
    }
}

// Rows and logits of the tile's keys t0..t0 + len into sa_row / sa_w, a thread per key.
fn sa_tile_logits(li: u32, i: u32, qo: u32, lo: i32, nwin: u32, t0: u32, len: u32) {
    for (var j = li; j < len; j += SA_THREADS) {
        let key = t0 + j;
        var row = lo + i32(key);
        if (key >= nwin) {
            row = ib[i * p.u4 + key - nwin];
        }
        sa_row[j] = row;
        if (row >= 0) {
            sa_w[j] = sa_logit(qo, u32(row), key >= nwin);
        }
    }
}

@compute @workgroup_size(SA_THREADS, 1, 1)
fn sink_attention(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) li: u32) {
    let x = wg.y * nwg.x + wg.x; // uniform across the workgroup
    if (x >= p.u0) { return; }
    let pair = sa_pair(x);
    let i = pair.i;
    let hd = p.u2;
    let kk = p.u4;
    let qo = pair.qo;
    let lo = pair.lo;
    let hi = pair.hi;
    if (li == 0u) {
        atomicStore(&sa_bad_any, select(0u, 1u, sa_window_bad(pair)));
    }
    workgroupBarrier();
    for (var s = li; s < kk; s += SA_THREADS) {
        let e = ib[i * kk + s];
        if (e < -1 || e >= i32(p.u5)) {
            atomicStore(&sa_bad_any, 1u);
        }
    }
    workgroupBarrier();
    if (li == 0u) {
        sa_bad = atomicLoad(&sa_bad_any);
    }
    if (workgroupUniformLoad(&sa_bad) != 0u) {
        for (var e = li; e < hd; e += SA_THREADS) { out[qo + e] = nan(); }
        return;
    }
    let nwin = u32(max(hi - lo + 1, 0));
    let nkeys = nwin + kk;
    let one_tile = nkeys <= SA_TILE;
    let sink = comb[pair.h];
    // pass 1: the max, sink first, then the keys in order
    var mx = sink;
    for (var t0 = 0u; t0 < nkeys; t0 += SA_TILE) {
        let len = min(SA_TILE, nkeys - t0);
        sa_tile_logits(li, i, qo, lo, nwin, t0, len);
        workgroupBarrier();
        if (li == 0u) {
            for (var j = 0u; j < len; j++) {
                if (sa_row[j] >= 0) { mx = max(mx, sa_w[j]); }
            }
        }
        workgroupBarrier();
    }
    if (li == 0u) {
        sa_mx = mx;
    }
    mx = workgroupUniformLoad(&sa_mx);
    // pass 2: the exponentials in parallel, their sum (after the sink's) in key order by thread 0
    var den = exp(sink - mx);
    for (var t0 = 0u; t0 < nkeys; t0 += SA_TILE) {
        let len = min(SA_TILE, nkeys - t0);
        if (!one_tile) {
            sa_tile_logits(li, i, qo, lo, nwin, t0, len);
            workgroupBarrier();
        }
        sa_tile_exp(li, len, mx);
        workgroupBarrier();
        if (li == 0u) {
            for (var j = 0u; j < len; j++) {
                if (sa_row[j] >= 0) { den += sa_w[j]; }
            }
        }
        workgroupBarrier();
    }
    if (li == 0u) {
        sa_den = den;
    }
    den = workgroupUniformLoad(&sa_den);
    // pass 3: the weights, then each thread's dims e = li + SA_THREADS·q summed over the keys
    // in acc[q] (the loops over q stop where e passes hd, as a loop over e would)
    var acc: array<f32, SA_DIMS>;
    for (var t0 = 0u; t0 < nkeys; t0 += SA_TILE) {
        let len = min(SA_TILE, nkeys - t0);
        if (!one_tile) {
            sa_tile_logits(li, i, qo, lo, nwin, t0, len);
            workgroupBarrier();
            sa_tile_exp(li, len, mx);
        }
        for (var j = li; j < len; j += SA_THREADS) {
            if (sa_row[j] >= 0) { sa_w[j] = sa_w[j] / den; }
        }
        workgroupBarrier();
        // each key's weight and row read once, its value added to the thread's dims in out
        for (var j = 0u; j < len; j++) {
            let row = sa_row[j];
            if (row < 0) { continue; }
            acc = sa_add_value(acc, li, u32(row), t0 + j >= nwin, sa_w[j]);
        }
        workgroupBarrier();
    }
    sa_store(qo, li, acc);
}

// sink_attention_part + sink_attention_merge: the same op split over keys, for few (query, head)
// pairs (a decode step: one query of every head is too few workgroups to fill a GPU, each
// folding its several hundred keys alone). Every head of a query reads the same keys (one shared
// latent), so a workgroup takes SP_HEADS heads of one query and part s of its keys,
// s·SP_KEYS .. (s + 1)·SP_KEYS, and reads each key row once for all of them (a workgroup per
// head read them once a head: 64 times the traffic at the model's 64 heads). For each of its
// heads the part writes a record into `out`: its keys' max logit m_s (one thread a head, key
// order), their exponentials e_j = exp(logit_j − m_s) and sum l_s (one thread a head, key order),
// and each output dim summed over them, Σ_j e_j·v_j: [m_s, l_s, bad, 0, the hd sums] (hd + 4
// words; l_s = 0: the part has no key). The merge takes M = max(sink, the m_s),
// den = exp(sink − M) + Σ_s exp(m_s − M)·l_s and each dim Σ_s exp(m_s − M)·sum_s / den, in part
// order: the reference's softmax with its sums regrouped by part. A window or compressed index
// out of range gives a NaN head, as above.
// A decode step has a few dozen of these workgroups, one or two a multiprocessor: nothing hides a
// load's latency but the loads in flight within each thread, so every load loop has a fixed trip
// count and fills registers before their values are used. The logits are dots over hd taken
// SP_CHUNK dims at a time through workgroup memory, the next chunk's loads issued before this
// chunk's products; the values go SP_BATCH keys at a time, their rows loaded together.
// sink_attention_part: a = q, b = kv, c = comp, ia = window, ib = comp_idx → out = the records,
//   [n·heads, parts, hd + 4]; grid (n·⌈heads / SP_HEADS⌉, parts) workgroups of SP_THREADS;
//   u0 = n·heads, u1 = heads, u2 = hd, u3 = m, u4 = kk, u5 = c rows, u6 = 1/√hd, u7 = parts
const SP_HEADS: u32 = 8u;
// The keys of a part: a pipeline-override constant, sink_attention_heads' 64 by default and
// sink_attention_part's lm.rs SINK_ATTENTION_PART_KEYS (32: a decode step's few workgroups then
// hold fewer keys each, and there are more of them; on an H100 the parts took 30 µs against 47
// with 64, the merge then 22.5 against 17 (14.5 since it loads each part's dims together), while
// sink_attention_heads' 4-layer prefill took 63.8 ms against 58.5). A divisor of SP_THREADS with
// SP_HEADS · SP_KEYS a multiple of it, at most SP_KEYS_MAX (the workgroup arrays' and register
// arrays' sizes).
override SP_KEYS: u32 = 64u;
const SP_KEYS_MAX: u32 = 64u;
const SP_THREADS: u32 = 256u;
// dims of a chunk: a thread loads one query value of the chunk (SP_HEADS · SP_CHUNK = SP_THREADS)
const SP_CHUNK: u32 = 32u;
// key values of a chunk a thread loads: rows li / SP_CHUNK + SP_KSTEP·t, dim li % SP_CHUNK
override SP_KLOADS: u32 = SP_KEYS * SP_CHUNK / SP_THREADS;
const SP_KLOADS_MAX: u32 = SP_KEYS_MAX * SP_CHUNK / SP_THREADS;
const SP_KSTEP: u32 = SP_THREADS / SP_CHUNK;
// logits a thread takes: key li % SP_KEYS, heads li / SP_KEYS + SP_HSTEP·t
override SP_LOGITS: u32 = SP_HEADS * SP_KEYS / SP_THREADS;
const SP_LOGITS_MAX: u32 = SP_HEADS * SP_KEYS_MAX / SP_THREADS;
override SP_HSTEP: u32 = SP_THREADS / SP_KEYS;
// keys a value batch loads
const SP_BATCH: u32 = 8u;
// the chunk of the part's key rows, [SP_KEYS][SP_CHUNK + 1] (a padded row: the threads of a
// subgroup read consecutive keys' same dim)
var<workgroup> sp_k: array<f32, SP_KEYS_MAX * (SP_CHUNK + 1u)>;
// the chunk of the heads' queries, [SP_HEADS][SP_CHUNK]
var<workgroup> sp_q: array<f32, SP_HEADS * SP_CHUNK>;
// [SP_HEADS][SP_KEYS]: the logits, then their exponentials (0 for no key)
var<workgroup> sp_w: array<f32, SP_HEADS * SP_KEYS_MAX>;
// per key of the part: its row in kv (window keys) or comp (compressed keys), −1 for no key
var<workgroup> sp_row: array<i32, SP_KEYS_MAX>;
var<workgroup> sp_mx: array<f32, SP_HEADS>;

// Element d of key `r` of the part (r < SP_KEYS): its row's, of kv or of comp; 0 for no key or
// past hd.
fn sp_key(s: u32, nwin: u32, r: u32, d: u32) -> f32 {
    let row = sp_row[r];
    if (row < 0 || d >= p.u2) { return 0.0; }
    if (s * SP_KEYS + r >= nwin) {
        return c[u32(row) * p.u2 + d];
    }
    return b[u32(row) * p.u2 + d];
}

// Part s of the keys of the pair's query (its window rows, then its compressed slots): each
// key's row into sp_row (−1: no key; a compressed index out of range raises sa_bad_any), then
// the keys' logits against the heads of the pair's query from its head on (nh of them; its qo)
// into sp_w [SP_HEADS][SP_KEYS] (0 for a key without a row and a head past nh). Ends with a
// barrier; reads sp_row and sp_w of a part before must be behind one.
fn sp_part_logits(li: u32, pair: SaPair, window_bad: bool, nwin: u32, s: u32, nh: u32) {
    let hd = p.u2;
    let kk = p.u4;
    let i = pair.i;
    // each key's row: window row lo + key, or compressed slot key − nwin
    if (li < SP_KEYS) {
        let key = s * SP_KEYS + li;
        var row = -1;
        if (!window_bad && key < nwin + kk) {
            if (key < nwin) {
                row = pair.lo + i32(key);
            } else {
                let e = ib[i * kk + key - nwin];
                if (e < -1 || e >= i32(p.u5)) {
                    atomicStore(&sa_bad_any, 1u);
                } else {
                    row = e;
                }
            }
        }
        sp_row[li] = row;
    }
    workgroupBarrier();
    // the logits: this thread's key j against its SP_LOGITS heads, SP_CHUNK dims at a time
    let j = li % SP_KEYS;
    let hl = li / SP_KEYS;
    let col = li % SP_CHUNK;
    let qh = li / SP_CHUNK; // the head whose query value this thread loads
    var dot: array<f32, SP_LOGITS_MAX>;
    var kr: array<f32, SP_KLOADS_MAX>;
    for (var t = 0u; t < SP_KLOADS; t++) {
        kr[t] = sp_key(s, nwin, li / SP_CHUNK + SP_KSTEP * t, col);
    }
    var qr = 0.0;
    if (qh < nh && col < hd) { qr = a[pair.qo + qh * hd + col]; }
    for (var d0 = 0u; d0 < hd; d0 += SP_CHUNK) {
        for (var t = 0u; t < SP_KLOADS; t++) {
            sp_k[(li / SP_CHUNK + SP_KSTEP * t) * (SP_CHUNK + 1u) + col] = kr[t];
        }
        sp_q[li] = qr;
        workgroupBarrier();
        let next = d0 + SP_CHUNK + col;
        for (var t = 0u; t < SP_KLOADS; t++) {
            kr[t] = sp_key(s, nwin, li / SP_CHUNK + SP_KSTEP * t, next);
        }
        qr = 0.0;
        if (qh < nh && next < hd) { qr = a[pair.qo + qh * hd + next]; }
        for (var d = 0u; d < SP_CHUNK; d++) {
            let kv = sp_k[j * (SP_CHUNK + 1u) + d];
            for (var t = 0u; t < SP_LOGITS; t++) {
                dot[t] = fma(sp_q[(hl + SP_HSTEP * t) * SP_CHUNK + d], kv, dot[t]);
            }
        }
        workgroupBarrier();
    }
    for (var t = 0u; t < SP_LOGITS; t++) {
        sp_w[(hl + SP_HSTEP * t) * SP_KEYS + j] = dot[t] * bitcast<f32>(p.u6);
    }
    workgroupBarrier();
}

// acc (one sum a head of the workgroup) plus dim d of the part's keys' value rows weighted by
// their sp_w (a key without a row weighs 0 and loads 0), key order, SP_BATCH keys' loads in flight
// together. Every loop over the register arrays has a fixed trip count: one bounded by nh indexed
// them dynamically, which put them in local memory (its stores took most of sink_attention_part's
// 70 µs at a decode step on an H200).
fn sp_add_values(acc: array<f32, SP_HEADS>, s: u32, nwin: u32, d: u32) -> array<f32, SP_HEADS> {
    var sum = acc;
    for (var k0 = 0u; k0 < SP_KEYS; k0 += SP_BATCH) {
        var v: array<f32, SP_BATCH>;
        for (var kb = 0u; kb < SP_BATCH; kb++) {
            v[kb] = sp_key(s, nwin, k0 + kb, d);
        }
        for (var kb = 0u; kb < SP_BATCH; kb++) {
            for (var h = 0u; h < SP_HEADS; h++) {
                sum[h] = fma(sp_w[h * SP_KEYS + k0 + kb], v[kb], sum[h]);
            }
        }
    }
    return sum;
}

@compute @workgroup_size(SP_THREADS, 1, 1)
fn sink_attention_part(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let heads = p.u1;
    let groups = (heads + SP_HEADS - 1u) / SP_HEADS;
    let x = wg.x; // uniform across the workgroup
    let i = x / groups;
    if (i * heads >= p.u0) { return; }
    let h0 = (x % groups) * SP_HEADS;
    let nh = min(SP_HEADS, heads - h0);
    let hd = p.u2;
    let s = wg.y;
    let pair = sa_pair(i * heads + h0);
    let window_bad = sa_window_bad(pair);
    let nwin = select(u32(max(pair.hi - pair.lo + 1, 0)), 0u, window_bad);
    if (li == 0u) {
        atomicStore(&sa_bad_any, select(0u, 1u, window_bad));
    }
    workgroupBarrier();
    sp_part_logits(li, pair, window_bad, nwin, s, nh);
    // each head's max over the part's keys, in key order
    if (li < SP_HEADS) {
        var any = false;
        var mx = 0.0;
        for (var k = 0u; k < SP_KEYS; k++) {
            if (sp_row[k] >= 0) {
                let v = sp_w[li * SP_KEYS + k];
                mx = select(v, max(mx, v), any);
                any = true;
            }
        }
        sp_mx[li] = mx;
    }
    workgroupBarrier();
    for (var e = li; e < SP_HEADS * SP_KEYS; e += SP_THREADS) {
        sp_w[e] = select(0.0, exp(sp_w[e] - sp_mx[e / SP_KEYS]), sp_row[e % SP_KEYS] >= 0);
    }
    workgroupBarrier();
    let parts = p.u7;
    // each head's sum of exponentials, in key order, and its record's head
    if (li < nh) {
        var den = 0.0;
        for (var k = 0u; k < SP_KEYS; k++) {
            if (sp_row[k] >= 0) { den += sp_w[li * SP_KEYS + k]; }
        }
        let rec = ((i * heads + h0 + li) * parts + s) * (hd + 4u);
        out[rec] = sp_mx[li];
        out[rec + 1u] = den;
        out[rec + 2u] = f32(atomicLoad(&sa_bad_any));
        out[rec + 3u] = 0.0;
    }
    // the values: each block of SP_THREADS dims of hd in turn (this thread's dim d of it), every
    // head's sum in registers (sp_add_values)
    for (var d0 = 0u; d0 < hd; d0 += SP_THREADS) {
        let d = d0 + li;
        let acc = sp_add_values(array<f32, SP_HEADS>(), s, nwin, d);
        for (var h = 0u; h < SP_HEADS; h++) {
            if (h < nh && d < hd) {
                out[((i * heads + h0 + h) * parts + s) * (hd + 4u) + 4u + d] = acc[h];
            }
        }
    }
}

// The dim paired with tail dim e (t-th of the tail) in the interleaved rotation.
fn tail_pair(e: u32, t: u32) -> u32 {
    return select(e - 1u, e + 1u, (t & 1u) == 0u);
}

// out[x·hd + e] = v, or past the first hd − rd (u8) dims v rotated back with its pair's vp at the
// query's position (rope_tail_at's inverse: `rotated`).
fn merge_store(x: u32, e: u32, v: f32, vp: f32) {
    let hd = p.u2;
    if (e + p.u8 < hd) {
        out[x * hd + e] = v;
        return;
    }
    let pos = f32(u32(ia[x / p.u1]));
    out[x * hd + e] = rotated(v, vp, e + p.u8 - hd, pos, true);
}

// sink_attention_merge: a = the parts' records, comb = sinks → out [n, heads·hd]; a workgroup of
// SA_THREADS per (query, head), each thread folding the parts' scalars itself (few parts), then
// its dims of the head (e = li + SA_THREADS·j, j < SA_DIMS) summed over the parts in part order,
// each part's loads of them issued together (a loop over dims, each summing its parts behind
// conditional loads, took 22.5 µs a dispatch at a decode step on an H100, this 14.5), over the
// denominator into workgroup memory. With u8 = rd > 0 (sink_attention_rope) each head's last rd
// dims are rotated back at the query's position (b = inv_freq [rd/2], ia = positions [n]) as
// rope_tail_at's inverse rotates them, each with its pair's merged value read from there.
//   u0 = n·heads, u1 = heads, u2 = hd (≤ SA_THREADS · SA_DIMS: lm.rs), u7 = parts, u8 = rd
var<workgroup> sm_head: array<f32, SA_THREADS * SA_DIMS>;

@compute @workgroup_size(SA_THREADS, 1, 1)
fn sink_attention_merge(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let x = wg.x;
    if (x >= p.u0) { return; }
    let h = x % p.u1;
    let hd = p.u2;
    let parts = p.u7;
    let rec0 = x * parts * (hd + 4u);
    let sink = comb[h];
    var bad = false;
    var keys = false;
    var mx = sink;
    for (var s = 0u; s < parts; s++) {
        let r = rec0 + s * (hd + 4u);
        bad = bad || a[r + 2u] != 0.0;
        if (a[r + 1u] > 0.0) {
            mx = max(mx, a[r]);
            keys = true;
        }
    }
    var den = exp(sink - mx);
    for (var s = 0u; s < parts; s++) {
        let r = rec0 + s * (hd + 4u);
        if (a[r + 1u] > 0.0) { den += exp(a[r] - mx) * a[r + 1u]; }
    }
    var o: array<f32, SA_DIMS>;
    for (var s = 0u; s < parts; s++) {
        let r = rec0 + s * (hd + 4u);
        let has = a[r + 1u] > 0.0;
        let f = exp(a[r] - mx);
        var v: array<f32, SA_DIMS>;
        for (var j = 0u; j < SA_DIMS; j++) {
            v[j] = a[r + 4u + min(li + j * SA_THREADS, hd - 1u)];
        }
        if (has) {
            for (var j = 0u; j < SA_DIMS; j++) {
                o[j] += f * v[j];
            }
        }
    }
    for (var j = 0u; j < SA_DIMS; j++) {
        let e = li + j * SA_THREADS;
        if (e < hd) { sm_head[e] = o[j] / den; }
    }
    workgroupBarrier();
    // no key: zeros, as the reference's empty sum (whatever the sink, −inf included)
    let none = bad || !keys;
    let z = select(0.0, nan(), bad);
    for (var e = li; e < hd; e += SA_THREADS) {
        var vp = 0.0;
        if (e + p.u8 >= hd) {
            vp = sm_head[tail_pair(e, e + p.u8 - hd)];
        }
        if (none) {
            merge_store(x, e, z, z);
        } else {
            merge_store(x, e, sm_head[e], vp);
        }
    }
}

// sink_attention_heads: the same op for many (query, head) pairs (a prefill chunk), a workgroup
// per (query, SP_HEADS heads) where sink_attention takes one per pair: every head of a query
// reads the same keys (one shared latent), and a workgroup a head read each key row once a head
// (64 times at the model's 64 heads: on an H100 under Vulkan the op took 48 % of a 4 096-token
// prefill). The workgroup goes through its query's keys in parts of SP_KEYS, taking each part's
// rows and logits as sink_attention_part does (sp_part_logits), and folds each part into every
// head's running max M, denominator and output sums (online softmax): M starts at the sink and
// the denominator at exp(sink − M) = 1 (0 for a −inf sink); a part raises M to M' = max(M, its
// logits), scales what is summed so far by exp(M − M'), and adds its exp(logit − M') (one thread
// a head, key order) and their value rows (each thread its dims of hd, as in
// sink_attention_part). The output is the sums over the denominator; zeros for a query without
// keys whatever the sink (the reference's empty sum); a NaN head for an index out of range. A
// −inf sink adds no term (told by its bits); other non-finite values get whatever the device's
// arithmetic gives (WGSL lets it assume there are none).
// Grid of ceil(n·⌈heads / SP_HEADS⌉) workgroups of SP_THREADS (2-D); the uniforms are
// sink_attention's.
// the blocks of SP_THREADS dims a thread sums (hd ≤ SH_BLOCKS · SP_THREADS = 1 024: lm.rs checks)
const SH_BLOCKS: u32 = 4u;
// per head of the workgroup: the running max, denominator, and the part's rescale exp(M − M')
var<workgroup> sh_m: array<f32, SP_HEADS>;
var<workgroup> sh_den: array<f32, SP_HEADS>;
var<workgroup> sh_scale: array<f32, SP_HEADS>;
// whether any part had a key (thread 0's)
var<workgroup> sh_keys: u32;

@compute @workgroup_size(SP_THREADS, 1, 1)
fn sink_attention_heads(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_index) li: u32) {
    let heads = p.u1;
    let groups = (heads + SP_HEADS - 1u) / SP_HEADS;
    let x = wg.y * nwg.x + wg.x; // uniform across the workgroup
    let i = x / groups;
    if (i * heads >= p.u0) { return; }
    let h0 = (x % groups) * SP_HEADS;
    let nh = min(SP_HEADS, heads - h0);
    let hd = p.u2;
    let pair = sa_pair(i * heads + h0);
    let window_bad = sa_window_bad(pair);
    let nwin = select(u32(max(pair.hi - pair.lo + 1, 0)), 0u, window_bad);
    let parts = (nwin + p.u4 + SP_KEYS - 1u) / SP_KEYS;
    if (li == 0u) {
        atomicStore(&sa_bad_any, select(0u, 1u, window_bad));
        sh_keys = 0u;
    }
    if (li < nh) {
        let sink = comb[h0 + li];
        sh_m[li] = sink;
        // the sink's term exp(sink − M) at M = sink: 1, none for −inf
        sh_den[li] = select(1.0, 0.0, !is_finite(sink) && sink < 0.0);
    }
    var acc: array<array<f32, SP_HEADS>, SH_BLOCKS>;
    for (var s = 0u; s < parts; s++) {
        workgroupBarrier();
        sp_part_logits(li, pair, window_bad, nwin, s, nh);
        // each head's new max over the part's keys (key order) and the rescale of its sums
        if (li < nh) {
            let m0 = sh_m[li];
            var mx = m0;
            for (var k = 0u; k < SP_KEYS; k++) {
                if (sp_row[k] >= 0) { mx = max(mx, sp_w[li * SP_KEYS + k]); }
            }
            sh_scale[li] = select(exp(m0 - mx), 1.0, m0 == mx);
            sh_m[li] = mx;
        }
        if (li == 0u) {
            for (var k = 0u; k < SP_KEYS; k++) {
                if (sp_row[k] >= 0) { sh_keys = 1u; }
            }
        }
        workgroupBarrier();
        for (var e = li; e < SP_HEADS * SP_KEYS; e += SP_THREADS) {
            let h = e / SP_KEYS;
            sp_w[e] = select(0.0, exp(sp_w[e] - sh_m[min(h, nh - 1u)]), h < nh && sp_row[e % SP_KEYS] >= 0);
        }
        workgroupBarrier();
        if (li < nh) {
            var den = sh_den[li] * sh_scale[li];
            for (var k = 0u; k < SP_KEYS; k++) {
                if (sp_row[k] >= 0) { den += sp_w[li * SP_KEYS + k]; }
            }
            sh_den[li] = den;
        }
        // every head's sums of this thread's dims, rescaled, plus the part's weighted values
        // (fixed trip counts: the sums stay in registers)
        for (var blk = 0u; blk < SH_BLOCKS; blk++) {
            if (blk * SP_THREADS < hd) {
                var scaled = acc[blk];
                for (var h = 0u; h < SP_HEADS; h++) { scaled[h] *= sh_scale[min(h, nh - 1u)]; }
                acc[blk] = sp_add_values(scaled, s, nwin, blk * SP_THREADS + li);
            }
        }
    }
    workgroupBarrier();
    let bad = atomicLoad(&sa_bad_any) != 0u;
    let keys = sh_keys != 0u;
    for (var h = 0u; h < SP_HEADS; h++) {
        if (h >= nh) { break; }
        let den = sh_den[h];
        for (var blk = 0u; blk < SH_BLOCKS; blk++) {
            let d = blk * SP_THREADS + li;
            if (d < hd) {
                let o = select(0.0, acc[blk][h] / den, keys);
                out[pair.qo + h * hd + d] = select(o, nan(), bad);
            }
        }
    }
}

// sink_attention_serial: the same op, one thread per (query, head) making the three passes alone
// (max, denominator, weighted sum, in the same order). The lane runs it on software adapters
// (lavapipe), which run a workgroup's barriers and serial folds far slower than this: a decode
// step's op took 27 ms this way against 350 ms in workgroups there, while on an H200's Vulkan the
// workgroups took one layer's decode step from 173 to 24 ms (with the top-k's sort). A thread
// here loops (m + kk)·(4·hd + 3) times at most, and lavapipe silently ends an invocation's loops
// past 65 535 iterations: the lane runs this kernel only where that bound stays within its
// budget (mod.rs, SOFTWARE_LOOP_BUDGET). Grid of ceil(u0 / 64) workgroups of 64; the uniforms are
// sink_attention's.
@compute @workgroup_size(64, 1, 1)
fn sink_attention_serial(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) li: u32) {
    let x = (wg.y * nwg.x + wg.x) * 64u + li;
    if (x >= p.u0) { return; }
    let pair = sa_pair(x);
    let i = pair.i;
    let hd = p.u2;
    let kk = p.u4;
    let qo = pair.qo;
    let lo = pair.lo;
    let hi = pair.hi;
    var bad = sa_window_bad(pair);
    for (var s = 0u; s < kk; s++) {
        let e = ib[i * kk + s];
        bad = bad || e < -1 || e >= i32(p.u5);
    }
    if (bad) {
        for (var e = 0u; e < hd; e++) { out[qo + e] = nan(); }
        return;
    }
    let nwin = u32(max(hi - lo + 1, 0));
    let sink = comb[pair.h];
    var mx = sink;
    for (var j = 0u; j < nwin; j++) { mx = max(mx, sa_logit(qo, u32(lo) + j, false)); }
    for (var s = 0u; s < kk; s++) {
        let e = ib[i * kk + s];
        if (e >= 0) { mx = max(mx, sa_logit(qo, u32(e), true)); }
    }
    var den = exp(sink - mx);
    for (var j = 0u; j < nwin; j++) { den += exp(sa_logit(qo, u32(lo) + j, false) - mx); }
    for (var s = 0u; s < kk; s++) {
        let e = ib[i * kk + s];
        if (e >= 0) { den += exp(sa_logit(qo, u32(e), true) - mx); }
    }
    for (var e = 0u; e < hd; e++) { out[qo + e] = 0.0; }
    for (var j = 0u; j < nwin; j++) {
        let key = u32(lo) + j;
        let wgt = exp(sa_logit(qo, key, false) - mx) / den;
        for (var e = 0u; e < hd; e++) { out[qo + e] += wgt * b[key * hd + e]; }
    }
    for (var s = 0u; s < kk; s++) {
        let ei = ib[i * kk + s];
        if (ei < 0) { continue; }
        let key = u32(ei);
        let wgt = exp(sa_logit(qo, key, true) - mx) / den;
        for (var e = 0u; e < hd; e++) { out[qo + e] += wgt * c[key * hd + e]; }
    }
}

// moe_sum: a = y [n·k, d], b = weights [n, k], ia = ids → out [n, d] = Σ_s weights_s · y_s (slot
// order); a slot whose id is outside 0..experts makes the element NaN.
//   u0 = n·d, u1 = d, u2 = k, u3 = experts
@compute @workgroup_size(256, 1, 1)
fn moe_sum(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) li: u32) {
    let x = flat(wg, nwg, li);
    if (x >= p.u0) { return; }
    let i = x / p.u1;
    let o = x % p.u1;
    var s = 0.0;
    for (var q = 0u; q < p.u2; q++) {
        let id = ia[i * p.u2 + q];
        if (id < 0 || u32(id) >= p.u3) {
            out[x] = nan();
            return;
        }
        s += b[i * p.u2 + q] * a[(i * p.u2 + q) * p.u1 + o];
    }
    out[x] = s;
}
