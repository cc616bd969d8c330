// Autotuned GEMMs for the CUDA matmul (max-autotune: kernels/autotune.h). Declared without CUDA
// types; defined in gemm_autotune.cu.
//
// A problem is one strided-batched GEMM in cuBLAS's column-major terms (matmul.cu maps reel's
// row-major problem onto it): for i in [0, batch)
//
//   C_i (m, n) = op(A_i) (m, k) @ op(B_i) (k, n)   (+ C_i when accumulate)
//
// with X_i at X + i * stride_x elements (stride 0: one shared matrix). On the first eager call of a
// problem the candidates are timed on the call's own operands — cuBLASLt's heuristic candidates and
// the untuned path — and the fastest is cached for the process; later calls (graph captures and
// their replays included) only look it up.
#pragma once
#include <cstdint>
#include <functional>

#include "tensor/tensor.h"

namespace reel::cuda {

struct GemmProblem {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;  // op(X) = X^T
  int64_t lda = 0, ldb = 0, ldc = 0;      // leading dims of A, B, C as stored (column-major)
  int64_t stride_a = 0, stride_b = 0, stride_c = 0, batch = 1;
  DType in = DType::f32;   // A and B
  DType out = DType::f32;  // C: `in`, or f32 from 16-bit operands
  bool accumulate = false;  // beta = 1
  Device device = Device::cuda(0);
};

// Computes the problem into `c` with its tuned choice, tuning it first when it has none and the
// current stream is not being captured (a capture without a choice takes the untuned path and
// caches nothing). `run_default(dst)` computes the problem into dst the untuned way
// (cublasGemmStridedBatchedEx, CUBLAS_GEMM_DEFAULT): it is timed as one candidate, on a scratch
// output, and is what runs whenever it wins or no cuBLASLt candidate applies.
void gemm_autotuned(const GemmProblem& p, const void* a, const void* b, void* c,
                    const std::function<void(void* dst)>& run_default);

// How many problems have been tuned so far (process-wide; each once, when its choice is cached).
int64_t gemm_tunings();

// Split-K for GEMMs whose output is too small to fill the GPU: a weight gradient dW (D, C) =
// dy^T x of 16-bit operands into f32 (the compiled step's matmul_into, accumulating over
// micro-batches), where K (the rows, B T) is long and the output tiles few — gpt-tiny's (256, 256)
// over K = 2048 is four 128 x 128 tiles, four SMs of 132 walking 2048 deep. For a single GEMM (batch
// 1) of 16-bit operands and an f32 result, cuBLASLt's first heuristic algorithm is checked for the
// waves it fills; when two or more splits of at least 256 of K fit in one wave, the most such splits
// (a power of two, at most 16) run with the in-place reduction scheme: the partial sums are added in
// the f32 result in an order that counters in the workspace fix, so the bits are the same on every
// run (no float atomics), and the reduction is in f32 as reel's precision contract asks. The choice
// depends on the problem (shapes, leading dims, alignments) and the GPU only, never on a timing;
// it is made once per problem, outside or inside a capture (no device work), and cached.
// Returns false, having done nothing, when the problem takes no split (the caller runs its own path).
bool gemm_split_k(const GemmProblem& p, const void* a, const void* b, void* c);

// How many GEMMs gemm_split_k has run so far (process-wide; captured calls count once, at capture).
int64_t gemm_split_k_runs();

}  // namespace reel::cuda
