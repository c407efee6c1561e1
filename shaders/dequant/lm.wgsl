// lm.wgsl's weight lookup, embed_rows, over a block-format weight: the same entry point, bindings
// and parameter block as lm.wgsl's (see there), reading W a run of 32 values at a time through
// `decode_run` (dequant/<format>.wgsl). Not a complete shader: the lane builds it per format as
// emitted tables + dequant/common.wgsl + the format file + the exact operands file + this.
// Every weight row length is a whole number of blocks, so of runs.

struct P {
    u0: u32, u1: u32, u2: u32, u3: u32,
    u4: u32, u5: u32, u6: u32, u7: u32,
    u8: u32, u9: u32, u10: u32, u11: u32,
    u12: u32, u13: u32, u14: u32, u15: u32,
}

var<immediate> p: P; // the dispatch's immediate data (mod.rs, PARAM_BYTES)
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(4) var<storage, read> ia: array<i32>;
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
