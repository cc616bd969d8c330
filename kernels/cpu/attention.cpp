// CPU kernels of fused scaled-dot-product self-attention: the reference the CUDA kernels are checked
// against.
//
// qkv (B, T, 3d) holds q, k, v side by side; head h of each uses columns [h hd, (h+1) hd), hd = d / H.
// For one (batch, head), with scale = 1 / sqrt(hd), M the optional additive mask (broadcast to
// (B, H, T, T); kernels/attention_mask.h) and the visible keys s <= t (causal) or all s < T (not):
//   forward    S_ts = scale q_t . k_s + M_ts    lse_t = log sum_s exp(S_ts)    P_ts = exp(S_ts - lse_t)
//              y_t  = sum_s P_ts v_s                                          (y (B, T, d), heads merged)
//   backward   D_t  = dy_t . y_t            dP_ts = dy_t . v_s                dS_ts = P_ts (dP_ts - D_t)
//              dq_t = scale sum_s dS_ts k_s     dk_s = scale sum_t dS_ts q_t     dv_s = sum_t P_ts dy_t
// A row whose visible keys the mask all removes (every S_ts = -inf) has no softmax: it gets y_t = 0
// and lse_t = +inf, so the backward's P_ts = exp(S_ts - lse_t) = 0 and its gradients are zero
// (FlashAttention's convention). The mask gets no gradient.
// Rounding, the same points as the CUDA kernels': q, k, v and dy are rounded to the compute dtype, and
// P and dS are rounded to it before they enter a product; everything accumulates in A (f32, or f64 for
// f64). The softmax's normaliser sums the unrounded P, as the fused forward does. With compute equal
// to qkv's dtype (f32, f64) nothing is rounded: the exact softmax-attention, which gradcheck checks.
// lse (B, H, T) is what backward needs to recompute P without storing it (T x T per head).
#include <cmath>
#include <limits>
#include <vector>

#include <Eigen/Dense>

#include "kernels/attention_mask.h"
#include "kernels/cpu/compose.h"
#include "kernels/cpu/dense_outputs.h"
#include "kernels/cpu/sgemm.h"
#include "kernels/cpu/vector_math.h"
#include "kernels/dispatch.h"

