// attention (non-causal, flash style) on cooperative matrices, fast precision: q, k, v
// [n, heads·64] → out [n, heads·64], scale 1/8: head dim 64 only (the ViT's). Built after
// operands_fast.wgsl (`to_operand`: round to the nearest f16) and attention_io.wgsl (parameters,
// bindings), only on an adapter whose
// cooperative tiles the lane uses (16×16×16 f16 → f32, subgroups of exactly 32: 8 per workgroup).
// q, k, v and the probabilities are each rounded once to f16; the products and every sum are f32
// (the same rounding as the CUDA lane's tensor-core attention).
// One workgroup per (block of 32 queries, head): dispatch (ceil(n/32), heads, 1). Keys are walked
// in tiles of 64 with an online softmax (running max m, running sum l per query).
// Per tile: S = Q·Kᵀ on cooperative matrices into workgroup memory (subgroup s owns the 16×16
// block of query rows 16·(s/4).. and key columns 16·(s%4)..); the softmax by threads (thread li:
// query li/8, an eighth of the keys and of the output columns); P·V on cooperative matrices
// (subgroup s: the same rows, output columns 16·(s%4)..) into the same workgroup memory; each
// thread then rescales its own output columns by exp(m_old − m_new) and adds the tile's P·V.
// Workgroup memory: Q block [32][64], K-then-V tile [64][64] and P [32][64] as f16, S-then-P·V
// [32][64] as f32, the eighth-row maxima-then-sums: 25 KiB (attention.rs `COOP_SHARED_BYTES`),
// within Metal's and DX12's 32 KiB.

const HD: u32 = 64u;
const BQ: u32 = 32u;
const BKEY: u32 = 64u;
const NEG: f32 = -1.0e30;

var<workgroup> qs: array<f16, 2048>; // [BQ][HD]
var<workgroup> kv: array<f16, 4096>; // [BKEY][HD]: the key tile, then the value tile
var<workgroup> ps: array<f16, 2048>; // [BQ][BKEY] probabilities
var<workgroup> sb: array<f32, 2048>; // [BQ][BKEY] scores, then [BQ][HD] the tile's P·V
var<workgroup> red: array<f32, 256>; // per thread: its eighth row's max, then its sum

// Rows k0.. of one head of `which` (1 k, 2 v) as f16 into kv, zero past n.
fn load_kv(which: u32, k0: u32, cols: u32, head_off: u32, li: u32) {
    for (var e = li; e < BKEY * HD; e += 256u) {
        let row = k0 + e / HD;
        var x = 0.0;
        if (row < p.n) {
            let at = row * cols + head_off + e % HD;
            if (which == 1u) {
                x = k[at];
            } else {
                x = v[at];
            }
        }
        kv[e] = to_operand(x);
    }
}

@compute @workgroup_size(256, 1, 1)
fn attention_coop(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32,
                  @builtin(subgroup_id) sg: u32) {
    let cols = p.heads * HD;
    let head_off = wg.y * HD;
    let q0 = wg.x * BQ;
    let r = li / 8u;          // this thread's query in the block
    let part = li % 8u;       // its keys 8·part.. of a tile, its output columns 8·part..
    let first = li - part;    // the first of the eight threads of query r
    let rb = (sg / 4u) * 16u; // the subgroup's first query row
    let cb = (sg % 4u) * 16u; // its first key column of S, its first output column of P·V

    for (var e = li; e < BQ * HD; e += 256u) {
        let row = q0 + e / HD;
        var x = 0.0;
        if (row < p.n) {
            x = q[row * cols + head_off + e % HD];
        }
        qs[e] = to_operand(x);
    }

    var o: array<f32, 8>;
    var m = NEG;
    var l = 0.0;
    var acc = coop_mat16x16<f32, C>();

    for (var k0 = 0u; k0 < p.n; k0 += BKEY) {
        load_kv(1u, k0, cols, head_off, li);
        workgroupBarrier();
        // S (A = Q row-major; B = Kᵀ: (d, key) at kv[key·HD + d], column-major)
        acc = coop_mat16x16<f32, C>();
        for (var d = 0u; d < HD; d += 16u) {
            let a = coopLoadT<coop_mat16x16<f16, A>>(&qs[rb * HD + d], HD);
            let b = coopLoad<coop_mat16x16<f16, B>>(&kv[cb * HD + d], HD);
            acc = coopMultiplyAdd(a, b, acc);
        }
        coopStoreT(acc, &sb[rb * BKEY + cb], BKEY);
        workgroupBarrier();
        // The value tile replaces the key tile; this thread's eighth-row max.
        load_kv(2u, k0, cols, head_off, li);
        var mx = NEG;
        for (var j = 0u; j < 8u; j++) {
            let key = 8u * part + j;
            if (k0 + key < p.n) {
                mx = max(mx, sb[r * BKEY + key] * p.scale);
            }
        }
        red[li] = mx;
        workgroupBarrier();
        var mt = m;
        for (var j = 0u; j < 8u; j++) {
            mt = max(mt, red[first + j]);
        }
        var sum = 0.0;
        for (var j = 0u; j < 8u; j++) {
            let key = 8u * part + j;
            var pj = 0.0;
            if (k0 + key < p.n) {
                pj = exp(sb[r * BKEY + key] * p.scale - mt);
            }
            let rounded = to_operand(pj);
            ps[r * BKEY + key] = rounded;
            sum += f32(rounded); // the weights P·V uses
        }
        workgroupBarrier();
        red[li] = sum;
        // P·V (A = P row-major; B = V row-major)
        acc = coop_mat16x16<f32, C>();
        for (var kk = 0u; kk < BKEY; kk += 16u) {
            let a = coopLoadT<coop_mat16x16<f16, A>>(&ps[rb * BKEY + kk], BKEY);
            let b = coopLoadT<coop_mat16x16<f16, B>>(&kv[kk * HD + cb], HD);
            acc = coopMultiplyAdd(a, b, acc);
        }
        coopStoreT(acc, &sb[rb * HD + cb], HD);
        workgroupBarrier();
        let alpha = exp(m - mt);
        m = mt;
        var tile_sum = 0.0;
        for (var j = 0u; j < 8u; j++) {
            tile_sum += red[first + j];
        }
        l = l * alpha + tile_sum;
        for (var c = 0u; c < 8u; c++) {
            o[c] = o[c] * alpha + sb[r * HD + 8u * part + c];
        }
        workgroupBarrier();
    }

    let row = q0 + r;
    if (row < p.n) {
        let inv = 1.0 / l;
        let base = row * cols + head_off + 8u * part;
        for (var c = 0u; c < 8u; c++) {
            out[base + c] = o[c] * inv;
        }
    }
}
