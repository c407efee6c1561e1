// The weight part of a small-row build (rows.wgsl) over a float format: a span is the pair of
// elements `load_pair` reads (linear_packed.wgsl: one bf16/f16 word or two f32 words;
// linear_f16.wgsl: one vec2<f16>), so consecutive threads read consecutive words.
const SPAN: u32 = 2u;

fn load_span(r: u32, s: u32) -> array<f32, SPAN> {
    let v = load_pair(r, 2u * s);
    return array<f32, SPAN>(v.x, v.y);
}
