// Op-harness cases of pooling and embedding (schemas: kernels/schema/pool.cpp). Pooling runs with
// windows that tile the input, overlap (stride < kernel) and reach into padding, on row-major,
// transposed and channels-last inputs. max_pool2d draws distinct values, so each window has one
// maximum and its index is the same on every backend; its backward is fed those indices, with
// overlapping windows so that one input element can collect several gradients. Embedding indices
// repeat, so the backward's sums are exercised. Plain-loop references: every op of the family.
#include <limits>

#include "tests/op_harness/inputs.h"

namespace reel::harness {
namespace {

using Inputs = std::vector<Tensor>;

struct Window {
  const char* name;
  Shape x;  // (N, C, H, W)
  int64_t kernel, stride, padding;
  Layout layout;
  int64_t out(int64_t size) const { return (size + 2 * padding - kernel) / stride + 1; }
  Shape y() const { return {x[0], x[1], out(x[2]), out(x[3])}; }
  Attrs attrs() const { return Attrs().set("kernel", kernel).set("stride", stride).set("padding", padding); }
};

const Window kWindows[] = {
    {"k2_s2_2x3x4x6", {2, 3, 4, 6}, 2, 2, 0, Layout::contiguous},
    {"k3_s2_pad1_overlapping_1x2x7x5", {1, 2, 7, 5}, 3, 2, 1, Layout::contiguous},
    {"k3_s1_pad1_transposed_1x2x5x6", {1, 2, 5, 6}, 3, 1, 1, Layout::transposed},
    {"k2_s1_channels_last_2x3x3x4", {2, 3, 3, 4}, 2, 1, 0, Layout::channels_last},
};

// Calls tap(plane, output flat index, input flat index within the plane) for every window element
// inside the input; planes are (n, c) pairs.
template <typename Tap>
void for_each_window_tap(const Window& p, Tap tap) {
  const Shape y = p.y();
  const int64_t H = p.x[2], W = p.x[3];
  for (int64_t plane = 0; plane < y[0] * y[1]; ++plane)
    for (int64_t oh = 0; oh < y[2]; ++oh)
      for (int64_t ow = 0; ow < y[3]; ++ow)
        for (int64_t i = 0; i < p.kernel; ++i)
          for (int64_t j = 0; j < p.kernel; ++j) {
            const int64_t h = oh * p.stride - p.padding + i, w = ow * p.stride - p.padding + j;
            if (h >= 0 && h < H && w >= 0 && w < W) tap(plane, (plane * y[2] + oh) * y[3] + ow, h * W + w);
          }
}

// (y, indices) of max pooling: the first maximum of each window in row-major window order.
Expected max_pool_reference(const Window& p, const OpCall& c) {
  const int64_t HW = p.x[2] * p.x[3];
  std::vector<double> x = host_values(c.inputs[0]), y(numel_of(p.y()), -std::numeric_limits<double>::infinity());
  std::vector<double> idx(y.size(), -1);
  for_each_window_tap(p, [&](int64_t plane, int64_t o, int64_t in) {
    if (x[plane * HW + in] > y[o]) y[o] = x[plane * HW + in], idx[o] = double(in);
  });
  return {y, idx};
}

Expected avg_pool_reference(const Window& p, const OpCall& c) {
  const int64_t HW = p.x[2] * p.x[3];
  std::vector<double> x = host_values(c.inputs[0]), y(numel_of(p.y()), 0.0);
  for_each_window_tap(p, [&](int64_t plane, int64_t o, int64_t in) { y[o] += x[plane * HW + in] / double(p.kernel * p.kernel); });
  return {y};
}

// dx of max pooling: g scattered to the indices.
Expected max_pool_backward_reference(const Window& p, const OpCall& c) {
  const Shape y = p.y();
  const int64_t HW = p.x[2] * p.x[3], per_plane = y[2] * y[3];
  std::vector<double> g = host_values(c.inputs[0]), idx = host_values(c.inputs[1]), dx(numel_of(p.x), 0.0);
  for (size_t o = 0; o < g.size(); ++o) dx[(int64_t(o) / per_plane) * HW + int64_t(idx[o])] += g[o];
  return {dx};
}

Expected avg_pool_backward_reference(const Window& p, const OpCall& c) {
  const int64_t HW = p.x[2] * p.x[3];
  std::vector<double> g = host_values(c.inputs[0]), dx(numel_of(p.x), 0.0);
  for_each_window_tap(p, [&](int64_t plane, int64_t o, int64_t in) { dx[plane * HW + in] += g[o] / double(p.kernel * p.kernel); });
  return {dx};
}

// max (max = true) or average pooling and its backward over every window geometry. max_pool2d's
// backward takes the indices of a CPU forward.
void add_pooling_cases(std::vector<OpTestCase>& cases, bool max) {
  const OpKind op = max ? OpKind::MaxPool2d : OpKind::AvgPool2d;
  const OpKind backward = max ? OpKind::MaxPool2dBackward : OpKind::AvgPool2dBackward;
  auto input = [max](const Window& p, DType t) {
    return max ? distinct_input(p.x, t, 100, p.layout) : randn_input(p.x, t, 100, p.layout);
  };
  for (const Window& p : kWindows) {
    GradcheckFn grad;
    if (numel_of(p.x) <= 72)
      grad = [p, max](const Inputs& x) {
        return max ? max_pool2d(x[0], p.kernel, p.stride, p.padding) : avg_pool2d(x[0], p.kernel, p.stride, p.padding);
      };
    cases.push_back({
        .op = op,
        .name = std::string(op_name(op)) + "_" + p.name,
        .dtypes = kFloatTypes,
        .make = [p, input](Device, DType t) { return OpCall{{input(p, t)}, p.attrs()}; },
        .grad = grad,
        .reference = [p, max](const OpCall& c) { return max ? max_pool_reference(p, c) : avg_pool_reference(p, c); },
    });
    cases.push_back({
        .op = backward,
        .name = std::string(op_name(backward)) + "_" + p.name,
        .dtypes = kFloatTypes,
        .make =
            [p, input, max](Device, DType t) {
              OpCall call{{randn_input(p.y(), t, 101, p.layout)}, p.attrs().set("input_shape", p.x)};
              if (max) call.inputs.push_back(dispatch(OpKind::MaxPool2d, {input(p, t)}, p.attrs())[1]);
              return call;
            },
        .reference =
            [p, max](const OpCall& c) { return max ? max_pool_backward_reference(p, c) : avg_pool_backward_reference(p, c); },
    });
  }
}

// ---- embedding ----

struct Lookup {
  const char* name;
  int64_t V, D;
  Shape indices;
  int64_t index_range;  // indices drawn from [0, index_range): small ranges repeat rows
  Layout weight_layout;
};

const Lookup kLookups[] = {
    {"10x4_indices_2x3", 10, 4, {2, 3}, 10, Layout::contiguous},
    {"transposed_weight_6x5_indices_7", 6, 5, {7}, 6, Layout::transposed},
    {"repeated_rows_8x3_indices_3x4", 8, 3, {3, 4}, 3, Layout::strided},
    {"0d_index_5x2", 5, 2, {}, 5, Layout::contiguous},
};

// dweight (V, D) += each position's row of g, at its index: the embedding backward by plain loops.
std::vector<double> scatter_rows(const OpCall& c, std::vector<double> dw, int64_t D) {
  const std::vector<double> g = host_values(c.inputs[0]), idx = host_values(c.inputs[1]);
  for (size_t p = 0; p < idx.size(); ++p)
    for (int64_t d = 0; d < D; ++d) dw[size_t(int64_t(idx[p]) * D + d)] += g[p * size_t(D) + size_t(d)];
  return dw;
}

void add_embedding_cases(std::vector<OpTestCase>& cases) {
  for (const Lookup& e : kLookups) {
    cases.push_back({
        .op = OpKind::Embedding,
        .name = std::string("embedding_") + e.name,
        .dtypes = kFloatTypes,
        .make =
            [e](Device, DType t) {
              return OpCall{{randn_input({e.V, e.D}, t, 104, e.weight_layout), index_input(e.indices, e.index_range, 105)}};
            },
        .grad = [](const Inputs& x) { return embedding(x[0], x[1]); },
        .reference =
            [e](const OpCall& c) {
              std::vector<double> w = host_values(c.inputs[0]), y;
              for (double i : host_values(c.inputs[1])) y.insert(y.end(), w.begin() + int64_t(i) * e.D, w.begin() + (int64_t(i) + 1) * e.D);
              return Expected{y};
            },
    });
    Shape g_shape = e.indices;
    g_shape.push_back(e.D);
    cases.push_back({
        .op = OpKind::EmbeddingBackward,
        .name = std::string("embedding_backward_") + e.name,
        .dtypes = kFloatTypes,
        .make =
            [e, g_shape](Device, DType t) {
              return OpCall{{randn_input(g_shape, t, 106, e.weight_layout), index_input(e.indices, e.index_range, 105)},
                            Attrs().set("num_weights", e.V)};
            },
        .reference =
            [e](const OpCall& c) {
              return Expected{scatter_rows(c, std::vector<double>(size_t(e.V * e.D), 0.0), e.D)};
            },
    });
  }
  // Accumulating into a gradient that already holds values (the later micro-batches): dweight =
  // before + the sums, rows no index touches keeping theirs; the sort path (positions > 8192 on CUDA)
  // beside the scan path.
  struct Accumulating {
    const char* name;
    Shape indices;
    int64_t V, D, index_range;
  };
  for (const Accumulating& e : {Accumulating{"accumulate_12x5_indices_3x7", {3, 7}, 12, 5, 9},
                                Accumulating{"accumulate_sorted_16x8_indices_9000", {9000}, 16, 8, 16}}) {
    Shape g_shape = e.indices;
    g_shape.push_back(e.D);
    cases.push_back({
        .op = OpKind::EmbeddingBackward,
        .name = std::string("embedding_backward_") + e.name,
        .dtypes = kFloatTypes,
        .make =
            [e, g_shape](Device, DType t) {
              Tensor before = randn_input({e.V, e.D}, t, 108);
              return OpCall{{randn_input(g_shape, t, 107), index_input(e.indices, e.index_range, 109), before},
                            Attrs().set("num_weights", e.V).set("accumulate", true),
                            {before}};
            },
        .reference = [e](const OpCall& c) { return Expected{scatter_rows(c, host_values(c.inputs[2]), e.D)}; },
    });
  }
}

}  // namespace

std::vector<OpTestCase> pool_cases() {
  std::vector<OpTestCase> cases;
  add_pooling_cases(cases, true);
  add_pooling_cases(cases, false);
  add_embedding_cases(cases);
  return cases;
}

}  // namespace reel::harness
