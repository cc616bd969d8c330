// The basic layers: Linear, Conv2d, Embedding, Dropout, activations, pooling, Flatten, Sequential
// and CrossEntropyLoss (norms are in norm_layers.h, attention in attention.h).
//
//   Linear     x (..., in) -> x W^T + b: (..., out);  weight (out, in), bias (out)
//   Conv2d     x (N, C, H, W) -> (N, O, Ho, Wo), Ho = (H + 2p - k) / s + 1;  weight (O, C/groups, k, k),
//              bias (O); groups as torch.nn.Conv2d's (groups == C: depthwise), fan_in = C/groups * k * k
//   Embedding  indices (any shape, i64) -> indices.shape + (D,);  weight (V, D)
//   Dropout    zero with probability p, scale by 1/(1-p), only while the module is training
// Initialisation follows PyTorch (init.h); every constructor takes an optional Generator (reel's
// default generator otherwise). Layers are created f32 on the CPU; Module::to moves them.
#pragma once
#include <initializer_list>
#include <string>

#include "nn/module.h"

namespace reel::nn {

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  const Tensor& weight() const { return *weight_; }
  const Tensor& bias() const { return bias_ ? *bias_ : none_; }  // undefined without bias
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

 private:
  int64_t in_, out_;
  Tensor* weight_ = nullptr;
  Tensor* bias_ = nullptr;
  Tensor none_;
};

// Conv2d's settings by name, as libtorch's torch::nn::Conv2dOptions:
//   Conv2d(Conv2dOptions(32, 32, 3).padding(1).groups(32).bias(false))   // a depthwise 3x3
struct Conv2dOptions {
  Conv2dOptions(int64_t in_channels, int64_t out_channels, int64_t kernel)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_(kernel) {}
  Conv2dOptions& stride(int64_t v) { stride_ = v; return *this; }
  Conv2dOptions& padding(int64_t v) { padding_ = v; return *this; }
  Conv2dOptions& groups(int64_t v) { groups_ = v; return *this; }
  Conv2dOptions& bias(bool v) { bias_ = v; return *this; }
  int64_t in_channels_, out_channels_, kernel_, stride_ = 1, padding_ = 0, groups_ = 1;
  bool bias_ = true;
};

class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride = 1, int64_t padding = 0,
         bool bias = true, Generator* gen = nullptr);
  explicit Conv2d(const Conv2dOptions& options, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  const Tensor& weight() const { return *weight_; }
  const Tensor& bias() const { return bias_ ? *bias_ : none_; }
  int64_t groups() const { return groups_; }

 private:
  int64_t stride_, padding_, groups_;
  Tensor* weight_ = nullptr;
  Tensor* bias_ = nullptr;
  Tensor none_;
};

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, Generator* gen = nullptr);
  Tensor forward(const Tensor& indices) override;
  const Tensor& weight() const { return *weight_; }

 private:
  Tensor* weight_ = nullptr;
};

class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;

 private:
  double p_;
  Generator* gen_;
};

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override { return relu(x); }
};

// GELU: the tanh approximation by default (GPT-2's and MODELS.md's); GELU("none") is the exact
// form, torch.nn.GELU's default (see gelu in autograd/ops.h).
class GELU : public Module {
 public:
  explicit GELU(std::string approximate = "tanh") : Module("GELU"), approximate_(std::move(approximate)) {
    REEL_CHECK(approximate_ == "none" || approximate_ == "tanh", "GELU: approximate must be \"none\" or \"tanh\", got \"",
               approximate_, "\"");
  }
  Tensor forward(const Tensor& x) override { return gelu(x, approximate_); }
  const std::string& approximate() const { return approximate_; }

 private:
  std::string approximate_;
};

// SiLU: x sigmoid(x), as torch.nn.SiLU.
class SiLU : public Module {
 public:
  SiLU() : Module("SiLU") {}
  Tensor forward(const Tensor& x) override { return silu(x); }
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(int64_t kernel, int64_t stride = -1, int64_t padding = 0);  // stride -1: = kernel
  Tensor forward(const Tensor& x) override { return max_pool2d(x, k_, s_, p_); }

