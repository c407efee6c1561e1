// One token's GEMVs on int8 activations (fast precision, a decode step of one sequence), after
// cuda/dequant.cuh's q8x_cols: the routed experts (moe_gate_q8x, moe_up_q8x, moe_down_q8x, the
// counterparts of rows.wgsl's moe_*_rows with the same bindings, outputs and epilogues, and
// moe_gate_up_q8x, the gate and up in one dispatch) and the widest linears (linear_q8x, rows.wgsl's
// linear_rows for one row). Each workgroup rounds its activation row to int8 once (ggml's q8_1
// rule: per 32 values the scale amax / 127 and round(x / scale)) into workgroup memory, then each
// of its teams of p.team invocations (8, 16 or 32: q8x.rs picks it from k) takes 4 adjacent
// columns, the invocations striding over the row's 32-value groups: the format's `q8x_dot32`
// (dequant/q8x/<format>.wgsl) multiplies the group's codes with the int8 values by dot4I8Packed
// (four products an instruction where the device has integer dot products: SPIR-V
// DotProductInput4x8BitPacked, HLSL SM 6.4; naga spells it out elsewhere) and applies the block
// scales once a group, and the group's activation scale multiplies that. A workgroup takes (WG /
// p.team) · 4 columns (of one slot's expert). The host (q8x.rs) takes these paths only for one row
// of x, k a multiple of 32 and at most MAX_K, the experts with every expert of a projection in one
// binding. Not a complete shader: the lane builds it per format as emitted tables +
// dequant/common.wgsl + the format's decoder + the fast operands file + dequant/q8x/<format>.wgsl +
// this. The format's file also gives `q8x_stage`, which each workgroup runs before its first
// barrier (IQ2_XXS: its grid copied into workgroup memory; the others: nothing).

struct P {
    k: u32,             // length of a weight row: d (gate, up) or h (down), the linear's k
    w_stride: u32,      // words per weight row
    cols: u32,          // outputs of one expert: h (gate, up) or d (down); the linear's chunk rows
    slots: u32,         // the token's slots (top-k)
    experts: u32,       // experts in the binding
    expert_stride: u32, // weight rows from one expert's first row to the next's
    limit: u32,         // moe_up_q8x: the SwiGLU clamp (f32 bits)
    col_off: u32,       // linear_q8x: the first output column of the bound weight chunk
    has_bias: u32,      // linear_q8x
    team: u32,          // invocations of a team (8, 16 or 32): WG / team · TEAM_COLS columns
    // unused: the block is the lane's PARAM_BYTES (64) long, which a pipeline's immediate range
    // derived from a shorter struct would refuse
    u10: u32, u11: u32, u12: u32, u13: u32, u14: u32, u15: u32,
}

var<immediate> p: P; // the dispatch's immediate data (mod.rs, PARAM_BYTES)
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<storage, read> ids: array<i32>;

const WG: u32 = 256u;
const TEAM_COLS: u32 = 4u;
// The longest activation row (MAX_K in q8x.rs): a group a thread when rounding it.
const MAX_K: u32 = 8192u;

var<workgroup> xq: array<u32, 2048>;         // MAX_K / 4: the int8 row, value i in byte i % 4 of word i / 4
var<workgroup> xs: array<f32, 256>;          // MAX_K / 32: each group's scale
var<workgroup> red: array<f32, 1024>;        // WG · TEAM_COLS: the invocations' partial sums

// Bits 0..3 of s as byte masks: byte j is 0xff where bit j is set (bit j lands on bit 8j of the
// product; no two products of the four bits overlap).
fn q8x_byte_mask4(s: u32) -> u32 {
    return (((s & 15u) * 0x00204081u) & 0x01010101u) * 0xffu;
}

