// The packet formulas of kernels/cpu/vector_math.h (GELU, its backward, softmax's shifted exp), written
// once for a packet of W floats, and the loops that run them over an array (the tail through a padded
// packet, as every other element).
// Included by two files, each compiled for its own instruction set, both with W = 16: vector_math.cpp
// (x86-64-v3: each Eigen op on two 256-bit registers, independent, so one's latency hides behind the
// other's; per lane the same operations as 8-wide packets, so the same bits) and vector_math_avx512.cpp
// (AVX-512: one 512-bit register, about 3x the AVX2 rate; its own exp code, so bits may differ from
// the AVX2 build's in the last place). Everything here is in an unnamed namespace on purpose: each file
// gets its own copy compiled for its own ISA, and no instantiation is shared with (or chosen by the
// linker over) the other's. Eigen's own templates have no such namespace: the AVX-512 file flattens its
// entry points so none is left out of line there, and the Makefile checks its object for weak symbols.
#pragma once
#include <Eigen/Core>
#include <cstdint>
#include <cstring>
#include <limits>

namespace reel::cpu {
namespace {

template <int W>
struct VectorPackets {
  using Packet = Eigen::Array<float, W, 1>;
  static constexpr float kSqrt2OverPi = 0.7978845608028654f;
  static constexpr float kCoeff = 0.044715f;

  // s = 1 / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3).
  static Packet logistic_2u(const Packet& x) {
    const Packet u = kSqrt2OverPi * (x + kCoeff * x * x * x);
    return 1.0f / (1.0f + (-2.0f * u).exp());
  }
  static void gelu(const float* x, float* y) {
    const Packet px = Eigen::Map<const Packet>(x);
    Eigen::Map<Packet> out(y);
    out = px * logistic_2u(px);
  }
  static void gelu_backward(const float* g, const float* x, float* y) {
    const Packet px = Eigen::Map<const Packet>(x), pg = Eigen::Map<const Packet>(g);
    const Packet s = logistic_2u(px);
    const Packet du = kSqrt2OverPi * (1.0f + (3.0f * kCoeff) * px * px);
    Eigen::Map<Packet> out(y);
    out = pg * (s + 2.0f * px * s * (1.0f - s) * du);
  }

  // y = exp(x - m) for a packet, 0 where x - m is below log(FLT_MIN) (a masked -inf included: Eigen's
  // exp clamps its argument and would give about 1e-38 there); the packet's values added into acc.
  static void exp_shifted(const float* x, float m, float* y, Packet& acc) {
    const Packet d = Eigen::Map<const Packet>(x) - m;
    Packet e = d.exp();  // evaluated on its own: inside select() Eigen would call the scalar exp per value
    e = (d < kLowestExpArg).select(Packet::Zero(), e);
    Eigen::Map<Packet> out(y);
    out = e;
    acc += e;
  }
  static constexpr float kLowestExpArg = -87.33654475f;  // log(FLT_MIN)

  // y = exp(x - m) over n values (as exp_shifted); returns their sum, added lane by lane and then
  // across the lanes: a fixed order for a given n.
  static float exp_shifted_array(const float* x, float m, float* y, int64_t n) {
    Packet acc = Packet::Zero();
    int64_t i = 0;
    for (; i + W <= n; i += W) exp_shifted(x + i, m, y + i, acc);
    if (i < n) {  // the tail padded with -inf, whose exp adds 0
      float in[W], out[W];
      for (int j = 0; j < W; ++j) in[j] = -std::numeric_limits<float>::infinity();
      std::memcpy(in, x + i, size_t(n - i) * sizeof(float));
      exp_shifted(in, m, out, acc);
      std::memcpy(y + i, out, size_t(n - i) * sizeof(float));
    }
    return acc.sum();
  }

  static void gelu_array(const float* x, float* y, int64_t n) {
    int64_t i = 0;
    for (; i + W <= n; i += W) gelu(x + i, y + i);
    if (i < n) {
      float in[W] = {}, out[W];
      std::memcpy(in, x + i, size_t(n - i) * sizeof(float));
      gelu(in, out);
      std::memcpy(y + i, out, size_t(n - i) * sizeof(float));
    }
  }
  static void gelu_backward_array(const float* g, const float* x, float* y, int64_t n) {
    int64_t i = 0;
    for (; i + W <= n; i += W) gelu_backward(g + i, x + i, y + i);
    if (i < n) {
      float gin[W] = {}, xin[W] = {}, out[W];
      std::memcpy(gin, g + i, size_t(n - i) * sizeof(float));
      std::memcpy(xin, x + i, size_t(n - i) * sizeof(float));
      gelu_backward(gin, xin, out);
      std::memcpy(y + i, out, size_t(n - i) * sizeof(float));
    }
  }
};

}  // namespace
}  // namespace reel::cpu
