// Code generation for fused elementwise kernels, without a GPU:
//   - the NVRTC formulas (kernels/jit/nvrtc_math.h, compiled here on the host) equal the shared ones of
//     kernels/elementwise_math.h bit for bit in f32 and f64, and every fusable op has one;
//   - the generated CUDA source: constant index math over merged dims, 32- or 64-bit, 16-bit
//     conversions, exact constants (infinities included);
//   - where the CUDA backend is built: NVRTC compiles a program using every op in every dtype for
//     sm_90 (no device needed), the disk cache serves the second compilation and survives a
//     corrupted file, compile errors carry NVRTC's log, the cache directory follows the environment.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>

#include "kernels/jit/codegen_cuda.h"
#include "kernels/jit/kernel_cache.h"
#include "kernels/jit/nvrtc.h"
#include "kernels/jit/nvrtc_math.h"
#include "kernels/elementwise_math.h"
#include "tensor/cuda.h"
#include "test_util.h"
#include "compile_test_util.h"

using namespace reel;
using reel::testing_util::TempCacheDir;
namespace fm = reel::jit::nvrtc_math;

namespace {

template <typename A>
bool same_bits(A a, A b) {
  return std::memcmp(&a, &b, sizeof(A)) == 0;
}

template <typename A>
void expect_unary_formulas() {
  const std::vector<A> xs = {A(-20), A(-5), A(-2.5), A(-1), A(-0.3), A(-1e-3), A(0), A(1e-4), A(0.2), A(0.7),
                             A(1), A(1.7), A(3), A(8.5), A(20), std::numeric_limits<A>::infinity()};
  auto check = [](const char* op, A x, A got, A want) {
    EXPECT_TRUE(same_bits(got, want)) << op << "(" << x << "): " << got << " vs " << want;
  };
  for (A x : xs) {
    check("neg", x, fm::op_neg(x), math::unary<OpKind::Neg, A>(x, A(0)));
    check("abs", x, fm::op_abs(x), math::unary<OpKind::Abs, A>(x, A(0)));
    check("exp", x, fm::op_exp(x), math::unary<OpKind::Exp, A>(x, A(0)));
    check("log", x, fm::op_log(x), math::unary<OpKind::Log, A>(x, A(0)));
    check("sqrt", x, fm::op_sqrt(x), math::unary<OpKind::Sqrt, A>(x, A(0)));
    check("rsqrt", x, fm::op_rsqrt(x), math::unary<OpKind::Rsqrt, A>(x, A(0)));
    check("tanh", x, fm::op_tanh(x), math::unary<OpKind::Tanh, A>(x, A(0)));
    check("sigmoid", x, fm::op_sigmoid(x), math::unary<OpKind::Sigmoid, A>(x, A(0)));
    check("relu", x, fm::op_relu(x), math::unary<OpKind::Relu, A>(x, A(0)));
    check("gelu", x, fm::op_gelu(x), math::unary<OpKind::Gelu, A>(x, A(0)));
    check("gelu_erf", x, fm::op_gelu_erf(x), math::unary<OpKind::GeluErf, A>(x, A(0)));
    check("silu", x, fm::op_silu(x), math::unary<OpKind::Silu, A>(x, A(0)));
    for (A p : {A(1.5), A(2), A(-0.5), A(0.3)}) {
      check("pow_scalar", x, fm::op_pow_scalar(x, p), math::unary<OpKind::PowScalar, A>(x, p));
      check("add_scalar", x, fm::op_add_scalar(x, p), math::unary<OpKind::AddScalar, A>(x, p));
      check("mul_scalar", x, fm::op_mul_scalar(x, p), math::unary<OpKind::MulScalar, A>(x, p));
    }
  }
}

template <typename A>
void expect_binary_formulas() {
  const std::vector<A> xs = {A(-7), A(-1.25), A(-0.1), A(0), A(0.3), A(1), A(2.5), A(9)};
  auto check = [](const char* op, A a, A b, A got, A want) {
    EXPECT_TRUE(same_bits(got, want)) << op << "(" << a << ", " << b << "): " << got << " vs " << want;
  };
  for (A a : xs)
    for (A b : xs) {
      check("add", a, b, fm::op_add(a, b), math::binary<OpKind::Add, A>(a, b));
      check("sub", a, b, fm::op_sub(a, b), math::binary<OpKind::Sub, A>(a, b));
      check("mul", a, b, fm::op_mul(a, b), math::binary<OpKind::Mul, A>(a, b));
      check("div", a, b, fm::op_div(a, b), math::binary<OpKind::Div, A>(a, b));
      check("eq", a, b, fm::op_eq(a, b), math::binary<OpKind::Eq, A>(a, b));
      check("ne", a, b, fm::op_ne(a, b), math::binary<OpKind::Ne, A>(a, b));
      check("lt", a, b, fm::op_lt(a, b), math::binary<OpKind::Lt, A>(a, b));
      check("le", a, b, fm::op_le(a, b), math::binary<OpKind::Le, A>(a, b));
      check("gt", a, b, fm::op_gt(a, b), math::binary<OpKind::Gt, A>(a, b));
      check("ge", a, b, fm::op_ge(a, b), math::binary<OpKind::Ge, A>(a, b));
      check("relu_backward", a, b, fm::op_relu_backward(a, b), math::binary<OpKind::ReluBackward, A>(a, b));
      check("tanh_backward", a, b, fm::op_tanh_backward(a, b), math::binary<OpKind::TanhBackward, A>(a, b));
      check("sigmoid_backward", a, b, fm::op_sigmoid_backward(a, b), math::binary<OpKind::SigmoidBackward, A>(a, b));
      check("gelu_backward", a, b, fm::op_gelu_backward(a, b), math::binary<OpKind::GeluBackward, A>(a, b));
      check("gelu_erf_backward", a, b, fm::op_gelu_erf_backward(a, b), math::binary<OpKind::GeluErfBackward, A>(a, b));
      check("silu_backward", a, b, fm::op_silu_backward(a, b), math::binary<OpKind::SiluBackward, A>(a, b));
      // The kernels' own expressions (kernels/cpu/elementwise.cpp, optim.cpp).
      check("where", a, b, fm::op_where(a, b, A(4)), a != A(0) ? b : A(4));
      check("masked_fill", a, b, fm::op_masked_fill(a, b, A(-3)), b != A(0) ? A(-3) : a);
      check("clamp_scalar", a, b, fm::op_clamp_scalar(a, b, A(2)), a < b ? b : (a > A(2) ? A(2) : a));
    }
}

TEST(NvrtcMath, FormulasEqualTheSharedOnesBitForBit) {
  expect_unary_formulas<float>();
  expect_unary_formulas<double>();
  expect_binary_formulas<float>();
  expect_binary_formulas<double>();
}

// The device's Philox and dropout rule, compiled here, against tensor/rng.h and dropout's kernel rule:
// every word at keys and counters across their 64-bit range, and the mask for p = 0, 0.1, 0.5, 1.
TEST(NvrtcMath, PhiloxAndTheDropoutMaskEqualTheSharedOnesBitForBit) {
  namespace fm = jit::nvrtc_math;
  const uint64_t keys[] = {0, 1, 1234, 0xFFFFFFFFull, 0x123456789ABCDEFull, ~0ull};
  const uint64_t counters[] = {0, 3, 0xFFFFFFFFull, 0x100000000ull, (1ull << 35) + 7, ~0ull - 5};
  for (uint64_t key : keys)
    for (uint64_t counter : counters) {
      const Philox4 want = philox4x32_10(key, counter);
      const fm::philox_words got = fm::philox4x32_10_words(key, counter);
      EXPECT_EQ(got.w0, want.w[0]);
      EXPECT_EQ(got.w1, want.w[1]);
      EXPECT_EQ(got.w2, want.w[2]);
      EXPECT_EQ(got.w3, want.w[3]);
      for (unsigned k = 0; k < 4; ++k) EXPECT_EQ(fm::philox_word(got, k), want.w[k]);
    }
  for (double p : {0.0, 0.1, 0.5, 1.0})
    for (uint64_t i = 0; i < 4096; ++i) {
      const bool kept = philox_uniform(77, 1000, i) >= float(p);
      EXPECT_EQ(fm::op_dropout_mask(77ull, 1000ull, i, float(p), 1.25f), kept ? 1.25f : 0.0f) << "p " << p << " i " << i;
      EXPECT_EQ(fm::op_dropout_mask(77ull, 1000ull, i, float(p), 2.0), kept ? 2.0 : 0.0);
    }
}

TEST(NvrtcMath, EveryFusableOpHasADeviceFormula) {
  const std::string text = jit::kNvrtcMathSource;
  int n = 0;
  for (int k = 0; k < kNumOps; ++k) {
    const OpKind op = static_cast<OpKind>(k);
    if (!is_fusable_op(op)) continue;
    ++n;
    EXPECT_NE(text.find(std::string("op_") + op_name(op) + "("), std::string::npos) << op_name(op);
  }
  EXPECT_EQ(n, 34);  // kernels/ops.def's elementwise family (33 ops) and clamp_scalar
  EXPECT_EQ(text.find('#'), std::string::npos) << "the stringized text must hold no preprocessor line";
}

// ---- generated source -----------------------------------------------------------------------

// A program with every op `dt` allows, a broadcast and a transposed input, and casts to every dtype.
FusedExpr every_op_expr(DType dt) {
  FusedExpr e;
  const int x = e.load(0, dt), y = e.load(1, dt);
  int acc = e.op(OpKind::Add, {x, y}, dt);
  const bool floating = dt != DType::i64;
  for (OpKind op : {OpKind::Neg, OpKind::Abs, OpKind::AddScalar, OpKind::MulScalar}) acc = e.op(op, {acc}, dt, 0.5);
  if (floating)
    for (OpKind op : {OpKind::Exp, OpKind::Log, OpKind::Sqrt, OpKind::Rsqrt, OpKind::Tanh, OpKind::Sigmoid, OpKind::Relu,
                      OpKind::Gelu, OpKind::GeluErf, OpKind::Silu, OpKind::PowScalar})
      acc = e.op(op, {acc}, dt, 1.5);
  for (OpKind op : {OpKind::Sub, OpKind::Mul, OpKind::Eq, OpKind::Ne, OpKind::Lt, OpKind::Le, OpKind::Gt, OpKind::Ge})
    acc = e.op(op, {acc, y}, dt);
  if (floating)
    for (OpKind op : {OpKind::Div, OpKind::ReluBackward, OpKind::GeluBackward, OpKind::GeluErfBackward,
                      OpKind::SiluBackward, OpKind::TanhBackward, OpKind::SigmoidBackward})
      acc = e.op(op, {acc, x}, dt);
  acc = e.op(OpKind::Where, {x, acc, y}, dt);
  acc = e.op(OpKind::MaskedFill, {acc, y}, dt, -2.0);
  if (floating) acc = e.op(OpKind::ClampScalar, {acc}, dt, -1.0, std::numeric_limits<double>::infinity());
  e.store(0, acc, dt);
  int k = 1;
  for (DType to : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64}) e.store(k++, e.cast(acc, to), to);
  return e;
}

