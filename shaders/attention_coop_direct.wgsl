// attention (non-causal, flash style) on cooperative matrices, fast precision: in
// attention_coop_direct with no workgroup staging of keys and values (a kernel that staged them
// element by element, retired in the twenty-eighth sitting, was 3× slower on an H200), in
// attention_coop_wide (at the end) with them staged by 16-byte copies: q, k, v [n, heads·64] →
// out [n, heads·64], scale 1/8: head dim 64 only (the ViT's). Built only on an adapter whose
// cooperative tiles the lane uses (16×16×16 f16 →
// f32, subgroups of exactly 32: 2 per workgroup).
// q, k and v come as f16 copies (half_rows.wgsl: each value rounded once), their rows padded with
// zeros to a multiple of 64 (`rows`), so the matrix loads read them straight from the buffers, in
// bounds, with no workgroup staging; the probabilities are rounded once to f16; the products and
// every sum are f32 (the same rounding as the CUDA lane's tensor-core attention).
// One workgroup per (block of 64 queries, head): dispatch (rows/64, heads, 1). Subgroup s owns
// queries 32·s.., two blocks of 16 that share each K and V matrix load (on an H100 the 1920×1080
// image's attention took 48.3 ms with 32 queries a subgroup against 54.3 with 16: twenty-ninth
// sitting), and walks every key in tiles of 64 with an online softmax (running max m, running sum
// l per query); the subgroups share nothing but the cache that serves their loads of a key tile.
// Per tile, in the subgroup's own workgroup memory: S = Q·Kᵀ (for each block of 16 keys, the four
// K matrices times each query block's four Q matrices, held in registers for the whole walk)
// stored row-major; the softmax by its lanes (`softmax_step`: lane l takes query l/2 of each
// block, the keys of parity l%2, its partner lane l^1 met by a shuffle); P as f16; P·V (each
// block of 16 columns: four V matrices times each query block's four P matrices) stored where S
// was; each lane then rescales its output columns (parity l%2) by the step's factor and adds the
// tile's P·V. The softmax works in log2 units (the scale times log2 e folded into one product,
// exp2), reads each score once into registers, masks only the last tile (a key at or past n
// scores NEG: its exp2 underflows to 0 or, within exp2's error, to below 2^-25, which
// round_probability takes to 0) and rounds the probabilities without a branch; these four took
// the image's attention from 84.1 ms (d23) to 54.3–54.6 (d23, d24) on the H100. P·V kept in
// cooperative accumulators across the walk, rescaled through workgroup memory only when a row's
// max moved by more than 2^8, measured slower (60.8 ms; its uniform flag costs a barrier a
// tile), as did V read from a transposed copy (65.2).
// Workgroup memory: per subgroup S-then-P·V [32][68] f32 and P [32][72] f16, rows padded by 16
// bytes (starts stay 16-byte aligned; a lane's reads walk its row with its partner a word apart):
// 26 KiB (attention.rs `DIRECT_SHARED_BYTES`), within Metal's and DX12's 32 KiB.

struct P {
    n: u32,
    heads: u32,
    hd: u32,
    scale: f32,
    // padding: every dispatch pushes 16 words (mod.rs, PARAM_BYTES)
    _p4: u32, _p5: u32, _p6: u32, _p7: u32, _p8: u32, _p9: u32,
    _p10: u32, _p11: u32, _p12: u32, _p13: u32, _p14: u32, _p15: u32,
}

var<immediate> p: P; // the dispatch's immediate data (mod.rs, PARAM_BYTES)
@group(0) @binding(1) var<storage, read> q: array<f16>; // [rows, heads·64]
@group(0) @binding(2) var<storage, read> k: array<f16>;
@group(0) @binding(3) var<storage, read> v: array<f16>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>; // [n, heads·64]

const HD: u32 = 64u;
const BKEY: u32 = 64u;
const SUBGROUPS: u32 = 2u;
const QROWS: u32 = 32u; // the queries of a subgroup: two blocks of 16 sharing each K and V load
const S_STRIDE: u32 = 68u;
const P_STRIDE: u32 = 72u;
const NEG: f32 = -1.0e30;
const LOG2_E: f32 = 1.4426950408889634;

