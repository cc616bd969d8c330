// The benchmark models of MODELS.md: exact parameter counts, the PyTorch peer's parameter names,
// forward shapes, GPT causality, model_loss against a plain log-softmax, an end-to-end gradcheck of
// a tiny GPT and of a small CNN with every layer kind, a tiny GPT that learns, and the Fashion-MNIST CNN.
// The seed's model families (resnet18-cifar, vit-tiny, yolov8n-cls): parameter counts, state_dict keys
// and shapes against the names peer/torch_anchor.py gives (torchvision's, timm's, Ultralytics'; read
// off the Python: PyTorch is not available here), forward shapes, the ViT's non-causal attention
// against a plain loop, and gradchecks of each family's blocks at a small size.
#include <gtest/gtest.h>

#include <cmath>

#include "nn/nn.h"
#include "test_util.h"

using namespace reel;
using namespace reel::nn;
using reel::testing_util::expect_error;

TEST(NnModels, ParameterCountsMatchModelsMd) {
  EXPECT_EQ(cnn_small()->num_parameters(), 279466);
  EXPECT_EQ(gpt_tiny()->num_parameters(), 3323392);
  EXPECT_EQ(gpt_small()->num_parameters(), 25613312);
}

TEST(NnModels, SeedFamiliesParameterCountsMatchModelsMd) {
  EXPECT_EQ(resnet18_cifar()->num_parameters(), 11173962);
  EXPECT_EQ(vit_tiny()->num_parameters(), 5362762);
  EXPECT_EQ(yolov8n_cls()->num_parameters(), 1451098);
}

TEST(NnModels, NamesMatchThePyTorchPeer) {
  auto cnn = cnn_small()->named_parameters();
  EXPECT_EQ(cnn.front().first, "0.weight");
  EXPECT_EQ(cnn[1].first, "1.weight");
  EXPECT_EQ(cnn.back().first, "17.bias");
  auto g = gpt_tiny()->named_parameters();
  std::vector<std::string> first;
  for (size_t i = 0; i < 14; ++i) first.push_back(g[i].first);
  EXPECT_EQ(first, (std::vector<std::string>{"wte.weight", "wpe.weight", "blocks.0.ln1.weight", "blocks.0.ln1.bias",
                                             "blocks.0.qkv.weight", "blocks.0.qkv.bias", "blocks.0.proj.weight",
                                             "blocks.0.proj.bias", "blocks.0.ln2.weight", "blocks.0.ln2.bias",
                                             "blocks.0.fc.weight", "blocks.0.fc.bias", "blocks.0.fc2.weight",
                                             "blocks.0.fc2.bias"}));
  EXPECT_EQ(g.back().first, "head.weight");
  EXPECT_EQ(g[g.size() - 2].first, "lnf.bias");
}

TEST(NnModels, ForwardShapes) {
  auto cnn = cnn_small();
  EXPECT_EQ(cnn->forward(randn({2, 3, 32, 32})).shape(), (Shape{2, 10}));
  auto g = gpt_tiny();
  Tensor idx = tensor_i64({1, 2, 3, 255, 0, 9, 8, 7}, {2, 4});
  EXPECT_EQ(g->forward(idx).shape(), (Shape{2, 4, 256}));
  expect_error([&] { g->forward(zeros({2, 129}).to(DType::i64)); }, {"Gpt", "129", "block_size 128"});
  expect_error([&] { g->forward(zeros({2, 4})); }, {"Gpt", "i64", "f32"});
  auto f = fashion_cnn();
  EXPECT_EQ(f->forward(randn({3, 1, 28, 28})).shape(), (Shape{3, 10}));
  EXPECT_EQ(f->num_parameters(), 288 + 64 + 18432 + 128 + 31370);  // convs without bias
}

TEST(NnModels, ModelLossIsMeanCrossEntropyOverAllPositions) {
  GptConfig c{7, 5, 8, 2, 1};
  auto g = gpt(c);
  g->to(DType::f64);
  Tensor x = tensor_i64({1, 2, 3, 4, 5, 6, 0, 1}, {2, 4}), y = tensor_i64({2, 3, 4, 5, 6, 0, 1, 2}, {2, 4});
  auto logits = g->forward(x).to_vector<double>();
  auto yv = y.to_vector<int64_t>();
  double ref = 0;
  for (int r = 0; r < 8; ++r) {
    double mx = -1e300, z = 0;
    for (int k = 0; k < 7; ++k) mx = std::max(mx, logits[r * 7 + k]);
    for (int k = 0; k < 7; ++k) z += std::exp(logits[r * 7 + k] - mx);
    ref += -(logits[r * 7 + yv[r]] - mx - std::log(z)) / 8;
  }
  EXPECT_NEAR(model_loss(*g, x, y).item(), ref, 1e-12);
  expect_error([&] { model_loss(*g, x, tensor_i64({1, 2}, {2})); }, {"model_loss", "(2, 4, 7)", "(2,)"});
}

