// Helpers of the mpirun suite (tests/dist/): skipping without two ranks, and comparing runs.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "reel.h"

namespace reel::dist_test {

// Skips the test unless the world has exactly two ranks (what `make test` starts).
#define REEL_NEED_TWO_RANKS()                                                                            \
  do {                                                                                                   \
    if (::reel::dist::world_size() != 2)                                                                 \
      GTEST_SKIP() << "needs 2 ranks (mpirun -np 2), world size is " << ::reel::dist::world_size();      \
  } while (0)

// max_i |a_i - b_i| / max(max_i |b_i|, tiny): the error relative to the reference's scale.
inline double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 1e-300;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return std::isnan(diff) ? INFINITY : diff / scale;
}

inline std::vector<double> values(const std::vector<Tensor>& ts) {
  std::vector<double> out;
  for (const Tensor& t : ts)
    for (double v : t.to_vector<double>()) out.push_back(v);
  return out;
}

// Where the equivalence tests run: the CPU (MPI carries the gradients), or with
// REEL_DIST_TEST_DEVICE=cuda each rank's GPU (cuda:<local rank>; NCCL carries them).
inline Device test_device() {
  const char* v = std::getenv("REEL_DIST_TEST_DEVICE");
  if (v && std::string(v) == "cuda") return Device::cuda(dist::local_rank());
  return Device::cpu();
}

// Whether every rank passed `ok` (so that both ranks agree on whether to go on).
inline bool all_ranks(bool ok) {
  Tensor t = tensor({ok ? 1.0 : 0.0}, {1}, TensorOptions().with_dtype(DType::f64));
  dist::world().all_reduce(t, dist::ReduceOp::min);
  return t.item() == 1.0;
}

}  // namespace reel::dist_test
