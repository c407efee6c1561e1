// The weight part of a small-row build (rows.wgsl) over a block format: a span is 8 values
// decoded by the format's `decode_run8`, so consecutive threads read consecutive 8-runs of the
// weight row and consecutive 32 bytes of each x row (spans of 32 put a subgroup's threads 128
// bytes apart in x and held 32 decoded values a thread; on an H200 under Vulkan the experts'
// small-row kernels ran 5× slower so).
@group(0) @binding(2) var<storage, read> w: array<u32>;

const SPAN: u32 = 8u;

fn load_span(r: u32, s: u32) -> array<f32, SPAN> {
    return decode_run8(r * p.w_stride, s);
}
