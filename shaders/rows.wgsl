// The small-row products (decode: at most 8 rows of x, or 8 expert slots at a time): linear_rows,
// linear_rows_pair, hc_mix_rows, grouped_rows, moe_gate_rows, moe_up_rows, moe_down_rows, each the
// counterpart of a GEMM kernel (linear_tile.wgsl, dequant/linear.wgsl, lm.wgsl's and
// dequant/lm.wgsl's GEMM ops) with the same epilogue. Those run a 64-row output tile (or a thread
// per output re-reading its weight row), so with one token row almost all of their work is padding;
// here, as in the CUDA lane's gemv_cols, one workgroup owns two output columns: its WG threads
// stride along k span by span, so each weight row is read once (consecutive threads, consecutive
// spans) and each x element a thread loads serves both columns; each thread accumulates the dot
// products of every row in registers, then `reduce_rows` sums the threads' partials (f32 products
// and sums as the tiles; only the summation order differs).
// Not a complete shader: the lane builds it after
//   - a weight part defining `SPAN` and `load_span(r, s) -> array<f32, SPAN>` (elements
//     SPAN·s … SPAN·s + SPAN − 1 of row r of the bound weight chunk): rows_pairs.wgsl after
//     linear_packed.wgsl or linear_f16.wgsl, or dequant/rows.wgsl (8-value runs) after a block
//     decoder;
//   - an operands file (`to_operand`, operands_exact.wgsl or operands_fast.wgsl): both operands
//     of every product go through it, as in the tiles;
//   - a row bound, rows_one.wgsl or rows_eight.wgsl: `ROWS`;
//   - a reduction file, rows_subgroup.wgsl or rows_workgroup.wgsl: `Lane` (the invocation
//     builtins the entry points take) and `reduce_rows(lane, acc)`, which leaves row i's total in
//     `sums[i]` (both columns) for every thread. It holds barriers (and subgroup operations), so
//     every call is in workgroup-uniform control flow: a workgroup's columns, row count and
//     expert batches depend only on the workgroup id, the parameters and `ids`.
// Dispatch: one workgroup per pair of columns of the bound chunk, numbered wg.y·gx + wg.x (2-D
// grid); linear_rows may also split k over grid layers (z), each writing its partial sums.

struct P {
    n: u32,          // rows of x (linear_rows, grouped_rows; ≤ ROWS) or expert slots n·topk
    k: u32,          // length of a weight row, so of each dot product
    w_stride: u32,   // words per weight row
    cols: u32,       // weight rows in the bound chunk: this dispatch's columns
    col_off: u32,    // linear_rows, grouped_rows: first output column of the chunk
    out_cols: u32,   // columns of y
    has_bias: u32,   // linear_rows
    x_stride: u32,   // grouped_rows: elements per row of x (g·k); linear_rows_pair: b's first row
    group_rows: u32, // grouped_rows: output columns per group (r); linear_rows_pair: a's columns
    topk: u32,       // experts: slots per token
    expert: u32,     // experts, one expert's weight bound: that expert
    limit: u32,      // moe_up_rows: the SwiGLU clamp (f32 bits)
    experts: u32,    // experts, every expert's weight bound (0: one expert's): how many,
    expert_stride: u32, // and the weight rows from one expert's first row to the next's
    k_slice: u32,    // linear_rows: elements of k grid layer z sums, from z·k_slice (k: all)
    slice_stride: u32, // linear_rows: elements of y from one layer's partial sums to the next's
}

var<immediate> p: P; // the dispatch's immediate data (mod.rs, PARAM_BYTES)
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<storage, read> ids: array<i32>;
@group(0) @binding(6) var<storage, read_write> y2: array<f32>; // linear_rows_pair: b's outputs; hc_mix_rows: Σx²

const WG: u32 = 64u;
// Output columns a workgroup owns: each x element a thread loads serves both.
const COLS: u32 = 2u;

// The workgroup's first column (its pair is c, c + 1), numbered (wg.y·gx + wg.x)·COLS.
fn column(wg: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return (wg.y * nwg.x + wg.x) * COLS;
}

