// The reduction of the small-row products (rows.wgsl) through workgroup memory, for a device
// without subgroup operations: a tree over the WG threads' partials, every row at each step.
struct Lane {
    @builtin(local_invocation_index) li: u32,
}

var<workgroup> partials: array<vec2<f32>, ROWS * WG>; // [ROWS][WG]: row i's partials of thread t at i·WG + t
var<workgroup> sums: array<vec2<f32>, ROWS>;

fn reduce_rows(lane: Lane, acc: array<vec2<f32>, ROWS>) {
    for (var i = 0u; i < ROWS; i++) {
        partials[i * WG + lane.li] = acc[i];
    }
    workgroupBarrier();
    for (var width = WG / 2u; width > 0u; width >>= 1u) {
        if (lane.li < width) {
            for (var i = 0u; i < ROWS; i++) {
                partials[i * WG + lane.li] += partials[i * WG + lane.li + width];
            }
        }
        workgroupBarrier();
    }
    if (lane.li < ROWS) {
        sums[lane.li] = partials[lane.li * WG];
    }
    workgroupBarrier();
}
