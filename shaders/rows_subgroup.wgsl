// The reduction of the small-row products (rows.wgsl) on a device with subgroup operations
// (wgpu's SUBGROUP feature): one subgroupAdd per row inside each subgroup, then thread i adds the
// subgroups' totals of row i in subgroup order.
struct Lane {
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_invocation_id) sli: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
}

var<workgroup> partials: array<vec2<f32>, ROWS * WG>; // [ROWS][WG]: row i's totals of subgroup s at i·WG + s
var<workgroup> sums: array<vec2<f32>, ROWS>;

fn reduce_rows(lane: Lane, acc: array<vec2<f32>, ROWS>) {
    for (var i = 0u; i < ROWS; i++) {
        let s = subgroupAdd(acc[i]);
        if (lane.sli == 0u) {
            partials[i * WG + lane.sg] = s;
        }
    }
    workgroupBarrier();
    if (lane.li < ROWS) {
        var t = vec2<f32>(0.0);
        for (var s = 0u; s < lane.nsg; s++) {
            t += partials[lane.li * WG + s];
        }
        sums[lane.li] = t;
    }
    workgroupBarrier();
}
