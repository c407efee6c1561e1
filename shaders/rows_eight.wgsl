// The row bound of a small-row build (rows.wgsl) for up to 8 rows of x (or expert slots a pass):
// rows.rs's SMALL_ROWS.
const ROWS: u32 = 8u;
