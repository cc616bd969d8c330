// ResNet-18 in its CIFAR form (MODELS.md's resnet18-cifar), with torchvision's module names so that a
// state_dict maps one to one onto the PyTorch peer's (peer/torch_anchor.py; BatchNorm's
// num_batches_tracked included).
//
//   stem        conv1 3x3 (3 -> 64, stride 1, pad 1, no bias), bn1, ReLU   (no max-pool: 32x32 stays 32x32)
//   layer1..4   2 BasicBlocks each, widths 64, 128, 256, 512; the first block of layers 2-4 has stride 2
//               and a downsample shortcut: Sequential(conv 1x1 stride 2 no bias, BatchNorm2d)
//   BasicBlock  y = relu(bn1(conv1(x)));  y = bn2(conv2(y));  out = relu(y + shortcut(x))
//               conv1 3x3 (stride s, pad 1), conv2 3x3 (stride 1, pad 1), both without bias
//   head        global average pool (N, 512, 4, 4) -> (N, 512), fc Linear(512 -> classes)
//   resnet18_cifar(): 11,173,962 parameters with 10 classes; images (N, 3, H, W), any H, W (32 in MODELS.md)
// Initialisation: PyTorch's defaults (nn/init.h), as torch_anchor.py leaves them.
#pragma once
#include <memory>

#include "nn/layers.h"
#include "nn/norm_layers.h"

namespace reel::nn {

class BasicBlock : public Module {
 public:
  BasicBlock(int64_t in_channels, int64_t out_channels, int64_t stride, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;  // x: (N, in, H, W) -> (N, out, H / stride, W / stride)
  bool has_downsample() const { return downsample_ != nullptr; }

 private:
  std::shared_ptr<Conv2d> conv1_, conv2_;
  std::shared_ptr<BatchNorm2d> bn1_, bn2_;
  std::shared_ptr<Sequential> downsample_;  // null: the identity shortcut
};

class ResNetCifar : public Module {
 public:
  // blocks: BasicBlocks per layer (2, 2, 2, 2 for ResNet-18); widths of layer1..4 are 64, 128, 256, 512.
  ResNetCifar(const std::vector<int64_t>& blocks, int64_t classes, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;  // x: (N, 3, H, W) -> logits (N, classes)

 private:
  std::shared_ptr<Conv2d> conv1_;
  std::shared_ptr<BatchNorm2d> bn1_;
  std::vector<std::shared_ptr<Sequential>> layers_;  // layer1..layer4
  std::shared_ptr<Linear> fc_;
};

std::shared_ptr<ResNetCifar> resnet18_cifar(Generator* gen = nullptr, int64_t classes = 10);

}  // namespace reel::nn
