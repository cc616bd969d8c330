// CUDA kernels of the creation and memory ops: fill, arange, the Philox random fills (the same
// numbers as the CPU: tensor/rng.h), the strided/casting copy within a device, transfers between
// host and device, and concat.
//
// Transfers. Host -> device: the host side is first made contiguous in the destination dtype on the
// CPU (when it is not already), then cudaMemcpyAsync on the current stream; pageable sources are
// staged by the driver before the call returns, pinned ones (cuda::pinned_empty) copy truly
// asynchronously. Device -> host: the device side is made contiguous in the destination dtype on the
// device, copied, and the stream is synchronised — the host reads the result next, so this is the
// one op that waits (like PyTorch's .cpu()).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_registry.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/multi_tensor_common.cuh"
#include "kernels/philox_args.h"
#include "tensor/rng.h"

namespace reel {
namespace cpu {
void copy_strided(const Tensor& dst, const Tensor& src);  // kernels/cpu/memory.cpp
}

namespace cuda {
namespace {

template <typename D, typename S, bool Index32>
__global__ void copy_cast_strided_kernel(StridedOffsets<2> geo, int64_t n, D* dst, const S* src) {
  grid_dependency_wait();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[2];
    if constexpr (Index32) geo.offsets32(uint32_t(i), off);
    else geo.offsets(i, off);
    dst[off[0]] = from_acc<D>(to_acc(src[off[1]]));
  }
}

// Both sides contiguous, same shape, dtypes differ (autocast's casts): no index arithmetic at all.
template <typename D, typename S>
__global__ void copy_cast_flat_kernel(uint32_t n, D* dst, const S* src) {
  grid_dependency_wait();
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    dst[i] = from_acc<D>(to_acc(src[i]));
}

// A batch of row-major (rows x cols) matrices written transposed (cols x rows), converting the dtype
// on the way: NCHW -> NHWC is (rows, cols) = (C, H*W) per image, NHWC -> NCHW is (H*W, C); a
// Linear's f32 weight (out, in) cast to its 16-bit transpose (in, out) is (out, in). Each
// block moves one 32x32 tile through shared memory, so that reads and writes are both coalesced rows
// (the elementwise strided copy reads or writes one element per 32-byte sector when it transposes:
// three times slower on cnn-small's casts into channels-last, and about 0.75 TB/s on gpt-small's
// weight casts). Block (32, 8): a thread moves 4 elements each way.
constexpr int kTile = 32, kTileRows = 8;

// The tile at (r0, c0) of matrix `base` (src + base: rows x cols, row-major) written transposed to
// dst + base, through `tile` (+1 column: a column read touches 32 different banks).
template <typename D, typename S, typename Acc>
__device__ __forceinline__ void transpose_tile(D* dst, const S* src, int64_t base, int64_t rows, int64_t cols,
                                               int64_t r0, int64_t c0, Acc (&tile)[kTile][kTile + 1],
                                               bool accumulate = false) {
  for (int j = threadIdx.y; j < kTile; j += kTileRows) {
    const int64_t r = r0 + j, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[j][threadIdx.x] = to_acc(src[base + r * cols + c]);
  }
  __syncthreads();
  for (int j = threadIdx.y; j < kTile; j += kTileRows) {
    const int64_t c = c0 + j, r = r0 + threadIdx.x;
    if (r < rows && c < cols) {
      D& out = dst[base + c * rows + r];
      out = accumulate ? from_acc<D>(to_acc(out) + to_acc(from_acc<D>(tile[threadIdx.x][j])))
                       : from_acc<D>(tile[threadIdx.x][j]);
    }
  }
}

template <typename D, typename S>
__global__ void transpose_cast_kernel(D* dst, const S* src, int64_t rows, int64_t cols) {
  grid_dependency_wait();
  __shared__ decltype(to_acc(S{})) tile[kTile][kTile + 1];
  transpose_tile(dst, src, int64_t(blockIdx.z) * rows * cols, rows, cols, int64_t(blockIdx.y) * kTile,
                 int64_t(blockIdx.x) * kTile, tile);
}

// Whether t, of shape (..., R, C), is a dense batch of (C, R) row-major matrices viewed transposed:
// strides (..., 1, R), the leading dims dense over the matrices (size-1 dims take any stride). A
// Linear's weight W^T is one: autocast's cast of it to 16 bits writes the (in, out) transpose.
bool is_transposed_dense(const Tensor& t) {
  const int64_t d = t.dim();
  if (d < 2) return false;
  const Shape& s = t.shape();
  const auto& st = t.strides();
  const int64_t R = s[size_t(d - 2)], C = s[size_t(d - 1)];
  if ((R > 1 && st[size_t(d - 2)] != 1) || (C > 1 && st[size_t(d - 1)] != R)) return false;
  int64_t expect = R * C;
  for (int64_t k = d - 3; k >= 0; --k) {
    if (s[size_t(k)] > 1 && st[size_t(k)] != expect) return false;
    expect *= s[size_t(k)];
  }
  return true;
}

// When dst and src are one dense shape laid out as a batch of matrices and their transposes: one
// contiguous and the other channels-last (4-D: NCHW <-> NHWC), or one contiguous and the other its
// last two dims swapped (is_transposed_dense). The batch of transposes that turns src's order into
// dst's, or none (batch 0).
struct BatchedTranspose {
  int64_t batch = 0, rows = 0, cols = 0;
  explicit operator bool() const { return batch > 0; }
};

BatchedTranspose as_batched_transpose(const Tensor& dst, const Tensor& src) {
  if (dst.dim() < 2 || dst.shape() != src.shape() || dst.numel() == 0) return {};
  const Shape& s = dst.shape();
  BatchedTranspose t;
  if (dst.dim() == 4) {
    const int64_t pixels = s[2] * s[3];
    if (src.is_contiguous() && !dst.is_contiguous() && dst.is_contiguous(MemoryFormat::ChannelsLast))
      t = {s[0], s[1], pixels};
    else if (dst.is_contiguous() && !src.is_contiguous() && src.is_contiguous(MemoryFormat::ChannelsLast))
      t = {s[0], pixels, s[1]};
  }
  if (!t) {
    const int64_t R = s[s.size() - 2], C = s[s.size() - 1], batch = dst.numel() / (R * C);
    if (dst.is_contiguous() && !src.is_contiguous() && is_transposed_dense(src)) t = {batch, C, R};
    else if (src.is_contiguous() && !dst.is_contiguous() && is_transposed_dense(dst)) t = {batch, R, C};
  }
  if (!t) return {};
  const int64_t tiles_y = (t.rows + kTile - 1) / kTile;
  return t.batch <= 65535 && tiles_y <= 65535 ? t : BatchedTranspose{};  // grid y and z limits
}

template <typename D, typename F>
__global__ void fill_indexed_kernel(StridedOffsets<1> geo, int64_t n, D* out, F f) {
  grid_dependency_wait();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[1];
    geo.offsets(i, off);
    out[off[0]] = from_acc<D>(f(i));
  }
}

// Writes f(i) (row-major index i) to every element of `out`, any strides.
template <typename F>
void fill_indexed(const Tensor& out, F f) {
  int64_t n = out.numel();
  if (n == 0) return;
  auto geo = make_offsets(make_geometry<1>(out.shape(), {out.strides()}));
  visit_dtype(out.dtype(), [&]<typename T>() {
    using D = Dev<T>;
    launch_kernel(fill_indexed_kernel<D, F>, blocks_for(n), 256, 0, stream_of(out), geo, n,
                  static_cast<D*>(out.data_ptr()), f);
    REEL_CUDA_LAUNCH_CHECK();
  });
}

struct ConstantValue {
  double v;
  __device__ double operator()(int64_t) const { return v; }
};
struct ArangeValue {
  double start, step;
  __device__ double operator()(int64_t i) const { return start + double(i) * step; }
};
// The key and first counter are read where the kernel runs: a compiled plan's state is device memory.
struct UniformValue {
  PhiloxArgs rng;
  double lo, hi;
  __device__ double operator()(int64_t i) const {
    return lo + (hi - lo) * double(philox_uniform(rng.key(), rng.start(), i));
  }
};
struct NormalValue {
  PhiloxArgs rng;
  double mean, std;
  __device__ double operator()(int64_t i) const {
    return mean + std * double(philox_normal(rng.key(), rng.start(), i));
  }
};

void fill_kernel(const KernelCall& c) { fill_indexed(c.out[0], ConstantValue{c.attrs.f("value")}); }

void arange_kernel(const KernelCall& c) {
  fill_indexed(c.out[0], ArangeValue{c.attrs.f("start", 0.0), c.attrs.f("step", 1.0)});
}

void rand_uniform_kernel(const KernelCall& c) {
  fill_indexed(c.out[0], UniformValue{philox_args(c, 0), c.attrs.f("low", 0.0), c.attrs.f("high", 1.0)});
}

void rand_normal_kernel(const KernelCall& c) {
  fill_indexed(c.out[0], NormalValue{philox_args(c, 0), c.attrs.f("mean", 0.0), c.attrs.f("std", 1.0)});
}

// A contiguous host copy of `src` in dtype `dt` (src itself when it already is one).
Tensor host_dense(const Tensor& src, DType dt) {
  if (src.is_contiguous() && src.dtype() == dt) return src;
  Tensor t = Tensor::empty(src.shape(), dt, Device::cpu());
  cpu::copy_strided(t, src);
  return t;
}

// A contiguous device copy of `src` in dtype `dt` on src's device.
Tensor device_dense(const Tensor& src, DType dt) {
  if (src.is_contiguous() && src.dtype() == dt) return src;
  Tensor t = Tensor::empty(src.shape(), dt, src.device());
  copy_on_device(t, src);
  return t;
}

void host_to_device(const Tensor& dst, const Tensor& src) {
  Tensor host = host_dense(src, dst.dtype());
  Tensor dev = dst.is_contiguous() ? dst : Tensor::empty(dst.shape(), dst.dtype(), dst.device());
  REEL_CUDA_CHECK(cudaMemcpyAsync(dev.data_ptr(), host.data_ptr(), dst.nbytes(), cudaMemcpyHostToDevice, stream_of(dst)));
  if (!dev.is_same(dst)) copy_on_device(dst, dev);
}

void device_to_host(const Tensor& dst, const Tensor& src) {
  Tensor dev = device_dense(src, dst.dtype());
  Tensor host = dst.is_contiguous() ? dst : Tensor::empty(dst.shape(), dst.dtype(), Device::cpu());
  cudaStream_t s = stream_of(src);
  REEL_CUDA_CHECK(cudaMemcpyAsync(host.data_ptr(), dev.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToHost, s));
  REEL_CUDA_CHECK(cudaStreamSynchronize(s));
  if (!host.is_same(dst)) cpu::copy_strided(dst, host);
}

void device_to_device(const Tensor& dst, const Tensor& src) {
  if (dst.device() == src.device()) return copy_on_device(dst, src);
  Tensor from = device_dense(src, dst.dtype());
  Tensor to = dst.is_contiguous() ? dst : Tensor::empty(dst.shape(), dst.dtype(), dst.device());
  REEL_CUDA_CHECK(cudaMemcpyPeerAsync(to.data_ptr(), dst.device().index, from.data_ptr(), src.device().index,
                                      dst.nbytes(), stream_of(dst)));
  if (!to.is_same(dst)) copy_on_device(dst, to);
}

void copy_kernel(const KernelCall& c) {
  const Tensor& src = c.in[0];
  const Tensor& dst = c.out[0];
  if (dst.numel() == 0) return;
  if (src.device().is_cpu() && dst.device().is_cuda()) return host_to_device(dst, src);
  if (src.device().is_cuda() && dst.device().is_cpu()) return device_to_host(dst, src);
  REEL_ASSERT(src.device().is_cuda() && dst.device().is_cuda(), "copy: no CUDA endpoint");
  device_to_device(dst, src);
}

void concat_kernel(const KernelCall& c) {
  const Tensor& out = c.out[0];
  int64_t dim = wrap_dim(c.attrs.i("dim"), out.dim(), "concat");
  int64_t at = 0;
  for (const Tensor& t : c.in) {
    copy_on_device(Tensor::make_view(out, t.shape(), out.strides(), out.offset() + at * out.strides()[dim]), t);
    at += t.shape()[dim];
  }
}

// ---- multi_tensor_cast: a step's casts of its weights in one launch ----
//
// Each (src, dst) pair of a launch is a flat cast (both contiguous, one shape) or a batch of tiled
// transposes (as_batched_transpose: a Linear's W^T, a convolution's weight into channels-last). Pair
// k is cut into virtual blocks of kTile x kTile elements (a flat pair: 1024 consecutive elements; a
// transposed one: one tile), numbered from first_block[k]; physical (32, 8) blocks walk them with a
// grid stride (multi_tensor_common.cuh). Every element is from_acc<D>(to_acc(x)), as the copy
// kernels above write it: the bits of one copy per pair. Pairs of any other layout take the copy.
// With accumulate (the table's flag) each element is added to what dst holds, in D's accumulation
// type after the cast: the bits of the copy and then an add (a micro-batch's weight gradients).
constexpr int kCastPairsPerLaunch = 48;
constexpr int64_t kCastFlatChunk = int64_t(kTile) * kTile;

struct CastTable {
  const void* src[kCastPairsPerLaunch];
  void* dst[kCastPairsPerLaunch];
  // A batch of transposes: one matrix's rows and cols (the batch is the virtual blocks' quotient);
  // a flat pair: rows = its elements, cols = 1.
  int64_t rows[kCastPairsPerLaunch], cols[kCastPairsPerLaunch];
  int64_t first_block[kCastPairsPerLaunch + 1];  // first_block[count]: the launch's virtual blocks
  bool transposed[kCastPairsPerLaunch];
  int count = 0;
  bool accumulate = false;
};

template <typename D, typename S>
__global__ void multi_tensor_cast_kernel(const __grid_constant__ CastTable table) {
  grid_dependency_wait();
  __shared__ decltype(to_acc(S{})) tile[kTile][kTile + 1];
  const int t = threadIdx.y * kTile + threadIdx.x;  // 0..255
  for (int64_t b = blockIdx.x; b < table.first_block[table.count]; b += gridDim.x) {
    const int k = tensor_of_block(table.first_block, table.count, b);
    const int64_t local = b - table.first_block[k];
    const S* src = static_cast<const S*>(table.src[k]);
    D* dst = static_cast<D*>(table.dst[k]);
    if (!table.transposed[k]) {
      const int64_t n = table.rows[k], begin = local * kCastFlatChunk;
      for (int64_t i = begin + t; i < begin + kCastFlatChunk && i < n; i += kTile * kTileRows)
        dst[i] = table.accumulate ? from_acc<D>(to_acc(dst[i]) + to_acc(from_acc<D>(to_acc(src[i]))))
                                  : from_acc<D>(to_acc(src[i]));
      continue;  // uniform across the block: the transposed branch's barriers are not skipped by some
    }
    const int64_t rows = table.rows[k], cols = table.cols[k];
    const int64_t tiles_x = (cols + kTile - 1) / kTile, tiles_y = (rows + kTile - 1) / kTile;
    const int64_t z = local / (tiles_x * tiles_y), yx = local % (tiles_x * tiles_y);
    transpose_tile(dst, src, z * rows * cols, rows, cols, (yx / tiles_x) * kTile, (yx % tiles_x) * kTile, tile,
                   table.accumulate);
    __syncthreads();  // the tile is read before the next virtual block writes it
  }
}

// out[i] = in[i] cast to the outputs' dtype, each pair as one copy would write it. in: x0..xk, one
// float dtype; out: y0..yk, one dtype. With attr accumulate, in: (x0..xk, y0..yk) and out[i] += the
// cast: only pairs the table takes (flat or a batched transpose: multi_tensor_cast_supported).
void multi_tensor_cast_kernel_call(const KernelCall& c) {
  if (c.in.empty()) return;
  const Device dev = c.out[0].device();
  const bool accumulate = c.attrs.b("accumulate", false);
  visit_dtype(c.out[0].dtype(), [&]<typename DT>() {
    visit_dtype(c.in[0].dtype(), [&]<typename ST>() {
      using D = Dev<DT>;
      using S = Dev<ST>;
      CastTable table;
      table.accumulate = accumulate;
      auto flush = [&] {
        if (table.count == 0) return;
        launch_kernel(multi_tensor_cast_kernel<D, S>, multi_tensor_grid(dev.index, table.first_block[table.count]),
                      dim3{kTile, kTileRows}, 0, stream_of(c.out[0]), table);
        REEL_CUDA_LAUNCH_CHECK();
        table.count = 0;
        table.first_block[0] = 0;
      };
      table.first_block[0] = 0;
      for (size_t i = 0; i < c.out.size(); ++i) {  // the pairs: with accumulate c.in also holds the y's
        const Tensor &src = c.in[i], &dst = c.out[i];
        if (dst.numel() == 0) continue;
        const bool flat = dst.is_contiguous() && src.is_contiguous() && dst.shape() == src.shape();
        const BatchedTranspose bt = flat ? BatchedTranspose{} : as_batched_transpose(dst, src);
        if (!flat && !bt) {
          REEL_CHECK(!accumulate, "multi_tensor_cast: accumulating ", shape_str(src.shape()), " strides ",
                     shape_str(src.strides()), " into strides ", shape_str(dst.strides()),
                     ": only flat pairs and batched transposes are added in place");
          copy_on_device(dst, src);  // another layout: the copy's own kernels, in order with the launches
          continue;
        }
        const int k = table.count;
        table.src[k] = src.data_ptr();
        table.dst[k] = dst.data_ptr();
        table.transposed[k] = !flat;
        table.rows[k] = flat ? dst.numel() : bt.rows;
        table.cols[k] = flat ? 1 : bt.cols;
        auto up = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
        const int64_t blocks =
            flat ? up(dst.numel(), kCastFlatChunk) : bt.batch * up(bt.rows, kTile) * up(bt.cols, kTile);
        table.first_block[k + 1] = table.first_block[k] + blocks;
        if (++table.count == kCastPairsPerLaunch) flush();
      }
      flush();
    });
  });
}

// Whether the kernel takes the call: with accumulate, every pair flat or a batched transpose.
bool multi_tensor_cast_supported(const KernelCall& c) {
  if (!c.attrs.b("accumulate", false)) return true;
  for (size_t i = 0; i < c.out.size(); ++i) {
    const Tensor &src = c.in[i], &dst = c.out[i];
    const bool flat = dst.is_contiguous() && src.is_contiguous() && dst.shape() == src.shape();
    if (!flat && dst.numel() > 0 && !as_batched_transpose(dst, src)) return false;
  }
  return true;
}

}  // namespace

