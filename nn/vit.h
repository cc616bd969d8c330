// ViT-Ti with 4x4 patches on 32x32 images (MODELS.md's vit-tiny), with timm's module names so that a
// state_dict maps one to one onto the PyTorch peer's (peer/torch_anchor.py).
//
//   patch_embed.proj  Conv2d(3 -> d, kernel p, stride p, with bias): (B, 3, 32, 32) -> (B, d, 8, 8)
//                     -> tokens (B, N, d), N = (32 / p)^2 = 64
//   x = concat(cls_token expanded to (B, 1, d), tokens) + pos_embed        (B, N + 1, d)
//   each of `depth` blocks (pre-norm):
//     x = x + attn.proj(attention(attn.qkv(norm1(x))))    qkv: Linear(d -> 3d), proj: Linear(d -> d)
//     x = x + mlp.fc2(gelu_erf(mlp.fc1(norm2(x))))        fc1: Linear(d -> hidden), fc2: Linear(hidden -> d)
//   logits = head(norm(x[:, 0]))                          head: Linear(d -> classes), on the class token
//   attention: NON-causal softmax(q k^T / sqrt(d / heads)) v per head, every token sees all N + 1.
//   LayerNorms eps 1e-6 (timm's); GELU exact (erf), torch's default.
//   vit_tiny(): d 192, depth 12, 3 heads of 64, hidden 768, 10 classes: 5,362,762 parameters.
// Initialisation: cls_token and pos_embed N(0, 0.02^2) (torch_anchor.py: randn * 0.02); Conv2d, Linear
// and LayerNorm PyTorch's defaults (nn/init.h).
#pragma once
#include <memory>

#include "nn/attention.h"
#include "nn/layers.h"
#include "nn/norm_layers.h"

namespace reel::nn {

struct VitConfig {
  int64_t image = 32;  // square images of this side
  int64_t patch = 4;   // square patches, also the stride: image % patch == 0
  int64_t dim = 192;
  int64_t depth = 12;
  int64_t heads = 3;
  int64_t hidden = 768;  // the MLP's width
  int64_t classes = 10;
};

class VitAttention : public Module {
 public:
  VitAttention(int64_t dim, int64_t heads, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;  // x: (B, T, d) -> (B, T, d)

 private:
  int64_t dim_, heads_;
  std::shared_ptr<Linear> qkv_, proj_;
};

class VitMlp : public Module {
 public:
  VitMlp(int64_t dim, int64_t hidden, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;  // x: (..., d) -> (..., d)

 private:
  std::shared_ptr<Linear> fc1_, fc2_;
};

class VitBlock : public Module {
 public:
  VitBlock(int64_t dim, int64_t heads, int64_t hidden, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;  // x: (B, T, d)

 private:
  std::shared_ptr<LayerNorm> norm1_, norm2_;
  std::shared_ptr<VitAttention> attn_;
  std::shared_ptr<VitMlp> mlp_;
};

// patch_embed: its proj conv, and the (B, d, h, w) -> (B, h * w, d) token layout.
class PatchEmbed : public Module {
 public:
  PatchEmbed(int64_t dim, int64_t patch, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;  // x: (B, 3, H, W) -> (B, (H / p) * (W / p), d)

 private:
  std::shared_ptr<Conv2d> proj_;
};

class VisionTransformer : public Module {
 public:
  explicit VisionTransformer(const VitConfig& config, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;  // x: (B, 3, image, image) -> logits (B, classes)
  const VitConfig& config() const { return config_; }

 private:
  VitConfig config_;
  Tensor *cls_token_, *pos_embed_;  // (1, 1, d), (1, N + 1, d)
  std::shared_ptr<PatchEmbed> patch_embed_;
  std::vector<std::shared_ptr<VitBlock>> blocks_;
  std::shared_ptr<LayerNorm> norm_;
  std::shared_ptr<Linear> head_;
};

std::shared_ptr<VisionTransformer> vision_transformer(const VitConfig& config, Generator* gen = nullptr);
std::shared_ptr<VisionTransformer> vit_tiny(Generator* gen = nullptr);  // VitConfig's defaults

}  // namespace reel::nn