 private:
  int64_t k_, s_, p_;
};

// Average pooling; padded zeros count in the average (PyTorch's count_include_pad=True).
class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(int64_t kernel, int64_t stride = -1, int64_t padding = 0);
  Tensor forward(const Tensor& x) override { return avg_pool2d(x, k_, s_, p_); }

 private:
  int64_t k_, s_, p_;
};

// (N, C, H, W) -> (N, C): the mean over H and W (AdaptiveAvgPool2d(1) followed by Flatten).
class GlobalAvgPool2d : public Module {
 public:
  GlobalAvgPool2d() : Module("GlobalAvgPool2d") {}
  Tensor forward(const Tensor& x) override { return global_avg_pool2d(x); }
};

// torch.nn.Upsample(scale_factor=s, mode="nearest") for an integer s: (N, C, H, W) -> (N, C, sH, sW).
class Upsample : public Module {
 public:
  explicit Upsample(int64_t scale_factor, std::string mode = "nearest") : Module("Upsample"), scale_(scale_factor) {
    REEL_CHECK(mode == "nearest", "Upsample: only mode \"nearest\" is implemented, got \"", mode, "\"");
    REEL_CHECK(scale_factor >= 1, "Upsample: scale_factor must be an integer >= 1, got ", scale_factor);
  }
  Tensor forward(const Tensor& x) override { return upsample_nearest2d(x, scale_); }

 private:
  int64_t scale_;
};

// Merges dims start_dim..end_dim into one (default: all but the batch dim).
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : Module("Flatten"), start_(start_dim), end_(end_dim) {}
  Tensor forward(const Tensor& x) override { return flatten(x, start_, end_); }

 private:
  int64_t start_, end_;
};

// Children named "0", "1", ... in order; forward runs them one after another.
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  Sequential(std::initializer_list<ModulePtr> modules);
  void push_back(ModulePtr m);
  Tensor forward(const Tensor& x) override;
  size_t size() const { return items_.size(); }
  const ModulePtr& operator[](size_t i) const;

 private:
  std::vector<ModulePtr> items_;
};

// Children named "0", "1", ... in order, as torch.nn.ModuleList: a registered list of modules (their
// parameters are the list's, their state_dict keys "<list>.<i>.<name>") with no forward of its own;
// the owner iterates it. at<M>(i) gives a child back as its own type.
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  ModuleList(std::initializer_list<ModulePtr> modules);
  void push_back(ModulePtr m);
  size_t size() const { return items_.size(); }
  const ModulePtr& operator[](size_t i) const;
  template <typename M>
  std::shared_ptr<M> at(size_t i) const {
    auto m = std::dynamic_pointer_cast<M>((*this)[i]);
    REEL_CHECK(m != nullptr, "ModuleList: module ", i, " is a ", (*this)[i]->type_name(), ", not the type asked for");
    return m;
  }
  std::vector<ModulePtr>::const_iterator begin() const { return items_.begin(); }
  std::vector<ModulePtr>::const_iterator end() const { return items_.end(); }

 private:
  std::vector<ModulePtr> items_;
};

// cross_entropy(logits (N, C), target (N) i64) with mean or sum reduction and an ignore_index.
class CrossEntropyLoss : public Module {
 public:
  explicit CrossEntropyLoss(std::string reduction = "mean", int64_t ignore_index = -100)
      : Module("CrossEntropyLoss"), reduction_(std::move(reduction)), ignore_index_(ignore_index) {}
  using Module::forward;
  Tensor forward(const Tensor& logits, const Tensor& target) {
    return cross_entropy(logits, target, reduction_, ignore_index_);
  }
  Tensor operator()(const Tensor& logits, const Tensor& target) { return forward(logits, target); }

 private:
  std::string reduction_;
  int64_t ignore_index_;
};

}  // namespace reel::nn
