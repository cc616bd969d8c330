// CUDA kernels of the elementwise ops: the same scalar formulas as the CPU (kernels/elementwise_math.h)
// in one grid-stride kernel per (op, dtype, arity). Operands are broadcast to the output's shape and
// may have any strides: the launcher merges dims exactly as the CPU loops do (kernels/loop_geometry.h)
// and, when every operand is contiguous and broadcast at most over leading dims, takes a flat path
// (16-byte vector loads where alignment allows).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_registry.h"
#include "kernels/elementwise_math.h"

namespace reel {
namespace cuda {
namespace {

template <int NIN>
struct InPtrs {
  const void* p[NIN];
};

template <typename D, int NIN, typename F>
__device__ __forceinline__ Acc<D> apply(const F& f, const InPtrs<NIN>& in, const int64_t* off) {
  const D* const* p = reinterpret_cast<const D* const*>(in.p);
  if constexpr (NIN == 1) return f(to_acc(p[0][off[0]]));
  else if constexpr (NIN == 2) return f(to_acc(p[0][off[0]]), to_acc(p[1][off[1]]));
  else return f(to_acc(p[0][off[0]]), to_acc(p[1][off[1]]), to_acc(p[2][off[2]]));
}

// Flat paths. Every input is either out-shaped and contiguous (period 0: element i reads element i)
// or contiguous and broadcast only over out's leading dims, such as a bias (C) added to (B, T, C) or
// a (T, T) mask over (B, H, T, T) scores (period = its numel: element i reads element i % period).
// I is the index type: uint32_t where the count allows, as 32-bit remainders are much cheaper.
template <int NIN>
struct Periods {
  int64_t p[NIN];
};

template <typename I, int NIN>
__device__ __forceinline__ I wrap(I i, const Periods<NIN>& per, int k) {
  return per.p[k] ? i % I(per.p[k]) : i;
}

template <typename D, int NIN, typename I, typename F>
__global__ void map_contiguous_kernel(I base, I n, D* out, InPtrs<NIN> in, Periods<NIN> per, F f) {
  grid_dependency_wait();
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < n; i += I(gridDim.x) * blockDim.x) {
    const I e = base + i;
    int64_t off[NIN];
#pragma unroll
    for (int k = 0; k < NIN; ++k) off[k] = wrap(e, per, k);
    out[e] = from_acc<D>(apply<D, NIN>(f, in, off));
  }
}

// 16 bytes of consecutive elements: one vector load or store.
template <typename D>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / sizeof(D);
  D v[kSize];
};

// The flat path with every pointer 16-byte aligned and every period a whole number of Packs: each
// thread moves whole Packs, so a warp issues 512-byte transactions instead of 128-byte ones. Covers
// elements [0, npack * Pack::kSize); the launcher runs the scalar kernel over the tail. Periods are
// counted in Packs here.
template <typename D, int NIN, typename I, typename F>
__global__ void map_packed_kernel(I npack, D* out, InPtrs<NIN> in, Periods<NIN> per, F f) {
  grid_dependency_wait();
  using P = Pack<D>;
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < npack; i += I(gridDim.x) * blockDim.x) {
    P src[NIN];
#pragma unroll
    for (int k = 0; k < NIN; ++k) src[k] = static_cast<const P*>(in.p[k])[wrap(i, per, k)];
    P r;
#pragma unroll
    for (int j = 0; j < P::kSize; ++j) {
      if constexpr (NIN == 1) r.v[j] = from_acc<D>(f(to_acc(src[0].v[j])));
      else if constexpr (NIN == 2) r.v[j] = from_acc<D>(f(to_acc(src[0].v[j]), to_acc(src[1].v[j])));
      else r.v[j] = from_acc<D>(f(to_acc(src[0].v[j]), to_acc(src[1].v[j]), to_acc(src[2].v[j])));
    }
    reinterpret_cast<P*>(out)[i] = r;
  }
}

template <typename D, int NIN, bool Index32, typename F>
__global__ void map_strided_kernel(StridedOffsets<NIN + 1> geo, int64_t n, D* out, InPtrs<NIN> in, F f) {
  grid_dependency_wait();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[NIN + 1];
    if constexpr (Index32) geo.offsets32(uint32_t(i), off);
    else geo.offsets(i, off);
    out[off[0]] = from_acc<D>(apply<D, NIN>(f, in, off + 1));
  }
}

// The period of `in` read flat against a contiguous `out` (see Periods), or -1 when it cannot be.
int64_t flat_period(const Tensor& in, const Tensor& out) {
  if (!in.is_contiguous()) return -1;
  if (in.shape() == out.shape()) return 0;
  const Shape& si = in.shape();
  const Shape& so = out.shape();
  size_t lead = 0;  // in's leading size-1 dims are broadcast like missing ones
  while (lead < si.size() && si[lead] == 1) ++lead;
  const size_t rest = si.size() - lead;
  if (rest > so.size() || !std::equal(si.begin() + lead, si.end(), so.end() - rest)) return -1;
  return in.numel() == out.numel() ? 0 : std::max<int64_t>(in.numel(), 1);
}

