// Fused scaled-dot-product attention on the CPU: the op against the textbook chain of ops it replaces
// (split, heads, q k^T, + mask, causal mask, softmax, times v; nn::attention_unfused) in f64 and f32,
// forward and every gradient, causal and not, for sequence lengths on and off the 64-row tile
// (1, 5, 64, 65 as ViT's, 128) and masks of every broadcast shape, a key padding and a fully masked
// row; the 16-bit compute mode against the exact one and under autocast; key_padding_mask; the
// SelfAttention module and its parameter names; the schema's errors. Finite differences of the op
// itself run with every other op's (autograd/cases/attention_cases.cpp, test_gradcheck).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "autograd/autocast.h"
#include "kernels/dispatch.h"
#include "nn/attention.h"
#include "test_util.h"

using namespace reel;
using testing_util::expect_error;
using testing_util::max_abs_diff;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor qkv_leaf(const Shape& shape, DType dt, uint64_t seed, double scale = 1.0) {
  Generator gen(seed);
  Tensor x = (randn(shape, TensorOptions{DType::f64}, &gen) * scale).to(dt);
  x.set_requires_grad(true);
  return x;
}

// y and d(sum(y * w))/dqkv of an attention function, for a fixed random weighting w of y.
std::pair<Tensor, Tensor> value_and_grad(const std::function<Tensor(const Tensor&)>& f, const Tensor& qkv,
                                         uint64_t seed) {
  Tensor x = qkv.detach();
  x.set_requires_grad(true);
  Tensor y = f(x);
  Generator gen(seed);
  Tensor w = randn(y.shape(), TensorOptions{y.dtype()}, &gen);
  sum(y * w).backward();
  return {y.detach(), x.grad()};
}

// A random additive mask of `shape` in dtype dt: N(0, 1) values, with -inf at about one entry in five
// (a fixed pattern, so some rows of a (T, T) mask lose most of their keys).
Tensor random_mask(const Shape& shape, DType dt, uint64_t seed) {
  Generator gen(seed);
  std::vector<double> v = randn(shape, TensorOptions{DType::f64}, &gen).to_vector<double>();
  for (size_t i = 0; i < v.size(); ++i)
    if ((i * 7 + seed) % 5 == 0) v[i] = -kInf;
  return tensor(v, shape, TensorOptions{dt});
}

// padding (B, T) with the last `padded[b]` keys of batch b ignored.
Tensor padding_of(int64_t T, const std::vector<int64_t>& padded) {
  std::vector<int64_t> v;
  for (int64_t p : padded)
    for (int64_t t = 0; t < T; ++t) v.push_back(t >= T - p ? 1 : 0);
  return tensor_i64(v, {int64_t(padded.size()), T});
}

struct MaskCase {
  std::string name;
  Tensor mask;  // undefined: none
};

// Every broadcast shape of (B, H, T, T) the op takes, a key padding and a row masked throughout.
std::vector<MaskCase> masks_for(int64_t B, int64_t H, int64_t T, DType dt) {
  std::vector<MaskCase> m{{"no mask", Tensor()},
                          {"(T, T)", random_mask({T, T}, dt, 1)},
                          {"(B, 1, T, T)", random_mask({B, 1, T, T}, dt, 2)},
                          {"(1, H, T, T)", random_mask({1, H, T, T}, dt, 3)},
                          {"(B, H, T, T)", random_mask({B, H, T, T}, dt, 4)},
                          {"(T)", random_mask({T}, dt, 6)}};
  std::vector<int64_t> padded(size_t(B), 0);
  for (int64_t b = 0; b < B; ++b) padded[size_t(b)] = std::min<int64_t>(b + 1, T - 1);
  m.push_back({"key padding (B, 1, 1, T)", nn::key_padding_mask(padding_of(T, padded), dt)});
  // Row T - 1 of every head removed whole: y = 0 and no gradient there.
  std::vector<double> dead(size_t(T * T), 0.0);
  for (int64_t s = 0; s < T; ++s) dead[size_t((T - 1) * T + s)] = -kInf;
  m.push_back({"fully masked row", tensor(dead, {T, T}, TensorOptions{dt})});
  return m;
}

}  // namespace

