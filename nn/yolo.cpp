// YOLOv8n-cls (architecture and names in yolo.h).
#include "nn/yolo.h"

namespace reel::nn {

namespace {
// Ultralytics' BatchNorm settings for every Conv.
constexpr double kYoloBnEps = 1e-3, kYoloBnMomentum = 0.03;
}  // namespace

YoloConv::YoloConv(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride, Generator* gen)
    : Module("Conv") {
  conv_ = register_module("conv",
                          std::make_shared<Conv2d>(in_channels, out_channels, kernel, stride, kernel / 2, false, gen));
  bn_ = register_module("bn", std::make_shared<BatchNorm2d>(out_channels, kYoloBnEps, kYoloBnMomentum));
}

Tensor YoloConv::forward(const Tensor& x) { return silu(bn_->forward(conv_->forward(x))); }

YoloBottleneck::YoloBottleneck(int64_t channels, Generator* gen) : Module("Bottleneck") {
  cv1_ = register_module("cv1", std::make_shared<YoloConv>(channels, channels, 3, 1, gen));
  cv2_ = register_module("cv2", std::make_shared<YoloConv>(channels, channels, 3, 1, gen));
}

Tensor YoloBottleneck::forward(const Tensor& x) { return x + cv2_->forward(cv1_->forward(x)); }

C2f::C2f(int64_t in_channels, int64_t out_channels, int64_t n, Generator* gen) : Module("C2f"), c_(out_channels / 2) {
  REEL_CHECK(out_channels >= 2 && out_channels % 2 == 0 && n >= 0, "C2f: out_channels ", out_channels,
             " must be even and n ", n, " non-negative");
  cv1_ = register_module("cv1", std::make_shared<YoloConv>(in_channels, 2 * c_, 1, 1, gen));
  cv2_ = register_module("cv2", std::make_shared<YoloConv>((2 + n) * c_, out_channels, 1, 1, gen));
  auto m = register_module("m", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < n; ++i) {
    m_.push_back(std::make_shared<YoloBottleneck>(c_, gen));
    m->push_back(m_.back());
  }
}

Tensor C2f::forward(const Tensor& x) {
  std::vector<Tensor> y = split(cv1_->forward(x), c_, 1);  // two halves (N, c, H, W): views of cv1's output
  for (auto& b : m_) y.push_back(b->forward(y.back()));     // each Bottleneck takes the last piece
  return cv2_->forward(concat(y, 1));                       // (N, (2 + n) c, H, W) -> (N, co, H, W)
}

YoloClassify::YoloClassify(int64_t in_channels, int64_t classes, Generator* gen) : Module("Classify") {
  REEL_CHECK(classes > 0, "YoloClassify: classes must be positive, got ", classes);
  conv_ = register_module("conv", std::make_shared<YoloConv>(in_channels, 1280, 1, 1, gen));
  linear_ = register_module("linear", std::make_shared<Linear>(1280, classes, true, gen));
}

Tensor YoloClassify::forward(const Tensor& x) {
  return linear_->forward(global_avg_pool2d(conv_->forward(x)));  // (N, 1280) -> (N, classes)
}

std::shared_ptr<Sequential> yolov8n_cls(Generator* gen, int64_t classes) {
  auto conv = [gen](int64_t ci, int64_t co, int64_t k, int64_t s) { return std::make_shared<YoloConv>(ci, co, k, s, gen); };
  auto c2f = [gen](int64_t ci, int64_t co, int64_t n) { return std::make_shared<C2f>(ci, co, n, gen); };
  auto s = std::make_shared<Sequential>();
  s->push_back(conv(3, 16, 3, 2));
  s->push_back(conv(16, 32, 3, 2));
  s->push_back(c2f(32, 32, 1));
  s->push_back(conv(32, 64, 3, 2));
  s->push_back(c2f(64, 64, 2));
  s->push_back(conv(64, 128, 3, 2));
  s->push_back(c2f(128, 128, 2));
  s->push_back(conv(128, 256, 3, 2));
  s->push_back(c2f(256, 256, 1));
  s->push_back(std::make_shared<YoloClassify>(256, classes, gen));
  return s;
}

}  // namespace reel::nn