void copy_on_device(const Tensor& dst, const Tensor& src) {
  int64_t n = dst.numel();
  if (n == 0) return;
  if (dst.dtype() == src.dtype() && dst.shape() == src.shape() && dst.is_contiguous() && src.is_contiguous()) {
    // A plain block copy: the copy engine's path runs at the device's bandwidth.
    REEL_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice,
                                    stream_of(dst)));
    return;
  }
  auto geo = make_offsets(make_geometry<2>(
      dst.shape(), {dst.strides(), broadcast_strides(src.shape(), src.strides(), dst.shape())}));
  visit_dtype(dst.dtype(), [&]<typename DT>() {
    visit_dtype(src.dtype(), [&]<typename ST>() {
      using D = Dev<DT>;
      using S = Dev<ST>;
      D* d = static_cast<D*>(dst.data_ptr());
      const S* sp = static_cast<const S*>(src.data_ptr());
      cudaStream_t s = stream_of(dst);
      const bool small = n < (int64_t(1) << 31);
      if (small && dst.shape() == src.shape() && dst.is_contiguous() && src.is_contiguous()) {
        launch_kernel(copy_cast_flat_kernel<D, S>, blocks_for(n), 256, 0, s, uint32_t(n), d, sp);
      } else if (const BatchedTranspose t = as_batched_transpose(dst, src)) {
        const dim3 grid{unsigned((t.cols + kTile - 1) / kTile), unsigned((t.rows + kTile - 1) / kTile),
                        unsigned(t.batch)};
        launch_kernel(transpose_cast_kernel<D, S>, grid, dim3{kTile, kTileRows}, 0, s, d, sp, t.rows, t.cols);
      } else if (small)
        launch_kernel(copy_cast_strided_kernel<D, S, true>, blocks_for(n), 256, 0, s, geo, n, d, sp);
      else
        launch_kernel(copy_cast_strided_kernel<D, S, false>, blocks_for(n), 256, 0, s, geo, n, d, sp);
      REEL_CUDA_LAUNCH_CHECK();
    });
  });
}

}  // namespace cuda

void register_memory_cuda_kernels() {
  constexpr DeviceType gpu = DeviceType::CUDA;
  register_kernel(gpu, OpKind::Fill, cuda::fill_kernel);
  register_kernel(gpu, OpKind::Arange, cuda::arange_kernel);
  register_kernel(gpu, OpKind::RandUniform, cuda::rand_uniform_kernel);
  register_kernel(gpu, OpKind::RandNormal, cuda::rand_normal_kernel);
  register_kernel(gpu, OpKind::Copy, cuda::copy_kernel);
  register_kernel(gpu, OpKind::Concat, cuda::concat_kernel);
  register_kernel(gpu, OpKind::MultiTensorCast, cuda::multi_tensor_cast_kernel_call);
  register_supports(gpu, OpKind::MultiTensorCast, cuda::multi_tensor_cast_supported);
}

}  // namespace reel