// (6, 5, 4): input 0 read transposed from a (4, 5, 6) buffer, input 1 a (5, 4) broadcast.
FusedLoop test_loop() { return make_fused_loop({6, 5, 4}, {{1, 6, 30}, {0, 4, 1}}); }

TEST(CudaCodegen, BroadcastBiasAndGeluCompileToConstantIndexMath) {
  FusedExpr e;
  const int x = e.load(0, DType::f32), b = e.load(1, DType::f32);
  e.store(0, e.op(OpKind::Gelu, {e.op(OpKind::Add, {x, b}, DType::f32)}, DType::f32), DType::f32);
  FusedLoop loop = make_fused_loop({2, 128, 1024}, {{131072, 1024, 1}, {0, 0, 1}});
  EXPECT_EQ(loop.sizes, std::vector<int64_t>({256, 1024}));
  const std::string src = jit::cuda_fused_source(e, loop, "add gelu");
  for (const char* part : {"extern \"C\" __global__ void __launch_bounds__(256) fused_elementwise_kernel(const float* in0, "
                           "const float* in1, float* out0)",
                           "typedef unsigned int index_t;", "const index_t n = 262144u;",
                           "const index_t i1 = rest % 1024u; rest /= 1024u;", "const float r0 = in0[e];",
                           "const float r1 = in1[i1];", "const float r2 = op_add(r0, r1);", "const float r3 = op_gelu(r2);",
                           "out0[e] = r3;", "// reel fused elementwise kernel: add gelu",
                           // mul, add and sub round on their own: no FMA across two ops of the chain
                           "float math_mul(float a, float b) { return __fmul_rn(a, b); }",
                           "float math_add(float a, float b) { return __fadd_rn(a, b); }",
                           "double math_sub(double a, double b) { return __dsub_rn(a, b); }"})
    EXPECT_NE(src.find(part), std::string::npos) << part << "\n" << src;
  EXPECT_NE(src.find(jit::kNvrtcMathSource), std::string::npos);
}