TEST(NnModels, GptIsCausal) {
  auto g = gpt({16, 6, 8, 2, 2});
  Tensor a = tensor_i64({1, 2, 3, 4, 5, 6}, {1, 6}), b = tensor_i64({1, 2, 3, 9, 9, 9}, {1, 6});
  auto la = g->forward(a).to_vector<float>(), lb = g->forward(b).to_vector<float>();
  for (int i = 0; i < 3 * 16; ++i) EXPECT_EQ(la[i], lb[i]);
  EXPECT_NE(la[3 * 16], lb[3 * 16]);
}

TEST(NnModels, TinyGptGradcheckEndToEnd) {
  auto g = gpt({5, 4, 4, 2, 2});
  g->to(DType::f64);
  Tensor x = tensor_i64({0, 1, 2, 3, 4, 0, 2, 1}, {2, 4}), y = tensor_i64({1, 2, 3, 4, 0, 2, 1, 3}, {2, 4});
  auto fn = [&](const std::vector<Tensor>&) { return model_loss(*g, x, y); };
  GradcheckResult r = gradcheck(fn, g->parameters());
  EXPECT_TRUE(r.ok) << r.str();
}

TEST(NnModels, SmallCnnGradcheckEndToEnd) {
  // cnn_small's layer kinds at a small size: conv, BatchNorm, GroupNorm, ReLU, pooling, Linear.
  Sequential s{std::make_shared<Conv2d>(2, 4, 3, 1, 1, false), std::make_shared<BatchNorm2d>(4),
               std::make_shared<ReLU>(), std::make_shared<Conv2d>(4, 4, 3, 2, 1, false),
               std::make_shared<GroupNorm>(2, 4), std::make_shared<ReLU>(), std::make_shared<GlobalAvgPool2d>(),
               std::make_shared<Linear>(4, 3)};
  s.to(DType::f64);
  Tensor x = randn({3, 2, 4, 4}, {DType::f64}), y = tensor_i64({0, 2, 1}, {3});
  auto fn = [&](const std::vector<Tensor>&) { return model_loss(s, x, y); };
  GradcheckResult r = gradcheck(fn, s.parameters());
  EXPECT_TRUE(r.ok) << r.str();
}

TEST(NnModels, TinyGptLearnsASequence) {
  Generator gen(0);
  auto g = gpt({8, 8, 16, 2, 1}, &gen);
  Tensor x = tensor_i64({0, 1, 2, 3, 4, 5, 6, 7}, {1, 8}), y = tensor_i64({1, 2, 3, 4, 5, 6, 7, 0}, {1, 8});
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    Tensor loss = model_loss(*g, x, y);
    if (step == 0) first = loss.item();
    last = loss.item();
    loss.backward();
    NoGradGuard ng;
    for (auto& p : g->parameters()) add_(p, p.grad() * -0.1);
    g->zero_grad();
  }
  EXPECT_LT(last, 0.25 * first) << "first " << first << " last " << last;
}

namespace {

std::vector<std::string> state_keys(const Module& m) {
  std::vector<std::string> keys;
  for (const auto& [name, t] : m.named_state()) keys.push_back(name);
  return keys;
}

Shape state_shape(const Module& m, const std::string& key) {
  for (const auto& [name, t] : m.named_state())
    if (name == key) return t.shape();
  ADD_FAILURE() << "no state_dict key " << key;
  return {};
}

bool has_key(const std::vector<std::string>& keys, const std::string& key) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

size_t batch_norms(const Module& m) {
  size_t n = 0;
  for (const auto& [name, child] : m.named_modules()) n += dynamic_cast<const BatchNorm2d*>(child.get()) != nullptr;
  return n;
}

}  // namespace

