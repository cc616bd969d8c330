// The f32 GEMM of the CPU matmul kernels through oneDNN's sgemm, and the backend choice (sgemm.h).
//
//   c (M, N) = alpha a (M, K) @ b (K, N)   dnnl_sgemm(transa, transb, M, N, K, alpha, a, lda, b, ldb, 0, c, ldc)
//
// dnnl_sgemm is row-major BLAS: op(A) (M, K) is A itself stored row-major ('N', lda >= K) or the
// transpose of a row-major (K, M) matrix ('T', lda >= M). A column-major (M, K) matrix with outer
// stride s is exactly the latter with lda = s, so both MatLayouts are read in place, never copied.
// beta = 0: c is written, not read (the kernels hand over uninitialised outputs, NaN bits included).
//
// Why sgemm rather than the dnnl::matmul primitive: timed side by side on gpt-tiny's 15 Linear GEMMs
// (bench/gemm_bench.cpp, gemm_library/...; medians of 5 on the 2-core machine), the two took the same
// time in total, 50.7 against 50.2 ms on one thread and 27.0 against 26.9 ms on two, each shape
// within 12% either way; on matrix-vector shapes sgemm was 3-4x faster (one thread: 1 x 512 x 512
// 0.008 against 0.029 ms, 512 x 512 x 1 0.012 against 0.039 ms). At equal speed the simpler call
// wins: the primitive would also need a memory descriptor per layout, a cache of primitives keyed by
// shape, strides and thread count, and a fallback where it picks its slow reference kernel. Batches
// are looped by the caller (matmul.cpp).
//
// Threads. oneDNN is built on OpenMP (libgomp, as reel is) and sizes its team by omp_get_max_threads()
// of the calling thread, so matmul.cpp's policy (GemmThreadScope: small GEMMs on one thread) applies
// to it unchanged. Called inside an active parallel region (a batch split over threads), the call is
// narrowed to one thread first, so a worker never forks a nested team.
#include "kernels/cpu/sgemm.h"

#include <dnnl.h>

#include <Eigen/Dense>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <string>
#include <type_traits>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "tensor/error.h"

namespace reel::cpu {

namespace {

CpuGemm from_env() {
  const char* v = std::getenv("REEL_CPU_GEMM");
  return v && *v ? parse_cpu_gemm(v) : CpuGemm::dnnl;
}

// The choice, read from the environment at the first use (a bad value throws there and is read
// again next time); atomic so set_cpu_gemm may run while other threads multiply.
std::atomic<CpuGemm>& chosen() {
  static std::atomic<CpuGemm> backend{from_env()};
  return backend;
}

// Narrows this thread's OpenMP team to one for the scope when it is a worker of an active region.
struct NoNestedTeam {
#ifdef _OPENMP
  int saved = 0;
  NoNestedTeam() {
    if (omp_in_parallel() && omp_get_max_threads() > 1) {
      saved = omp_get_max_threads();
      omp_set_num_threads(1);
    }
  }
  ~NoNestedTeam() {
    if (saved) omp_set_num_threads(saved);
  }
#endif
  NoNestedTeam(const NoNestedTeam&) = delete;
  NoNestedTeam& operator=(const NoNestedTeam&) = delete;
};

template <typename T, int Order>
using ConstMatMap =
    Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Order>, 0, Eigen::OuterStride<>>;

template <typename T>
void gemm_on_backend(const T* a, MatLayout la, const T* b, MatLayout lb, T* c, int64_t M, int64_t K, int64_t N,
                     int64_t ldc, T alpha) {
  if (ldc == 0) ldc = N;
  if constexpr (std::is_same_v<T, float>) {
    if (cpu_gemm() == CpuGemm::dnnl) return sgemm_dnnl(a, la, b, lb, c, M, K, N, ldc, alpha);
  }
  Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0, Eigen::OuterStride<>> C(
      c, M, N, Eigen::OuterStride<>(ldc));
  auto times_b = [&](const auto& A) {
    if (lb.row_major) C.noalias() = A * ConstMatMap<T, Eigen::RowMajor>(b, K, N, Eigen::OuterStride<>(lb.outer));
    else C.noalias() = A * ConstMatMap<T, Eigen::ColMajor>(b, K, N, Eigen::OuterStride<>(lb.outer));
    if (alpha != T(1)) C *= alpha;
  };
  if (la.row_major) times_b(ConstMatMap<T, Eigen::RowMajor>(a, M, K, Eigen::OuterStride<>(la.outer)));
  else times_b(ConstMatMap<T, Eigen::ColMajor>(a, M, K, Eigen::OuterStride<>(la.outer)));
}

}  // namespace

void gemm(const float* a, MatLayout la, const float* b, MatLayout lb, float* c, int64_t M, int64_t K, int64_t N,
          int64_t ldc, float alpha) {
  gemm_on_backend(a, la, b, lb, c, M, K, N, ldc, alpha);
}

void gemm(const double* a, MatLayout la, const double* b, MatLayout lb, double* c, int64_t M, int64_t K, int64_t N,
          int64_t ldc, double alpha) {
  gemm_on_backend(a, la, b, lb, c, M, K, N, ldc, alpha);
}

CpuGemm parse_cpu_gemm(const char* value) {
  std::string v(value ? value : "");
  for (char& ch : v) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  if (v == "dnnl" || v == "onednn") return CpuGemm::dnnl;
  if (v == "eigen") return CpuGemm::eigen;
  throw Error(
      detail::cat("REEL_CPU_GEMM=", value ? value : "", ": expected dnnl (oneDNN's sgemm, the default) or eigen"));
}

CpuGemm cpu_gemm() { return chosen().load(std::memory_order_relaxed); }

void set_cpu_gemm(CpuGemm backend) { chosen().store(backend, std::memory_order_relaxed); }

const char* cpu_gemm_name(CpuGemm backend) { return backend == CpuGemm::dnnl ? "dnnl" : "eigen"; }

void sgemm_dnnl(const float* a, MatLayout la, const float* b, MatLayout lb, float* c, int64_t M, int64_t K, int64_t N,
                int64_t ldc, float alpha) {
  REEL_ASSERT(M >= 1 && K >= 1 && N >= 1, "sgemm of ", M, " x ", K, " x ", N);
  if (ldc == 0) ldc = N;
  NoNestedTeam one_thread_inside_a_team;
  const dnnl_status_t status = dnnl_sgemm(la.row_major ? 'N' : 'T', lb.row_major ? 'N' : 'T', M, N, K, alpha, a,
                                          la.outer, b, lb.outer, 0.0f, c, ldc);
  REEL_ASSERT(status == dnnl_success, "dnnl_sgemm status ", int(status), " for ", M, " x ", K, " x ", N, " (lda ",
              la.outer, ", ldb ", lb.outer, ")");
}

}  // namespace reel::cpu
