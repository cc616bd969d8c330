// The seed's model families (resnet18-cifar, vit-tiny, yolov8n-cls: nn/resnet.h, nn/vit.h, nn/yolo.h)
// in MODELS.md's training step on the CPU, at micro-batches of 1 or 2 to keep each test to seconds:
//   - compiled vs eager (fusion off, f32): the plan runs eager's kernels in eager's order, so losses,
//     parameters and BatchNorm running statistics agree to the bit over a few AdamW steps with
//     clipping and accumulation (call 0 warms up, 1 traces, the rest replay); with fusion on, the
//     losses agree to f32 rounding;
//   - the accumulation contract: ACCUM micro-batches give the gradient of one batch ACCUM times the
//     size (within f32 rounding). With BatchNorm in training mode that holds only for the mean of the
//     micro-batches' own gradients (tests/test_accumulation_batchnorm.cpp); in eval mode (running
//     statistics, each item alone) the large-batch equality holds for the BatchNorm models too; on
//     the GPU as well (skipped without one).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "compile/runtime/train_step.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "test_util.h"

using namespace reel;

namespace {

struct Family {
  const char* name;
  std::function<std::shared_ptr<nn::Module>(Generator*)> make;
  int64_t side;         // image side of the test's inputs
  int64_t micro_batch;  // items per micro-batch
};

// resnet18-cifar and yolov8n-cls are fully convolutional: smaller images than MODELS.md's keep the
// CPU test short with every layer still in play (resnet: 16 -> 2 after three stride-2 blocks; yolo: 32 -> 1
// after five stride-2 convs). The ViT's
// pos_embed fixes 32x32, and with no BatchNorm it can take micro-batches of one image.
std::vector<Family> families() {
  return {
      {"resnet18-cifar", [](Generator* g) { return std::static_pointer_cast<nn::Module>(nn::resnet18_cifar(g)); }, 16, 2},
      {"vit-tiny", [](Generator* g) { return std::static_pointer_cast<nn::Module>(nn::vit_tiny(g)); }, 32, 1},
      {"yolov8n-cls", [](Generator* g) { return std::static_pointer_cast<nn::Module>(nn::yolov8n_cls(g)); }, 32, 2},
  };
}

std::vector<optim::MicroBatch> image_batches(int accum, int64_t B, int64_t side, uint64_t seed) {
  Generator gen(seed);
  std::vector<optim::MicroBatch> micro;
  for (int i = 0; i < accum; ++i) {
    std::vector<int64_t> labels;
    for (int64_t b = 0; b < B; ++b) labels.push_back((3 * i + 7 * b + 1) % 10);
    micro.push_back({randn({B, 3, side, side}, {}, &gen), tensor_i64(labels, {B})});
  }
  return micro;
}

std::vector<double> flat(const std::vector<Tensor>& ts) {
  std::vector<double> out;
  for (const Tensor& t : ts)
    for (double v : t.to_vector<double>()) out.push_back(v);
  return out;
}

std::vector<double> flat_grads(const nn::Module& m) {
  std::vector<Tensor> g;
  for (const Tensor& p : m.parameters()) g.push_back(p.grad());
  return flat(g);
}

// || a - b || / || b ||
double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return std::sqrt(num / std::max(den, 1e-300));
}

struct Run {
  std::vector<double> losses;
  std::shared_ptr<nn::Module> model;
};