TEST(CudaCodegen, StridesSixteenBitTypesAndConstants) {
  const std::string src = jit::cuda_fused_source(every_op_expr(DType::f16), test_loop(), "every op");
  for (const char* part : {"const unsigned short* in0", "unsigned short* out0", "reel_load_f16(in0[i0 + i1 * 6u + i2 * 30u])",
                           "reel_load_f16(in1[i1 * 4u + i2])", "out0[e] = reel_store_f16(",
                           "__longlong_as_double(0x7ff0000000000000LL)", "reel_load_bf16(reel_store_bf16((float)(double)r"})
    EXPECT_NE(src.find(part), std::string::npos) << part << "\n" << src;
  EXPECT_TRUE(jit::fused_loop_fits_32bit(test_loop()));
  FusedLoop huge = make_fused_loop({int64_t(1) << 16, int64_t(1) << 16}, {{0, 1}});
  EXPECT_FALSE(jit::fused_loop_fits_32bit(huge));
  FusedExpr e;
  e.store(0, e.op(OpKind::Neg, {e.load(0, DType::f32)}, DType::f32), DType::f32);
  const std::string big = jit::cuda_fused_source(e, huge, "neg");
  EXPECT_NE(big.find("typedef long long index_t;"), std::string::npos) << big;
  EXPECT_NE(big.find("const index_t n = 4294967296LL;"), std::string::npos) << big;
}