// This thread's share (spans k0 / SPAN + li, + WG, …) of Σ_e x[xo[i] + e] · W[r0 + c + q, e]
// over k0 ≤ e < k1 (k0 a multiple of SPAN) for rows i < rows, in acc[i][q], q < COLS (r0: the
// first weight row of the dispatch's matrix in the binding, less its first column: 0 but for the
// experts and the second weight of a pair). A workgroup whose second column is past the chunk
// reads the first column's row for it (in bounds) and stores nothing from it.
fn dot_rows(li: u32, r0: u32, c: u32, xo: array<u32, ROWS>, rows: u32, k0: u32, k1: u32) -> array<vec2<f32>, ROWS> {
    var acc: array<vec2<f32>, ROWS>;
    let c1 = select(c, c + 1u, c + 1u < p.cols);
    var s = k0 / SPAN + li;
    // two whole spans a step, their four weight loads issued before either's products (a decode
    // step's workgroups all fit on the GPU at once, so a thread's chain of load latencies bounds
    // them). The products still go in span order, so the sums are one span a step's. Measured
    // on an H100 (timed dispatches, against the sitting before's): grouped_rows 37 → 33 µs, wo_b's
    // linear_rows 25 → 24; the int8 kernels' loop taken the same way gained nothing (reverted).
    for (; (s + WG) * SPAN + SPAN <= k1; s += 2u * WG) {
        let wa0 = load_span(r0 + c, s);
        let wb0 = load_span(r0 + c1, s);
        let wa1 = load_span(r0 + c, s + WG);
        let wb1 = load_span(r0 + c1, s + WG);
        acc = add_span(acc, wa0, wb0, xo, rows, s * SPAN);
        acc = add_span(acc, wa1, wb1, xo, rows, (s + WG) * SPAN);
    }
    for (; s * SPAN < k1; s += WG) {
        let wa = load_span(r0 + c, s);
        let wb = load_span(r0 + c1, s);
        let e0 = s * SPAN;
        if (e0 + SPAN <= k1) {
            acc = add_span(acc, wa, wb, xo, rows, e0);
        } else {
            for (var j = 0u; j < SPAN; j++) {
                let e = e0 + j;
                if (e >= k1) { break; }
                let wo = vec2<f32>(f32(to_operand(wa[j])), f32(to_operand(wb[j])));
                for (var i = 0u; i < ROWS; i++) {
                    if (i < rows) {
                        acc[i] += f32(to_operand(x[xo[i] + e])) * wo;
                    }
                }
            }
        }
    }
    return acc;
}

// acc plus the products of a whole span (elements e0 … e0 + SPAN − 1) of both columns' rows
// (wa, wb) with each row i < rows of x: its x loads carry no test, so they issue together rather
// than one latency after another behind a per-element branch.
fn add_span(acc: array<vec2<f32>, ROWS>, wa: array<f32, SPAN>, wb: array<f32, SPAN>, xo: array<u32, ROWS>,
            rows: u32, e0: u32) -> array<vec2<f32>, ROWS> {
    var sum = acc;
    for (var i = 0u; i < ROWS; i++) {
        if (i < rows) {
            var xs: array<f32, SPAN>;
            for (var j = 0u; j < SPAN; j++) { xs[j] = x[xo[i] + e0 + j]; }
            for (var j = 0u; j < SPAN; j++) {
                let wo = vec2<f32>(f32(to_operand(wa[j])), f32(to_operand(wb[j])));
                sum[i] += f32(to_operand(xs[j])) * wo;
            }
        }
    }
    return sum;
}

// The pair's totals v into y[at] and, when column c + 1 is in the chunk, y[at + 1].
fn store_pair(c: u32, at: u32, v: vec2<f32>) {
    y[at] = v.x;
    if (c + 1u < p.cols) {
        y[at + 1u] = v.y;
    }
}

// linear: y[i, col_off + c] = x[i] · W[c] (+ bias), rows i < n ≤ ROWS (as linear_tile's store).
// Split over k (few columns, so few workgroups: the model's hyper-connection mixes are 24
// columns over 16 384 inputs, 12 workgroups that each walked 16 384 elements one latency at a
// time): layer z sums k_slice elements into y[z·slice_stride + i·out_cols + c] (the host gives
// col_off 0, out_cols = cols and no bias), and elementwise.wgsl's sum_slices adds the layers.
@compute @workgroup_size(64, 1, 1)
fn linear_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, lane: Lane) {
    let c = column(wg, nwg);
    if (c >= p.cols) { return; }
    linear_rows_layer(lane, c, wg.z);
}

// linear_rows' column pair c (< p.cols) of grid layer z.
fn linear_rows_layer(lane: Lane, c: u32, z: u32) {
    var xo: array<u32, ROWS>;
    for (var i = 0u; i < ROWS; i++) { xo[i] = i * p.k; }
    let k0 = z * p.k_slice;
    reduce_rows(lane, dot_rows(lane.li, 0u, c, xo, p.n, k0, min(p.k, k0 + p.k_slice)));
    if (lane.li < p.n) {
        let oc = p.col_off + c;
        var v = sums[lane.li];
        if (p.has_bias != 0u) {
            v += vec2<f32>(bias[oc], bias[min(oc + 1u, p.col_off + p.cols - 1u)]);
        }
        store_pair(c, z * p.slice_stride + lane.li * p.out_cols + oc, v);
    }
}