// `steps` MODELS.md steps (AdamW lr 1e-3 wd 0.01, clip 1.0, ACCUM = micro.size()), eager or compiled
// (fusion passes on or off).
Run train(const Family& f, const std::vector<optim::MicroBatch>& micro, int steps, bool compiled, bool fuse = false) {
  Generator gen(3);
  Run run{{}, f.make(&gen)};
  optim::AdamW opt(run.model->parameters(), optim::AdamWOptions(1e-3).weight_decay(0.01));
  opt.set_accum_steps(int64_t(micro.size())).set_max_grad_norm(1.0);
  nn::Module* m = run.model.get();
  auto loss_fn = [m](const Tensor& x, const Tensor& y) { return nn::model_loss(*m, x, y); };
  auto step = compile::compile_train_step(opt, loss_fn, {compile::Mode::Default, 8, fuse});
  for (int s = 0; s < steps; ++s) {
    if (compiled) {
      run.losses.push_back(step(compile::flatten_micro(micro))[0].item());
    } else {
      Tensor mean_loss;
      optim::train_step(opt, loss_fn, micro, &mean_loss);
      run.losses.push_back(mean_loss.item());
    }
  }
  if (compiled) {
    EXPECT_EQ(step.traces(), 1);
    EXPECT_EQ(step.replays(), steps - 2);
    EXPECT_TRUE(step.graph_breaks().empty());
  }
  return run;
}

void expect_compiled_matches_eager(const Family& f) {
  SCOPED_TRACE(f.name);
  auto micro = image_batches(2, f.micro_batch, f.side, 12);
  Run eager = train(f, micro, 4, false), compiled = train(f, micro, 4, true);
  EXPECT_EQ(eager.losses, compiled.losses);
  EXPECT_NE(eager.losses.front(), eager.losses.back()) << "the steps must change the model";
  auto pe = eager.model->named_parameters(), pc = compiled.model->named_parameters();
  ASSERT_EQ(pe.size(), pc.size());
  for (size_t i = 0; i < pe.size(); ++i)
    EXPECT_EQ(pe[i].second.to_vector<double>(), pc[i].second.to_vector<double>()) << pe[i].first;
  auto be = eager.model->named_buffers(), bc = compiled.model->named_buffers();
  ASSERT_EQ(be.size(), bc.size());
  for (size_t i = 0; i < be.size(); ++i)
    EXPECT_EQ(be[i].second.to_vector<double>(), bc[i].second.to_vector<double>()) << be[i].first;
  // With every pass on, the plan's fused kernels (elementwise chains with the families' SiLU and exact
  // GELU, GEMM epilogues, the optimizer over all parameters) run in place of eager's: the same
  // losses to f32 rounding.
  Run fused = train(f, micro, 3, true, true);  // warm-up, trace, one replay
  for (size_t s = 0; s < fused.losses.size(); ++s)
    EXPECT_NEAR(fused.losses[s], eager.losses[s], 1e-5 * std::abs(eager.losses[s])) << "fused, step " << s;
}

// The gradient after ACCUM micro-batches through the optimizer's contract (scale_loss, backward,
// micro_step before the boundary), and that of one batch holding all of them, on `device`.
void expect_accumulation_equals_large_batch(const Family& f, bool eval_mode, Device device = Device::cpu()) {
  SCOPED_TRACE(std::string(f.name) + (eval_mode ? " eval" : " train") + " on " + device.str());
  const int accum = 2;
  auto micro = image_batches(accum, f.micro_batch, f.side, 31);
  std::vector<Tensor> xs, ys;
  for (auto& m : micro) {
    m.inputs = to_device(m.inputs, device), m.targets = to_device(m.targets, device);
    xs.push_back(m.inputs), ys.push_back(m.targets);
  }
  Generator g1(5), g2(5);
  auto acc = f.make(&g1), whole = f.make(&g2);
  acc->to(device), whole->to(device);
  if (eval_mode) acc->eval(), whole->eval();
  optim::SGD opt(acc->parameters(), optim::SGDOptions(0.0));
  opt.set_accum_steps(accum);
  for (int i = 0; i < accum; ++i) {
    opt.scale_loss(nn::model_loss(*acc, micro[i].inputs, micro[i].targets)).backward();
    if (i + 1 < accum) opt.micro_step();  // the boundary's step would zero the gradients
  }
  nn::model_loss(*whole, concat(xs, 0), concat(ys, 0)).backward();
  std::vector<double> a = flat_grads(*acc), w = flat_grads(*whole);
  // f32 sums in another order (one GEMM over the whole batch against one per micro-batch): rounding, amplified a little
  // by depth; a wrong normalisation would be off by a factor, a missed micro-batch by ~50%. On the
  // GPU cuDNN and cuBLAS may also pick other algorithms for the two batch sizes: 10x the slack.
  const double tol = device.is_cuda() ? 10.0 : 1.0;
  EXPECT_LT(rel_l2(a, w), 1e-5 * tol);
  // Per parameter too, for those whose gradient is not ~0 (where the relative error means nothing).
  auto pa = acc->named_parameters(), pw = whole->named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    std::vector<double> ga = pa[i].second.grad().to_vector<double>(), gw = pw[i].second.grad().to_vector<double>();
    double n = 0;
    for (double v : gw) n += v * v;
    if (std::sqrt(n / double(gw.size())) > 1e-6) {
      EXPECT_LT(rel_l2(ga, gw), 1e-4 * tol) << pa[i].first;
    }
  }
}

}  // namespace

