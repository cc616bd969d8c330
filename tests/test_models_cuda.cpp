// The benchmark models of MODELS.md on the GPU against the CPU: from the same initial weights and
// inputs, the loss and every parameter's gradient agree (f32; the backends sum in different orders,
// which a deep network amplifies a little). The seed's model families (resnet18-cifar, vit-tiny,
// yolov8n-cls) also compiled against eager on the GPU over 20 steps of MODELS.md's training step: to
// the bit with fusion off (the plan runs eager's kernels), within the dtype's tolerance with every
// pass on, in f32 and bf16. Skips, saying why, where no GPU is visible.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "compile/runtime/train_step.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "tensor/cuda.h"
#include "test_util.h"
#include "workload_parity.h"

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
  // Bound on each gradient's relative L2 distance, GPU against CPU, both f32. The sums run in other
  // orders (cuDNN's algorithms against im2col GEMMs, other reduction trees), and the difference grows
  // on the way back through a deep network: in resnet18-cifar's 20 conv + BatchNorm layers the first
  // layers' gradients were 2e-4 to 8.4e-4 apart on the H200 (BatchNorm biases the most), layer3,
  // layer4 and fc within 1e-4, the loss within 1e-5.
  double grad_tol = 1e-4;
  // Where f32 itself is that far from the exact gradients (resnet18-cifar at this batch: any f32 order
  // of sums is ~5e-3 from f64 in its worst gradient, measured on the CPU for both im2col and oneDNN,
  // which are 7e-3 from each other), the GPU is held to the f64 gradients instead: no farther from
  // them than twice the CPU's f32, plus grad_tol.
  bool f64_reference = false;
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
  auto images = [](int64_t B, int64_t side) {
    Generator g(5);
    std::vector<int64_t> labels;
    for (int64_t b = 0; b < B; ++b) labels.push_back(b % 10);
    return std::make_pair(randn({B, 3, side, side}, {}, &g), tensor_i64(labels, {B}));
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
      {"resnet18-cifar", [](Generator* g) { return std::static_pointer_cast<nn::Module>(nn::resnet18_cifar(g)); },
       [images] { return images(8, 32); }, 2e-3, true},
      {"vit-tiny", [](Generator* g) { return std::static_pointer_cast<nn::Module>(nn::vit_tiny(g)); },
       [images] { return images(4, 32); }},
      {"yolov8n-cls", [](Generator* g) { return std::static_pointer_cast<nn::Module>(nn::yolov8n_cls(g)); },
       [images] { return images(8, 64); }},
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
    nn::NamedTensors exact;
    std::shared_ptr<nn::Module> f64_model;
    if (c.f64_reference) {
      Generator g3(1);
      f64_model = c.make(&g3);
      f64_model->to(DType::f64);
      nn::model_loss(*f64_model, x.to(DType::f64), y).backward();  // resnet18-cifar: x is f32 images
      exact = f64_model->named_parameters();
    }
    for (size_t i = 0; i < pc.size(); ++i) {
      ASSERT_EQ(pc[i].first, pg[i].first);
      const std::vector<double> gpu = pg[i].second.grad().to_vector<double>(), cpu = pc[i].second.grad().to_vector<double>();
      if (c.f64_reference) {
        const std::vector<double> ref = exact[i].second.grad().to_vector<double>();
        const double spread = rel_l2(cpu, ref);
        EXPECT_LE(rel_l2(gpu, ref), 2 * spread + c.grad_tol)
            << "gradient of " << pc[i].first << " (the CPU's f32 is " << spread << " from f64)";
      } else {
        EXPECT_LE(rel_l2(gpu, cpu), c.grad_tol) << "gradient of " << pc[i].first;
      }
    }
  }
}

// MODELS.md's step (ACCUM 4, AdamW lr 1e-3 wd 0.01, clip 1.0) on the workloads of nn/workloads.h at
// micro-batch 4, compiled under reduce-overhead (the whole step one CUDA graph) against eager.
TEST(CudaModels, SeedFamiliesCompiledMatchEagerAfterTwentySteps) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (const char* model : {"resnet18-cifar", "vit-tiny", "yolov8n-cls"})
    testing_util::expect_workload_compiled_matches_eager(model, Device::cuda(0));
}
