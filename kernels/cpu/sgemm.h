// The f32 GEMM behind the CPU matmul kernels (matmul.cpp: matmul, matmul_into, gemm_epilogue), and
// the run-time choice of the library that computes it:
//
//   c (M, N) = a (M, K) @ b (K, N)      c row-major and contiguous (ldc = N); a and b read in place
//                                       through their MatLayout (row-major, or column-major = a
//                                       transposed view), each with its own leading dimension
//
// Backends. `dnnl` (the default) is oneDNN's dnnl_sgemm: JIT kernels blocked for the machine's widest
// vector ISA (AVX-512 where present), about twice Eigen's rate at gpt-tiny's shapes, since Eigen is
// compiled for x86-64-v3 (AVX2) only. `eigen` is the Eigen GEMM that came before, kept so both can be
// run and timed in one binary. REEL_CPU_GEMM=dnnl|eigen picks it, read once, at the first GEMM;
// set_cpu_gemm overrides it (tests, benchmarks). f64 always runs on Eigen (gradcheck's dtype). `gemm`
// is the one entry the kernels call (matmul, attention's per-head products); conv2d's im2col path
// calls Eigen itself.
#pragma once
#include <cstdint>

#include "kernels/matrix_layout.h"

namespace reel::cpu {

enum class CpuGemm { dnnl, eigen };

// The backend of f32 GEMMs: set_cpu_gemm's choice, else REEL_CPU_GEMM's (read once), else dnnl.
CpuGemm cpu_gemm();
void set_cpu_gemm(CpuGemm backend);
const char* cpu_gemm_name(CpuGemm backend);
// "dnnl" / "eigen" (any case); anything else throws reel::Error naming the two.
CpuGemm parse_cpu_gemm(const char* value);

// c (M, N) = alpha a (M, K) @ b (K, N), each read in place through its layout, c row-major with
// row stride ldc (0: N, contiguous): f32 on the chosen backend, f64 on Eigen. c is written, not read.
// Single-threaded when called inside a parallel region, threaded by the library otherwise.
void gemm(const float* a, MatLayout la, const float* b, MatLayout lb, float* c, int64_t M, int64_t K, int64_t N,
          int64_t ldc = 0, float alpha = 1);
void gemm(const double* a, MatLayout la, const double* b, MatLayout lb, double* c, int64_t M, int64_t K, int64_t N,
          int64_t ldc = 0, double alpha = 1);

// c = alpha a @ b through oneDNN's sgemm, every operand f32 (ldc as gemm's). M, K, N >= 1. Threaded over the calling
// thread's OpenMP team size (omp_get_max_threads(), which GemmThreadScope narrows); on one thread when
// called inside a parallel region, so it never forks a team of its own there.
void sgemm_dnnl(const float* a, MatLayout la, const float* b, MatLayout lb, float* c, int64_t M, int64_t K, int64_t N,
                int64_t ldc = 0, float alpha = 1);

}  // namespace reel::cpu
