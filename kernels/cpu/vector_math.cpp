// Vectorised f32 formulas (see vector_math.h).
#include "kernels/cpu/vector_math.h"

#include <Eigen/Core>
#include <algorithm>
#include <cstring>

namespace reel::cpu {

namespace {

using Packet = Eigen::Array<float, 8, 1>;

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCoeff = 0.044715f;

// s = 1 / (1 + exp(-2u)) and du/dx for a packet of x.
inline Packet logistic_2u(const Packet& x) {
  const Packet u = kSqrt2OverPi * (x + kCoeff * x * x * x);
  return 1.0f / (1.0f + (-2.0f * u).exp());
}

inline void gelu_packet(const float* x, float* y) {
  const Packet px = Eigen::Map<const Packet>(x);
  Eigen::Map<Packet> out(y);
  out = px * logistic_2u(px);
}

inline void gelu_backward_packet(const float* g, const float* x, float* y) {
  const Packet px = Eigen::Map<const Packet>(x), pg = Eigen::Map<const Packet>(g);
  const Packet s = logistic_2u(px);
  const Packet du = kSqrt2OverPi * (1.0f + (3.0f * kCoeff) * px * px);
  Eigen::Map<Packet> out(y);
  out = pg * (s + 2.0f * px * s * (1.0f - s) * du);
}

}  // namespace

void gelu_f32(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) gelu_packet(x + i, y + i);
  if (i < n) {  // the tail through a padded packet, as every other element
    float in[8] = {}, out[8];
    std::memcpy(in, x + i, size_t(n - i) * sizeof(float));
    gelu_packet(in, out);
    std::memcpy(y + i, out, size_t(n - i) * sizeof(float));
  }
}

void gelu_backward_f32(const float* g, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) gelu_backward_packet(g + i, x + i, y + i);
  if (i < n) {
    float gin[8] = {}, xin[8] = {}, out[8];
    std::memcpy(gin, g + i, size_t(n - i) * sizeof(float));
    std::memcpy(xin, x + i, size_t(n - i) * sizeof(float));
    gelu_backward_packet(gin, xin, out);
    std::memcpy(y + i, out, size_t(n - i) * sizeof(float));
  }
}

}  // namespace reel::cpu
