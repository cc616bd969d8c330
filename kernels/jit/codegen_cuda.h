// CUDA C source of a fused elementwise kernel, generated from its FusedExpr and FusedLoop, for NVRTC
// (kernels/jit/nvrtc.h compiles and launches it). Plain string building: no CUDA headers needed, so the
// generator is tested on machines without the CUDA toolchain too.
//
// The kernel (always named kFusedKernelName, one per program):
//   extern "C" __global__ void fused_elementwise_kernel(const T0* in0, ..., U0* out0, ...)
//   first waits for the kernels before it (griddepcontrol.wait: it is launched with programmatic
//   dependent launch, kernels/cuda/launch.cuh), then a grid-stride loop over element e of the loop
//   (kFusedBlockThreads threads a block):
//     the merged dims' indices from e by constant divisions (shapes and strides are specialised as
//     constants: the index math compiles to multiply-shifts), each input read at sum_d i_d * stride_d
//     (an input laid out like the outputs is read at e), the instructions as `const A rK = ...;`,
//     each output written at e. Every load comes first, before any instruction or store: a
//     thread has all its reads in flight at once (a horizontal group of 32 small in-place adds waits
//     on memory once, not 32 times; the compiler cannot move a load above a store to a pointer that
//     may alias it). The same values: a group reads a buffer it writes only at the element it
//     writes, and before writing it (compile/passes/fuse_elementwise.cpp), so no load sees a store of the group.
//   Index math is 32-bit (unsigned) when the element count and every operand's largest offset are
//   below 2^31, else 64-bit. Views' element offsets are not in the source: they are in the pointers.
//   A loop whose operands are all contiguous first runs a vector loop (fused_vector_width): when
//   every pointer is 16-byte aligned, each thread loads 8 consecutive elements of each input at once
//   (16 bytes of a 16-bit one), computes them one after another with the same instructions, and
//   stores 8 of each output; the grid-stride loop above then takes the remainder (or, misaligned,
//   everything). The values are the scalar loop's: only the memory accesses are wider.
// With column sums (kernels/fused_expr.h, FusedColumnSums; a contiguous loop whose rows of C columns
// are a multiple of kFusedVectorWidth: fused_column_sums_fit) the kernel walks rows instead: block
// (tile, chunk) of the grid (ceil(C / kFusedColumnTile), chunks) takes the tile's kFusedColumnTile
// columns over rows [chunk * rows_per_chunk, ...), its 32 lanes a pack of 8 adjacent columns each
// and its 8 warps every 8th row, computing each pack as the vector loop does (or element by element
// when a pointer is misaligned) and adding the summed output's stored values per column in f32.
// The warps' sums are added in warp order through shared memory and written as the chunk's partial;
// the tile's last block to finish (kernels/cuda/last_block.cuh's scheme, the counters a module global
// that starts at zero) adds the chunks' partials in order and writes (or adds to) the sums. One fixed
// order for a given grid: the same bits on every run, no float atomics.
// The device formulas are kernels/jit/nvrtc_math.h's text; 16-bit values are converted with the
// cvt.f32.f16 / cvt.rn.f16.f32 PTX instructions and bf16's bit arithmetic (round to nearest even),
// as cuda_fp16.h and the host's BFloat16 do, so the program needs no header at all.
#pragma once
#include <string>

#include "kernels/fused_expr.h"

namespace reel::jit {

constexpr const char* kFusedKernelName = "fused_elementwise_kernel";
constexpr int kFusedBlockThreads = 256;

// Elements a thread of the vector loop takes at once (one 16-byte load of a 16-bit operand).
constexpr int kFusedVectorWidth = 8;

// Inputs past which a loop takes the scalar loop alone: a thread of the vector loop holds a pack of
// every input in registers at once, and 9 or more packs of 8 values (up to 64 inputs in a horizontal
// group of small gradient adds) spill to local memory.
constexpr int kFusedVectorMaxInputs = 8;

// kFusedVectorWidth when every operand is contiguous in the loop's order (one merged dim of stride
// 1), there are at least that many elements and at most kFusedVectorMaxInputs inputs, so the kernel
// gets the vector loop; else 1. The launch sizes its grid by it.
int fused_vector_width(const FusedLoop& loop);

// True when the loop's element count and every operand's offsets fit 32-bit index math.
bool fused_loop_fits_32bit(const FusedLoop& loop);

// Columns of a column-sums block (32 lanes of kFusedVectorWidth), and the column tiles a kernel's
// counters cover.
constexpr int kFusedColumnTile = 32 * kFusedVectorWidth;
constexpr int kFusedColumnCounters = 4096;
// Whether the column-sums kernel takes the loop: contiguous (the vector loop's condition), rows of a
// multiple of kFusedVectorWidth columns, at most kFusedColumnCounters tiles of them.
bool fused_column_sums_fit(const FusedLoop& loop);

// The whole NVRTC program; `label` (the fused ops, say) becomes a comment at its top. With `sums` on,
// the column-sums kernel (the loop must fit it).
std::string cuda_fused_source(const FusedExpr& expr, const FusedLoop& loop, const std::string& label,
                              FusedColumnSums sums = {});

}  // namespace reel::jit
