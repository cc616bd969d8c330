// Variable-length text items (data/text_lines.h): lines split and cut as documented, batches padded
// with the pad token and cross_entropy's ignore_index, checked element by element against the items,
// and the padded loss equal to the loss over the real positions alone.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/text_lines.h"
#include "reel.h"
#include "test_util.h"

namespace reel {
namespace {

using data::LineBatch;
using data::LineSampler;

TEST(TextLines, SplitKeepsNonEmptyLinesWithoutTheirNewline) {
  EXPECT_EQ(data::split_lines("a\n\nbc\r\n\n\ndef"), (std::vector<std::string>{"a", "bc\r", "def"}));
  EXPECT_EQ(data::split_lines("one\n"), (std::vector<std::string>{"one"}));
  EXPECT_TRUE(data::split_lines("\n\n").empty());
  EXPECT_TRUE(data::split_lines("").empty());
}

TEST(TextLines, ItemsAreCutToTheContextAndOneByteLinesLeftOut) {
  LineSampler s({"x", "abcdefg", "hi", "jkl"}, 3);
  ASSERT_EQ(s.num_items(), 3u);
  EXPECT_EQ(s.item(0), "abcd");  // block_size + 1 bytes: 3 positions
  EXPECT_EQ(s.item(1), "hi");
  EXPECT_EQ(s.item(2), "jkl");
}

TEST(TextLines, BatchesArePaddedItemsOfTheirLongestLength) {
  const std::vector<std::string> lines = {"hello world", "hi", "a longer line of text here", "ok!"};
  LineSampler s(lines, 16, 7);
  for (int round = 0; round < 5; ++round) {
    LineBatch b = s.next(6);
    ASSERT_EQ(b.inputs.dim(), 2);
    const int64_t B = b.inputs.size(0), L = b.inputs.size(1);
    ASSERT_EQ(B, 6);
    ASSERT_EQ(b.lengths.size(), 6u);
    int64_t longest = 0;
    for (int64_t n : b.lengths) longest = std::max(longest, n);
    EXPECT_EQ(L, longest);
    std::vector<int64_t> x = b.inputs.to_vector<int64_t>(), y = b.targets.to_vector<int64_t>();
    int64_t total = 0;
    for (int64_t row = 0; row < B; ++row) {
      const int64_t n = b.lengths[size_t(row)];
      total += n;
      // The item this row holds: the one among the kept items whose bytes it spells.
      std::string spelled;
      for (int64_t t = 0; t < n; ++t) spelled += char(x[size_t(row * L + t)]);
      spelled += char(y[size_t(row * L + n - 1)]);
      bool found = false;
      for (size_t i = 0; i < s.num_items(); ++i) found = found || s.item(i) == spelled;
      EXPECT_TRUE(found) << "row " << row << " spells \"" << spelled << "\"";
      for (int64_t t = 0; t + 1 < n; ++t) EXPECT_EQ(y[size_t(row * L + t)], x[size_t(row * L + t + 1)]);
      for (int64_t t = n; t < L; ++t) {
        EXPECT_EQ(x[size_t(row * L + t)], data::kPadToken);
        EXPECT_EQ(y[size_t(row * L + t)], data::kIgnoreIndex);
      }
    }
    EXPECT_EQ(b.positions(), total);
  }
}

TEST(TextLines, DrawsAreAFunctionOfSeedAndDrawNumber) {
  const std::vector<std::string> lines = {"first line", "second", "third one", "4th", "fifth line here"};
  LineSampler a(lines, 32, 3), b(lines, 32, 3), c(lines, 32, 4);
  bool differs = false;
  for (int round = 0; round < 4; ++round) {
    LineBatch x = a.next(5), y = b.next(5), z = c.next(5);
    EXPECT_EQ(x.inputs.to_vector<int64_t>(), y.inputs.to_vector<int64_t>());
    EXPECT_EQ(x.lengths, y.lengths);
    differs = differs || x.lengths != z.lengths;
  }
  EXPECT_TRUE(differs) << "seeds 3 and 4 drew the same items 20 times";
  EXPECT_EQ(a.draws(), 20u);
}

TEST(TextLines, PadToABucketLength) {
  LineSampler s({"abc", "de"}, 8);
  LineBatch b = s.next(3, Device::cpu(), 8);
  EXPECT_EQ(b.inputs.size(1), 8);
  EXPECT_EQ(b.targets.size(1), 8);
  for (int64_t n : b.lengths) EXPECT_LE(n, 2);
}

TEST(TextLines, ThePaddedLossIsTheLossOverTheRealPositions) {
  // cross_entropy's mean skips ignore_index: over a padded batch it is the mean over the items' real
  // positions, and so is its gradient.
  const std::vector<std::string> lines = {"the quick brown fox", "jumps", "over the lazy dog", "!?"};
  LineSampler s(lines, 24, 9);
  LineBatch b = s.next(4, Device::cpu(), 24);
  const int64_t B = b.inputs.size(0), L = b.inputs.size(1), V = data::kByteVocab;
  Generator gen(5);
  Tensor logits = randn({B * L, V}, {DType::f64}, &gen);
  logits.set_requires_grad();
  Tensor padded = cross_entropy(logits, b.targets.reshape({B * L}));
  padded.backward();
  // The reference: the real rows alone, gathered by a plain loop.
  std::vector<double> all = logits.to_vector<double>(), real_logits;
  std::vector<int64_t> y = b.targets.to_vector<int64_t>(), real_targets;
  for (int64_t row = 0; row < B; ++row)
    for (int64_t t = 0; t < b.lengths[size_t(row)]; ++t) {
      const int64_t r = row * L + t;
      real_logits.insert(real_logits.end(), all.begin() + r * V, all.begin() + (r + 1) * V);
      real_targets.push_back(y[size_t(r)]);
    }
  const int64_t n = int64_t(real_targets.size());
  ASSERT_EQ(n, b.positions());
  Tensor ref_logits = tensor(real_logits, {n, V}, {DType::f64});
  ref_logits.set_requires_grad();
  Tensor ref = cross_entropy(ref_logits, tensor_i64(real_targets, {n}));
  ref.backward();
  EXPECT_NEAR(padded.item(), ref.item(), 1e-12);
  std::vector<double> g = logits.grad().to_vector<double>(), gr = ref_logits.grad().to_vector<double>();
  size_t k = 0;
  for (int64_t row = 0; row < B; ++row)
    for (int64_t t = 0; t < L; ++t)
      for (int64_t v = 0; v < V; ++v) {
        const double got = g[size_t((row * L + t) * V + v)];
        if (t < b.lengths[size_t(row)]) EXPECT_NEAR(got, gr[k++], 1e-15);
        else EXPECT_EQ(got, 0.0);
      }
}

TEST(TextLines, BadInputIsRefusedWithTheReason) {
  testing_util::expect_error([] { LineSampler({"a", "", "b"}, 8); }, {"LineSampler", "2 bytes"});
  testing_util::expect_error([] { LineSampler({"abc"}, 0); }, {"LineSampler", "block_size", "0"});
  LineSampler s({"abc"}, 4);
  testing_util::expect_error([&] { s.next(0); }, {"LineSampler::next", "batch_size"});
  testing_util::expect_error([&] { s.next(2, Device::cpu(), 5); }, {"pad_to 5", "[0, 4]"});
  testing_util::expect_error([&] { s.next(int64_t(1) << 62); }, {"2^63 bytes"});
}

}  // namespace
}  // namespace reel
