// ResNet-18, CIFAR form (architecture and names in resnet.h).
#include "nn/resnet.h"

#include <string>

namespace reel::nn {

BasicBlock::BasicBlock(int64_t in_channels, int64_t out_channels, int64_t stride, Generator* gen)
    : Module("BasicBlock") {
  conv1_ = register_module("conv1", std::make_shared<Conv2d>(in_channels, out_channels, 3, stride, 1, false, gen));
  bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(out_channels));
  conv2_ = register_module("conv2", std::make_shared<Conv2d>(out_channels, out_channels, 3, 1, 1, false, gen));
  bn2_ = register_module("bn2", std::make_shared<BatchNorm2d>(out_channels));
  // torchvision's rule: a projection shortcut wherever the identity would not fit (stride or width).
  if (stride != 1 || in_channels != out_channels) {
    downsample_ = register_module(
        "downsample",
        std::make_shared<Sequential>(std::initializer_list<ModulePtr>{
            std::make_shared<Conv2d>(in_channels, out_channels, 1, stride, 0, false, gen),
            std::make_shared<BatchNorm2d>(out_channels)}));
  }
}

Tensor BasicBlock::forward(const Tensor& x) {
  Tensor y = relu(bn1_->forward(conv1_->forward(x)));  // (N, out, H/s, W/s)
  y = bn2_->forward(conv2_->forward(y));
  return relu(y + (downsample_ ? downsample_->forward(x) : x));
}

ResNetCifar::ResNetCifar(const std::vector<int64_t>& blocks, int64_t classes, Generator* gen) : Module("ResNet") {
  REEL_CHECK(blocks.size() == 4, "ResNetCifar: expected blocks for 4 layers, got ", blocks.size());
  REEL_CHECK(classes > 0, "ResNetCifar: classes must be positive, got ", classes);
  conv1_ = register_module("conv1", std::make_shared<Conv2d>(3, 64, 3, 1, 1, false, gen));
  bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(64));
  const int64_t widths[4] = {64, 128, 256, 512};
  int64_t in = 64;
  for (int i = 0; i < 4; ++i) {
    REEL_CHECK(blocks[i] > 0, "ResNetCifar: layer", i + 1, " needs at least one block, got ", blocks[i]);
    auto layer = std::make_shared<Sequential>();
    for (int64_t b = 0; b < blocks[i]; ++b) {
      layer->push_back(std::make_shared<BasicBlock>(in, widths[i], b == 0 && i > 0 ? 2 : 1, gen));
      in = widths[i];
    }
    layers_.push_back(register_module("layer" + std::to_string(i + 1), layer));
  }
  fc_ = register_module("fc", std::make_shared<Linear>(512, classes, true, gen));
}

Tensor ResNetCifar::forward(const Tensor& x) {
  REEL_CHECK(x.dim() == 4 && x.size(1) == 3, "ResNetCifar: input ", shape_str(x.shape()), " must be images (N, 3, H, W)");
  Tensor h = relu(bn1_->forward(conv1_->forward(x)));  // (N, 64, H, W)
  for (auto& layer : layers_) h = layer->forward(h);    // (N, 512, H/8, W/8)
  return fc_->forward(global_avg_pool2d(h));            // (N, 512) -> (N, classes)
}

std::shared_ptr<ResNetCifar> resnet18_cifar(Generator* gen, int64_t classes) {
  return std::make_shared<ResNetCifar>(std::vector<int64_t>{2, 2, 2, 2}, classes, gen);
}

}  // namespace reel::nn