TEST(ModelFamilies, ResNet18CompiledStepsMatchEagerToTheBit) { expect_compiled_matches_eager(families()[0]); }
TEST(ModelFamilies, VitTinyCompiledStepsMatchEagerToTheBit) { expect_compiled_matches_eager(families()[1]); }
TEST(ModelFamilies, Yolov8nClsCompiledStepsMatchEagerToTheBit) { expect_compiled_matches_eager(families()[2]); }

// The ViT has no BatchNorm: the large-batch equality holds in training mode.
TEST(ModelFamilies, VitTinyAccumulationEqualsOneLargeBatch) {
  expect_accumulation_equals_large_batch(families()[1], false);
}

TEST(ModelFamilies, ResNet18AccumulationEqualsOneLargeBatchInEvalMode) {
  expect_accumulation_equals_large_batch(families()[0], true);
}

TEST(ModelFamilies, Yolov8nClsAccumulationEqualsOneLargeBatchInEvalMode) {
  expect_accumulation_equals_large_batch(families()[2], true);
}

// The same on the GPU (MODELS.md's step runs there): each family, at ACCUM 2.
TEST(ModelFamilies, AccumulationEqualsOneLargeBatchOnTheGpu) {
  REEL_REQUIRE_GPU();
  expect_accumulation_equals_large_batch(families()[1], false, Device::cuda(0));
  expect_accumulation_equals_large_batch(families()[0], true, Device::cuda(0));
  expect_accumulation_equals_large_batch(families()[2], true, Device::cuda(0));
}

// In training mode, BatchNorm normalises each micro-batch with its own statistics: the accumulated
// gradient is the mean of the micro-batches' gradients, each from the same starting weights.
TEST(ModelFamilies, Yolov8nClsAccumulationInTrainingIsTheMeanOfMicroBatchGradients) {
  const Family f = families()[2];
  auto micro = image_batches(2, f.micro_batch, f.side, 41);
  Generator g(6);
  auto acc = f.make(&g);
  optim::SGD opt(acc->parameters(), optim::SGDOptions(0.0));
  opt.set_accum_steps(2);
  opt.scale_loss(nn::model_loss(*acc, micro[0].inputs, micro[0].targets)).backward();
  opt.micro_step();
  opt.scale_loss(nn::model_loss(*acc, micro[1].inputs, micro[1].targets)).backward();
  std::vector<double> expected;
  for (int i = 0; i < 2; ++i) {
    Generator gi(6);
    auto one = f.make(&gi);
    nn::model_loss(*one, micro[i].inputs, micro[i].targets).backward();
    std::vector<double> gr = flat_grads(*one);
    if (expected.empty()) expected.assign(gr.size(), 0.0);
    for (size_t k = 0; k < gr.size(); ++k) expected[k] += gr[k] / 2;
  }
  EXPECT_LT(rel_l2(flat_grads(*acc), expected), 1e-6);
}