namespace reel {
namespace {

Tensor dense(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device());
  cpu::copy_strided(c, t);
  return c;
}

// v rounded to the compute dtype and back (a no-op when compute is the storage dtype).
template <typename A>
A round_to(DType compute, A v) {
  switch (compute) {
    case DType::bf16: return A(float(BFloat16(float(v))));
    case DType::f16: return A(float(Half(float(v))));
    default: return v;
  }
}

struct Geometry {
  int64_t B, T, d, H, hd;
  DType compute;
  bool causal;
  Geometry(const Tensor& qkv, const Attrs& a)
      : B(qkv.size(0)), T(qkv.size(1)), d(qkv.size(2) / 3), H(a.i("heads")), hd(d / H),
        compute(static_cast<DType>(a.i("compute"))), causal(a.b("causal", true)) {}
  // Keys [0, keys(t)) are visible to query t.
  int64_t keys(int64_t t) const { return causal ? t + 1 : T; }
};

template <typename A>
using Mat = Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// One (batch, head)'s (T, hd) slice of a (B, T, width) tensor from column col0, as A values, rounded
// to the compute dtype when `round`.
template <typename T, typename A>
Mat<A> gather_head(const T* base, const Geometry& g, int64_t width, int64_t b, int64_t col0, bool round) {
  Mat<A> out(g.T, g.hd);
  for (int64_t t = 0; t < g.T; ++t)
    for (int64_t c = 0; c < g.hd; ++c) {
      A v = A(load(base[(b * g.T + t) * width + col0 + c]));
      out(t, c) = round ? round_to(g.compute, v) : v;
    }
  return out;
}

template <typename T, typename A>
void scatter_head(T* base, const Mat<A>& m, const Geometry& g, int64_t width, int64_t b, int64_t col0, A scale) {
  for (int64_t t = 0; t < g.T; ++t)
    for (int64_t c = 0; c < g.hd; ++c) base[(b * g.T + t) * width + col0 + c] = store<T>(scale * m(t, c));
}

// One (batch, head)'s (T, hd) matrix as a GEMM reads it: in place in its (B, T, width) tensor (row
// stride width) when it needs neither widening nor rounding (f32 and f64 at their own precision), else
// gathered into `store` (row stride hd).
template <typename A>
struct Head {
  const A* p;
  int64_t ld;
  MatLayout rows() const { return {true, ld}; }         // the (T, hd) matrix
  MatLayout transposed() const { return {false, ld}; }  // the (hd, T) matrix read from it
};

template <typename T, typename A>
Head<A> head(const T* base, const Geometry& g, int64_t width, int64_t b, int64_t col0, bool round, Mat<A>& store) {
  if constexpr (std::is_same_v<T, A>) {
    if (!round || (g.compute != DType::bf16 && g.compute != DType::f16)) return {base + b * g.T * width + col0, width};
  }
  store = gather_head<T, A>(base, g, width, b, col0, round);
  return {store.data(), g.hd};
}

// (M, N) = alpha a (M, K) @ b (K, N), each read through its layout, on kernels/cpu/sgemm.h's backend.
template <typename A>
Mat<A> product(int64_t M, int64_t K, int64_t N, const A* a, MatLayout la, const A* b, MatLayout lb, A alpha = A(1)) {
  Mat<A> c(M, N);
  if constexpr (std::is_floating_point_v<A>) cpu::gemm(a, la, b, lb, c.data(), M, K, N, 0, alpha);
  else throw InternalError("attention: integer operands reached the GEMM");  // visit_float_dtype refuses them
  return c;
}

// One (batch, head)'s (T, hd) block of a (B, T, width) output from column col0 = alpha a (T, K) @ m (K, hd):
// the GEMM writes it in place when the output holds A values (f32, f64), else it goes through a
// temporary and is rounded to T.
template <typename T, typename A>
void product_into(T* base, const Geometry& g, int64_t width, int64_t b, int64_t col0, A alpha, int64_t K, const A* a,
                  MatLayout la, const A* m, MatLayout lm) {
  if constexpr (std::is_same_v<T, A> && std::is_floating_point_v<A>)
    cpu::gemm(a, la, m, lm, base + b * g.T * width + col0, g.T, K, g.hd, width, alpha);
  else
    scatter_head<T, A>(base, product(g.T, K, g.hd, a, la, m, lm), g, width, b, col0, alpha);
}

// The optional additive mask, read in place through its broadcast strides (kernels/attention_mask.h).
template <typename A>
struct MaskView {
  const A* data = nullptr;  // null: no mask
  AttentionMaskStrides st;
  explicit MaskView(const Tensor& mask) {
    if (!mask.defined()) return;
    data = mask.data<A>();
    st = attention_mask_strides(mask);
  }
  // s (T, T) += M of (batch b, head h).
  void add_to(Mat<A>& s, int64_t b, int64_t h) const {
    if (!data) return;
    const A* m = data + b * st.b + h * st.h;
    for (int64_t t = 0; t < s.rows(); ++t)
      for (int64_t j = 0; j < s.cols(); ++j) s(t, j) += m[t * st.t + j * st.s];
  }
};

// The mask is the input after the `required` ones, when there is one.
Tensor mask_input(const KernelCall& c, size_t required) { return c.in.size() > required ? c.in[required] : Tensor(); }

template <typename M>
void round_all(M&& m, DType compute) {
  using A = typename std::decay_t<M>::Scalar;
  if (compute == DType::bf16 || compute == DType::f16) m = m.unaryExpr([compute](A v) { return round_to(compute, v); });
}

// out[j] = exp(s[j] - shift) for j < n, returning their sum: f32 through kernels/cpu/vector_math.h's
// packets (AVX-512 where present), f64 through Eigen's packet exp (the scalar std::exp loop these
// replace took most of the attention kernels' time). Eigen clamps its argument from below, so a
// masked logit (-inf) or one far below the rest would come out near the smallest normal number
// instead of 0; both give exactly 0 for every argument whose exp is below the normal range (a key that
// cannot contribute).
template <typename A>
A exp_shifted_row(const A* s, A shift, A* out, int64_t n) {
  if constexpr (std::is_same_v<A, float>) {
    return cpu::exp_shifted_f32(s, shift, out, n);
  } else {
    static const A lowest = std::log(std::numeric_limits<A>::min());
    using Row = Eigen::Array<A, Eigen::Dynamic, 1>;
    const auto d = Eigen::Map<const Row>(s, n) - shift;
    Eigen::Map<Row> e(out, n);
    e = d.exp();
    e = (d < lowest).select(A(0), e);
    return e.sum();
  }
}

// The products run as dense (T, T) GEMMs per (batch, head), the causally hidden half zeroed: at these sizes
// a GEMM beats a triangular loop by far. They go through kernels/cpu/sgemm.h (oneDNN's sgemm for f32,
// AVX-512 where the machine has it; Eigen for f64), q, k, v and dy read in place where no rounding is
// needed. One (batch, head) per thread: inside the parallel loop each GEMM stays on its thread.
void attention_fwd_kernel(const KernelCall& c) {
  Tensor qkv = dense(c.in[0]);
  const Tensor &y = c.out[0], &lse = c.out[1];
  const Geometry g(qkv, c.attrs);
  visit_float_dtype(qkv.dtype(), "attention", [&]<typename T>() {
    using A = AccType<T>;
    const MaskView<A> mask(mask_input(c, 1));
    const T* x = qkv.data<T>();
    T* py = y.data<T>();
    A* plse = lse.data<A>();
    const A scale = A(1) / std::sqrt(A(g.hd));
#pragma omp parallel for collapse(2) if (g.B * g.H > 1)
    for (int64_t b = 0; b < g.B; ++b)
      for (int64_t h = 0; h < g.H; ++h) {
        const int64_t T_ = g.T, hd = g.hd;
        Mat<A> qs, ks, vs;
        const Head<A> q = head<T, A>(x, g, 3 * g.d, b, h * hd, true, qs);
        const Head<A> k = head<T, A>(x, g, 3 * g.d, b, g.d + h * hd, true, ks);
        const Head<A> v = head<T, A>(x, g, 3 * g.d, b, 2 * g.d + h * hd, true, vs);
        Mat<A> s = product(T_, hd, T_, q.p, q.rows(), k.p, k.transposed(), scale);  // (T, T) = scale q k^T
        mask.add_to(s, b, h);
        Mat<A> p = Mat<A>::Zero(g.T, g.T);
        for (int64_t t = 0; t < g.T; ++t) {
          const int64_t keys = g.keys(t);
          auto st = s.row(t).head(keys).array();
          const A m = st.maxCoeff();
          if (m == -std::numeric_limits<A>::infinity()) {  // every visible key masked: y_t = 0, lse_t = +inf
            plse[(b * g.H + h) * g.T + t] = std::numeric_limits<A>::infinity();
            continue;
          }
          auto e = p.row(t).head(keys).array();
          const A l = exp_shifted_row(s.row(t).data(), m, p.row(t).data(), keys);
          round_all(e, g.compute);
          e /= l;  // y = (sum_s round(e_s) v_s) / l, the normaliser of the unrounded e
          plse[(b * g.H + h) * g.T + t] = m + std::log(l);
        }
        product_into<T, A>(py, g, g.d, b, h * hd, A(1), T_, p.data(), MatLayout{true, T_}, v.p, v.rows());  // y = p v
      }
  });
}

void attention_bwd_kernel(const KernelCall& c) {
  Tensor dy = dense(c.in[0]), qkv = dense(c.in[1]), y = dense(c.in[2]), lse = dense(c.in[3]);
  const Tensor& dqkv = c.out[0];
  const Geometry g(qkv, c.attrs);
  visit_float_dtype(qkv.dtype(), "attention_backward", [&]<typename T>() {
    using A = AccType<T>;
    const MaskView<A> mask(mask_input(c, 4));
    const T *x = qkv.data<T>(), *pdy = dy.data<T>(), *py = y.data<T>();
    const A* plse = lse.data<A>();
    T* pd = dqkv.data<T>();
    const A scale = A(1) / std::sqrt(A(g.hd));
#pragma omp parallel for collapse(2) if (g.B * g.H > 1)
    for (int64_t b = 0; b < g.B; ++b)
      for (int64_t h = 0; h < g.H; ++h) {
        const int64_t T_ = g.T, hd = g.hd;
        Mat<A> qs, ks, vs, gos, gxs, ys;
        const Head<A> q = head<T, A>(x, g, 3 * g.d, b, h * hd, true, qs);
        const Head<A> k = head<T, A>(x, g, 3 * g.d, b, g.d + h * hd, true, ks);
        const Head<A> v = head<T, A>(x, g, 3 * g.d, b, 2 * g.d + h * hd, true, vs);
        const Head<A> go = head<T, A>(pdy, g, g.d, b, h * hd, true, gos);
        const Head<A> go_exact = head<T, A>(pdy, g, g.d, b, h * hd, false, gxs);
        const Head<A> yo = head<T, A>(py, g, g.d, b, h * hd, false, ys);
        Mat<A> s = product(T_, hd, T_, q.p, q.rows(), k.p, k.transposed(), scale);  // (T, T) = scale q k^T
        mask.add_to(s, b, h);
        const Mat<A> dp = product(T_, hd, T_, go.p, go.rows(), v.p, v.transposed());  // (T, T) = dy v^T
        Mat<A> p = Mat<A>::Zero(g.T, g.T), ds = Mat<A>::Zero(g.T, g.T);
        for (int64_t t = 0; t < g.T; ++t) {
          A D = 0;
#pragma omp simd reduction(+ : D)
          for (int64_t c = 0; c < hd; ++c) D += go_exact.p[t * go_exact.ld + c] * yo.p[t * yo.ld + c];
          const A l = plse[(b * g.H + h) * g.T + t];
          const int64_t keys = g.keys(t);
          auto e = p.row(t).head(keys).array();
          exp_shifted_row(s.row(t).data(), l, p.row(t).data(), keys);  // 0 for a fully masked row (l = +inf)
          ds.row(t).head(keys).array() = e * (dp.row(t).head(keys).array() - D);
        }
        round_all(p, g.compute);
        round_all(ds, g.compute);
        const MatLayout by_rows{true, T_}, by_columns{false, T_};  // a (T, T) matrix, or its transpose
        product_into<T, A>(pd, g, 3 * g.d, b, h * hd, scale, T_, ds.data(), by_rows, k.p, k.rows());  // dq
        product_into<T, A>(pd, g, 3 * g.d, b, g.d + h * hd, scale, T_, ds.data(), by_columns, q.p, q.rows());  // dk
        product_into<T, A>(pd, g, 3 * g.d, b, 2 * g.d + h * hd, A(1), T_, p.data(), by_columns, go.p, go.rows());  // dv
      }
  });
}

// Operands held in the compute dtype for an f32 result (the compiler's 16-bit storage) are widened to
// the result's dtype first: exact, and the kernels round them to compute anyway. `operands`: how many
// leading inputs hold such values (qkv; or dy, qkv, y: lse and the mask are in their own dtype).
void run_widened(const KernelCall& c, KernelFn kernel, size_t operands) {
  std::vector<Tensor> in = c.in;
  for (size_t i = 0; i < operands; ++i) in[i] = cpu::converted(in[i], c.out[0].dtype());
  cpu::run_into_contiguous(KernelCall{c.op, in, c.out, c.attrs}, kernel);
}

void attention_kernel(const KernelCall& c) { run_widened(c, attention_fwd_kernel, 1); }
void attention_backward_kernel(const KernelCall& c) { run_widened(c, attention_bwd_kernel, 3); }

// The fused variants: the plain op into f32 (a temporary when the f32 result is not kept), then its
// copy in the compute dtype.
void with_16bit_copy(const KernelCall& c, OpKind plain) {
  std::vector<Tensor> out(c.out.begin(), c.out.end() - 1);
  if (!c.attrs.b("keep_f32", true)) out.insert(out.begin(), cpu::scratch(c.out.back().shape(), DType::f32));
  cpu::run_op(plain, c.in, out, Attrs(c.attrs).set("dtype", DType::f32));
  cpu::run_op(OpKind::Copy, {out[0]}, {c.out.back()});
}

}  // namespace

void register_attention_cpu_kernels() {
  constexpr DeviceType cpu = DeviceType::CPU;
  register_kernel(cpu, OpKind::Attention, attention_kernel);
  register_kernel(cpu, OpKind::AttentionBackward, attention_backward_kernel);
  register_kernel(cpu, OpKind::AttentionCast,
                  [](const KernelCall& c) { with_16bit_copy(c, OpKind::Attention); });
  register_kernel(cpu, OpKind::AttentionBackwardCast,
                  [](const KernelCall& c) { with_16bit_copy(c, OpKind::AttentionBackward); });
}

}  // namespace reel