TEST(CudaCodegen, ContiguousLoopsGetTheSixteenByteVectorLoop) {
  // x (bf16) * y (f32) -> bf16 and f32 outputs over 1000 contiguous elements: the vector loop (8
  // elements a thread, packs in and out) before the scalar loop, which starts where it stopped.
  FusedExpr e;
  const int x = e.load(0, DType::bf16), y = e.load(1, DType::f32);
  const int xy = e.op(OpKind::Mul, {e.cast(x, DType::f32), y}, DType::f32);
  e.store(0, e.cast(xy, DType::bf16), DType::bf16);
  e.store(1, xy, DType::f32);
  const FusedLoop flat = make_fused_loop({10, 100}, {{100, 1}, {100, 1}});
  EXPECT_EQ(jit::fused_vector_width(flat), jit::kFusedVectorWidth);
  const std::string src = jit::cuda_fused_source(e, flat, "mul");
  for (const char* part : {"struct alignas(16) reel_pack_u16 { unsigned short v[8]; };",
                           "| (unsigned long long)in0 | (unsigned long long)in1 | (unsigned long long)out0 | (unsigned long long)out1;",
                           "if ((addresses & 15ull) == 0) {", "const index_t packs = n / 8u;",
                           "const reel_pack_u16 l0 = *reinterpret_cast<const reel_pack_u16*>(in0 + p * 8u);",
                           "const reel_pack_f32 l1 = *reinterpret_cast<const reel_pack_f32*>(in1 + p * 8u);",
                           "= reel_load_bf16(l0.v[j]);", "s0.v[j] = reel_store_bf16(", "s1.v[j] = r",
                           "*reinterpret_cast<reel_pack_u16*>(out0 + p * 8u) = s0;", "first = packs * 8u;",
                           "for (index_t e = first + index_t(blockIdx.x) * 256u + threadIdx.x; e < n;",
                           "= reel_load_bf16(in0[e]);", "out0[e] = reel_store_bf16("})
    EXPECT_NE(src.find(part), std::string::npos) << part << "\n" << src;
  // A broadcast operand, a transposed one, or fewer elements than a pack: the scalar loop alone.
  for (const FusedLoop& l : {make_fused_loop({10, 100}, {{100, 1}, {0, 1}}),
                             make_fused_loop({10, 100}, {{100, 1}, {1, 10}}),
                             make_fused_loop({7}, {{1}, {1}})}) {
    EXPECT_EQ(jit::fused_vector_width(l), 1);
    const std::string scalar = jit::cuda_fused_source(e, l, "mul");
    EXPECT_EQ(scalar.find("addresses"), std::string::npos) << scalar;
    EXPECT_NE(scalar.find("index_t first = 0;"), std::string::npos) << scalar;
  }
}

