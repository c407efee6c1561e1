// GEMM operands in fast precision (`--precision fast`, needs SHADER_F16; the lane emits
// `enable f16;` first): each operand is rounded once to the nearest f16, ties to even (the CUDA
// lane's cvt.rn.f16), and kept as f16 in the GEMM tiles (half the workgroup memory). The products
// of two f16 values are exact in f32, so with f32 accumulation the result is the f32 GEMM of the
// rounded operands, whatever the device: the rounding is done here in integer arithmetic, because
// WGSL lets an f32 → f16 conversion of an inexact value go to either neighbour (only an exact
// value converts exactly). f16's range is the price: a magnitude of 65520 or more rounds past
// f16's largest value, and what the f16 conversion then gives is up to the device (WGSL leaves it
// indeterminate); the model's GEMM inputs are normalised or clamped far below it.
alias operand = f16;

fn to_operand(v: f32) -> f16 {
    return f16(round_to_f16(v));
}

// v rounded to the nearest value f16 holds (ties to even), as an f32; ±inf beyond f16's range.
fn round_to_f16(v: f32) -> f32 {
    let u = bitcast<u32>(v);
    let mag = u & 0x7fffffffu;
    let sign = u & 0x80000000u;
    if (mag >= 0x7f800000u) {
        return v; // inf, NaN
    }
    if (mag >= 0x477ff000u) {
        return bitcast<f32>(sign | 0x7f800000u); // ≥ 65520: past the tie with the next binade
    }
    if (mag < 0x38800000u) {
        // below 2^-14, f16's subnormal step 2^-24: scaling by 2^24 is exact, round() ties to even
        let r = round(abs(v) * 16777216.0) * 5.9604644775390625e-8;
        return bitcast<f32>(sign | bitcast<u32>(r));
    }
    // normal: keep 10 of the 23 fraction bits, to nearest with ties to the even kept bit (a
    // carry out of the fraction moves the exponent up, which is the right neighbour)
    let keep_odd = (mag >> 13u) & 1u;
    return bitcast<f32>(sign | ((mag + 0xfffu + keep_odd) & 0xffffe000u));
}
