// Test hooks, never launched by the model.
//   debug_poke_u32: one thread writes `value` at word `index` of `buf` (the host checks the index is
//                   inside the allocation, guard band included), to prove guard bands catch overruns.

extern "C" __global__ void debug_poke_u32(unsigned int* buf, unsigned int index, unsigned int value) {
    grid_wait();
    if (blockIdx.x == 0 && threadIdx.x == 0) buf[index] = value;
}