// hc_mix_split's product (lane: lm.rs): linear_rows split over k (the host gives it no bias),
// on the raw rows (the norm's factor is taken out of the product: lm.wgsl's hc_split applies
// it); the workgroup of the first column pair also sums the slice's x² of each row into
// y2[z·n + i].
@compute @workgroup_size(64, 1, 1)
fn hc_mix_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, lane: Lane) {
    let c = column(wg, nwg);
    if (c >= p.cols) { return; }
    linear_rows_layer(lane, c, wg.z);
    if (c == 0u) {
        // (uniform: the workgroup's column) the threads' reads of `sums` above come before the
        // next reduction's first barrier, its writes to `sums` after it
        let k0 = wg.z * p.k_slice;
        let k1 = min(p.k, k0 + p.k_slice);
        var sq: array<vec2<f32>, ROWS>;
        for (var i = 0u; i < ROWS; i++) {
            if (i < p.n) {
                for (var e = k0 + lane.li; e < k1; e += WG) {
                    let v = x[i * p.k + e];
                    sq[i].x = fma(v, v, sq[i].x);
                }
            }
        }
        reduce_rows(lane, sq);
        if (lane.li < p.n) {
            y2[wg.z * p.n + lane.li] = sums[lane.li].x;
        }
    }
}

// linear_pair: the bound span holds weight a's rows, then weight b's from row x_stride (lane:
// upload_weight_pair, rows.rs's PairSpan); columns c < group_rows (a's rows, even, so a pair
// never straddles the two) are a's, into y [n, group_rows], the rest b's, into y2
// [n, cols − group_rows]. The same sums as linear_rows over each weight alone.
@compute @workgroup_size(64, 1, 1)
fn linear_rows_pair(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, lane: Lane) {
    let c = column(wg, nwg);
    if (c >= p.cols) { return; }
    var xo: array<u32, ROWS>;
    for (var i = 0u; i < ROWS; i++) { xo[i] = i * p.k; }
    let a_cols = p.group_rows;
    let in_b = c >= a_cols; // uniform across the workgroup
    // weight row of column c: c for a's, x_stride + (c − a_cols) for b's
    let r0 = select(0u, p.x_stride - a_cols, in_b);
    reduce_rows(lane, dot_rows(lane.li, r0, c, xo, p.n, 0u, p.k));
    if (lane.li < p.n) {
        let v = sums[lane.li];
        if (in_b) {
            let at = lane.li * (p.cols - a_cols) + c - a_cols;
            y2[at] = v.x;
            if (c + 1u < p.cols) {
                y2[at + 1u] = v.y;
            }
        } else {
            store_pair(c, lane.li * a_cols + c, v);
        }
    }
}

// linear_rows_swiglu (rows.rs linear_pair_swiglu): the bound span holds gate a's rows, then up b's (as many) from row
// x_stride (as linear_rows_pair's); a workgroup takes column pair c of both, linear_rows_pair's
// sums of each, into y [n, cols] through lm.wgsl swiglu_clamp's arithmetic:
// silu(min(g, limit)) · clamp(u, ±limit).
@compute @workgroup_size(64, 1, 1)
fn linear_rows_swiglu(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, lane: Lane) {
    let c = column(wg, nwg);
    if (c >= p.cols) { return; }
    var xo: array<u32, ROWS>;
    for (var i = 0u; i < ROWS; i++) { xo[i] = i * p.k; }
    reduce_rows(lane, dot_rows(lane.li, 0u, c, xo, p.n, 0u, p.k));
    var g = vec2<f32>(0.0);
    if (lane.li < p.n) {
        g = min(sums[lane.li], vec2<f32>(bitcast<f32>(p.limit)));
    }
    // reduce_rows ends on a barrier: the gate's sums are read before the up's overwrite them
    reduce_rows(lane, dot_rows(lane.li, p.x_stride, c, xo, p.n, 0u, p.k));
    if (lane.li < p.n) {
        let lim = vec2<f32>(bitcast<f32>(p.limit));
        let u = clamp(sums[lane.li], -lim, lim);
        store_pair(c, lane.li * p.cols + c, g / (1.0 + exp(-g)) * u);
    }
}