var<workgroup> sw: array<f32, SUBGROUPS * QROWS * S_STRIDE>; // [subgroup][32][S_STRIDE]
var<workgroup> pw: array<f16, SUBGROUPS * QROWS * P_STRIDE>; // [subgroup][32][P_STRIDE]

// A probability (0 ≤ v ≤ 1) rounded to the nearest f16, ties to even: operands_fast.wgsl's
// round_to_f16 for that range (its normal and subnormal paths, chosen without a branch; its inf
// and overflow cases cannot occur), so P is what the other fast kernels' rounding gives.
fn round_probability(v: f32) -> f32 {
    let u = bitcast<u32>(v);
    let normal = bitcast<f32>((u + 0xfffu + ((u >> 13u) & 1u)) & 0xffffe000u);
    let subnormal = round(v * 16777216.0) * 5.9604644775390625e-8;
    return select(subnormal, normal, u >= 0x38800000u);
}

// One query's online-softmax step over a tile (this lane: the keys of parity `par`, its partner
// lane the others): reads its scores at sw[row..], writes its probabilities at pw[prow..], moves
// the running max m (log2 units) and sum l, and returns the factor the query's output is rescaled
// by, exp2(m_old − m_new) (0 on the first tile, where m_old is NEG).
fn softmax_step(row: u32, prow: u32, par: u32, k0: u32, scale2: f32, m: ptr<function, f32>,
                l: ptr<function, f32>) -> f32 {
    var s: array<f32, 32>;
    if (k0 + BKEY <= p.n) {
        for (var j = 0u; j < 32u; j++) {
            s[j] = sw[row + 2u * j + par] * scale2;
        }
    } else {
        for (var j = 0u; j < 32u; j++) {
            s[j] = select(NEG, sw[row + 2u * j + par] * scale2, k0 + 2u * j + par < p.n);
        }
    }
    var mx = s[0];
    for (var j = 1u; j < 32u; j++) {
        mx = max(mx, s[j]);
    }
    let mt = max(*m, max(mx, subgroupShuffleXor(mx, 1u)));
    var sum = 0.0;
    for (var j = 0u; j < 32u; j++) {
        let rounded = round_probability(exp2(s[j] - mt));
        pw[prow + 2u * j + par] = f16(rounded); // exact: already an f16 value
        sum += rounded; // the weights P·V uses
    }
    let alpha = exp2(*m - mt);
    *m = mt;
    *l = *l * alpha + sum + subgroupShuffleXor(sum, 1u);
    return alpha;
}

