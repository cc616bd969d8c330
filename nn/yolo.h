// YOLOv8n-cls (MODELS.md's yolov8n-cls): Ultralytics' yolov8-cls.yaml at scale n (depth 0.33, width
// 0.25), with the module tree and names of peer/torch_anchor.py (a Sequential 0..9 whose parts are
// named as Ultralytics' Conv, C2f, Bottleneck and Classify), so a state_dict maps one to one.
//
//   Conv(ci, co, k, s)  y = silu(bn(conv(x))): conv k x k, stride s, pad k / 2, no bias;
//                       bn BatchNorm2d(co, eps 1e-3, momentum 0.03)
//   Bottleneck(c)       y = x + cv2(cv1(x)), cv1 and cv2 Conv(c, c, 3, 1)
//   C2f(ci, co, n)      c = co / 2;  a, b = split(cv1(x), 2 halves of c channels);  y_0 = b,
//                       y_i = m[i-1](y_{i-1}) for i = 1..n;  out = cv2(concat(a, b, y_1..y_n))
//                       cv1 Conv(ci, 2c, 1), cv2 Conv((2 + n) c, co, 1), m a ModuleList of n Bottlenecks
//   Classify(ci, k)     logits = linear(global_avg_pool(conv(x))): conv Conv(ci, 1280, 1), linear Linear(1280 -> k)
//   layers              0 Conv(3,16,3,2)  1 Conv(16,32,3,2)  2 C2f(32,32,1)  3 Conv(32,64,3,2)  4 C2f(64,64,2)
//                       5 Conv(64,128,3,2)  6 C2f(128,128,2)  7 Conv(128,256,3,2)  8 C2f(256,256,1)  9 Classify(256,10)
//   images (N, 3, H, W), any side (64 in MODELS.md: 64 -> 2 after five stride-2 convs)
//   yolov8n_cls(): 1,451,098 parameters with 10 classes.
// The C++ classes are YoloConv, YoloBottleneck, C2f and YoloClassify (their type names Ultralytics').
// Initialisation: PyTorch's defaults (nn/init.h), as torch_anchor.py leaves them.
#pragma once
#include <memory>

#include "nn/layers.h"
#include "nn/norm_layers.h"

namespace reel::nn {

class YoloConv : public Module {
 public:
  YoloConv(int64_t in_channels, int64_t out_channels, int64_t kernel = 1, int64_t stride = 1, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;  // x: (N, ci, H, W) -> (N, co, H / s, W / s)

 private:
  std::shared_ptr<Conv2d> conv_;
  std::shared_ptr<BatchNorm2d> bn_;
};

class YoloBottleneck : public Module {
 public:
  explicit YoloBottleneck(int64_t channels, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;  // x: (N, c, H, W), same shape out

 private:
  std::shared_ptr<YoloConv> cv1_, cv2_;
};

class C2f : public Module {
 public:
  C2f(int64_t in_channels, int64_t out_channels, int64_t n, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;  // x: (N, ci, H, W) -> (N, co, H, W)

 private:
  int64_t c_;  // channels of each half and of each Bottleneck
  std::shared_ptr<YoloConv> cv1_, cv2_;
  std::vector<std::shared_ptr<YoloBottleneck>> m_;
};

class YoloClassify : public Module {
 public:
  YoloClassify(int64_t in_channels, int64_t classes, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;  // x: (N, ci, H, W) -> logits (N, classes)

 private:
  std::shared_ptr<YoloConv> conv_;
  std::shared_ptr<Linear> linear_;
};

std::shared_ptr<Sequential> yolov8n_cls(Generator* gen = nullptr, int64_t classes = 10);

}  // namespace reel::nn