TEST(CudaCodegen, ManyInputsTakeTheScalarLoopWithEveryLoadFirst) {
  // 12 in-place adds side by side (a horizontal group of gradient accumulations: out k = in 2k +
  // in 2k+1, 24 inputs) over 512 contiguous elements: past kFusedVectorMaxInputs the vector loop
  // would hold 24 packs per thread, so the scalar loop alone runs, and it reads every input before
  // its first instruction and store.
  FusedExpr e;
  const int adds = 12;
  std::vector<int> loads;
  for (int k = 0; k < 2 * adds; ++k) loads.push_back(e.load(k, DType::f32));
  for (int k = 0; k < adds; ++k) e.store(k, e.op(OpKind::Add, {loads[2 * k], loads[2 * k + 1]}, DType::f32), DType::f32);
  const FusedLoop wide = make_fused_loop({512}, std::vector<std::vector<int64_t>>(2 * adds, {1}));
  EXPECT_EQ(jit::fused_vector_width(wide), 1);
  const std::string src = jit::cuda_fused_source(e, wide, "add x12");
  EXPECT_EQ(src.find("addresses"), std::string::npos) << src;
  const size_t body = src.find(std::string("void __launch_bounds__(256) ") + jit::kFusedKernelName);
  ASSERT_NE(body, std::string::npos) << src;
  const size_t last_load = src.rfind("= in"), first_op = src.find("= op_", body), first_store = src.find("out0[e] =", body);
  ASSERT_NE(last_load, std::string::npos) << src;
  ASSERT_NE(first_store, std::string::npos) << src;
  EXPECT_LT(last_load, first_op) << src;
  EXPECT_LT(last_load, first_store) << src;
  // At the limit the vector loop stays.
  const FusedLoop eight = make_fused_loop({512}, std::vector<std::vector<int64_t>>(jit::kFusedVectorMaxInputs, {1}));
  EXPECT_EQ(jit::fused_vector_width(eight), jit::kFusedVectorWidth);
}

TEST(CudaCodegen, TheKernelWaitsForTheKernelBeforeItBeforeItsFirstLoad) {
  // It is launched with programmatic dependent launch (kernels/cuda/launch.cuh): griddepcontrol.wait
  // is its first instruction, before any load or store, in both loops.
  FusedExpr e;
  e.store(0, e.op(OpKind::Mul, {e.load(0, DType::bf16), e.load(1, DType::bf16)}, DType::f32), DType::bf16);
  for (const FusedLoop& loop :
       {make_fused_loop({4096}, {{1}, {1}, {1}}), make_fused_loop({6, 5, 4}, {{1, 6, 30}, {0, 4, 1}, {1, 6, 30}})}) {
    const std::string src = jit::cuda_fused_source(e, loop, "mul");
    const size_t body = src.find(std::string("void __launch_bounds__(256) ") + jit::kFusedKernelName);
    const size_t wait = src.find("griddepcontrol.wait;", body), first_load = src.find("in0[", body);
    ASSERT_NE(body, std::string::npos) << src;
    ASSERT_NE(wait, std::string::npos) << src;
    ASSERT_NE(first_load, std::string::npos) << src;
    EXPECT_LT(wait, first_load) << src;
    EXPECT_LT(wait, src.find("out0[", body)) << src;
  }
}

// ---- NVRTC and the disk cache (CUDA backend built; no device needed) ------------------------------

#define REEL_REQUIRE_CUDA_BUILD() \
  if (!cuda::is_built()) GTEST_SKIP() << "reel was built without the CUDA backend (no NVRTC)"

