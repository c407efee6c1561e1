// attention (non-causal, flash style) on cooperative matrices, fast precision, with no workgroup
// staging of keys and values (a kernel that staged them, retired in the twenty-eighth sitting,
// was 3× slower on an H200): q, k, v [n, heads·64] → out [n, heads·64], scale 1/8: head dim 64
// only (the ViT's). Built after operands_fast.wgsl (`to_operand`: round to the nearest f16), only on an
// adapter whose cooperative tiles the lane uses (16×16×16 f16 → f32, subgroups of exactly 32: 4
// per workgroup).
// q, k and v come as f16 copies (half_rows.wgsl: each value rounded once), their rows padded with
// zeros to a multiple of 64 (`rows`), so the matrix loads read them straight from the buffers, in
// bounds, with no workgroup staging; the probabilities are rounded once to f16; the products and
// every sum are f32 (the same rounding as the CUDA lane's tensor-core attention).
// One workgroup per (block of 64 queries, head): dispatch (rows/64, heads, 1). Subgroup s owns
// queries 16·s.. of the block and walks every key in tiles of 64 with an online softmax (running
// max m, running sum l per query); the subgroups share nothing but the cache that serves their
// loads of the same key tile.
// Per tile, in the subgroup's own workgroup memory: S = Q·Kᵀ (four 16×16 blocks, Q's four
// matrices held in registers for the whole walk) stored row-major; the softmax by its lanes (lane
// l: query l/2, the keys of parity l%2, its partner lane l^1 met by a shuffle); P as f16; P·V
// (four 16×16 blocks) stored where S was; each lane then rescales its output columns (parity l%2)
// by exp(m_old − m_new) and adds the tile's P·V.
// Workgroup memory: per subgroup S-then-P·V [16][68] f32 and P [16][72] f16, rows padded by 16
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
const SUBGROUPS: u32 = 4u;
const S_STRIDE: u32 = 68u;
const P_STRIDE: u32 = 72u;
const NEG: f32 = -1.0e30;

var<workgroup> sw: array<f32, SUBGROUPS * 16u * S_STRIDE>; // [subgroup][16][S_STRIDE]
var<workgroup> pw: array<f16, SUBGROUPS * 16u * P_STRIDE>; // [subgroup][16][P_STRIDE]

@compute @workgroup_size(128, 1, 1)
fn attention_coop_direct(@builtin(workgroup_id) wg: vec3<u32>, @builtin(subgroup_id) sg: u32,
                  @builtin(subgroup_invocation_id) lane: u32) {
    let cols = p.heads * HD;
    let head = wg.y * HD;
    let q0 = wg.x * (16u * SUBGROUPS) + 16u * sg; // the subgroup's first query
    let r = lane / 2u;    // this lane's query in the subgroup's 16
    let par = lane % 2u;  // its keys of a tile and its output columns: 2·j + par
    let s_base = sg * 16u * S_STRIDE;
    let p_base = sg * 16u * P_STRIDE;

    // A = Q rows q0.., head dims 16·d.. (row-major, a row `cols` apart)
    let q_at = q0 * cols + head;
    let qa0 = coopLoadT<coop_mat16x16<f16, A>>(&q[q_at], cols);
    let qa1 = coopLoadT<coop_mat16x16<f16, A>>(&q[q_at + 16u], cols);
    let qa2 = coopLoadT<coop_mat16x16<f16, A>>(&q[q_at + 32u], cols);
    let qa3 = coopLoadT<coop_mat16x16<f16, A>>(&q[q_at + 48u], cols);

    var o: array<f32, 32>; // output columns 2·j + par of query q0 + r
    var m = NEG;
    var l = 0.0;

    for (var k0 = 0u; k0 < p.n; k0 += BKEY) {
        // S (B = Kᵀ: (d, key) at k[key·cols + head + d], column-major), 16 keys a block
        for (var j = 0u; j < 4u; j++) {
            let k_at = (k0 + 16u * j) * cols + head;
            var acc = coop_mat16x16<f32, C>();
            acc = coopMultiplyAdd(qa0, coopLoad<coop_mat16x16<f16, B>>(&k[k_at], cols), acc);
            acc = coopMultiplyAdd(qa1, coopLoad<coop_mat16x16<f16, B>>(&k[k_at + 16u], cols), acc);
            acc = coopMultiplyAdd(qa2, coopLoad<coop_mat16x16<f16, B>>(&k[k_at + 32u], cols), acc);
            acc = coopMultiplyAdd(qa3, coopLoad<coop_mat16x16<f16, B>>(&k[k_at + 48u], cols), acc);
            coopStoreT(acc, &sw[s_base + 16u * j], S_STRIDE);
        }
        workgroupBarrier();
        // the softmax of query r over the tile's keys below n
        let row = s_base + r * S_STRIDE;
        var mx = NEG;
        for (var j = 0u; j < 32u; j++) {
            let key = 2u * j + par;
            if (k0 + key < p.n) {
                mx = max(mx, sw[row + key] * p.scale);
            }
        }
        let mt = max(m, max(mx, subgroupShuffleXor(mx, 1u)));
        var sum = 0.0;
        for (var j = 0u; j < 32u; j++) {
            let key = 2u * j + par;
            var pj = 0.0;
            if (k0 + key < p.n) {
                pj = exp(sw[row + key] * p.scale - mt);
            }
            let rounded = to_operand(pj);
            pw[p_base + r * P_STRIDE + key] = rounded;
            sum += f32(rounded); // the weights P·V uses
        }
        let alpha = exp(m - mt);
        m = mt;
        l = l * alpha + sum + subgroupShuffleXor(sum, 1u);
        workgroupBarrier();
        // P·V (A = P row-major; B = V: (key, c) at v[key·cols + head + c], row-major)
        let pa0 = coopLoadT<coop_mat16x16<f16, A>>(&pw[p_base], P_STRIDE);
        let pa1 = coopLoadT<coop_mat16x16<f16, A>>(&pw[p_base + 16u], P_STRIDE);
        let pa2 = coopLoadT<coop_mat16x16<f16, A>>(&pw[p_base + 32u], P_STRIDE);
        let pa3 = coopLoadT<coop_mat16x16<f16, A>>(&pw[p_base + 48u], P_STRIDE);
        let v_at = k0 * cols + head;
        let key16 = 16u * cols;
        for (var c = 0u; c < 4u; c++) {
            let at = v_at + 16u * c;
            var acc = coop_mat16x16<f32, C>();
            acc = coopMultiplyAdd(pa0, coopLoadT<coop_mat16x16<f16, B>>(&v[at], cols), acc);
            acc = coopMultiplyAdd(pa1, coopLoadT<coop_mat16x16<f16, B>>(&v[at + key16], cols), acc);
            acc = coopMultiplyAdd(pa2, coopLoadT<coop_mat16x16<f16, B>>(&v[at + 2u * key16], cols), acc);
            acc = coopMultiplyAdd(pa3, coopLoadT<coop_mat16x16<f16, B>>(&v[at + 3u * key16], cols), acc);
            coopStoreT(acc, &sw[s_base + 16u * c], S_STRIDE);
        }
        workgroupBarrier();
        for (var j = 0u; j < 32u; j++) {
            o[j] = o[j] * alpha + sw[row + 2u * j + par];
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
}
