// CPU kernels of the elementwise ops: each is the shared scalar formula (kernels/elementwise_math.h)
// run through the strided, broadcasting, OpenMP-parallel loops of loops.h. GELU and its backward in
// f32 accumulation (f32, bf16, f16 tensors) run vector_math.h's packets instead, each row staged
// through float buffers, so that their bits are the fused kernel's (fused_elementwise.cpp).
#include <algorithm>
#include <array>
#include <type_traits>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/vector_math.h"
#include "kernels/dispatch.h"
#include "kernels/elementwise_math.h"

namespace reel {
namespace {

double scalar_param(OpKind op, const Attrs& a) {
  if (op == OpKind::PowScalar) return a.f("exponent");
  if (op == OpKind::AddScalar || op == OpKind::MulScalar) return a.f("value");
  return 0.0;
}

constexpr int64_t kStage = 256;  // elements staged per packet call

// out = gelu(a) (kGelu) or out = a * gelu'(b) (the backward), A = float: rows of any stride through
// stack buffers of kStage floats and vector_math.h.
template <typename T, bool kBackward>
void gelu_rows(const Tensor& out, const Tensor& a, const Tensor& b) {
  auto g = make_geometry<3>(out.shape(), {out.strides(), broadcast_strides(a.shape(), a.strides(), out.shape()),
                                          broadcast_strides(b.shape(), b.strides(), out.shape())});
  T* po = out.data<T>();
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  cpu::for_each_row(g, [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& s) {
    if constexpr (std::is_same_v<T, float>) {
      // Contiguous f32 rows go to the packets as they are (the same packet code: the same bits).
      if (s[0] == 1 && s[1] == 1 && (!kBackward || s[2] == 1)) {
        if constexpr (kBackward) cpu::gelu_backward_f32(pa + off[1], pb + off[2], po + off[0], n);
        else cpu::gelu_f32(pa + off[1], po + off[0], n);
        return;
      }
    }
    float in_a[kStage], in_b[kStage], res[kStage];
    for (int64_t c0 = 0; c0 < n; c0 += kStage) {
      const int64_t m = std::min(kStage, n - c0);
      for (int64_t i = 0; i < m; ++i) in_a[i] = load(pa[off[1] + (c0 + i) * s[1]]);
      if constexpr (kBackward) {
        for (int64_t i = 0; i < m; ++i) in_b[i] = load(pb[off[2] + (c0 + i) * s[2]]);
        cpu::gelu_backward_f32(in_a, in_b, res, m);
      } else {
        cpu::gelu_f32(in_a, res, m);
      }
      for (int64_t i = 0; i < m; ++i) po[off[0] + (c0 + i) * s[0]] = store<T>(res[i]);
    }
  });
}

template <OpKind Op>
void unary_kernel(const KernelCall& c) {
  double param = scalar_param(Op, c.attrs);
  visit_dtype(c.in[0].dtype(), [&]<typename T>() {
    using A = AccType<T>;
    if constexpr (Op == OpKind::Gelu && std::is_same_v<A, float>) {
      gelu_rows<T, false>(c.out[0], c.in[0], c.in[0]);
      return;
    }
    A p = A(param);
    cpu::map1<T>(c.out[0], c.in[0], [p](A x) { return math::unary<Op, A>(x, p); });
  });
}

template <OpKind Op>
void binary_kernel(const KernelCall& c) {
  visit_dtype(c.in[0].dtype(), [&]<typename T>() {
    using A = AccType<T>;
    if constexpr (Op == OpKind::GeluBackward && std::is_same_v<A, float>) {
      gelu_rows<T, true>(c.out[0], c.in[0], c.in[1]);
      return;
    }
    cpu::map2<T>(c.out[0], c.in[0], c.in[1], [](A a, A b) { return math::binary<Op, A>(a, b); });
  });
}

void where_kernel(const KernelCall& c) {
  visit_dtype(c.in[1].dtype(), [&]<typename T>() {
    using A = AccType<T>;
    cpu::map3<T>(c.out[0], c.in[0], c.in[1], c.in[2], [](A cond, A a, A b) { return cond != A(0) ? a : b; });
  });
}

void masked_fill_kernel(const KernelCall& c) {
  double value = c.attrs.f("value");
  visit_dtype(c.in[0].dtype(), [&]<typename T>() {
    using A = AccType<T>;
    A v = A(value);
    cpu::map2<T>(c.out[0], c.in[0], c.in[1], [v](A x, A m) { return m != A(0) ? v : x; });
  });
}

}  // namespace

void register_elementwise_cpu_kernels() {
  constexpr DeviceType cpu = DeviceType::CPU;
  register_kernel(cpu, OpKind::Neg, unary_kernel<OpKind::Neg>);
  register_kernel(cpu, OpKind::Exp, unary_kernel<OpKind::Exp>);
  register_kernel(cpu, OpKind::Log, unary_kernel<OpKind::Log>);
  register_kernel(cpu, OpKind::Sqrt, unary_kernel<OpKind::Sqrt>);
  register_kernel(cpu, OpKind::Rsqrt, unary_kernel<OpKind::Rsqrt>);
  register_kernel(cpu, OpKind::Abs, unary_kernel<OpKind::Abs>);
  register_kernel(cpu, OpKind::Tanh, unary_kernel<OpKind::Tanh>);
  register_kernel(cpu, OpKind::Sigmoid, unary_kernel<OpKind::Sigmoid>);
  register_kernel(cpu, OpKind::Relu, unary_kernel<OpKind::Relu>);
  register_kernel(cpu, OpKind::Gelu, unary_kernel<OpKind::Gelu>);
  register_kernel(cpu, OpKind::GeluErf, unary_kernel<OpKind::GeluErf>);
  register_kernel(cpu, OpKind::Silu, unary_kernel<OpKind::Silu>);
  register_kernel(cpu, OpKind::PowScalar, unary_kernel<OpKind::PowScalar>);
  register_kernel(cpu, OpKind::AddScalar, unary_kernel<OpKind::AddScalar>);
  register_kernel(cpu, OpKind::MulScalar, unary_kernel<OpKind::MulScalar>);
  register_kernel(cpu, OpKind::ReluBackward, binary_kernel<OpKind::ReluBackward>);
  register_kernel(cpu, OpKind::GeluBackward, binary_kernel<OpKind::GeluBackward>);
  register_kernel(cpu, OpKind::GeluErfBackward, binary_kernel<OpKind::GeluErfBackward>);
  register_kernel(cpu, OpKind::SiluBackward, binary_kernel<OpKind::SiluBackward>);
  register_kernel(cpu, OpKind::TanhBackward, binary_kernel<OpKind::TanhBackward>);
  register_kernel(cpu, OpKind::SigmoidBackward, binary_kernel<OpKind::SigmoidBackward>);
  register_kernel(cpu, OpKind::Add, binary_kernel<OpKind::Add>);
  register_kernel(cpu, OpKind::Sub, binary_kernel<OpKind::Sub>);
  register_kernel(cpu, OpKind::Mul, binary_kernel<OpKind::Mul>);
  register_kernel(cpu, OpKind::Div, binary_kernel<OpKind::Div>);
  register_kernel(cpu, OpKind::Eq, binary_kernel<OpKind::Eq>);
  register_kernel(cpu, OpKind::Ne, binary_kernel<OpKind::Ne>);
  register_kernel(cpu, OpKind::Lt, binary_kernel<OpKind::Lt>);
  register_kernel(cpu, OpKind::Le, binary_kernel<OpKind::Le>);
  register_kernel(cpu, OpKind::Gt, binary_kernel<OpKind::Gt>);
  register_kernel(cpu, OpKind::Ge, binary_kernel<OpKind::Ge>);
  register_kernel(cpu, OpKind::Where, where_kernel);
  register_kernel(cpu, OpKind::MaskedFill, masked_fill_kernel);
}

}  // namespace reel