// torchvision's names, every entry of PyTorch's state_dict (122), num_batches_tracked included.
TEST(NnModels, ResNetStateDictKeysAreTorchvisions) {
  auto m = resnet18_cifar();
  std::vector<std::string> keys = state_keys(*m);
  const size_t bns = batch_norms(*m);  // one per convolution: the stem's, 16 in the blocks, 3 shortcuts
  EXPECT_EQ(bns, 20u);
  // A conv weight and a BatchNorm's weight, bias, running_mean, running_var, num_batches_tracked
  // each, and fc's weight and bias.
  EXPECT_EQ(keys.size(), bns * (1 + 5) + 2);
  EXPECT_EQ(keys.size(), 122u);
  std::vector<std::string> first(keys.begin(), keys.begin() + 13);
  EXPECT_EQ(first, (std::vector<std::string>{"conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean",
                                             "bn1.running_var", "bn1.num_batches_tracked", "layer1.0.conv1.weight",
                                             "layer1.0.bn1.weight", "layer1.0.bn1.bias", "layer1.0.bn1.running_mean",
                                             "layer1.0.bn1.running_var", "layer1.0.bn1.num_batches_tracked",
                                             "layer1.0.conv2.weight"}));
  EXPECT_EQ(keys[keys.size() - 2], "fc.weight");
  EXPECT_EQ(keys.back(), "fc.bias");
  for (const char* k : {"layer2.0.downsample.0.weight", "layer2.0.downsample.1.running_var",
                        "layer3.0.downsample.1.weight", "layer4.0.downsample.1.bias", "layer4.1.bn2.running_mean"})
    EXPECT_TRUE(has_key(keys, k)) << k;
  for (const char* k : {"layer1.0.downsample.0.weight", "layer2.1.downsample.0.weight"})
    EXPECT_FALSE(has_key(keys, k)) << k;  // identity shortcuts
  EXPECT_EQ(state_shape(*m, "conv1.weight"), (Shape{64, 3, 3, 3}));
  EXPECT_EQ(state_shape(*m, "layer2.0.conv1.weight"), (Shape{128, 64, 3, 3}));
  EXPECT_EQ(state_shape(*m, "layer2.0.downsample.0.weight"), (Shape{128, 64, 1, 1}));
  EXPECT_EQ(state_shape(*m, "layer4.1.conv2.weight"), (Shape{512, 512, 3, 3}));
  EXPECT_EQ(state_shape(*m, "fc.weight"), (Shape{10, 512}));
  EXPECT_EQ(state_shape(*m, "layer4.0.downsample.1.num_batches_tracked"), (Shape{}));
}

// timm's names; the model's own parameters come before its children's, as in torch's state_dict.
TEST(NnModels, VitStateDictKeysAreTimms) {
  auto m = vit_tiny();
  std::vector<std::string> keys = state_keys(*m);
  EXPECT_EQ(keys.size(), 152u);  // 4 + 12 blocks x 12 + 4; no buffers
  std::vector<std::string> first(keys.begin(), keys.begin() + 16);
  EXPECT_EQ(first, (std::vector<std::string>{
                       "cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias",
                       "blocks.0.norm1.weight", "blocks.0.norm1.bias", "blocks.0.attn.qkv.weight",
                       "blocks.0.attn.qkv.bias", "blocks.0.attn.proj.weight", "blocks.0.attn.proj.bias",
                       "blocks.0.norm2.weight", "blocks.0.norm2.bias", "blocks.0.mlp.fc1.weight",
                       "blocks.0.mlp.fc1.bias", "blocks.0.mlp.fc2.weight", "blocks.0.mlp.fc2.bias"}));
  std::vector<std::string> last(keys.end() - 5, keys.end());
  EXPECT_EQ(last, (std::vector<std::string>{"blocks.11.mlp.fc2.bias", "norm.weight", "norm.bias", "head.weight",
                                            "head.bias"}));
  EXPECT_EQ(state_shape(*m, "cls_token"), (Shape{1, 1, 192}));
  EXPECT_EQ(state_shape(*m, "pos_embed"), (Shape{1, 65, 192}));
  EXPECT_EQ(state_shape(*m, "patch_embed.proj.weight"), (Shape{192, 3, 4, 4}));
  EXPECT_EQ(state_shape(*m, "blocks.7.attn.qkv.weight"), (Shape{576, 192}));
  EXPECT_EQ(state_shape(*m, "blocks.7.mlp.fc1.weight"), (Shape{768, 192}));
  EXPECT_EQ(state_shape(*m, "head.weight"), (Shape{10, 192}));
}

