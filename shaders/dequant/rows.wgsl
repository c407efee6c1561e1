// The weight part of a small-row build (rows.wgsl) over a block format: a span is a run of 32
// values decoded by the format's `decode_run` (every block scale read once per run); k is a whole
// number of runs.
@group(0) @binding(2) var<storage, read> w: array<u32>;

const SPAN: u32 = 32u;

fn load_span(r: u32, s: u32) -> array<f32, SPAN> {
    return decode_run(r * p.w_stride, s);
}
