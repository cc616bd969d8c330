// CPU kernels of the creation and memory ops: fill, arange, the Philox random fills (the same numbers
// the CUDA kernels draw), strided/casting copy, concat.
#include <cstring>
#include <type_traits>

#include "kernels/cpu/compose.h"
#include "kernels/cpu/dense_outputs.h"
#include "kernels/cpu/loops.h"
#include "kernels/dispatch.h"
#include "kernels/philox_args.h"
#include "tensor/rng.h"

namespace reel {
namespace cpu {

void copy_strided(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous() && dst.shape() == src.shape()) {
    std::memcpy(dst.data_ptr(), src.data_ptr(), dst.nbytes());
    return;
  }
  visit_dtype(dst.dtype(), [&]<typename D>() {
    visit_dtype(src.dtype(), [&]<typename S>() {
      auto g = make_geometry<2>(dst.shape(), {dst.strides(), broadcast_strides(src.shape(), src.strides(), dst.shape())});
      D* pd = static_cast<D*>(dst.data_ptr());
      const S* ps = static_cast<const S*>(src.data_ptr());
      for_each_row(g, [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& s) {
        D* o = pd + off[0];
        const S* x = ps + off[1];
        if constexpr (std::is_same_v<D, S>) {
          for (int64_t i = 0; i < n; ++i) o[i * s[0]] = x[i * s[1]];
        } else {
          // Through double keeps i64 exact up to 2^53 and every float value exact.
          for (int64_t i = 0; i < n; ++i)
            o[i * s[0]] = static_cast<D>(static_cast<AccType<D>>(static_cast<double>(load(x[i * s[1]]))));
        }
      });
    });
  });
}

}  // namespace cpu

namespace {

// Writes f(i) to element i (row-major) of `out`, which may be a strided view.
template <typename T, typename F>
void fill_indexed(const Tensor& out, F f) {
  Tensor dense = out.is_contiguous() ? out : Tensor::empty(out.shape(), out.dtype(), out.device());
  T* p = dense.data<T>();
  int64_t n = dense.numel();
#pragma omp parallel for if (n >= cpu::kParallelGrain)
  for (int64_t i = 0; i < n; ++i) p[i] = store<T>(static_cast<AccType<T>>(f(i)));
  if (!dense.is_same(out)) cpu::copy_strided(out, dense);
}

void fill_kernel(const KernelCall& c) {
  double v = c.attrs.f("value");
  visit_dtype(c.out[0].dtype(), [&]<typename T>() { fill_indexed<T>(c.out[0], [v](int64_t) { return v; }); });
}

void arange_kernel(const KernelCall& c) {
  double start = c.attrs.f("start", 0.0), step = c.attrs.f("step", 1.0);
  visit_dtype(c.out[0].dtype(),
              [&]<typename T>() { fill_indexed<T>(c.out[0], [=](int64_t i) { return start + double(i) * step; }); });
}

void rand_uniform_kernel(const KernelCall& c) {
  const PhiloxArgs rng = philox_args(c, 0);
  const uint64_t seed = rng.key(), offset = rng.start();
  double lo = c.attrs.f("low", 0.0), hi = c.attrs.f("high", 1.0);
  visit_dtype(c.out[0].dtype(), [&]<typename T>() {
    fill_indexed<T>(c.out[0], [=](int64_t i) { return lo + (hi - lo) * double(philox_uniform(seed, offset, i)); });
  });
}

void rand_normal_kernel(const KernelCall& c) {
  const PhiloxArgs rng = philox_args(c, 0);
  const uint64_t seed = rng.key(), offset = rng.start();
  double mean = c.attrs.f("mean", 0.0), stddev = c.attrs.f("std", 1.0);
  visit_dtype(c.out[0].dtype(), [&]<typename T>() {
    fill_indexed<T>(c.out[0], [=](int64_t i) { return mean + stddev * double(philox_normal(seed, offset, i)); });
  });
}

void copy_kernel(const KernelCall& c) {
  REEL_CHECK(c.in[0].device().is_cpu() && c.out[0].device().is_cpu(), "copy: ", c.in[0].device().str(), " -> ",
             c.out[0].device().str(), " needs the CUDA backend");
  cpu::copy_strided(c.out[0], c.in[0]);
}

void concat_kernel(const KernelCall& c) {
  const Tensor& out = c.out[0];
  int64_t dim = wrap_dim(c.attrs.i("dim"), out.dim(), "concat");
  int64_t at = 0;
  for (const Tensor& t : c.in) {
    int64_t len = t.shape()[dim];
    Shape strides = out.strides();
    Tensor part = Tensor::make_view(out, t.shape(), strides, out.offset() + at * out.strides()[dim]);
    cpu::copy_strided(part, t);
    at += len;
  }
}

// Fused (kernels/ops.def): each y_i as the copy of x_i writes it, in order; with accumulate, the copy
// into a new tensor and then the add into y_i, as the two ops would run.
void multi_tensor_cast_kernel(const KernelCall& c) {
  if (!c.attrs.b("accumulate", false)) {
    for (size_t k = 0; k < c.in.size(); ++k) cpu::copy_strided(c.out[k], c.in[k]);
    return;
  }
  for (size_t k = 0; k < c.out.size(); ++k) {
    Tensor t = cpu::scratch(c.out[k].shape(), c.out[k].dtype());
    cpu::copy_strided(t, c.in[k]);
    cpu::run_op(OpKind::Add, {c.in[c.out.size() + k], t}, {c.out[k]});
  }
}

}  // namespace

void register_memory_cpu_kernels() {
  constexpr DeviceType cpu = DeviceType::CPU;
  register_kernel(cpu, OpKind::Fill, fill_kernel);
  register_kernel(cpu, OpKind::Arange, arange_kernel);
  register_kernel(cpu, OpKind::RandUniform, rand_uniform_kernel);
  register_kernel(cpu, OpKind::RandNormal, rand_normal_kernel);
  register_kernel(cpu, OpKind::Copy, copy_kernel);
  register_kernel(cpu, OpKind::Concat, concat_kernel);
  register_kernel(cpu, OpKind::MultiTensorCast, multi_tensor_cast_kernel);
}

}  // namespace reel
