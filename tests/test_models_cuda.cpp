// The three benchmark models of MODELS.md on the GPU against the CPU: from the same initial weights
// and inputs, the loss and every parameter's gradient agree (f32; the backends sum in different
// orders, which a deep network amplifies a little). Skips, saying why, where no GPU is visible.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "nn/nn.h"
#include "tensor/cuda.h"
#include "test_util.h"

using namespace reel;

namespace {

double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return (std::isnan(num) || a.size() != b.size()) ? INFINITY : std::sqrt(num / std::max(den, 1e-300));
}

struct ModelCase {
  const char* name;
  std::function<std::shared_ptr<nn::Module>(Generator*)> make;
  std::function<std::pair<Tensor, Tensor>()> batch;  // (inputs, targets) on the CPU
};

std::vector<ModelCase> model_cases() {
  auto tokens = [](int64_t B, int64_t T) {
    Generator g(4);
    std::vector<int64_t> v;
    for (double u : uniform({B * (T + 1)}, 0, 256, {DType::f64}, &g).to_vector<double>())
      v.push_back(std::min<int64_t>(255, int64_t(u)));
    Tensor all = tensor_i64(v, {B, T + 1});
    return std::make_pair(all.slice(1, 0, T).contiguous(), all.slice(1, 1, T + 1).contiguous());
  };
  return {
      {"cnn-small", [](Generator* g) { return std::static_pointer_cast<nn::Module>(nn::cnn_small(g)); },
       [] {
         Generator g(3);
         return std::make_pair(randn({8, 3, 32, 32}, {}, &g), tensor_i64({0, 1, 2, 3, 4, 5, 6, 7}, {8}));
       }},
      {"gpt-tiny", [](Generator* g) { return std::static_pointer_cast<nn::Module>(nn::gpt_tiny(g)); },
       [tokens] { return tokens(2, 128); }},
      {"gpt-small", [](Generator* g) { return std::static_pointer_cast<nn::Module>(nn::gpt_small(g)); },
       [tokens] { return tokens(1, 256); }},
  };
}

}  // namespace

TEST(CudaModels, LossAndGradientsMatchTheCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (const ModelCase& c : model_cases()) {
    SCOPED_TRACE(c.name);
    Generator g1(1), g2(1);
    auto cpu_model = c.make(&g1), gpu_model = c.make(&g2);
    gpu_model->to(Device::cuda());
    auto [x, y] = c.batch();
    Tensor loss_c = nn::model_loss(*cpu_model, x, y);
    Tensor loss_g = nn::model_loss(*gpu_model, x.to(Device::cuda()), y.to(Device::cuda()));
    loss_c.backward();
    loss_g.backward();
    EXPECT_NEAR(loss_g.item(), loss_c.item(), 1e-5 * std::fabs(loss_c.item()));
    auto pc = cpu_model->named_parameters(), pg = gpu_model->named_parameters();
    ASSERT_EQ(pc.size(), pg.size());
    for (size_t i = 0; i < pc.size(); ++i) {
      ASSERT_EQ(pc[i].first, pg[i].first);
      EXPECT_LE(rel_l2(pg[i].second.grad().to_vector<double>(), pc[i].second.grad().to_vector<double>()), 1e-4)
          << "gradient of " << pc[i].first;
    }
  }
}
