// The benchmark models of MODELS.md (cnn-small, gpt-tiny, gpt-small here; the seed's model families
// resnet18-cifar, vit-tiny and yolov8n-cls in resnet.h, vit.h and yolo.h, which this index includes),
// the Fashion-MNIST CNN of `make run`, and model_loss. Parameter names match the PyTorch peer
// (peer/torch_anchor.py), so a state_dict maps one to one (BatchNorm's num_batches_tracked included).
//
//   cnn_small   Sequential: 5 x [conv3x3 (no bias), BatchNorm2d x3 / GroupNorm(8) x2, ReLU],
//               GlobalAvgPool2d, Flatten (a no-op, for the peer's indices), Linear(128 -> 10);
//               279,466 parameters; images (N, 3, 32, 32)
//   gpt         x = wte(idx) + wpe(0..T-1);  per block (pre-norm):
//                 x = x + proj(causal_attention(qkv(ln1(x))));  x = x + fc2(gelu_tanh(fc(ln2(x))))
//               (GptConfig::dropout: dropout on wte + wpe and on both residual branches, as GPT-2)
//               logits = head(lnf(x)), head without bias; idx (B, T) i64 -> logits (B, T, vocab)
//               gpt_tiny: 3,323,392 parameters; gpt_small: 25,613,312
//   fashion_cnn conv3x3(1->w) BN ReLU maxpool2, conv3x3(w->2w) BN ReLU maxpool2, Flatten,
//               Linear(2w*7*7 -> 10), w = 32 by default (convs without bias: BN follows); images (N, 1, 28, 28)
//   resnet18_cifar  (resnet.h) 11,173,962 parameters; images (N, 3, 32, 32)
//   vit_tiny        (vit.h)     5,362,762 parameters; images (N, 3, 32, 32)
//   yolov8n_cls     (yolo.h)    1,451,098 parameters; images (N, 3, 64, 64)
#pragma once
#include "nn/attention.h"
#include "nn/layers.h"
#include "nn/norm_layers.h"
#include "nn/resnet.h"
#include "nn/vit.h"
#include "nn/yolo.h"

namespace reel::nn {

struct GptConfig {
  int64_t vocab = 256;
  int64_t block_size = 128;  // the context T: the longest sequence the position embedding covers
  int64_t dim = 256;
  int64_t heads = 4;
  int64_t layers = 4;
  // GPT-2's dropout (its embd/resid pdrop): on the embeddings' sum and on each residual branch
  // (attention's projection, the MLP's fc2) while training; 0 leaves it out. The attention
  // probabilities are not dropped (the fused attention op has no dropout).
  double dropout = 0.0;
};

// One pre-norm transformer block (names as the peer's: ln1 qkv proj ln2 fc fc2).
class GptBlock : public Module {
 public:
  GptBlock(int64_t dim, int64_t heads, Generator* gen = nullptr, double dropout = 0.0);
  Tensor forward(const Tensor& x) override;  // x: (B, T, d)
  void set_dropout(double p) { dropout_ = p; }

 private:
  int64_t heads_;
  double dropout_;
  std::shared_ptr<LayerNorm> ln1_, ln2_;
  std::shared_ptr<Linear> qkv_, proj_, fc_, fc2_;
};

class Gpt : public Module {
 public:
  explicit Gpt(const GptConfig& config, Generator* gen = nullptr);
  Tensor forward(const Tensor& idx) override;  // idx: (B, T) i64, T <= block_size -> (B, T, vocab)
  const GptConfig& config() const { return config_; }
  // The dropout probability of every dropout site (GptConfig::dropout), in [0, 1).
  void set_dropout(double p);

 private:
  GptConfig config_;
  std::shared_ptr<Embedding> wte_, wpe_;
  std::vector<std::shared_ptr<GptBlock>> blocks_;
  std::shared_ptr<LayerNorm> lnf_;
  std::shared_ptr<Linear> head_;
};

std::shared_ptr<Sequential> cnn_small(Generator* gen = nullptr);
std::shared_ptr<Gpt> gpt(const GptConfig& config, Generator* gen = nullptr);
std::shared_ptr<Gpt> gpt_tiny(Generator* gen = nullptr, double dropout = 0.0);   // T 128, d 256, 4 heads, 4 layers
std::shared_ptr<Gpt> gpt_small(Generator* gen = nullptr, double dropout = 0.0);  // T 256, d 512, 8 heads, 8 layers
// width: channels of the first conv (the second has 2 * width); 32 gives 50,282 parameters.
std::shared_ptr<Sequential> fashion_cnn(Generator* gen = nullptr, int64_t width = 32);

// Mean cross-entropy of model(x) against y. Logits (..., C) are flattened to (M, C) and y (...) to
// (M): the CNNs' (N, 10) with y (N), the GPT's (B, T, 256) with y (B, T) over all B*T positions.
Tensor model_loss(Module& model, const Tensor& x, const Tensor& y);

}  // namespace reel::nn
