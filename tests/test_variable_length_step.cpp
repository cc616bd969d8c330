// The accumulation contract for variable-length sequences (data/text_lines.h): a step over
// micro-batches of lines padded to their longest, counted by real tokens (set_items_per_step), gives
// the update of the same lines run one by one unpadded. Right padding leaves a causal model's real
// positions as they are (a real query never sees a later, padded key), and cross_entropy's
// ignore_index counts the padded targets out of the loss and of its mean. f64 on the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "data/text_lines.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "reel.h"

namespace reel {
namespace {

std::shared_ptr<nn::Module> small_gpt() {
  Generator gen(3);
  auto m = nn::gpt(nn::GptConfig{256, 24, 16, 2, 2}, &gen);
  m->to(DType::f64);
  return m;
}

double max_abs_diff(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    std::vector<double> x = a[i].to_vector<double>(), y = b[i].to_vector<double>();
    for (size_t k = 0; k < x.size(); ++k) d = std::max(d, std::abs(x[k] - y[k]));
  }
  return d;
}

TEST(VariableLengthStep, PaddedMicroBatchesUpdateAsTheUnpaddedLinesDo) {
  const std::vector<std::string> lines = {"A short line.", "Another, somewhat longer, line of text.", "ok",
                                          "Lines of every length come together in one batch", "twelve bytes"};
  data::LineSampler sampler(lines, 24, 11);
  std::vector<data::LineBatch> micro;
  int64_t tokens = 0;
  for (int i = 0; i < 3; ++i) {
    micro.push_back(sampler.next(3));
    tokens += micro.back().positions();
  }
  auto padded = small_gpt(), unpadded = small_gpt();
  const std::vector<Tensor> before = [&] {
    std::vector<Tensor> out;
    for (const Tensor& p : padded->parameters()) out.push_back(p.clone());
    return out;
  }();
  optim::SGD opt_padded(padded->parameters(), optim::SGDOptions(0.5)), opt_unpadded(unpadded->parameters(), optim::SGDOptions(0.5));
  opt_padded.set_items_per_step(tokens);
  opt_unpadded.set_items_per_step(tokens);
  int64_t lengths_seen = 0;
  for (const data::LineBatch& b : micro) {
    opt_padded.scale_loss(nn::model_loss(*padded, b.inputs, b.targets), b.positions()).backward();
    opt_padded.micro_step();
    for (int64_t row = 0; row < b.inputs.size(0); ++row) {
      const int64_t n = b.lengths[size_t(row)];
      lengths_seen = std::max(lengths_seen, b.inputs.size(1) - n);
      Tensor x = b.inputs.slice(0, row, row + 1).slice(1, 0, n).contiguous();   // (1, n)
      Tensor y = b.targets.slice(0, row, row + 1).slice(1, 0, n).contiguous();  // (1, n)
      opt_unpadded.scale_loss(nn::model_loss(*unpadded, x, y), n).backward();
      opt_unpadded.micro_step();
    }
  }
  EXPECT_GT(lengths_seen, 0) << "no batch held items of different lengths: the test would not test padding";
  EXPECT_EQ(opt_padded.step_count(), 1);
  EXPECT_EQ(opt_unpadded.step_count(), 1);
  // The update moved the parameters, and both ways moved them alike.
  EXPECT_GT(max_abs_diff(before, padded->parameters()), 1e-4);
  EXPECT_LT(max_abs_diff(padded->parameters(), unpadded->parameters()), 1e-10);
}

}  // namespace
}  // namespace reel
