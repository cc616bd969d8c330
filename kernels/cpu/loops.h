// Strided loops for CPU kernels: the machinery behind every elementwise op and strided copy.
//
// An N-operand loop walks `shape` (the output's) with one stride vector per operand (0 on broadcast
// dims). Before walking, size-1 dims are dropped and neighbouring dims are merged wherever every
// operand's strides allow it, so a contiguous tensor of any rank becomes one flat row and the inner
// loop is a plain unit-stride loop the compiler vectorises. Rows are split across OpenMP threads
// (both cores of the CI machine) once there is enough work to pay for the fork.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/loop_geometry.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace reel::cpu {

using reel::LoopGeometry;
using reel::make_geometry;

// Elements below which a loop stays on one thread.
constexpr int64_t kParallelGrain = 1 << 15;

// Element offsets of each operand at the start of row r (r counts rows of the innermost dim).
template <size_t N>
std::array<int64_t, N> row_offsets(const LoopGeometry<N>& g, int64_t r) {
  std::array<int64_t, N> off{};
  for (int64_t d = int64_t(g.sizes.size()) - 2; d >= 0; --d) {
    int64_t i = r % g.sizes[d];
    r /= g.sizes[d];
    for (size_t k = 0; k < N; ++k) off[k] += i * g.strides[k][d];
  }
  return off;
}

// This thread's share [lo, hi) of n items inside an OpenMP parallel region (all of them outside one).
struct ThreadShare {
  int tid, nthreads;
  int64_t lo, hi;
};
inline ThreadShare thread_share(int64_t n) {
  int tid = 0, nthreads = 1;
#ifdef _OPENMP
  tid = omp_get_thread_num();
  nthreads = omp_get_num_threads();
#endif
  return {tid, nthreads, n * tid / nthreads, n * (tid + 1) / nthreads};
}

inline int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// Calls body(offsets, n, inner_strides) for runs of the innermost dim, where offsets[k] is the
// element offset of operand k at the run's start. Large loops run in parallel: over rows when there
// are many (each thread steps an odometer through its block of rows), else over chunks of the rows
// (a contiguous tensor merges into one long row, which still needs splitting across cores).
template <size_t N, typename Body>
void for_each_row(const LoopGeometry<N>& g, Body&& body) {
  if (g.numel == 0) return;
  const int64_t nd = int64_t(g.sizes.size());
  const int64_t inner = g.sizes.back();
  const int64_t rows = g.numel / inner;
  std::array<int64_t, N> inner_strides;
  for (size_t k = 0; k < N; ++k) inner_strides[k] = g.strides[k].back();
  const bool parallel = g.numel >= kParallelGrain;
  const int threads = parallel ? max_threads() : 1;

  if (rows < 4 * threads) {
    const int64_t chunk = std::max<int64_t>(4096, (inner + 4 * threads - 1) / (4 * threads));
    const int64_t per_row = (inner + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t unit = 0; unit < rows * per_row; ++unit) {
      int64_t r = unit / per_row, c0 = (unit % per_row) * chunk;
      std::array<int64_t, N> off = row_offsets(g, r);
      for (size_t k = 0; k < N; ++k) off[k] += c0 * inner_strides[k];
      body(off, std::min(chunk, inner - c0), inner_strides);
    }
    return;
  }

#pragma omp parallel if (parallel)
  {
    const auto [tid, nthreads, r0, r1] = thread_share(rows);
    if (r0 < r1) {
      std::vector<int64_t> idx(nd > 1 ? nd - 1 : 0, 0);
      int64_t rem = r0;
      for (int64_t d = nd - 2; d >= 0; --d) {
        idx[d] = rem % g.sizes[d];
        rem /= g.sizes[d];
      }
      std::array<int64_t, N> off = row_offsets(g, r0);
      for (int64_t r = r0; r < r1; ++r) {
        body(off, inner, inner_strides);
        for (int64_t d = nd - 2; d >= 0; --d) {  // odometer step to row r + 1
          ++idx[d];
          for (size_t k = 0; k < N; ++k) off[k] += g.strides[k][d];
          if (idx[d] < g.sizes[d]) break;
          for (size_t k = 0; k < N; ++k) off[k] -= idx[d] * g.strides[k][d];
          idx[d] = 0;
        }
      }
    }
  }
}

// Whether a contiguous run of n outputs at o may be computed in SIMD lanes from n inputs at x: the
// same elements (in place) or no overlap. Lanes read several inputs before writing; an output run
// that overlaps its input at another offset must go element by element. Without the pragma's
// promise the compiler keeps most of these loops scalar (a data-dependent select, as relu's, then
// costs a mispredicted branch an element).
template <typename T>
bool simd_safe(const T* o, const T* x, int64_t n) {
  return o == x || o + n <= x || x + n <= o;
}

// out = f(a), with a broadcast to out's shape. Functors take and return the accumulation type.
template <typename T, typename F>
void map1(const Tensor& out, const Tensor& a, F f) {
  auto g = make_geometry<2>(out.shape(), {out.strides(), broadcast_strides(a.shape(), a.strides(), out.shape())});
  T* po = out.data<T>();
  const T* pa = a.data<T>();
  for_each_row(g, [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& s) {
    T* o = po + off[0];
    const T* x = pa + off[1];
    if (s[0] == 1 && s[1] == 1 && simd_safe(o, x, n)) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] = store<T>(f(load(x[i])));
    } else if (s[0] == 1 && s[1] == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = store<T>(f(load(x[i])));
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * s[0]] = store<T>(f(load(x[i * s[1]])));
    }
  });
}

// out = f(a, b), both broadcast to out's shape.
template <typename T, typename F>
void map2(const Tensor& out, const Tensor& a, const Tensor& b, F f) {
  auto g = make_geometry<3>(out.shape(), {out.strides(), broadcast_strides(a.shape(), a.strides(), out.shape()),
                                          broadcast_strides(b.shape(), b.strides(), out.shape())});
  T* po = out.data<T>();
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  for_each_row(g, [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& s) {
    T* o = po + off[0];
    const T* x = pa + off[1];
    const T* y = pb + off[2];
    if (s[0] == 1 && s[1] == 1 && s[2] == 1 && simd_safe(o, x, n) && simd_safe(o, y, n)) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] = store<T>(f(load(x[i]), load(y[i])));
    } else if (s[0] == 1 && s[1] == 1 && s[2] == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = store<T>(f(load(x[i]), load(y[i])));
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * s[0]] = store<T>(f(load(x[i * s[1]]), load(y[i * s[2]])));
    }
  });
}

// out = f(a, b, c), all broadcast to out's shape.
template <typename T, typename F>
void map3(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c, F f) {
  auto g = make_geometry<4>(out.shape(), {out.strides(), broadcast_strides(a.shape(), a.strides(), out.shape()),
                                          broadcast_strides(b.shape(), b.strides(), out.shape()),
                                          broadcast_strides(c.shape(), c.strides(), out.shape())});
  T* po = out.data<T>();
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  const T* pc = c.data<T>();
  for_each_row(g, [&](const std::array<int64_t, 4>& off, int64_t n, const std::array<int64_t, 4>& s) {
    for (int64_t i = 0; i < n; ++i)
      po[off[0] + i * s[0]] = store<T>(f(load(pa[off[1] + i * s[1]]), load(pb[off[2] + i * s[2]]),
                                         load(pc[off[3] + i * s[3]])));
  });
}

// dst = src with dtype conversion, any strides on either side (src broadcast to dst's shape).
void copy_strided(const Tensor& dst, const Tensor& src);

}  // namespace reel::cpu