// grouped_linear: output column o = col_off + c reads x columns [(o / group_rows)·k, +k).
@compute @workgroup_size(64, 1, 1)
fn grouped_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, lane: Lane) {
    let c = column(wg, nwg);
    if (c >= p.cols) { return; }
    let o = p.col_off + c;
    let g = o / p.group_rows;
    var xo: array<u32, ROWS>;
    for (var i = 0u; i < ROWS; i++) { xo[i] = i * p.x_stride + g * p.k; }
    var acc = dot_rows(lane.li, 0u, c, xo, p.n, 0u, p.k);
    if (c + 1u < p.cols && (o + 1u) / p.group_rows != g) {
        // the pair straddles two groups (odd group_rows, or a chunk starting mid-group): column
        // c + 1 reads the next group's x
        for (var i = 0u; i < ROWS; i++) { xo[i] += p.k; }
        let next = dot_rows(lane.li, 0u, c, xo, p.n, 0u, p.k);
        for (var i = 0u; i < ROWS; i++) { acc[i].y = next[i].y; }
    }
    reduce_rows(lane, acc);
    if (lane.li < p.n) {
        store_pair(c, lane.li * p.out_cols + o, sums[lane.li]);
    }
}

// Up to ROWS slots routed to `expert`, the first at or after slot `first`, and the slot to
// continue from. Every thread scans `ids` alike, so the batch is workgroup-uniform. A token's
// top-k experts are distinct, so one batch holds every slot of ≤ ROWS tokens; more (or
// repeated ids) take more batches, each reading the weight row again.
struct Batch {
    slots: array<u32, ROWS>,
    rows: u32,
    next: u32,
}

fn next_batch(expert: i32, first: u32) -> Batch {
    var b: Batch;
    var t = first;
    for (; t < p.n && b.rows < ROWS; t++) {
        if (ids[t] == expert) {
            b.slots[b.rows] = t;
            b.rows++;
        }
    }
    b.next = t;
    return b;
}

// The experts (moe_gate_rows, moe_up_rows, moe_down_rows): columns j, j + 1
// of w1/w3 (k = d) into hid[slot, j …] (out_cols = h), or columns o, o + 1 of w2 (k = h) into
// ys[slot, o …] (out_cols = d), for each slot routed to the expert. x is the token rows (gate,
// up: slot t reads row t / topk) or hid (down: row t).
// With one expert's weight bound (p.experts = 0) the dispatch is that expert's (a grid of one
// layer, z = 0). With every expert's bound (p.expert_stride rows apart) the host dispatches a
// projection once, without reading the ids back, over min(slots, experts) grid layers: with
// fewer slots than experts layer z stands for slot z, and the first slot routed to an expert
// runs that expert's slots while the others return; else layer z is expert z (which may have no
// slot). An id outside 0..experts runs nothing (moe_sum makes its token NaN).
fn expert_rows(lane: Lane, col: u32, z: u32, from_hid: bool, epilogue: u32) {
    var expert = i32(p.expert);
    var first = 0u;
    var r0 = 0u;
    if (p.experts != 0u) {
        if (p.experts <= p.n) {
            expert = i32(z);
        } else {
            expert = ids[z];
            if (expert < 0 || u32(expert) >= p.experts) { return; }
            for (var t = 0u; t < z; t++) {
                if (ids[t] == expert) { return; }
            }
            first = z;
        }
        r0 = u32(expert) * p.expert_stride;
    }
    var b = next_batch(expert, first);
    while (b.rows > 0u) {
        var xo: array<u32, ROWS>;
        for (var i = 0u; i < ROWS; i++) {
            xo[i] = select(b.slots[i] / p.topk, b.slots[i], from_hid) * p.k;
        }
        reduce_rows(lane, dot_rows(lane.li, r0, col, xo, b.rows, 0u, p.k));
        if (lane.li < b.rows) {
            let at = b.slots[lane.li] * p.out_cols + col;
            let s = sums[lane.li];
            for (var q = 0u; q < COLS; q++) {
                if (col + q >= p.cols) { break; }
                if (epilogue == SWIGLU) {
                    // the gate's value is in y already (moe_gate_rows)
                    let lim = bitcast<f32>(p.limit);
                    let g = min(y[at + q], lim);
                    y[at + q] = g / (1.0 + exp(-g)) * clamp(s[q], -lim, lim);
                } else {
                    y[at + q] = s[q];
                }
            }
        }
        b = next_batch(expert, b.next);
    }
}

const STORE: u32 = 0u;
const SWIGLU: u32 = 1u;

@compute @workgroup_size(64, 1, 1)
fn moe_gate_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, lane: Lane) {
    let j = column(wg, nwg);
    if (j >= p.cols) { return; }
    expert_rows(lane, j, wg.z, false, STORE);
}

@compute @workgroup_size(64, 1, 1)
fn moe_up_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, lane: Lane) {
    let j = column(wg, nwg);
    if (j >= p.cols) { return; }
    expert_rows(lane, j, wg.z, false, SWIGLU);
}

@compute @workgroup_size(64, 1, 1)
fn moe_down_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, lane: Lane) {
    let o = column(wg, nwg);
    if (o >= p.cols) { return; }
    expert_rows(lane, o, wg.z, true, STORE);
}
