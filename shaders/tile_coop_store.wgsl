// The store of the cooperative tiles' bodies (tile_coop.wgsl, tile_coop_direct.wgsl), built after
// either: a subgroup's 16×16 accumulator through its own rows of the body's workgroup `staging`
// (`STAGING_STRIDE` f32 a row) to tile_rows.wgsl's bounds-checked `store`.

// The 16×16 block `c` at tile rows m0 .., columns n0 .. of y, through subgroup `sg`'s staging:
// lane l stores elements l + 32·e. Every subgroup calls it the same number of times, so the
// barriers stay in uniform control flow.
fn store_block(t: TileRows, sg: u32, lane: u32, c: coop_mat16x16<f32, C>, m0: u32, n0: u32) {
    let base = sg * 16u * STAGING_STRIDE;
    coopStoreT(c, &staging[base], STAGING_STRIDE);
    workgroupBarrier();
    for (var e = 0u; e < 8u; e++) {
        let idx = lane + 32u * e;
        let m = idx / 16u;
        let col = idx % 16u;
        store(t, m0 + m, n0 + col, staging[base + m * STAGING_STRIDE + col]);
    }
    workgroupBarrier();
}
