// Diagnostics: poke writes one u32 word at an arbitrary element index of a tensor's buffer
// (the whole buffer, guard band included, is bound) so tests can check the guard-band detector.
// Workgroup 1 thread, dispatch (1, 1, 1).

struct P {
    index: u32,
    value: u32,
    _a: u32,
    _b: u32,
    // padding: every dispatch pushes 16 words (mod.rs, PARAM_BYTES)
    _p4: u32, _p5: u32, _p6: u32, _p7: u32, _p8: u32, _p9: u32,
    _p10: u32, _p11: u32, _p12: u32, _p13: u32, _p14: u32, _p15: u32,
}

var<immediate> p: P; // the dispatch's immediate data (mod.rs, PARAM_BYTES)
@group(0) @binding(1) var<storage, read_write> buf: array<u32>;

@compute @workgroup_size(1, 1, 1)
fn poke() {
    buf[p.index] = p.value;
}