// Row `row` of x (p.k values) rounded to int8 into xq and xs, a group an invocation. A group with
// an inf or NaN gets a NaN scale, so the sums it reaches are NaN (where the f32 path's would be
// NaN or ±inf: either is non-finite, which is what the op harness compares). WGSL's round takes a
// tie to even where ggml's roundf takes it away from zero: either is within the step's half,
// which is what fast precision's bound counts. The codes are packed clamped: a group of
// subnormal values (amax / 127 subnormal, so 1 / dx inf) would otherwise carry an out-of-range
// conversion into its neighbours' bytes (its sums are then ≈ 1e-37, as the values).
fn quantize_row(li: u32, row: u32) {
    let o = row * p.k;
    for (var g = li; g < p.k / 32u; g += WG) {
        var v: array<f32, 32>;
        var amax = 0.0;
        var finite = true;
        for (var i = 0u; i < 32u; i++) {
            v[i] = x[o + 32u * g + i];
            amax = max(amax, abs(v[i]));
            finite = finite && abs(v[i]) <= 3.40282347e38;
        }
        let dx = amax / 127.0;
        let inv = select(0.0, 1.0 / dx, dx != 0.0);
        for (var j = 0u; j < 8u; j++) {
            let q = vec4<i32>(round(vec4<f32>(v[4u * j], v[4u * j + 1u], v[4u * j + 2u], v[4u * j + 3u]) * inv));
            xq[8u * g + j] = select(0u, pack4xI8Clamp(q), finite);
        }
        xs[g] = select(nan_f32(), dx, finite);
    }
}

// One output of a workgroup: a column's total and the column (p.cols or past: none).
struct ColumnSum {
    total: f32,
    col: u32,
}

// The workgroup's columns, (WG / p.team) · TEAM_COLS.
fn wg_cols() -> u32 {
    return (WG / p.team) * TEAM_COLS;
}

// Workgroup wgx's wg_cols() columns from `wgx · wg_cols()` of `expert` against the int8 row:
// each invocation's sums of its team's 4 columns (team_sums), then their totals (column_total).
fn columns(li: u32, wgx: u32, expert: u32) -> ColumnSum {
    return column_total(li, wgx, team_sums(li, team_rows(li, wgx, expert)));
}

// The first words of the rows of this invocation's team's 4 columns of `expert` (a column past the
// last reads the last's row, in bounds; nothing stores its sum).
fn team_rows(li: u32, wgx: u32, expert: u32) -> array<u32, 4> {
    let col0 = wgx * wg_cols() + (li / p.team) * TEAM_COLS;
    var base: array<u32, 4>;
    for (var j = 0u; j < TEAM_COLS; j++) {
        base[j] = (expert * p.expert_stride + min(col0 + j, p.cols - 1u)) * p.w_stride;
    }
    return base;
}

// This invocation's share of its team's 4 columns (rows from `base`): the row's groups lt,
// lt + p.team, … (lt its place in the team)
fn team_sums(li: u32, base: array<u32, 4>) -> vec4<f32> {
    var acc = vec4<f32>(0.0);
    for (var g = li % p.team; g < p.k / 32u; g += p.team) {
        var q: array<u32, 8>;
        for (var j = 0u; j < 8u; j++) { q[j] = xq[8u * g + j]; }
        let dx = xs[g];
        for (var j = 0u; j < TEAM_COLS; j++) {
            acc[j] = fma(dx, q8x_dot32(base[j], g, q), acc[j]);
        }
    }
    return acc;
}

// team_sums of two sets of rows in one pass (each set's sums as team_sums gives them), their
// weight loads in flight together.
fn team_sums2(li: u32, base_a: array<u32, 4>, base_b: array<u32, 4>) -> array<vec4<f32>, 2> {
    var acc: array<vec4<f32>, 2>;
    for (var g = li % p.team; g < p.k / 32u; g += p.team) {
        var q: array<u32, 8>;
        for (var j = 0u; j < 8u; j++) { q[j] = xq[8u * g + j]; }
        let dx = xs[g];
        for (var j = 0u; j < TEAM_COLS; j++) {
            acc[0][j] = fma(dx, q8x_dot32(base_a[j], g, q), acc[0][j]);
            acc[1][j] = fma(dx, q8x_dot32(base_b[j], g, q), acc[1][j]);
        }
    }
    return acc;
}

// The workgroup's column totals from each invocation's team sums `acc`: into red, then invocation
// li < wg_cols() totals column li % 4 of team li / 4 over the team's invocations in order; the
// others get no column. Every invocation calls it (a barrier); a second call needs a barrier
// before it.
fn column_total(li: u32, wgx: u32, acc: vec4<f32>) -> ColumnSum {
    for (var j = 0u; j < TEAM_COLS; j++) { red[li * TEAM_COLS + j] = acc[j]; }
    workgroupBarrier();
    var out = ColumnSum(0.0, p.cols);
    if (li < wg_cols()) {
        let t = li / TEAM_COLS;
        let j = li % TEAM_COLS;
        for (var i = 0u; i < p.team; i++) { out.total += red[(t * p.team + i) * TEAM_COLS + j]; }
        out.col = wgx * wg_cols() + li;
    }
    return out;
}

