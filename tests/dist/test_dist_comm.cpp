// The MPI communicator on two ranks: every collective and dtype, counting, dup, and the timeout that
// turns a missing peer into a reel::Error.
#include <chrono>
#include <thread>

#include "distributed/communicator.h"
#include "tests/dist/dist_test_util.h"

namespace reel {
namespace {

using dist::ReduceOp;

TEST(DistComm, RanksAndBackend) {
  REEL_NEED_TWO_RANKS();
  dist::Communicator& w = dist::world();
  EXPECT_EQ(w.world_size(), 2);
  EXPECT_TRUE(w.rank() == 0 || w.rank() == 1);
  EXPECT_NE(w.describe().find("mpi"), std::string::npos) << w.describe();
  EXPECT_TRUE(dist::launched_by_mpirun());
  // Both ranks run on this host.
  EXPECT_EQ(dist::local_rank(), w.rank());
}

TEST(DistComm, AllReduceEveryOpAndDtype) {
  REEL_NEED_TWO_RANKS();
  dist::Communicator& w = dist::world();
  const double r = w.rank();
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    auto make = [&] { return tensor({1 + r, -2 * r, 0.5}, {3}, TensorOptions().with_dtype(dt)); };
    Tensor s = make(), m = make(), hi = make(), lo = make();
    w.all_reduce(s, ReduceOp::sum);
    w.all_reduce(m, ReduceOp::mean);
    w.all_reduce(hi, ReduceOp::max);
    w.all_reduce(lo, ReduceOp::min);
    EXPECT_EQ(s.to_vector<double>(), (std::vector<double>{3, -2, 1})) << dtype_name(dt);
    EXPECT_EQ(m.to_vector<double>(), (std::vector<double>{1.5, -1, 0.5})) << dtype_name(dt);
    EXPECT_EQ(hi.to_vector<double>(), (std::vector<double>{2, 0, 0.5})) << dtype_name(dt);
    EXPECT_EQ(lo.to_vector<double>(), (std::vector<double>{1, -2, 0.5})) << dtype_name(dt);
  }
  Tensor i = tensor_i64({w.rank() + 1, 10 * w.rank()}, {2});
  w.all_reduce(i, ReduceOp::sum);
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{3, 10}));
  // A non-contiguous view is reduced through a copy and written back in place.
  Tensor base = full({2, 3}, 1 + r, TensorOptions().with_dtype(DType::f64));
  w.all_reduce(base.transpose(0, 1), ReduceOp::sum);
  EXPECT_EQ(base.to_vector<double>(), std::vector<double>(6, 3.0));
}

TEST(DistComm, BroadcastAllGatherBarrierAndCount) {
  REEL_NEED_TWO_RANKS();
  dist::Communicator& w = dist::world();
  const uint64_t before = w.collective_count();
  Tensor t = full({2, 2}, 10.0 + w.rank(), TensorOptions().with_dtype(DType::f64));
  w.broadcast(t, 1);
  EXPECT_EQ(t.to_vector<double>(), std::vector<double>(4, 11.0));
  Tensor g = w.all_gather(tensor({double(w.rank()), 5}, {2}));
  EXPECT_EQ(g.shape(), (Shape{2, 2}));
  EXPECT_EQ(g.to_vector<double>(), (std::vector<double>{0, 5, 1, 5}));
  w.barrier();
  EXPECT_EQ(w.collective_count() - before, 3u);
}

TEST(DistComm, DupIsIndependent) {
  REEL_NEED_TWO_RANKS();
  std::unique_ptr<dist::Communicator> d = dist::world().dup();
  EXPECT_EQ(d->rank(), dist::rank());
  EXPECT_EQ(d->world_size(), 2);
  Tensor t = full({3}, 1.0);
  d->all_reduce(t);
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(3, 2.0f));
  EXPECT_EQ(d->collective_count(), 1u);
}

TEST(DistComm, MissingPeerTimesOutWithAClearError) {
  REEL_NEED_TWO_RANKS();
  std::unique_ptr<dist::Communicator> d = dist::world().dup();
  d->set_timeout_seconds(0.3);
  if (d->rank() == 0) {
    try {
      d->barrier();  // rank 1 is late
      ADD_FAILURE() << "expected a timeout";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("barrier"), std::string::npos) << msg;
      EXPECT_NE(msg.find("timed out on rank 0 after 0.3 s"), std::string::npos) << msg;
    }
    // The communicator is unusable now: its collectives no longer line up.
    try {
      d->barrier();
      ADD_FAILURE() << "expected the broken communicator to refuse";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("unusable"), std::string::npos) << e.what();
    }
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    d->set_timeout_seconds(30);
    d->barrier();  // completes rank 0's abandoned barrier
  }
  dist::world().barrier();
}

TEST(DistComm, TracedCollectiveIsRefused) {
  REEL_NEED_TWO_RANKS();
  struct Observer : DispatchObserver {
    void on_dispatch(OpKind, const std::vector<Tensor>&, const std::vector<Tensor>&, const Attrs&, bool) override {}
  } observer;
  Tensor t = zeros({2});
  ScopedDispatchObserver watching(&observer);  // restored on any exit, an unexpected exception included
  try {
    dist::world().all_reduce(t);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be recorded by the compiler"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace reel