template <typename D, int NIN, typename I, typename F>
void launch_flat(int64_t n, D* po, const InPtrs<NIN>& ptrs, const Periods<NIN>& per, bool aligned, F f,
                 cudaStream_t s) {
  constexpr int kPack = Pack<D>::kSize;
  bool packable = aligned;
  Periods<NIN> per_pack;
  for (int k = 0; k < NIN; ++k) {
    packable = packable && per.p[k] % kPack == 0;
    per_pack.p[k] = per.p[k] / kPack;
  }
  const int64_t npack = packable ? n / kPack : 0, done = npack * kPack;
  if (npack > 0)
    launch_kernel(map_packed_kernel<D, NIN, I, F>, blocks_for(npack), 256, 0, s, I(npack), po, ptrs, per_pack, f);
  if (done < n)
    launch_kernel(map_contiguous_kernel<D, NIN, I, F>, blocks_for(n - done), 256, 0, s, I(done), I(n - done), po, ptrs,
                  per, f);
}

// out = f(inputs...), every input broadcast to out's shape; T is the host scalar type.
template <typename T, int NIN, typename F>
void launch_map(const Tensor& out, const std::array<Tensor, NIN>& ins, F f) {
  using D = Dev<T>;
  const int64_t n = out.numel();
  if (n == 0) return;
  InPtrs<NIN> ptrs;
  Periods<NIN> per;
  bool flat = out.is_contiguous();
  bool aligned = aligned16(out.data_ptr());
  std::array<std::vector<int64_t>, NIN + 1> strides;
  strides[0] = out.strides();
  for (int k = 0; k < NIN; ++k) {
    ptrs.p[k] = ins[k].data_ptr();
    per.p[k] = flat_period(ins[k], out);
    flat = flat && per.p[k] >= 0;
    aligned = aligned && aligned16(ptrs.p[k]);
    strides[k + 1] = broadcast_strides(ins[k].shape(), ins[k].strides(), out.shape());
  }
  D* po = static_cast<D*>(out.data_ptr());
  cudaStream_t s = stream_of(out);
  if (flat) {
    if (n < (int64_t(1) << 31)) launch_flat<D, NIN, uint32_t>(n, po, ptrs, per, aligned, f, s);
    else launch_flat<D, NIN, int64_t>(n, po, ptrs, per, aligned, f, s);
  } else {
    auto geo = make_offsets(make_geometry<NIN + 1>(out.shape(), strides));
    if (n < (int64_t(1) << 31))
      launch_kernel(map_strided_kernel<D, NIN, true, F>, blocks_for(n), 256, 0, s, geo, n, po, ptrs, f);
    else
      launch_kernel(map_strided_kernel<D, NIN, false, F>, blocks_for(n), 256, 0, s, geo, n, po, ptrs, f);
  }
  REEL_CUDA_LAUNCH_CHECK();
}

// Instantiates only the float types: the float-only formulas have no integer meaning on the device.
template <typename Fn>
void visit_floating(DType t, Fn&& fn) {
  switch (t) {
    case DType::f32: return fn.template operator()<float>();
    case DType::f64: return fn.template operator()<double>();
    case DType::f16: return fn.template operator()<Half>();
    case DType::bf16: return fn.template operator()<BFloat16>();
    default: throw Error(detail::cat("cuda elementwise: dtype ", dtype_name(t), " is not supported"));
  }
}

template <OpKind Op, typename A>
struct UnaryF {
  A param;
  __device__ A operator()(A x) const { return math::unary<Op, A>(x, param); }
};

template <OpKind Op, typename A>
struct BinaryF {
  __device__ A operator()(A a, A b) const { return math::binary<Op, A>(a, b); }
};

template <typename A>
struct WhereF {
  __device__ A operator()(A cond, A a, A b) const { return cond != A(0) ? a : b; }
};

template <typename A>
struct MaskedFillF {
  A value;
  __device__ A operator()(A x, A mask) const { return mask != A(0) ? value : x; }
};

constexpr bool integer_ok(OpKind op) {
  return op == OpKind::Neg || op == OpKind::Abs || op == OpKind::AddScalar || op == OpKind::MulScalar ||
         op == OpKind::Add || op == OpKind::Sub || op == OpKind::Mul || op == OpKind::Eq || op == OpKind::Ne ||
         op == OpKind::Lt || op == OpKind::Le || op == OpKind::Gt || op == OpKind::Ge;
}

template <typename Fn>
void visit_for(OpKind op, DType t, Fn&& fn) {
  if (t == DType::i64 && integer_ok(op)) return fn.template operator()<int64_t>();
  visit_floating(t, std::forward<Fn>(fn));
}