@compute @workgroup_size(64, 1, 1)
fn attention_coop_direct(@builtin(workgroup_id) wg: vec3<u32>, @builtin(subgroup_id) sg: u32,
                  @builtin(subgroup_invocation_id) lane: u32) {
    let cols = p.heads * HD;
    let head = wg.y * HD;
    let q0 = wg.x * (QROWS * SUBGROUPS) + QROWS * sg; // the subgroup's first query
    let r = lane / 2u;    // this lane's query in each block of 16
    let par = lane % 2u;  // its keys of a tile and its output columns: 2·j + par
    let s_base = sg * QROWS * S_STRIDE;
    let p_base = sg * QROWS * P_STRIDE;
    let second_s = 16u * S_STRIDE; // the second block's rows
    let second_p = 16u * P_STRIDE;

    // A = Q rows q0.. (qa) and q0 + 16.. (qb), head dims 16·d.. (row-major, a row `cols` apart)
    let q_at = q0 * cols + head;
    let q_second = q_at + 16u * cols;
    let qa0 = coopLoadT<coop_mat16x16<f16, A>>(&q[q_at], cols);
    let qa1 = coopLoadT<coop_mat16x16<f16, A>>(&q[q_at + 16u], cols);
    let qa2 = coopLoadT<coop_mat16x16<f16, A>>(&q[q_at + 32u], cols);
    let qa3 = coopLoadT<coop_mat16x16<f16, A>>(&q[q_at + 48u], cols);
    let qb0 = coopLoadT<coop_mat16x16<f16, A>>(&q[q_second], cols);
    let qb1 = coopLoadT<coop_mat16x16<f16, A>>(&q[q_second + 16u], cols);
    let qb2 = coopLoadT<coop_mat16x16<f16, A>>(&q[q_second + 32u], cols);
    let qb3 = coopLoadT<coop_mat16x16<f16, A>>(&q[q_second + 48u], cols);

    let scale2 = p.scale * LOG2_E;
    var o: array<f32, 32>; // output columns 2·j + par of query q0 + r
    var o2: array<f32, 32>; // and of query q0 + 16 + r
    var m = NEG;
    var m2 = NEG;
    var l = 0.0;
    var l2 = 0.0;
    let row = s_base + r * S_STRIDE;
    let prow = p_base + r * P_STRIDE;

    for (var k0 = 0u; k0 < p.n; k0 += BKEY) {
        // S (B = Kᵀ: (d, key) at k[key·cols + head + d], column-major), 16 keys a block
        for (var j = 0u; j < 4u; j++) {
            let k_at = (k0 + 16u * j) * cols + head;
            let kb0 = coopLoad<coop_mat16x16<f16, B>>(&k[k_at], cols);
            let kb1 = coopLoad<coop_mat16x16<f16, B>>(&k[k_at + 16u], cols);
            let kb2 = coopLoad<coop_mat16x16<f16, B>>(&k[k_at + 32u], cols);
            let kb3 = coopLoad<coop_mat16x16<f16, B>>(&k[k_at + 48u], cols);
            var acc = coop_mat16x16<f32, C>();
            acc = coopMultiplyAdd(qa0, kb0, acc);
            acc = coopMultiplyAdd(qa1, kb1, acc);
            acc = coopMultiplyAdd(qa2, kb2, acc);
            acc = coopMultiplyAdd(qa3, kb3, acc);
            coopStoreT(acc, &sw[s_base + 16u * j], S_STRIDE);
            var acc2 = coop_mat16x16<f32, C>();
            acc2 = coopMultiplyAdd(qb0, kb0, acc2);
            acc2 = coopMultiplyAdd(qb1, kb1, acc2);
            acc2 = coopMultiplyAdd(qb2, kb2, acc2);
            acc2 = coopMultiplyAdd(qb3, kb3, acc2);
            coopStoreT(acc2, &sw[s_base + second_s + 16u * j], S_STRIDE);
        }
        workgroupBarrier();
        let alpha = softmax_step(row, prow, par, k0, scale2, &m, &l);
        let alpha2 = softmax_step(row + second_s, prow + second_p, par, k0, scale2, &m2, &l2);
        workgroupBarrier();
        // P·V (A = P row-major; B = V: (key, c) at v[key·cols + head + c], row-major)
        let pa0 = coopLoadT<coop_mat16x16<f16, A>>(&pw[p_base], P_STRIDE);
        let pa1 = coopLoadT<coop_mat16x16<f16, A>>(&pw[p_base + 16u], P_STRIDE);
        let pa2 = coopLoadT<coop_mat16x16<f16, A>>(&pw[p_base + 32u], P_STRIDE);
        let pa3 = coopLoadT<coop_mat16x16<f16, A>>(&pw[p_base + 48u], P_STRIDE);
        let pb0 = coopLoadT<coop_mat16x16<f16, A>>(&pw[p_base + second_p], P_STRIDE);
        let pb1 = coopLoadT<coop_mat16x16<f16, A>>(&pw[p_base + second_p + 16u], P_STRIDE);
        let pb2 = coopLoadT<coop_mat16x16<f16, A>>(&pw[p_base + second_p + 32u], P_STRIDE);
        let pb3 = coopLoadT<coop_mat16x16<f16, A>>(&pw[p_base + second_p + 48u], P_STRIDE);
        let v_at = k0 * cols + head;
        let key16 = 16u * cols;
        for (var c = 0u; c < 4u; c++) {
            let at = v_at + 16u * c;
            let vb0 = coopLoadT<coop_mat16x16<f16, B>>(&v[at], cols);
            let vb1 = coopLoadT<coop_mat16x16<f16, B>>(&v[at + key16], cols);
            let vb2 = coopLoadT<coop_mat16x16<f16, B>>(&v[at + 2u * key16], cols);
            let vb3 = coopLoadT<coop_mat16x16<f16, B>>(&v[at + 3u * key16], cols);
            var acc = coop_mat16x16<f32, C>();
            acc = coopMultiplyAdd(pa0, vb0, acc);
            acc = coopMultiplyAdd(pa1, vb1, acc);
            acc = coopMultiplyAdd(pa2, vb2, acc);
            acc = coopMultiplyAdd(pa3, vb3, acc);
            coopStoreT(acc, &sw[s_base + 16u * c], S_STRIDE);
            var acc2 = coop_mat16x16<f32, C>();
            acc2 = coopMultiplyAdd(pb0, vb0, acc2);
            acc2 = coopMultiplyAdd(pb1, vb1, acc2);
            acc2 = coopMultiplyAdd(pb2, vb2, acc2);
            acc2 = coopMultiplyAdd(pb3, vb3, acc2);
            coopStoreT(acc2, &sw[s_base + second_s + 16u * c], S_STRIDE);
        }
        workgroupBarrier();
        for (var j = 0u; j < 32u; j++) {
            o[j] = o[j] * alpha + sw[row + 2u * j + par];
            o2[j] = o2[j] * alpha2 + sw[row + second_s + 2u * j + par];
        }
        workgroupBarrier();
    }

    let query = q0 + r;
    if (query < p.n) {
        let inv = 1.0 / l;
        let base = query * cols + head + par;
        for (var j = 0u; j < 32u; j++) {
            out[base + 2u * j] = o[j] * inv;
        }
    }
    if (query + 16u < p.n) {
        let inv = 1.0 / l2;
        let base = (query + 16u) * cols + head + par;
        for (var j = 0u; j < 32u; j++) {
            out[base + 2u * j] = o2[j] * inv;
        }
    }
}


