// Linear, Conv2d, Embedding, Dropout, pooling and Sequential (see layers.h for shapes and init).
#include "nn/layers.h"

#include <cmath>

#include "autograd/autocast.h"  // the thread's precision policy
#include "nn/init.h"

namespace reel::nn {

namespace {
void check_positive(const char* layer, const char* what, int64_t v) {
  REEL_CHECK(v > 0, layer, ": ", what, " must be positive, got ", v);
}
}  // namespace

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, Generator* gen)
    : Module("Linear"), in_(in_features), out_(out_features) {
  check_positive("Linear", "in_features", in_features);
  check_positive("Linear", "out_features", out_features);
  weight_ = &register_parameter("weight", init::kaiming_uniform({out_, in_}, std::sqrt(5.0), gen));
  if (bias) bias_ = &register_parameter("bias", init::bias_uniform({out_}, in_, gen));
}

Tensor Linear::forward(const Tensor& x) {
  // x: (..., in) @ weight^T: (in, out) -> (..., out)
  REEL_CHECK(x.dim() >= 1 && x.size(-1) == in_, "Linear: input ", shape_str(x.shape()), " must end in in_features ",
             in_);
  Tensor y = autocast_matmul(x, weight().t(), autocast_policy());  // f32 out, whatever the policy
  return bias_ ? y + *bias_ : y;
}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride, int64_t padding, bool bias,
               Generator* gen)
    : Conv2d(Conv2dOptions(in_channels, out_channels, kernel).stride(stride).padding(padding).bias(bias), gen) {}

Conv2d::Conv2d(const Conv2dOptions& o, Generator* gen)
    : Module("Conv2d"), stride_(o.stride_), padding_(o.padding_), groups_(o.groups_) {
  check_positive("Conv2d", "in_channels", o.in_channels_);
  check_positive("Conv2d", "out_channels", o.out_channels_);
  check_positive("Conv2d", "kernel", o.kernel_);
  check_positive("Conv2d", "stride", o.stride_);
  check_positive("Conv2d", "groups", o.groups_);
  REEL_CHECK(o.padding_ >= 0, "Conv2d: padding must be >= 0, got ", o.padding_);
  REEL_CHECK(o.in_channels_ % o.groups_ == 0 && o.out_channels_ % o.groups_ == 0, "Conv2d: in_channels ",
             o.in_channels_, " and out_channels ", o.out_channels_, " must both be divisible by groups ", o.groups_);
  // Each output channel sees in_channels / groups inputs, so that is the weight's dim 1 and, through
  // it, the fan_in of PyTorch's default init: in_channels / groups * k * k.
  Shape w_shape{o.out_channels_, o.in_channels_ / o.groups_, o.kernel_, o.kernel_};
  weight_ = &register_parameter("weight", init::kaiming_uniform(w_shape, std::sqrt(5.0), gen));
  if (o.bias_) bias_ = &register_parameter("bias", init::bias_uniform({o.out_channels_}, init::fan_in(w_shape), gen));
}

Tensor Conv2d::forward(const Tensor& x) {
  return autocast_conv2d(x, weight(), bias(), stride_, padding_, autocast_policy(), groups_);
}

Embedding::Embedding(int64_t num_embeddings, int64_t dim, Generator* gen) : Module("Embedding") {
  check_positive("Embedding", "num_embeddings", num_embeddings);
  check_positive("Embedding", "dim", dim);
  weight_ = &register_parameter("weight", init::normal({num_embeddings, dim}, 0.0, 1.0, gen));
}

Tensor Embedding::forward(const Tensor& indices) { return embedding(weight(), indices); }

Dropout::Dropout(double p, Generator* gen) : Module("Dropout"), p_(p), gen_(gen) {
  REEL_CHECK(p >= 0 && p <= 1, "Dropout: probability p must be in [0, 1], got ", p);
}

Tensor Dropout::forward(const Tensor& x) { return dropout(x, p_, is_training(), gen_); }

MaxPool2d::MaxPool2d(int64_t kernel, int64_t stride, int64_t padding)
    : Module("MaxPool2d"), k_(kernel), s_(stride), p_(padding) {
  check_positive("MaxPool2d", "kernel", kernel);
}

AvgPool2d::AvgPool2d(int64_t kernel, int64_t stride, int64_t padding)
    : Module("AvgPool2d"), k_(kernel), s_(stride), p_(padding) {
  check_positive("AvgPool2d", "kernel", kernel);
}

Sequential::Sequential(std::initializer_list<ModulePtr> modules) : Module("Sequential") {
  for (const auto& m : modules) push_back(m);
}

void Sequential::push_back(ModulePtr m) {
  REEL_CHECK(m != nullptr, "Sequential.push_back: module ", items_.size(), " is null");
  items_.push_back(register_module(std::to_string(items_.size()), std::move(m)));
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (const auto& m : items_) y = m->forward(y);
  return y;
}

const ModulePtr& Sequential::operator[](size_t i) const {
  REEL_CHECK(i < items_.size(), "Sequential: index ", i, " out of range for ", items_.size(), " modules");
  return items_[i];
}

ModuleList::ModuleList(std::initializer_list<ModulePtr> modules) : Module("ModuleList") {
  for (const auto& m : modules) push_back(m);
}

void ModuleList::push_back(ModulePtr m) {
  REEL_CHECK(m != nullptr, "ModuleList.push_back: module ", items_.size(), " is null");
  items_.push_back(register_module(std::to_string(items_.size()), std::move(m)));
}

const ModulePtr& ModuleList::operator[](size_t i) const {
  REEL_CHECK(i < items_.size(), "ModuleList: index ", i, " out of range for ", items_.size(), " modules");
  return items_[i];
}

}  // namespace reel::nn