TEST(Attention, MatchesTheUnfusedChainOfOpsAndItsGradients) {
  struct Case {
    int64_t B, T, d, H;
  };
  for (DType dt : {DType::f64, DType::f32}) {
    // f32: both sides round differently (the chain's GEMMs and softmax against the op's loops).
    const double tol_y = dt == DType::f64 ? 1e-12 : 2e-5, tol_g = dt == DType::f64 ? 1e-11 : 1e-4;
    for (Case c : {Case{2, 7, 12, 3}, Case{1, 1, 8, 2}, Case{2, 5, 16, 1}, Case{2, 64, 8, 2}, Case{2, 65, 12, 3},
                   Case{1, 128, 8, 2}})
      for (bool causal : {true, false})
        for (const MaskCase& m : masks_for(c.B, c.H, c.T, dt)) {
          SCOPED_TRACE(std::string(dtype_name(dt)) + " B " + std::to_string(c.B) + " T " + std::to_string(c.T) + " d " +
                       std::to_string(c.d) + " H " + std::to_string(c.H) + (causal ? " causal " : " full ") + m.name);
          Tensor qkv = qkv_leaf({c.B, c.T, 3 * c.d}, dt, 7 + c.T, 1.5);
          auto [y, g] = value_and_grad([&](const Tensor& x) { return nn::attention(x, c.H, causal, m.mask); }, qkv, 99);
          auto [y_ref, g_ref] =
              value_and_grad([&](const Tensor& x) { return nn::attention_unfused(x, c.H, causal, m.mask); }, qkv, 99);
          ASSERT_EQ(y.shape(), (Shape{c.B, c.T, c.d}));
          EXPECT_LT(max_abs_diff(y.to_vector<double>(), y_ref.to_vector<double>()), tol_y);
          EXPECT_LT(max_abs_diff(g.to_vector<double>(), g_ref.to_vector<double>()), tol_g);
        }
  }
}

TEST(Attention, NonCausalAttentionSeesLaterKeys) {
  // A change to the last token's k and v moves every non-causal output row, but only the last causal one.
  Tensor qkv = qkv_leaf({1, 6, 24}, DType::f64, 3).detach();
  std::vector<double> v = qkv.to_vector<double>();
  for (int64_t c = 8; c < 24; ++c) v[size_t(5 * 24 + c)] += 1.0;
  Tensor moved = tensor(v, qkv.shape(), TensorOptions{DType::f64});
  for (bool causal : {true, false}) {
    std::vector<double> a = nn::attention(qkv, 2, causal).to_vector<double>();
    std::vector<double> b = nn::attention(moved, 2, causal).to_vector<double>();
    for (int64_t t = 0; t < 6; ++t) {
      double diff = 0;
      for (int64_t c = 0; c < 8; ++c) diff = std::max(diff, std::abs(a[size_t(t * 8 + c)] - b[size_t(t * 8 + c)]));
      if (causal && t < 5) EXPECT_EQ(diff, 0.0) << "causal row " << t;
      else EXPECT_GT(diff, 1e-6) << (causal ? "causal" : "full") << " row " << t;
    }
  }
}

TEST(Attention, FullyMaskedRowsGiveZeroOutputZeroGradientAndInfiniteLse) {
  const int64_t B = 2, T = 5, d = 8, H = 2;
  Tensor padding = padding_of(T, {0, T});  // batch 1: every key ignored
  Tensor mask = nn::key_padding_mask(padding, DType::f64);
  Tensor qkv = qkv_leaf({B, T, 3 * d}, DType::f64, 21);
  auto [y, g] = value_and_grad([&](const Tensor& x) { return nn::attention(x, H, false, mask); }, qkv, 5);
  std::vector<double> yv = y.to_vector<double>(), gv = g.to_vector<double>();
  for (int64_t i = 0; i < T * d; ++i) EXPECT_EQ(yv[size_t(T * d + i)], 0.0);
  for (int64_t i = 0; i < T * 3 * d; ++i) EXPECT_EQ(gv[size_t(T * 3 * d + i)], 0.0);
  // Batch 0 is untouched by batch 1's mask.
  Tensor alone = nn::attention(qkv.detach().slice(0, 0, 1), H, false);
  EXPECT_LT(max_abs_diff(alone.to_vector<double>(), y.slice(0, 0, 1).to_vector<double>()), 1e-14);
  std::vector<Tensor> out = dispatch(OpKind::Attention, {qkv.detach(), mask},
                                     Attrs().set("heads", H).set("compute", DType::f64).set("causal", false));
  std::vector<double> lse = out[1].to_vector<double>();  // (B, H, T)
  for (int64_t i = 0; i < H * T; ++i) {
    EXPECT_TRUE(std::isfinite(lse[size_t(i)]));
    EXPECT_EQ(lse[size_t(H * T + i)], kInf);
  }
}

