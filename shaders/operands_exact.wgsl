// GEMM operands in exact precision (`--precision exact`): every matrix product reads its operands
// as the f32 they are. A GEMM kernel appends this or operands_fast.wgsl (the lane picks per
// weight): it stores `to_operand(v)` of each weight value in its tiles of type `operand` (x's
// values it copies: x is bound as `array<operand>`, in fast precision the f16 copy half_rows.wgsl
// makes) and multiplies `f32(...)` of them with f32 accumulation, so one body serves both
// precisions.
alias operand = f32;

fn to_operand(v: f32) -> f32 {
    return v;
}
