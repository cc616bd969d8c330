// The models of MODELS.md and the Fashion-MNIST CNN (architectures in models.h).
#include "nn/models.h"

namespace reel::nn {

namespace {
// conv3x3 (no bias), norm, ReLU: the repeated unit of cnn_small.
void conv_block(Sequential& s, int64_t cin, int64_t cout, int64_t stride, ModulePtr norm, Generator* gen) {
  s.push_back(std::make_shared<Conv2d>(cin, cout, 3, stride, 1, false, gen));
  s.push_back(std::move(norm));
  s.push_back(std::make_shared<ReLU>());
}
}  // namespace

std::shared_ptr<Sequential> cnn_small(Generator* gen) {
  auto s = std::make_shared<Sequential>();
  conv_block(*s, 3, 32, 1, std::make_shared<BatchNorm2d>(32), gen);
  conv_block(*s, 32, 64, 2, std::make_shared<BatchNorm2d>(64), gen);
  conv_block(*s, 64, 64, 1, std::make_shared<BatchNorm2d>(64), gen);
  conv_block(*s, 64, 128, 2, std::make_shared<GroupNorm>(8, 128), gen);
  conv_block(*s, 128, 128, 1, std::make_shared<GroupNorm>(8, 128), gen);
  s->push_back(std::make_shared<GlobalAvgPool2d>());  // (N, 128)
  // A no-op on (N, 128), kept so the indices match the peer's AdaptiveAvgPool2d(1), Flatten, Linear
  // (its head is "17.weight" in both).
  s->push_back(std::make_shared<Flatten>());
  s->push_back(std::make_shared<Linear>(128, 10, true, gen));
  return s;
}

std::shared_ptr<Sequential> fashion_cnn(Generator* gen, int64_t width) {
  REEL_CHECK(width > 0, "fashion_cnn: width must be positive, got ", width);
  auto s = std::make_shared<Sequential>();
  conv_block(*s, 1, width, 1, std::make_shared<BatchNorm2d>(width), gen);
  s->push_back(std::make_shared<MaxPool2d>(2));  // 28 -> 14
  conv_block(*s, width, 2 * width, 1, std::make_shared<BatchNorm2d>(2 * width), gen);
  s->push_back(std::make_shared<MaxPool2d>(2));  // 14 -> 7
  s->push_back(std::make_shared<Flatten>());
  s->push_back(std::make_shared<Linear>(2 * width * 7 * 7, 10, true, gen));
  return s;
}

GptBlock::GptBlock(int64_t dim, int64_t heads, Generator* gen, double dropout)
    : Module("GptBlock"), heads_(heads), dropout_(dropout) {
  REEL_CHECK(dim > 0 && heads > 0 && dim % heads == 0, "GptBlock: heads ", heads, " must divide dim ", dim);
  ln1_ = register_module("ln1", std::make_shared<LayerNorm>(dim));
  qkv_ = register_module("qkv", std::make_shared<Linear>(dim, 3 * dim, true, gen));
  proj_ = register_module("proj", std::make_shared<Linear>(dim, dim, true, gen));
  ln2_ = register_module("ln2", std::make_shared<LayerNorm>(dim));
  fc_ = register_module("fc", std::make_shared<Linear>(dim, 4 * dim, true, gen));
  fc2_ = register_module("fc2", std::make_shared<Linear>(4 * dim, dim, true, gen));
}

Tensor GptBlock::forward(const Tensor& x) {
  // Dropout draws from the default generator, as torch's does; it is the identity in eval mode or at p 0.
  auto drop = [&](const Tensor& t) { return dropout(t, dropout_, is_training()); };
  Tensor h = x + drop(proj_->forward(causal_attention(qkv_->forward(ln1_->forward(x)), heads_)));  // (B, T, d)
  return h + drop(fc2_->forward(gelu(fc_->forward(ln2_->forward(h)))));
}

Gpt::Gpt(const GptConfig& c, Generator* gen) : Module("Gpt"), config_(c) {
  REEL_CHECK(c.vocab > 0 && c.block_size > 0 && c.layers >= 0, "Gpt: config needs positive vocab and block_size, got ",
             c.vocab, " and ", c.block_size);
  REEL_CHECK(c.dropout >= 0 && c.dropout < 1, "Gpt: dropout must be in [0, 1), got ", c.dropout);
  wte_ = register_module("wte", std::make_shared<Embedding>(c.vocab, c.dim, gen));
  wpe_ = register_module("wpe", std::make_shared<Embedding>(c.block_size, c.dim, gen));
  auto blocks = register_module("blocks", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < c.layers; ++i) {
    blocks_.push_back(std::make_shared<GptBlock>(c.dim, c.heads, gen, c.dropout));
    blocks->push_back(blocks_.back());
  }
  lnf_ = register_module("lnf", std::make_shared<LayerNorm>(c.dim));
  head_ = register_module("head", std::make_shared<Linear>(c.dim, c.vocab, false, gen));
}

Tensor Gpt::forward(const Tensor& idx) {
  REEL_CHECK(idx.dim() == 2 && idx.dtype() == DType::i64, "Gpt: input must be token ids (B, T) i64, got ",
             dtype_name(idx.dtype()), " ", shape_str(idx.shape()));
  int64_t T = idx.size(1);
  REEL_CHECK(T >= 1 && T <= config_.block_size, "Gpt: sequence length ", T, " must be in [1, block_size ",
             config_.block_size, "]");
  Tensor pos = arange(T, TensorOptions{}.with_dtype(DType::i64).with_device(idx.device()));
  Tensor x = dropout(wte_->forward(idx) + wpe_->forward(pos), config_.dropout, is_training());  // (B, T, d) + (T, d)
  for (auto& b : blocks_) x = b->forward(x);
  return head_->forward(lnf_->forward(x));  // (B, T, vocab)
}

void Gpt::set_dropout(double p) {
  REEL_CHECK(p >= 0 && p < 1, "Gpt: dropout must be in [0, 1), got ", p);
  config_.dropout = p;
  for (auto& b : blocks_) b->set_dropout(p);
}

std::shared_ptr<Gpt> gpt(const GptConfig& config, Generator* gen) { return std::make_shared<Gpt>(config, gen); }
std::shared_ptr<Gpt> gpt_tiny(Generator* gen, double dropout) { return gpt({256, 128, 256, 4, 4, dropout}, gen); }
std::shared_ptr<Gpt> gpt_small(Generator* gen, double dropout) { return gpt({256, 256, 512, 8, 8, dropout}, gen); }

Tensor model_loss(Module& model, const Tensor& x, const Tensor& y) {
  Tensor logits = model.forward(x);
  REEL_CHECK(logits.dim() >= 2 && y.dim() == logits.dim() - 1, "model_loss: logits ", shape_str(logits.shape()),
             " and targets ", shape_str(y.shape()), " do not match (expected logits (..., C), targets (...))");
  int64_t C = logits.size(-1);
  int64_t M = logits.numel() / C;
  return cross_entropy(logits.reshape({M, C}), y.reshape({M}));
}

}  // namespace reel::nn