TEST(Attention, KeyPaddingMaskIsZeroOrMinusInfinityPerKey) {
  Tensor m = nn::key_padding_mask(padding_of(4, {1, 0, 3}));
  EXPECT_EQ(m.shape(), (Shape{3, 1, 1, 4}));
  EXPECT_EQ(m.dtype(), DType::f32);
  EXPECT_EQ(m.to_vector<double>(), (std::vector<double>{0, 0, 0, -kInf, 0, 0, 0, 0, 0, -kInf, -kInf, -kInf}));
}

TEST(Attention, SixteenBitComputeStaysCloseToTheExactResult) {
  Tensor qkv = qkv_leaf({2, 40, 48}, DType::f32, 5);
  for (bool causal : {true, false}) {
    Tensor mask = causal ? Tensor() : nn::key_padding_mask(padding_of(40, {3, 11}));
    auto exact = [&](const Tensor& x) { return scaled_dot_product_attention(x, 2, causal, mask); };
    auto [y, g] = value_and_grad(exact, qkv, 3);
    for (DType c : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(std::string(dtype_name(c)) + (causal ? " causal" : " padded"));
      auto [y16, g16] =
          value_and_grad([&](const Tensor& x) { return scaled_dot_product_attention(x, 2, causal, mask, c); }, qkv, 3);
      const double tol = c == DType::bf16 ? 3e-2 : 5e-3;
      EXPECT_LT(max_abs_diff(y16.to_vector<double>(), y.to_vector<double>()), tol);
      EXPECT_LT(max_abs_diff(g16.to_vector<double>(), g.to_vector<double>()), 2 * tol);
      // ... and rounds: the 16-bit result is not the exact one.
      EXPECT_GT(max_abs_diff(y16.to_vector<double>(), y.to_vector<double>()), 0.0);
    }
  }
}

TEST(Attention, AutocastRunsTheProductsInTheComputeDtype) {
  Tensor qkv = qkv_leaf({2, 9, 24}, DType::f32, 11);
  for (bool causal : {true, false}) {
    Tensor mask = causal ? Tensor() : random_mask({2, 1, 9, 9}, DType::f32, 8);
    Tensor exact = nn::attention(qkv, 2, causal, mask);
    Tensor bf16, unfused;
    {
      AutocastGuard amp(PrecisionPolicy::parse("bf16"));
      bf16 = nn::attention(qkv, 2, causal, mask);
      unfused = nn::attention_unfused(qkv, 2, causal, mask);
    }
    Tensor direct = scaled_dot_product_attention(qkv, 2, causal, mask, DType::bf16);
    EXPECT_EQ(bf16.dtype(), DType::f32);
    EXPECT_EQ(bf16.to_vector<double>(), direct.to_vector<double>());
    EXPECT_GT(max_abs_diff(bf16.to_vector<double>(), exact.to_vector<double>()), 0.0);
    // The chain under autocast rounds at other points (its softmax's output, not the op's P): close.
    EXPECT_LT(max_abs_diff(bf16.to_vector<double>(), unfused.to_vector<double>()), 3e-2);
  }
}

TEST(Attention, CausalShorthandsAreTheCausalAttention) {
  Tensor qkv = qkv_leaf({2, 6, 18}, DType::f64, 13).detach();
  EXPECT_EQ(nn::causal_attention(qkv, 3).to_vector<double>(), nn::attention(qkv, 3, true).to_vector<double>());
  EXPECT_EQ(scaled_causal_attention(qkv, 3).to_vector<double>(),
            scaled_dot_product_attention(qkv, 3, true).to_vector<double>());
  EXPECT_EQ(nn::causal_attention_unfused(qkv, 3).to_vector<double>(),
            nn::attention_unfused(qkv, 3, true).to_vector<double>());
}

TEST(Attention, SelfAttentionKeepsTimmsNamesAndTakesAMask) {
  Generator g1(4), g2(4);
  nn::SelfAttention vit(12, 3, false, &g1);
  nn::CausalSelfAttention gpt(12, 3, &g2);
  std::vector<std::string> names, gpt_names;
  for (auto& [name, t] : vit.named_parameters()) names.push_back(name);
  for (auto& [name, t] : gpt.named_parameters()) gpt_names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"qkv.weight", "qkv.bias", "proj.weight", "proj.bias"}));
  EXPECT_EQ(gpt_names, names);
  EXPECT_FALSE(vit.causal());
  EXPECT_TRUE(gpt.causal());
  Generator gx(5);
  Tensor x = randn({2, 5, 12}, {}, &gx);
  Tensor mask = nn::key_padding_mask(padding_of(5, {2, 0}));
  // The same weights (same seed): the module is proj(attention(qkv(x))).
  auto& qkv = dynamic_cast<nn::Linear&>(*vit.named_children().at(0).second);
  auto& proj = dynamic_cast<nn::Linear&>(*vit.named_children().at(1).second);
  Tensor want = proj.forward(nn::attention(qkv.forward(x), 3, false, mask));
  EXPECT_EQ(vit.forward(x, mask).to_vector<double>(), want.to_vector<double>());
  EXPECT_EQ(gpt.forward(x).to_vector<double>(),
            proj.forward(nn::attention(qkv.forward(x), 3, true)).to_vector<double>());
  EXPECT_NE(vit.forward(x).to_vector<double>(), gpt.forward(x).to_vector<double>());
}

