// (d) The distributed sampler on two ranks: each rank's DataLoader shard, gathered, is disjoint from
// the other's and together they cover the data set (padded: one item twice; cut: one item skipped).
#include <set>

#include "data/loader.h"
#include "tests/dist/dist_test_util.h"

namespace reel {
namespace {

TEST(DistSampler, ShardsAreDisjointAndCoverTheDataSet) {
  REEL_NEED_TWO_RANKS();
  dist::Communicator& w = dist::world();
  const int64_t n = 101;
  Tensor x = zeros({n, 1});
  Tensor y = arange(n, TensorOptions().with_dtype(DType::i64));
  for (bool cut : {false, true})
    for (int64_t epoch : {0, 3}) {
      data::DataLoader loader(
          x, y, data::DataLoaderOptions().with_batch_size(8).with_seed(7).with_shard(w.rank(), 2, cut));
      loader.set_epoch(epoch);
      std::vector<int64_t> mine;
      for (const data::Batch& b : loader)
        for (int64_t v : b.targets.to_vector<int64_t>()) mine.push_back(v);
      ASSERT_EQ(int64_t(mine.size()), cut ? 50 : 51);  // the same count on both ranks
      std::vector<int64_t> both = w.all_gather(tensor_i64(mine, {int64_t(mine.size())})).to_vector<int64_t>();
      std::set<int64_t> r0(both.begin(), both.begin() + int64_t(mine.size()));
      std::set<int64_t> r1(both.begin() + int64_t(mine.size()), both.end());
      std::set<int64_t> all(both.begin(), both.end());
      size_t common = 0;
      for (int64_t v : r0) common += r1.count(v);
      EXPECT_EQ(r0.size(), mine.size()) << "a rank's shard repeats an item";
      if (cut) {
        EXPECT_EQ(common, 0u) << "epoch " << epoch;
        EXPECT_EQ(all.size(), 100u) << "epoch " << epoch;  // one item skipped this epoch
      } else {
        EXPECT_EQ(common, 1u) << "epoch " << epoch;  // the padding repeats the order's first item
        EXPECT_EQ(all.size(), 101u) << "epoch " << epoch;
      }
    }
}

}  // namespace
}  // namespace reel