// attention_coop_wide: attention_coop_direct with each key tile's K and V copied into workgroup
// memory first, by 16-byte pieces (`Piece`: each of the 64 threads copies eight of K's and eight
// of V's), and every K and V matrix load reading those tiles, shared by both subgroups; one more
// barrier a tile. The same products in the same order, so the same results. 44 KiB of workgroup
// memory with the direct kernel's arrays: taken where the adapter has that much (attention.rs).
// On an H100 the 1920×1080 image's attention took 31.0 ms here against 48.4 (thirtieth sitting).
// The tiles: 64 keys × 64 head dims + 8 of padding (144-byte rows: eight rows' 16-byte pieces
// fall in distinct banks), counted in vec4<f16> (a matrix load's index and stride count its
// pointer's type).
struct Piece {
    lo: vec4<f16>,
    hi: vec4<f16>,
}
@group(0) @binding(5) var<storage, read> k_wide: array<Piece>;
@group(0) @binding(6) var<storage, read> v_wide: array<Piece>;
const KV_ROW: u32 = 18u;
var<workgroup> k_tile: array<vec4<f16>, 64 * KV_ROW>;
var<workgroup> v_tile: array<vec4<f16>, 64 * KV_ROW>;

@compute @workgroup_size(64, 1, 1)
fn attention_coop_wide(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32,
                  @builtin(subgroup_id) sg: u32,
                  @builtin(subgroup_invocation_id) lane: u32) {
    let cols = p.heads * HD;
    let head = wg.y * HD;
    let q0 = wg.x * (QROWS * SUBGROUPS) + QROWS * sg; // the subgroup's first query
    let r = lane / 2u;    // this lane's query in each block of 16
    let par = lane % 2u;  // its keys of a tile and its output columns: 2·j + par
    let s_base = sg * QROWS * S_STRIDE;
    let p_base = sg * QROWS * P_STRIDE;
    let second_s = 16u * S_STRIDE; // the second block's rows
    let second_p = 16u * P_STRIDE;

    // A = Q rows q0.. (qa) and q0 + 16.. (qb), head dims 16·d.. (row-major, a row `cols` apart)
    let q_at = q0 * cols + head;
    let q_second = q_at + 16u * cols;
    let qa0 = coopLoadT<coop_mat16x16<f16, A>>(&q[q_at], cols);
    let qa1 = coopLoadT<coop_mat16x16<f16, A>>(&q[q_at + 16u], cols);
    let qa2 = coopLoadT<coop_mat16x16<f16, A>>(&q[q_at + 32u], cols);
    let qa3 = coopLoadT<coop_mat16x16<f16, A>>(&q[q_at + 48u], cols);
    let qb0 = coopLoadT<coop_mat16x16<f16, A>>(&q[q_second], cols);
    let qb1 = coopLoadT<coop_mat16x16<f16, A>>(&q[q_second + 16u], cols);
    let qb2 = coopLoadT<coop_mat16x16<f16, A>>(&q[q_second + 32u], cols);
    let qb3 = coopLoadT<coop_mat16x16<f16, A>>(&q[q_second + 48u], cols);

    let scale2 = p.scale * LOG2_E;
    var o: array<f32, 32>; // output columns 2·j + par of query q0 + r
    var o2: array<f32, 32>; // and of query q0 + 16 + r
    var m = NEG;
    var m2 = NEG;
    var l = 0.0;
    var l2 = 0.0;
    let row = s_base + r * S_STRIDE;
    let prow = p_base + r * P_STRIDE;

    // this thread's pieces of a tile: keys li / 8 + 8·i, head dims 8·(li % 8) .. + 8
    let piece = li % 8u;
    let key = li / 8u;
    let src = ((key * cols + head) / 8u) + piece; // in pieces, from the tile's first key
    let key8 = cols; // 8 keys on, in pieces (8·cols / 8)
    let to = key * KV_ROW + 2u * piece;
    for (var k0 = 0u; k0 < p.n; k0 += BKEY) {
        let tile = k0 * cols / 8u;
        for (var i = 0u; i < 8u; i++) {
            let kp = k_wide[tile + src + i * key8];
            let vp = v_wide[tile + src + i * key8];
            k_tile[to + i * 8u * KV_ROW] = kp.lo;
            k_tile[to + i * 8u * KV_ROW + 1u] = kp.hi;
            v_tile[to + i * 8u * KV_ROW] = vp.lo;
            v_tile[to + i * 8u * KV_ROW + 1u] = vp.hi;
        }
        workgroupBarrier();
        // S (B = Kᵀ: (d, key) at k_tile[key][d], column-major), 16 keys a block
        for (var j = 0u; j < 4u; j++) {
            let k_at = 16u * j * KV_ROW;
            let kb0 = coopLoad<coop_mat16x16<f16, B>>(&k_tile[k_at], KV_ROW);
            let kb1 = coopLoad<coop_mat16x16<f16, B>>(&k_tile[k_at + 4u], KV_ROW);
            let kb2 = coopLoad<coop_mat16x16<f16, B>>(&k_tile[k_at + 8u], KV_ROW);
            let kb3 = coopLoad<coop_mat16x16<f16, B>>(&k_tile[k_at + 12u], KV_ROW);
            var acc = coop_mat16x16<f32, C>();
            acc = coopMultiplyAdd(qa0, kb0, acc);
            acc = coopMultiplyAdd(qa1, kb1, acc);
            acc = coopMultiplyAdd(qa2, kb2, acc);
            acc = coopMultiplyAdd(qa3, kb3, acc);
            coopStoreT(acc, &sw[s_base + 16u * j], S_STRIDE);
            var acc2 = coop_mat16x16<f32, C>();
            acc2 = coopMultiplyAdd(qb0, kb0, acc2);
            acc2 = coopMultiplyAdd(qb1, kb1, acc2);
            acc2 = coopMultiplyAdd(qb2, kb2, acc2);
            acc2 = coopMultiplyAdd(qb3, kb3, acc2);
            coopStoreT(acc2, &sw[s_base + second_s + 16u * j], S_STRIDE);
        }
        workgroupBarrier();
        let alpha = softmax_step(row, prow, par, k0, scale2, &m, &l);
        let alpha2 = softmax_step(row + second_s, prow + second_p, par, k0, scale2, &m2, &l2);
        workgroupBarrier();
        // P·V (A = P row-major; B = V: (key, c) at v_tile[key][c], row-major)
        let pa0 = coopLoadT<coop_mat16x16<f16, A>>(&pw[p_base], P_STRIDE);
        let pa1 = coopLoadT<coop_mat16x16<f16, A>>(&pw[p_base + 16u], P_STRIDE);
        let pa2 = coopLoadT<coop_mat16x16<f16, A>>(&pw[p_base + 32u], P_STRIDE);
        let pa3 = coopLoadT<coop_mat16x16<f16, A>>(&pw[p_base + 48u], P_STRIDE);
        let pb0 = coopLoadT<coop_mat16x16<f16, A>>(&pw[p_base + second_p], P_STRIDE);
        let pb1 = coopLoadT<coop_mat16x16<f16, A>>(&pw[p_base + second_p + 16u], P_STRIDE);
        let pb2 = coopLoadT<coop_mat16x16<f16, A>>(&pw[p_base + second_p + 32u], P_STRIDE);
        let pb3 = coopLoadT<coop_mat16x16<f16, A>>(&pw[p_base + second_p + 48u], P_STRIDE);
        let key16 = 16u * KV_ROW;
        for (var c = 0u; c < 4u; c++) {
            let at = 4u * c;
            let vb0 = coopLoadT<coop_mat16x16<f16, B>>(&v_tile[at], KV_ROW);
            let vb1 = coopLoadT<coop_mat16x16<f16, B>>(&v_tile[at + key16], KV_ROW);
            let vb2 = coopLoadT<coop_mat16x16<f16, B>>(&v_tile[at + 2u * key16], KV_ROW);
            let vb3 = coopLoadT<coop_mat16x16<f16, B>>(&v_tile[at + 3u * key16], KV_ROW);
            var acc = coop_mat16x16<f32, C>();
            acc = coopMultiplyAdd(pa0, vb0, acc);
            acc = coopMultiplyAdd(pa1, vb1, acc);
            acc = coopMultiplyAdd(pa2, vb2, acc);
            acc = coopMultiplyAdd(pa3, vb3, acc);
            coopStoreT(acc, &sw[s_base + 16u * c], S_STRIDE);
            var acc2 = coop_mat16x16<f32, C>();
            acc2 = coopMultiplyAdd(pb0, vb0, acc2);
            acc2 = coopMultiplyAdd(pb1, vb1, acc2);
            acc2 = coopMultiplyAdd(pb2, vb2, acc2);
            acc2 = coopMultiplyAdd(pb3, vb3, acc2);
            coopStoreT(acc2, &sw[s_base + second_s + 16u * c], S_STRIDE);
        }
        workgroupBarrier();
        for (var j = 0u; j < 32u; j++) {
            o[j] = o[j] * alpha + sw[row + 2u * j + par];
            o2[j] = o2[j] * alpha2 + sw[row + second_s + 2u * j + par];
        }
        workgroupBarrier();
    }

    let query = q0 + r;
    if (query < p.n) {
        let inv = 1.0 / l;
        let base = query * cols + head + par;
        for (var j = 0u; j < 32u; j++) {
            out[base + 2u * j] = o[j] * inv;
        }
    }
    if (query + 16u < p.n) {
        let inv = 1.0 / l2;
        let base = (query + 16u) * cols + head + par;
        for (var j = 0u; j < 32u; j++) {
            out[base + 2u * j] = o2[j] * inv;
        }
    }
}