// The workgroup's number within its grid layer (a 2-D grid past the dispatch limit's columns).
fn flat(wg: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wg.y * nwg.x + wg.x;
}

// The expert of slot z, or -1 when its id is outside 0..experts (moe_sum makes its token NaN).
fn slot_expert(z: u32) -> i32 {
    let e = ids[z];
    return select(-1, e, e >= 0 && u32(e) < p.experts);
}

const STORE: u32 = 0u;
const SWIGLU: u32 = 1u;

// Slot z's wg_cols() columns from workgroup x (gate, up: of hid [slots, h] from the token's row
// of x; down: of ys [slots, d] from hid's row z), stored or, for the up, through the clamped SwiGLU with
// the gate's value already in y (moe_gate_q8x), as rows.wgsl's expert_rows.
fn expert_q8x(li: u32, wg: vec3<u32>, nwg: vec3<u32>, x_row: u32, epilogue: u32) {
    let e = slot_expert(wg.z);
    if (e < 0) { return; }
    q8x_stage(li);
    quantize_row(li, x_row);
    workgroupBarrier();
    let r = columns(li, flat(wg, nwg), u32(e));
    if (r.col < p.cols) {
        let at = wg.z * p.cols + r.col;
        if (epilogue == SWIGLU) {
            let lim = bitcast<f32>(p.limit);
            let g = min(y[at], lim);
            y[at] = g / (1.0 + exp(-g)) * clamp(r.total, -lim, lim);
        } else {
            y[at] = r.total;
        }
    }
}

@compute @workgroup_size(256, 1, 1)
fn moe_gate_q8x(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) li: u32) {
    expert_q8x(li, wg, nwg, 0u, STORE);
}

@compute @workgroup_size(256, 1, 1)
fn moe_up_q8x(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) li: u32) {
    expert_q8x(li, wg, nwg, 0u, SWIGLU);
}

// moe_gate_q8x then moe_up_q8x in one dispatch, where the up's experts follow the gate's in the
// binding (experts p.experts … 2·p.experts − 1: the lane's upload_expert_pair): the row rounded
// once, each team's columns of the gate's expert and of the up's summed in one pass, each
// reduced as `columns` reduces, the clamped SwiGLU of the two totals stored, as the two
// dispatches store it. A decode step's gate and up took two dispatches.
@compute @workgroup_size(256, 1, 1)
fn moe_gate_up_q8x(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) li: u32) {
    let e = slot_expert(wg.z);
    if (e < 0) { return; }
    q8x_stage(li);
    quantize_row(li, 0u);
    workgroupBarrier();
    let wgx = flat(wg, nwg);
    let sums = team_sums2(li, team_rows(li, wgx, u32(e)), team_rows(li, wgx, u32(e) + p.experts));
    let g = column_total(li, wgx, sums[0]);
    workgroupBarrier(); // every invocation's gate totals read from red before the up's overwrite it
    let u = column_total(li, wgx, sums[1]);
    if (g.col < p.cols) {
        let lim = bitcast<f32>(p.limit);
        let gc = min(g.total, lim);
        y[wg.z * p.cols + g.col] = gc / (1.0 + exp(-gc)) * clamp(u.total, -lim, lim);
    }
}

@compute @workgroup_size(256, 1, 1)
fn moe_down_q8x(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) li: u32) {
    expert_q8x(li, wg, nwg, wg.z, STORE);
}

// linear: y[0, col_off + c] = x[0] · W[c] (+ bias) for the bound chunk's columns c.
@compute @workgroup_size(256, 1, 1)
fn linear_q8x(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) li: u32) {
    q8x_stage(li);
    quantize_row(li, 0u);
    workgroupBarrier();
    let r = columns(li, flat(wg, nwg), 0u);
    if (r.col < p.cols) {
        let oc = p.col_off + r.col;
        var v = r.total;
        if (p.has_bias != 0u) {
            v += bias[oc];
        }
        y[oc] = v;
    }
}
