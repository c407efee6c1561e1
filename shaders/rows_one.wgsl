// The row bound of a small-row build (rows.wgsl) for a lone sequence's decode step: one row of x
// (or one token's expert slots), so one accumulator pair, one x offset and no per-row tests.
const ROWS: u32 = 1u;
