// ViT-Ti (architecture and names in vit.h).
#include "nn/vit.h"

#include <cmath>

#include "autograd/autocast.h"  // the thread's precision policy
#include "nn/init.h"

namespace reel::nn {

namespace {
constexpr double kVitNormEps = 1e-6;  // timm's LayerNorm eps for ViTs
}  // namespace

VitAttention::VitAttention(int64_t dim, int64_t heads, Generator* gen)
    : Module("Attention"), dim_(dim), heads_(heads) {
  REEL_CHECK(dim > 0 && heads > 0 && dim % heads == 0, "VitAttention: heads ", heads,
             " must be positive and divide dim ", dim);
  qkv_ = register_module("qkv", std::make_shared<Linear>(dim, 3 * dim, true, gen));
  proj_ = register_module("proj", std::make_shared<Linear>(dim, dim, true, gen));
}

Tensor VitAttention::forward(const Tensor& x) {
  REEL_CHECK(x.dim() == 3 && x.size(2) == dim_, "VitAttention: input ", shape_str(x.shape()), " must be (B, T, ",
             dim_, ")");
  return proj_->forward(attention(qkv_->forward(x), heads_, /*causal=*/false));  // the fused op, every key
}

VitMlp::VitMlp(int64_t dim, int64_t hidden, Generator* gen) : Module("Mlp") {
  fc1_ = register_module("fc1", std::make_shared<Linear>(dim, hidden, true, gen));
  fc2_ = register_module("fc2", std::make_shared<Linear>(hidden, dim, true, gen));
}

Tensor VitMlp::forward(const Tensor& x) { return fc2_->forward(gelu(fc1_->forward(x), "none")); }

VitBlock::VitBlock(int64_t dim, int64_t heads, int64_t hidden, Generator* gen) : Module("Block") {
  norm1_ = register_module("norm1", std::make_shared<LayerNorm>(dim, kVitNormEps));
  attn_ = register_module("attn", std::make_shared<VitAttention>(dim, heads, gen));
  norm2_ = register_module("norm2", std::make_shared<LayerNorm>(dim, kVitNormEps));
  mlp_ = register_module("mlp", std::make_shared<VitMlp>(dim, hidden, gen));
}

Tensor VitBlock::forward(const Tensor& x) {
  Tensor h = x + attn_->forward(norm1_->forward(x));  // (B, T, d)
  return h + mlp_->forward(norm2_->forward(h));
}

PatchEmbed::PatchEmbed(int64_t dim, int64_t patch, Generator* gen) : Module("PatchEmbed") {
  proj_ = register_module("proj", std::make_shared<Conv2d>(3, dim, patch, patch, 0, true, gen));
}

Tensor PatchEmbed::forward(const Tensor& x) {
  Tensor y = proj_->forward(x);                // (B, d, h, w)
  return flatten(y, 2).transpose(1, 2);        // (B, h * w, d)
}

VisionTransformer::VisionTransformer(const VitConfig& c, Generator* gen) : Module("VisionTransformer"), config_(c) {
  REEL_CHECK(c.image > 0 && c.patch > 0 && c.image % c.patch == 0, "VisionTransformer: patch ", c.patch,
             " must divide the image side ", c.image);
  REEL_CHECK(c.depth >= 0 && c.hidden > 0 && c.classes > 0, "VisionTransformer: depth ", c.depth, ", hidden ",
             c.hidden, " and classes ", c.classes, " must be non-negative, positive and positive");
  const int64_t tokens = (c.image / c.patch) * (c.image / c.patch) + 1;  // the patches and the class token
  patch_embed_ = register_module("patch_embed", std::make_shared<PatchEmbed>(c.dim, c.patch, gen));
  cls_token_ = &register_parameter("cls_token", init::normal({1, 1, c.dim}, 0.0, 0.02, gen));
  pos_embed_ = &register_parameter("pos_embed", init::normal({1, tokens, c.dim}, 0.0, 0.02, gen));
  auto blocks = register_module("blocks", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < c.depth; ++i) {
    blocks_.push_back(std::make_shared<VitBlock>(c.dim, c.heads, c.hidden, gen));
    blocks->push_back(blocks_.back());
  }
  norm_ = register_module("norm", std::make_shared<LayerNorm>(c.dim, kVitNormEps));
  head_ = register_module("head", std::make_shared<Linear>(c.dim, c.classes, true, gen));
}

Tensor VisionTransformer::forward(const Tensor& x) {
  REEL_CHECK(x.dim() == 4 && x.size(1) == 3 && x.size(2) == config_.image && x.size(3) == config_.image,
             "VisionTransformer: input ", shape_str(x.shape()), " must be images (B, 3, ", config_.image, ", ",
             config_.image, ")");
  const int64_t B = x.size(0), d = config_.dim;
  Tensor tokens = patch_embed_->forward(x);                                           // (B, N, d)
  Tensor h = concat({expand(*cls_token_, {B, 1, d}), tokens}, 1) + *pos_embed_;      // (B, N + 1, d)
  for (auto& b : blocks_) h = b->forward(h);
  // The peer normalises every token and then takes the class token's row; LayerNorm acts on each row
  // alone, so normalising that row only is the same value and gradient, at 1/(N + 1) of the work.
  return head_->forward(norm_->forward(select(h, 1, 0)));  // (B, d) -> (B, classes)
}

std::shared_ptr<VisionTransformer> vision_transformer(const VitConfig& config, Generator* gen) {
  return std::make_shared<VisionTransformer>(config, gen);
}

std::shared_ptr<VisionTransformer> vit_tiny(Generator* gen) { return vision_transformer(VitConfig{}, gen); }

}  // namespace reel::nn
