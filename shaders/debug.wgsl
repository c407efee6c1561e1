// Diagnostics: poke writes one u32 word at an arbitrary element index of a tensor's buffer
// (the whole buffer, guard band included, is bound) so tests can check the guard-band detector.
// Workgroup 1 thread, dispatch (1, 1, 1).

struct P {
    index: u32,
    value: u32,
    _a: u32,
    _b: u32,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> buf: array<u32>;

@compute @workgroup_size(1, 1, 1)
fn poke() {
    buf[p.index] = p.value;
}