template <OpKind Op>
void unary_kernel(const KernelCall& c) {
  double p = Op == OpKind::PowScalar ? c.attrs.f("exponent")
             : (Op == OpKind::AddScalar || Op == OpKind::MulScalar) ? c.attrs.f("value") : 0.0;
  auto run = [&]<typename T>() {
    using A = Acc<Dev<T>>;
    launch_map<T, 1>(c.out[0], {c.in[0]}, UnaryF<Op, A>{A(p)});
  };
  if constexpr (integer_ok(Op)) visit_for(Op, c.in[0].dtype(), run);
  else visit_floating(c.in[0].dtype(), run);
}

template <OpKind Op>
void binary_kernel(const KernelCall& c) {
  auto run = [&]<typename T>() { launch_map<T, 2>(c.out[0], {c.in[0], c.in[1]}, BinaryF<Op, Acc<Dev<T>>>{}); };
  if constexpr (integer_ok(Op)) visit_for(Op, c.in[0].dtype(), run);
  else visit_floating(c.in[0].dtype(), run);
}

void where_kernel(const KernelCall& c) {
  visit_dtype(c.in[1].dtype(), [&]<typename T>() {
    launch_map<T, 3>(c.out[0], {c.in[0], c.in[1], c.in[2]}, WhereF<Acc<Dev<T>>>{});
  });
}

void masked_fill_kernel(const KernelCall& c) {
  double v = c.attrs.f("value");
  visit_dtype(c.in[0].dtype(), [&]<typename T>() {
    using A = Acc<Dev<T>>;
    launch_map<T, 2>(c.out[0], {c.in[0], c.in[1]}, MaskedFillF<A>{A(v)});
  });
}

}  // namespace
}  // namespace cuda

void register_elementwise_cuda_kernels() {
  using namespace cuda;
  constexpr DeviceType gpu = DeviceType::CUDA;
  register_kernel(gpu, OpKind::Neg, unary_kernel<OpKind::Neg>);
  register_kernel(gpu, OpKind::Exp, unary_kernel<OpKind::Exp>);
  register_kernel(gpu, OpKind::Log, unary_kernel<OpKind::Log>);
  register_kernel(gpu, OpKind::Sqrt, unary_kernel<OpKind::Sqrt>);
  register_kernel(gpu, OpKind::Rsqrt, unary_kernel<OpKind::Rsqrt>);
  register_kernel(gpu, OpKind::Abs, unary_kernel<OpKind::Abs>);
  register_kernel(gpu, OpKind::Tanh, unary_kernel<OpKind::Tanh>);
  register_kernel(gpu, OpKind::Sigmoid, unary_kernel<OpKind::Sigmoid>);
  register_kernel(gpu, OpKind::Relu, unary_kernel<OpKind::Relu>);
  register_kernel(gpu, OpKind::Gelu, unary_kernel<OpKind::Gelu>);
  register_kernel(gpu, OpKind::GeluErf, unary_kernel<OpKind::GeluErf>);
  register_kernel(gpu, OpKind::Silu, unary_kernel<OpKind::Silu>);
  register_kernel(gpu, OpKind::PowScalar, unary_kernel<OpKind::PowScalar>);
  register_kernel(gpu, OpKind::AddScalar, unary_kernel<OpKind::AddScalar>);
  register_kernel(gpu, OpKind::MulScalar, unary_kernel<OpKind::MulScalar>);
  register_kernel(gpu, OpKind::ReluBackward, binary_kernel<OpKind::ReluBackward>);
  register_kernel(gpu, OpKind::GeluBackward, binary_kernel<OpKind::GeluBackward>);
  register_kernel(gpu, OpKind::GeluErfBackward, binary_kernel<OpKind::GeluErfBackward>);
  register_kernel(gpu, OpKind::SiluBackward, binary_kernel<OpKind::SiluBackward>);
  register_kernel(gpu, OpKind::TanhBackward, binary_kernel<OpKind::TanhBackward>);
  register_kernel(gpu, OpKind::SigmoidBackward, binary_kernel<OpKind::SigmoidBackward>);
  register_kernel(gpu, OpKind::Add, binary_kernel<OpKind::Add>);
  register_kernel(gpu, OpKind::Sub, binary_kernel<OpKind::Sub>);
  register_kernel(gpu, OpKind::Mul, binary_kernel<OpKind::Mul>);
  register_kernel(gpu, OpKind::Div, binary_kernel<OpKind::Div>);
  register_kernel(gpu, OpKind::Eq, binary_kernel<OpKind::Eq>);
  register_kernel(gpu, OpKind::Ne, binary_kernel<OpKind::Ne>);
  register_kernel(gpu, OpKind::Lt, binary_kernel<OpKind::Lt>);
  register_kernel(gpu, OpKind::Le, binary_kernel<OpKind::Le>);
  register_kernel(gpu, OpKind::Gt, binary_kernel<OpKind::Gt>);
  register_kernel(gpu, OpKind::Ge, binary_kernel<OpKind::Ge>);
  register_kernel(gpu, OpKind::Where, where_kernel);
  register_kernel(gpu, OpKind::MaskedFill, masked_fill_kernel);
}

}  // namespace reel