TEST(Nvrtc, ProgramsWithEveryOpCompileForSm90InEveryDtype) {
  REEL_REQUIRE_CUDA_BUILD();
  TempCacheDir cache;
  // The strided test loop (scalar) and a contiguous one (the vector loop too).
  const FusedLoop flat = make_fused_loop({6, 5, 4}, {{20, 4, 1}, {20, 4, 1}});
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64}) {
    for (const FusedLoop& loop : {test_loop(), flat}) {
      const std::string src = jit::cuda_fused_source(every_op_expr(dt), loop, "every op");
      std::string code;
      EXPECT_NO_THROW(code = jit::nvrtc_compile_cached(src, "sm_90", "every op")) << dtype_name(dt);
      EXPECT_GT(code.size(), 1000u) << dtype_name(dt);
    }
  }
  FusedExpr e;
  e.store(0, e.op(OpKind::Neg, {e.load(0, DType::f32)}, DType::f32), DType::f32);
  FusedLoop huge = make_fused_loop({int64_t(1) << 16, int64_t(1) << 16}, {{1, int64_t(1) << 16}});
  EXPECT_NO_THROW(jit::nvrtc_compile_cached(jit::cuda_fused_source(e, huge, "neg"), "sm_90", "neg"));
  // PTX for a virtual architecture (what an unknown, newer GPU gets): text the driver can load.
  const std::string ptx = jit::nvrtc_compile_cached(jit::cuda_fused_source(e, test_loop(), "neg"), "compute_90", "neg");
  EXPECT_NE(ptx.find(".entry fused_elementwise_kernel"), std::string::npos);
}

// Dropout masks drawn in the kernel (random instructions): the state's two values read once, the
// vector loop drawing each Philox block of its pack once, the scalar loop per element; both compile.
TEST(Nvrtc, DropoutMasksDrawnInTheKernelCompileInBothLoops) {
  FusedExpr e;
  const int x = e.load(0, DType::bf16);
  const int m = e.random(0, DType::bf16, 0.1, 0, 3);
  e.store(0, e.op(OpKind::Mul, {x, m}, DType::bf16), DType::bf16);
  e.store(1, e.random(-1, DType::f32, 0.5, 77, 9), DType::f32);
  EXPECT_EQ(e.states, 1);
  const FusedLoop flat = make_fused_loop({16, 64}, {{64, 1}});
  const std::string src = jit::cuda_fused_source(e, flat, "dropout_mask mul dropout_mask");
  for (const char* part : {"const unsigned short* in0, const unsigned long long* st0, unsigned short* out0, float* out1)",
                           "const unsigned long long key0 = st0[0], base0 = st0[1];",
                           "= philox4x32_10_words(key0, (base0 + 3ull) + (unsigned long long)p * 2ull + 0ull);",
                           "= philox4x32_10_words(key0, (base0 + 3ull) + (unsigned long long)p * 2ull + 1ull);",
                           "= philox4x32_10_words(77ull, 9ull + (unsigned long long)p * 2ull + 1ull);",
                           "dropout_mask_of(philox_word((j < 4 ? ph", "op_dropout_mask(key0, (base0 + 3ull), (unsigned long long)e,",
                           "op_dropout_mask(77ull, 9ull, (unsigned long long)e,"})
    EXPECT_NE(src.find(part), std::string::npos) << part << "\n" << src;
  if (!cuda::is_built()) GTEST_SKIP() << "reel was built without the CUDA backend (no NVRTC)";
  TempCacheDir cache;
  EXPECT_NO_THROW(jit::nvrtc_compile_cached(src, "sm_90", "dropout"));
  const FusedLoop strided = make_fused_loop({16, 64}, {{1, 16}});
  EXPECT_NO_THROW(jit::nvrtc_compile_cached(jit::cuda_fused_source(e, strided, "dropout"), "sm_90", "dropout"));
}