// torch_anchor.py's yolov8n_cls() is a bare nn.Sequential, so its keys start at the layer index (an
// Ultralytics checkpoint's carry a "model." prefix). All 158 of PyTorch's, num_batches_tracked included.
TEST(NnModels, YoloStateDictKeysAreTheSequentialOfUltralyticsParts) {
  auto m = yolov8n_cls();
  std::vector<std::string> keys = state_keys(*m);
  const size_t convs = batch_norms(*m);  // each Conv is conv + BatchNorm + SiLU
  EXPECT_EQ(convs, 26u);
  EXPECT_EQ(keys.size(), convs * (1 + 5) + 2);  // Convs x (conv weight, bn 5) + linear 2
  EXPECT_EQ(keys.size(), 158u);
  std::vector<std::string> first(keys.begin(), keys.begin() + 7);
  EXPECT_EQ(first, (std::vector<std::string>{"0.conv.weight", "0.bn.weight", "0.bn.bias", "0.bn.running_mean",
                                             "0.bn.running_var", "0.bn.num_batches_tracked", "1.conv.weight"}));
  std::vector<std::string> last(keys.end() - 3, keys.end());
  EXPECT_EQ(last, (std::vector<std::string>{"9.conv.bn.num_batches_tracked", "9.linear.weight", "9.linear.bias"}));
  for (const char* k : {"2.cv1.conv.weight", "2.cv2.bn.bias", "2.m.0.cv1.conv.weight", "2.m.0.cv2.bn.running_mean",
                        "4.m.1.cv2.conv.weight", "6.m.1.cv1.bn.weight", "8.m.0.cv2.conv.weight", "9.conv.conv.weight"})
    EXPECT_TRUE(has_key(keys, k)) << k;
  EXPECT_FALSE(has_key(keys, "2.m.1.cv1.conv.weight"));  // layer 2 has n = 1
  EXPECT_EQ(state_shape(*m, "0.conv.weight"), (Shape{16, 3, 3, 3}));
  EXPECT_EQ(state_shape(*m, "2.cv1.conv.weight"), (Shape{32, 32, 1, 1}));
  EXPECT_EQ(state_shape(*m, "2.cv2.conv.weight"), (Shape{32, 48, 1, 1}));  // (2 + n) c = 3 x 16
  EXPECT_EQ(state_shape(*m, "4.cv2.conv.weight"), (Shape{64, 128, 1, 1}));  // 4 x 32
  EXPECT_EQ(state_shape(*m, "6.m.1.cv2.conv.weight"), (Shape{64, 64, 3, 3}));
  EXPECT_EQ(state_shape(*m, "9.conv.conv.weight"), (Shape{1280, 256, 1, 1}));
  EXPECT_EQ(state_shape(*m, "9.linear.weight"), (Shape{10, 1280}));
}

// The norms' settings the families differ in. A channel (or row) of values +-a has variance a^2, so
// normalisation gives a / sqrt(a^2 + eps): with a^2 comparable to eps the output shows which eps is used.
TEST(NnModels, SeedFamiliesNormSettingsAsModelsMd) {
  // YOLO's Conv: BatchNorm eps 1e-3, momentum 0.03 (Ultralytics'); conv weight 1, so bn sees x itself.
  YoloConv c(1, 1, 1, 1);
  {
    NoGradGuard ng;
    fill_(c.named_parameters()[0].second, 1.0);
  }
  const double a = 0.01;
  Tensor x = tensor({a + 2, -a + 2, a + 2, -a + 2}, {2, 1, 1, 2});  // mean 2, variance a^2
  Tensor y = c.forward(x);
  const double z = a / std::sqrt(a * a + 1e-3);
  EXPECT_NEAR(y.to_vector<double>()[0], z / (1 + std::exp(-z)), 1e-6);  // silu(z)
  EXPECT_NEAR(c.named_buffers()[0].second.item(), 0.03 * 2.0, 1e-7);   // running_mean after one update

  // ViT: every LayerNorm eps 1e-6 (timm's), here with a^2 = 1e-6.
  auto v = vit_tiny();
  int norms = 0;
  for (const auto& [name, m] : v->named_modules()) {
    if (m->type_name() != "LayerNorm") continue;
    ++norms;
    std::vector<double> row(192);
    for (size_t i = 0; i < row.size(); ++i) row[i] = i % 2 ? -1e-3 : 1e-3;
    EXPECT_NEAR(m->forward(tensor(row, {1, 192})).to_vector<double>()[0], 1e-3 / std::sqrt(2e-6), 1e-5) << name;
  }
  EXPECT_EQ(norms, 25);  // 2 per block and the final norm
}

