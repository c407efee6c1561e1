// The language-model ops with a weight operand, over a block-format weight: the same entry
// points, bindings and parameter blocks as lm.wgsl's (see there), each reading W a run of 32
// values at a time through `decode_run` (dequant/<format>.wgsl). Not a complete shader: the
// lane builds it per format and precision as emitted tables + dequant/common.wgsl + the format
// file + an operands file (as lm.wgsl's GEMM ops, the products take both operands through
// `to_operand`) + this.
// Every weight row length (k, d, h) is a whole number of blocks, so of runs.

struct P {
    u0: u32, u1: u32, u2: u32, u3: u32,
    u4: u32, u5: u32, u6: u32, u7: u32,
    u8: u32, u9: u32, u10: u32, u11: u32,
    u12: u32, u13: u32, u14: u32, u15: u32,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read> ia: array<i32>;
@group(0) @binding(5) var<storage, read> ib: array<i32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;
@group(0) @binding(8) var<storage, read> w: array<u32>;

fn flat(wg: vec3<u32>, nwg: vec3<u32>, li: u32) -> u32 {
    return (wg.y * nwg.x + wg.x) * 256u + li;
}

// embed_rows, one thread per run of 32 output values (u0 = n·d elements; otherwise as lm.wgsl:
// u1 = d, u2 = vocab, u3 = row0, u4 = rows, u6 = stride words, u7 = first chunk).
@compute @workgroup_size(256, 1, 1)
fn embed_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) li: u32) {
    let t = flat(wg, nwg, li);
    if (t >= p.u0 / 32u) { return; }
    let d = p.u1;
    let i0 = t * 32u;
    let id = ia[i0 / d];
    if (id < 0) {
        if (p.u7 == 1u) {
            for (var j = 0u; j < 32u; j++) { out[i0 + j] = nan_f32(); }
        }
        return;
    }
    let r = u32(id);
    if (r >= p.u2) {
        if (p.u7 == 1u) {
            for (var j = 0u; j < 32u; j++) { out[i0 + j] = 0.0; }
        }
        return;
    }
    if (r >= p.u3 && r < p.u3 + p.u4) {
        let v = decode_run((r - p.u3) * p.u6, (i0 % d) / 32u);
        for (var j = 0u; j < 32u; j++) { out[i0 + j] = v[j]; }
    }
}

// grouped_linear: one thread per output (u0 = n·rows, u1 = rows, u2 = row0, u3 = k, u4 = r,
// u5 = g·k, u6 = g·r, u8 = stride).
@compute @workgroup_size(256, 1, 1)
fn grouped_linear(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) li: u32) {
    let x = flat(wg, nwg, li);
    if (x >= p.u0) { return; }
    let i = x / p.u1;
    let ol = x % p.u1;
    let o = p.u2 + ol;
    let k = p.u3;
    let xb = i * p.u5 + (o / p.u4) * k;
    var s = 0.0;
    for (var run = 0u; run < k / 32u; run++) {
        let v = decode_run(ol * p.u8, run);
        for (var j = 0u; j < 32u; j++) {
            s += f32(to_operand(a[xb + 32u * run + j])) * f32(to_operand(v[j]));
        }
    }
    out[i * p.u6 + o] = s;
}

// Slot t's token row of x against row j of this expert's weight (this build's format), k = d.
fn expert_row_dot(t: u32, j: u32) -> f32 {
    let xo = (t / p.u3) * p.u2;
    var s = 0.0;
    for (var run = 0u; run < p.u2 / 32u; run++) {
        let v = decode_run(j * p.u6, run);
        for (var e = 0u; e < 32u; e++) {
            s += f32(to_operand(a[xo + 32u * run + e])) * f32(to_operand(v[e]));
        }
    }
    return s;
}

// moe_gate, then moe_up on the same hid (u0 = (e's slots)·h, u1 = h, u2 = d, u3 = k, u4 = e,
// u6 = stride, u7 = limit, u8 = e's first entry in the slot list ib): lm.wgsl's pair, w1_e and
// w3_e each bound in its own format's build.
@compute @workgroup_size(256, 1, 1)
fn moe_gate(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) li: u32) {
    let y = flat(wg, nwg, li);
    if (y >= p.u0) { return; }
    let t = u32(ib[p.u8 + y / p.u1]);
    let j = y % p.u1;
    let x = t * p.u1 + j;
    if (ia[t] != i32(p.u4)) { return; }
    out[x] = expert_row_dot(t, j);
}

@compute @workgroup_size(256, 1, 1)
fn moe_up(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let y = flat(wg, nwg, li);
    if (y >= p.u0) { return; }
    let t = u32(ib[p.u8 + y / p.u1]);
    let j = y % p.u1;
    let x = t * p.u1 + j;
    if (ia[t] != i32(p.u4)) { return; }
    let u = expert_row_dot(t, j);
    let lim = bitcast<f32>(p.u7);
    let g = min(out[x], lim);
    out[x] = g / (1.0 + exp(-g)) * clamp(u, -lim, lim);
}

// moe_down (u0 = (e's slots)·d, u1 = d, u2 = h, u4 = e, u6 = stride, u8 = e's first entry in ib).
@compute @workgroup_size(256, 1, 1)
fn moe_down(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) li: u32) {
    let y = flat(wg, nwg, li);
    if (y >= p.u0) { return; }
    let t = u32(ib[p.u8 + y / p.u1]);
    let o = y % p.u1;
    let x = t * p.u1 + o;
    if (ia[t] != i32(p.u4)) { return; }
    var s = 0.0;
    for (var run = 0u; run < p.u2 / 32u; run++) {
        let v = decode_run(o * p.u6, run);
        for (var e = 0u; e < 32u; e++) {
            s += f32(to_operand(b[t * p.u2 + 32u * run + e])) * f32(to_operand(v[e]));
        }
    }
    out[x] = s;
}