// Column sums in the kernel (a bias gradient summed where the gradient is written): the grid walks
// (column tile, row chunk) blocks, each lane a pack of 8 columns, the summed output's stored 16-bit
// values added per column, then the block's, chunks' and tile's sums in order; the kernel compiles
// with a dropout mask in the program too. Loops it cannot take: strided, broadcast, rows not a
// multiple of 8 columns.
TEST(CudaCodegen, ColumnSumsWalkColumnTilesAndRowChunks) {
  FusedExpr e;
  const int g = e.cast(e.load(0, DType::bf16), DType::f32), z = e.cast(e.load(1, DType::bf16), DType::f32);
  const int m = e.random(0, DType::f32, 0.1, 0, 3);
  e.store(0, e.cast(e.op(OpKind::Mul, {e.op(OpKind::GeluBackward, {g, z}, DType::f32), m}, DType::f32), DType::bf16),
          DType::bf16);
  const FusedLoop rows = make_fused_loop({4, 128, 1024}, {{131072, 1024, 1}, {131072, 1024, 1}});
  EXPECT_TRUE(jit::fused_column_sums_fit(rows));
  const std::string src = jit::cuda_fused_source(e, rows, "copy x2 gelu_backward mul copy", {0, true});
  for (const char* part :
       {"__device__ unsigned reel_column_counters[4096];",
        "unsigned short* out0, float* sums, float* partial, long long chunk)",
        "const index_t rows = 512u, cols = 1024u;", "const index_t c0 = index_t(blockIdx.x) * 256u + lane * 8u;",
        "for (index_t r = lo + row_in_step; r < hi; r += 8u) {", "const index_t p = (r * cols + c0) / 8u;",
        "for (int j = 0; j < 8; ++j) acc[j] += reel_load_bf16(s0.v[j]);", "acc[j] += reel_load_bf16(out0[e]);",
        "part[row_in_step][lane * 8 + j] = acc[j];",
        "atomicAdd(&reel_column_counters[blockIdx.x], 1u) + 1u == gridDim.y",
        "v += __ldcg(partial + index_t(s) * cols + col);", "sums[col] = sums[col] + v;"})
    EXPECT_NE(src.find(part), std::string::npos) << part << "\n" << src;
  EXPECT_NE(jit::cuda_fused_source(e, rows, "x", {0, false}).find("sums[col] = v;"), std::string::npos);
  for (const FusedLoop& l :
       {make_fused_loop({16, 100}, {{100, 1}, {100, 1}}), make_fused_loop({16, 64}, {{1, 16}, {64, 1}}),
        make_fused_loop({16, 64}, {{0, 1}, {64, 1}})})
    EXPECT_FALSE(jit::fused_column_sums_fit(l)) << shape_str(l.sizes);
  if (!cuda::is_built()) GTEST_SKIP() << "reel was built without the CUDA backend (no NVRTC)";
  TempCacheDir cache;
  EXPECT_NO_THROW(jit::nvrtc_compile_cached(src, "sm_90", "column sums"));
  // Every dtype the column_sums op sums (f32, f16, bf16), in 32- and 64-bit index math.
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    for (int64_t rows : {int64_t(512), int64_t(1) << 22}) {
      FusedExpr y;
      y.store(0, y.op(OpKind::Neg, {y.load(0, t)}, t), t);
      const std::string s = jit::cuda_fused_source(y, make_fused_loop({rows, 1024}, {{1024, 1}}), "neg", {0, false});
      EXPECT_NO_THROW(jit::nvrtc_compile_cached(s, "sm_90", "neg with column sums")) << dtype_name(t) << " " << rows;
    }
}

// y = x * m + u * n in f32 (dropout's multiply and a product of draws, added): eager rounds each
// product in its own kernel before the add, so the fused kernel must too. Its PTX multiplies and adds
// with mul.rn / add.rn, which neither NVVM nor ptxas may contract into an fma (a plain mul.f32 +
// add.f32 pair may become one, and did: on the H200 such a chain differed from eager in the last bit).
TEST(Nvrtc, AChainOfMultipliesAndAddsIsNotContractedIntoFmas) {
  if (!cuda::is_built()) GTEST_SKIP() << "reel was built without the CUDA backend (no NVRTC)";
  TempCacheDir cache;
  FusedExpr e;
  const int x = e.load(0, DType::f32), u = e.load(1, DType::f32), n = e.load(2, DType::f32);
  const int m = e.random(0, DType::f32, 0.3, 0, 0);
  const int y = e.op(OpKind::Add, {e.op(OpKind::Mul, {x, m}, DType::f32), e.op(OpKind::Mul, {u, n}, DType::f32)}, DType::f32);
  e.store(0, e.op(OpKind::Sub, {e.op(OpKind::MulScalar, {y}, DType::f32, 3.0), u}, DType::f32), DType::f32);
  const std::string ptx =
      jit::nvrtc_compile_cached(jit::cuda_fused_source(e, make_fused_loop({96}, {{1}, {1}, {1}}), "mul add"), "compute_90", "mul add");
  EXPECT_NE(ptx.find("mul.rn.f32"), std::string::npos) << ptx;
  EXPECT_NE(ptx.find("add.rn.f32"), std::string::npos) << ptx;
  EXPECT_NE(ptx.find("sub.rn.f32"), std::string::npos) << ptx;
  EXPECT_EQ(ptx.find("fma.rn.f32"), std::string::npos) << ptx;
  // (A plain mul.f32 remains: the mask's uniform, (w >> 8) * 2^-24, exact and compared, never added.)
  for (const char* contractable : {"add.f32", "sub.f32"})
    EXPECT_EQ(ptx.find(contractable), std::string::npos) << contractable << "\n" << ptx;
}