TEST(Attention, BadInputsNameTheOpAndTheShapes) {
  Tensor x = zeros({2, 5, 12});
  expect_error([&] { scaled_causal_attention(zeros({2, 5, 10}), 2); }, {"attention", "(2, 5, 10)", "3d"});
  expect_error([&] { scaled_causal_attention(zeros({10, 12}), 2); }, {"attention", "(10, 12)"});
  expect_error([&] { scaled_causal_attention(x, 3); }, {"attention", "heads 3", "divide d 4"});
  expect_error([&] { scaled_causal_attention(x, 2, DType::f64); }, {"attention", "compute dtype f64"});
  expect_error([&] { scaled_causal_attention(zeros({2, 5, 12}, TensorOptions{DType::f64}), 2, DType::bf16); },
               {"attention", "compute dtype bf16"});
  const Attrs a = Attrs().set("heads", int64_t(2)).set("compute", DType::f32);
  std::vector<Tensor> out = dispatch(OpKind::Attention, {x}, a);
  expect_error([&] { dispatch(OpKind::AttentionBackward, {zeros({2, 5, 3}), x, out[0], out[1]}, a); },
               {"attention_backward", "gradient dy", "(2, 5, 3)", "(2, 5, 4)"});
}

TEST(Attention, BadMasksNameTheOpTheMaskAndTheFullShape) {
  Tensor x = zeros({2, 7, 18});  // B 2, T 7, d 6, H 3
  expect_error([&] { scaled_dot_product_attention(x, 3, false, zeros({2, 1, 5, 7})); },
               {"attention: mask (2, 1, 5, 7) f32 does not broadcast to (B, H, T, T) = (2, 3, 7, 7)"});
  expect_error([&] { scaled_dot_product_attention(x, 3, false, zeros({7, 6})); }, {"attention", "(7, 6)", "(2, 3, 7, 7)"});
  expect_error([&] { scaled_dot_product_attention(x, 3, true, zeros({1, 2, 3, 7, 7})); },
               {"attention", "(1, 2, 3, 7, 7)", "(2, 3, 7, 7)"});
  expect_error([&] { scaled_dot_product_attention(x, 3, false, zeros({3, 1, 1, 7})); }, {"attention", "(3, 1, 1, 7)"});
  // A 0/1 padding is not an additive mask: nn::key_padding_mask makes one.
  expect_error([&] { scaled_dot_product_attention(x, 3, false, tensor_i64({0, 1}, {1, 2})); },
               {"attention", "i64", "additive", "key_padding_mask"});
  // The op itself takes the mask in the accumulation dtype only (the API converts other float dtypes).
  const Attrs a = Attrs().set("heads", int64_t(3)).set("compute", DType::f32).set("causal", false);
  expect_error([&] { dispatch(OpKind::Attention, {x, zeros({7, 7}, TensorOptions{DType::f16})}, a); },
               {"attention: mask (7, 7) f16 must be f32"});
  std::vector<Tensor> out = dispatch(OpKind::Attention, {x, zeros({7, 7})}, a);
  expect_error([&] { dispatch(OpKind::AttentionBackward, {zeros({2, 7, 6}), x, out[0], out[1], zeros({2, 7})}, a); },
               {"attention_backward: mask (2, 7) f32 does not broadcast to (B, H, T, T) = (2, 3, 7, 7)"});
  // Masks are constants: one that requires grad is refused rather than left without a gradient.
  Tensor learned = zeros({7, 7});
  learned.set_requires_grad(true);
  expect_error([&] { scaled_dot_product_attention(x, 3, false, learned); },
               {"attention: mask (7, 7) f32 requires grad", "constants"});
  expect_error([&] { nn::key_padding_mask(zeros({2, 7, 1})); }, {"key_padding_mask", "(2, 7, 1)", "(B, T)"});
}
