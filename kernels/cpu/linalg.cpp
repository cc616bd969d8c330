// CPU kernels of the linalg family: registration, and the GEMM threading policy shared by the
// kernels, which live in matmul.cpp (oneDNN sgemm or Eigen GEMM over a broadcast batch; sgemm.h) and
// conv2d.cpp (im2col + GEMM, forward and both backward ops).
//
// Threading policy. Eigen splits one GEMM over omp_get_max_threads() threads unless it is called
// inside a parallel region; oneDNN's sgemm sizes its team by the same omp_get_max_threads(). Their
// threads synchronise by spinning, so a small GEMM split in two can take milliseconds instead of
// microseconds whenever another process holds one of the cores (seen on the shared 2-core machines:
// Eigen's 128^3 went from 0.07 ms to 0.3-7 ms; sgemm's 128 x 64 x 128 from 0.017 ms to 8 ms). So a
// GEMM below kGemmThreadFlops runs on the calling thread alone; above it the library threads it. A
// batch of GEMMs (batched matmul, one per image in conv2d) is instead split over threads one GEMM
// each, once the batch holds kGemmForkFlops of work, with the GEMM single-threaded inside. The OpenMP
// thread count is a per-thread setting (the nthreads-var ICV), so narrowing it here affects only
// the calling thread's next parallel regions, and it is restored straight after.
#include <Eigen/Core>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cpu/gemm_threading.h"
#include "kernels/cpu/loops.h"
#include "kernels/dispatch.h"

namespace reel {
namespace cpu {

void register_matmul_cpu_kernel();
void register_conv2d_cpu_kernels();

namespace {
// About 0.4 ms of one core's GEMM (256^3 * 2 flops): below it a split saves less than it risks.
constexpr double kGemmThreadFlops = double(1 << 25);
// About 30 us of one core's GEMMs: enough to repay one fork/join of the batch loop.
constexpr double kGemmForkFlops = double(1 << 21);
}  // namespace

bool split_gemm_batch(int64_t count, double flops_each) {
#ifdef _OPENMP
  return count >= 2 && omp_get_max_threads() > 1 && double(count) * flops_each >= kGemmForkFlops;
#else
  return false;
#endif
}

int narrow_gemm_threads(double flops) {
#ifdef _OPENMP
  int saved = omp_get_max_threads();
  if (flops < kGemmThreadFlops && saved > 1) omp_set_num_threads(1);
  return saved;
#else
  return 1;
#endif
}

void restore_gemm_threads(int saved) {
#ifdef _OPENMP
  if (omp_get_max_threads() != saved) omp_set_num_threads(saved);
#endif
}

}  // namespace cpu

void register_linalg_cpu_kernels() {
  // The kernels call Eigen's GEMM from inside OpenMP regions; initialise its shared state (thread
  // count, cache sizes) once, up front, as Eigen asks of multi-threaded callers.
  Eigen::initParallel();
  cpu::register_matmul_cpu_kernel();
  cpu::register_conv2d_cpu_kernels();
}

}  // namespace reel