TEST(Nvrtc, TheDiskCacheServesTheSecondCompilation) {
  REEL_REQUIRE_CUDA_BUILD();
  TempCacheDir cache;
  EXPECT_EQ(jit::kernel_cache_dir(), cache.dir());
  const std::string src = jit::cuda_fused_source(every_op_expr(DType::f32), test_loop(), "every op");
  const jit::KernelCacheStats s0 = jit::kernel_cache_stats();
  const std::string first = jit::nvrtc_compile_cached(src, "sm_90", "every op");
  const jit::KernelCacheStats s1 = jit::kernel_cache_stats();
  EXPECT_EQ(s1.compilations, s0.compilations + 1);
  EXPECT_EQ(s1.disk_hits, s0.disk_hits);
  EXPECT_EQ(jit::nvrtc_compile_cached(src, "sm_90", "every op"), first);
  const jit::KernelCacheStats s2 = jit::kernel_cache_stats();
  EXPECT_EQ(s2.compilations, s1.compilations) << "the second compilation should be a disk hit";
  EXPECT_EQ(s2.disk_hits, s1.disk_hits + 1);
  // Another architecture is another kernel.
  jit::nvrtc_compile_cached(src, "sm_80", "every op");
  EXPECT_EQ(jit::kernel_cache_stats().compilations, s2.compilations + 1);
  // A damaged entry is a miss (and is replaced), never the wrong code.
  std::vector<std::filesystem::path> files;
  for (const auto& f : std::filesystem::directory_iterator(cache.dir())) files.push_back(f.path());
  ASSERT_EQ(files.size(), 2u);
  for (const auto& f : files) std::filesystem::resize_file(f, std::filesystem::file_size(f) - 7);
  EXPECT_EQ(jit::nvrtc_compile_cached(src, "sm_90", "every op"), first);
  EXPECT_EQ(jit::kernel_cache_stats().compilations, s2.compilations + 2);
  EXPECT_EQ(jit::clear_kernel_cache(), 2u);
  EXPECT_TRUE(std::filesystem::is_empty(cache.dir()));
}

TEST(Nvrtc, CompileErrorsCarryTheLog) {
  REEL_REQUIRE_CUDA_BUILD();
  TempCacheDir cache;
  testing_util::expect_error(
      [] { jit::nvrtc_compile_cached("extern \"C\" __global__ void k() { undeclared_name(); }", "sm_90", "broken"); },
      {"fused_elementwise: NVRTC could not compile the kernel (broken) for sm_90", "undeclared_name", "nvrtc.cpp:"});
  EXPECT_TRUE(std::filesystem::is_empty(cache.dir())) << "a failed compilation must not be cached";
}

TEST(KernelCache, DirectoryFollowsTheEnvironment) {
  auto saved = [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
  const auto reel = saved("REEL_CACHE_DIR"), xdg = saved("XDG_CACHE_HOME"), home = saved("HOME");
  setenv("REEL_CACHE_DIR", "/r/k", 1);
  setenv("XDG_CACHE_HOME", "/x", 1);
  setenv("HOME", "/h", 1);
  EXPECT_EQ(jit::kernel_cache_dir(), "/r/k");
  unsetenv("REEL_CACHE_DIR");
  EXPECT_EQ(jit::kernel_cache_dir(), "/x/reel/kernels");
  unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(jit::kernel_cache_dir(), "/h/.cache/reel/kernels");
  auto restore = [](const char* name, const std::optional<std::string>& v) {
    if (v) setenv(name, v->c_str(), 1);
    else unsetenv(name);
  };
  restore("REEL_CACHE_DIR", reel);
  restore("XDG_CACHE_HOME", xdg);
  restore("HOME", home);
}

}  // namespace
