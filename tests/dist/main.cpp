// main of build/reel_dist_tests, the data-parallel suite that `make test` runs as
//     mpirun -np 2 --oversubscribe build/reel_dist_tests
// It starts the process's communicator first (MPI under mpirun: the plugin build/libreel_mpi.so
// beside this binary), with a 120 s collective timeout so that a desynchronised test fails instead
// of hanging CI. Rank 0 prints GoogleTest's usual output; other ranks print only their failures,
// prefixed with their rank. Each rank returns its own result, and mpirun fails when any rank does.
// Without mpirun the suite runs with world size 1 and the multi-rank tests skip, saying so.
#include <gtest/gtest.h>

#include <cstdio>

#include "distributed/communicator.h"
#include "tensor/error.h"

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                 r.summary());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed())
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  try {
    reel::dist::Communicator& world = reel::dist::init();
    world.set_timeout_seconds(120);
    rank = world.rank();
    if (rank == 0)
      std::printf("reel_dist_tests: %d rank%s, %s\n", world.world_size(), world.world_size() == 1 ? "" : "s",
                  world.describe().c_str());
  } catch (const reel::Error& e) {
    std::fprintf(stderr, "reel_dist_tests: %s\n", e.what());
    return 1;
  }
  if (rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  return RUN_ALL_TESTS();
}