TEST(NnModels, SeedFamiliesForwardShapes) {
  Generator gen(5);
  EXPECT_EQ(resnet18_cifar(&gen)->forward(randn({2, 3, 32, 32}, {}, &gen)).shape(), (Shape{2, 10}));
  auto vit = vit_tiny(&gen);
  EXPECT_EQ(vit->forward(randn({2, 3, 32, 32}, {}, &gen)).shape(), (Shape{2, 10}));
  expect_error([&] { vit->forward(zeros({2, 3, 64, 64})); }, {"VisionTransformer", "(2, 3, 64, 64)", "(B, 3, 32, 32)"});
  EXPECT_EQ(yolov8n_cls(&gen)->forward(randn({2, 3, 64, 64}, {}, &gen)).shape(), (Shape{2, 10}));
  // The parts on their own.
  EXPECT_EQ(PatchEmbed(192, 4).forward(zeros({1, 3, 32, 32})).shape(), (Shape{1, 64, 192}));
  EXPECT_EQ(C2f(16, 32, 2).forward(zeros({2, 16, 8, 8})).shape(), (Shape{2, 32, 8, 8}));
  EXPECT_EQ(BasicBlock(64, 128, 2).forward(zeros({1, 64, 8, 8})).shape(), (Shape{1, 128, 4, 4}));
  EXPECT_TRUE(BasicBlock(64, 128, 2).has_downsample());
  EXPECT_FALSE(BasicBlock(64, 64, 1).has_downsample());
}

// The ViT's attention, the fused op with causal = false: softmax(q k^T / sqrt(hd)) v per head over
// every token (no mask), against plain loops in f64.
TEST(NnModels, VitAttentionIsNonCausalSoftmaxAttention) {
  const int64_t B = 2, T = 5, H = 2, hd = 3, d = H * hd;
  Generator gen(8);
  Tensor qkv = randn({B, T, 3 * d}, {DType::f64}, &gen);
  std::vector<double> in = qkv.to_vector<double>(), out = attention(qkv, H, /*causal=*/false).to_vector<double>();
  ASSERT_EQ(out.size(), size_t(B * T * d));
  auto at = [&](int64_t b, int64_t t, int64_t col) { return in[size_t((b * T + t) * 3 * d + col)]; };
  double worst = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> p(T);
        double mx = -1e300, z = 0;
        for (int64_t s = 0; s < T; ++s) {
          double dot = 0;
          for (int64_t i = 0; i < hd; ++i) dot += at(b, t, h * hd + i) * at(b, s, d + h * hd + i);
          p[s] = dot / std::sqrt(double(hd));
          mx = std::max(mx, p[s]);
        }
        for (double& v : p) z += (v = std::exp(v - mx));
        for (int64_t i = 0; i < hd; ++i) {
          double y = 0;
          for (int64_t s = 0; s < T; ++s) y += p[s] / z * at(b, s, 2 * d + h * hd + i);
          worst = std::max(worst, std::fabs(y - out[size_t((b * T + t) * d + h * hd + i)]));
        }
      }
  EXPECT_LT(worst, 1e-12);
  expect_error([&] { attention(zeros({2, 5, 9}), 2, false); }, {"attention", "(2, 5, 9)", "divide"});
}

// Each family's blocks at a small size, end to end through model_loss, in f64.
TEST(NnModels, SeedFamiliesGradcheckEndToEnd) {
  Generator gen(21);
  Tensor y = tensor_i64({0, 2, 1}, {3});
  auto check = [&](Module& m, const Tensor& x, const char* what) {
    m.to(DType::f64);
    auto fn = [&](const std::vector<Tensor>&) { return model_loss(m, x, y); };
    GradcheckResult r = gradcheck(fn, m.parameters());
    EXPECT_TRUE(r.ok) << what << "\n" << r.str();
  };
  Sequential res{std::make_shared<BasicBlock>(2, 4, 2, &gen), std::make_shared<BasicBlock>(4, 4, 1, &gen),
                 std::make_shared<GlobalAvgPool2d>(), std::make_shared<Linear>(4, 3, true, &gen)};
  check(res, randn({3, 2, 4, 4}, {DType::f64}, &gen), "BasicBlocks");
  auto vit = vision_transformer({4, 2, 4, 1, 2, 8, 3}, &gen);  // 4 patches + the class token, 2 heads of 2
  check(*vit, randn({3, 3, 4, 4}, {DType::f64}, &gen), "ViT");
  Sequential yolo{std::make_shared<YoloConv>(2, 4, 3, 2, &gen), std::make_shared<C2f>(4, 4, 2, &gen),
                  std::make_shared<GlobalAvgPool2d>(), std::make_shared<Linear>(4, 3, true, &gen)};
  check(yolo, randn({3, 2, 4, 4}, {DType::f64}, &gen), "YoloConv, C2f");
}
