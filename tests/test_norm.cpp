// Layer norm, group norm, batch norm and dropout: forward (and the fused backward ops) against plain
// reference loops in f64 and f32, non-contiguous inputs, with and without weight/bias, inputs large
// enough to take the threaded paths, running-statistics updates, eval mode, f16/bf16 against f32, the
// dropout mask convention and statistics, and every error message. Gradients in f64 are covered by
// the gradcheck cases in autograd/cases/norm_cases.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <omp.h>

#include "reel.h"
#include "test_util.h"

using namespace reel;
using testing_util::expect_error;

namespace {

using Vec = std::vector<double>;
using Sets = std::vector<std::vector<int64_t>>;  // each normalised set as flat (row-major) indices

Tensor random(const Shape& shape, DType dtype, uint64_t seed, double scale = 1.0, double shift = 0.0) {
  Generator gen(seed);
  return normal(shape, shift, scale, TensorOptions{dtype}, &gen);
}

Vec values(const Tensor& t) { return t.to_vector<double>(); }

void expect_close(const Vec& got, const Vec& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << " at " << i;
}

// The reference norm: statistics of each set (biased variance), then the affine map indexed by
// feature(i); w, b empty when absent.
struct NormRef {
  Vec y, mean, rstd;
};
NormRef norm_ref(const Vec& x, const Sets& sets, const std::function<int64_t(int64_t)>& feature, const Vec& w,
                 const Vec& b, double eps) {
  NormRef r{Vec(x.size()), {}, {}};
  for (const auto& set : sets) {
    double sum = 0, sq = 0;
    for (int64_t i : set) sum += x[i];
    double mean = sum / double(set.size());
    for (int64_t i : set) sq += (x[i] - mean) * (x[i] - mean);
    double rstd = 1 / std::sqrt(sq / double(set.size()) + eps);
    for (int64_t i : set) {
      int64_t f = feature(i);
      r.y[i] = (x[i] - mean) * rstd * (w.empty() ? 1.0 : w[f]) + (b.empty() ? 0.0 : b[f]);
    }
    r.mean.push_back(mean);
    r.rstd.push_back(rstd);
  }
  return r;
}

// The reference backward given the saved statistics of each set (training formula).
struct GradRef {
  Vec dx, dw, db;
};
GradRef norm_grad_ref(const Vec& g, const Vec& x, const Sets& sets, const std::function<int64_t(int64_t)>& feature,
                      const Vec& w, const NormRef& stats, int64_t features) {
  GradRef r{Vec(x.size()), Vec(features, 0.0), Vec(features, 0.0)};
  for (size_t k = 0; k < sets.size(); ++k) {
    double mean = stats.mean[k], rstd = stats.rstd[k], n = double(sets[k].size()), mean_gw = 0, mean_gwx = 0;
    auto gw = [&](int64_t i) { return g[i] * (w.empty() ? 1.0 : w[feature(i)]); };
    for (int64_t i : sets[k]) {
      mean_gw += gw(i) / n;
      mean_gwx += gw(i) * (x[i] - mean) * rstd / n;
      r.dw[feature(i)] += g[i] * (x[i] - mean) * rstd;
      r.db[feature(i)] += g[i];
    }
    for (int64_t i : sets[k]) r.dx[i] = rstd * (gw(i) - mean_gw - (x[i] - mean) * rstd * mean_gwx);
  }
  return r;
}

Sets layer_sets(int64_t rows, int64_t cols) {
  Sets s(rows);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) s[r].push_back(r * cols + j);
  return s;
}

// x (N, C, S): the sets of group norm with G groups (G = C gives instance norm, and the sets of
// batch norm are the same per channel across n).
Sets group_sets(int64_t N, int64_t C, int64_t S, int64_t G) {
  Sets s(N * G);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < S; ++i) s[n * G + c / (C / G)].push_back((n * C + c) * S + i);
  return s;
}

Sets batch_sets(int64_t N, int64_t C, int64_t S) {
  Sets s(C);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < S; ++i) s[c].push_back((n * C + c) * S + i);
  return s;
}

std::function<int64_t(int64_t)> channel_of(int64_t C, int64_t S) {
  return [C, S](int64_t i) { return (i / S) % C; };
}

double tol_for(DType t) { return t == DType::f64 ? 1e-12 : 2e-5; }

}  // namespace

// ---------------------------------------------------------------- layer norm

TEST(LayerNorm, ForwardMatchesLoopWithAffine) {
  for (DType dt : {DType::f64, DType::f32}) {
    Tensor x = random({3, 2, 5}, dt, 1, 2.0, 3.0), w = random({2, 5}, dt, 2), b = random({2, 5}, dt, 3);
    auto out = dispatch(OpKind::LayerNorm, {x, w, b}, Attrs().set("eps", 1e-5).set("normalized_ndim", 2));
    NormRef ref = norm_ref(
        values(x), layer_sets(3, 10), [](int64_t i) { return i % 10; }, values(w), values(b), 1e-5);
    expect_close(values(out[0]), ref.y, tol_for(dt), "y");
    EXPECT_EQ(out[1].shape(), (Shape{3}));
    EXPECT_EQ(out[1].dtype(), dt);
    expect_close(values(out[1]), ref.mean, tol_for(dt), "mean");
    expect_close(values(out[2]), ref.rstd, tol_for(dt), "rstd");
    expect_close(values(layer_norm(x, {2, 5}, w, b)), ref.y, tol_for(dt), "public layer_norm");
  }
}

TEST(LayerNorm, NonContiguousWithoutAffineAndWeightOnly) {
  for (DType dt : {DType::f64, DType::f32}) {
    Tensor x = transpose(random({6, 4}, dt, 4), 0, 1);  // (4, 6), strides (1, 4)
    ASSERT_FALSE(x.is_contiguous());
    Tensor w = random({6}, dt, 5);
    auto col = [](int64_t i) { return i % 6; };
    expect_close(values(layer_norm(x, {6})), norm_ref(values(x), layer_sets(4, 6), col, {}, {}, 1e-5).y, tol_for(dt),
                 "no affine");
    expect_close(values(layer_norm(x, {6}, w, Tensor(), 1e-3)),
                 norm_ref(values(x), layer_sets(4, 6), col, values(w), {}, 1e-3).y, tol_for(dt), "weight only");
  }
}

TEST(LayerNorm, LargeInputThreadedForwardAndBackward) {
  // 64 x 1024 elements: above the parallel grain, so rows split across threads and dw/db partial
  // sums are combined.
  Tensor x = random({64, 1024}, DType::f32, 6), w = random({1024}, DType::f32, 7),
         g = random({64, 1024}, DType::f32, 8);
  auto out = dispatch(OpKind::LayerNorm, {x, w, Tensor()}, Attrs().set("eps", 1e-5).set("normalized_ndim", 1));
  Sets sets = layer_sets(64, 1024);
  auto col = [](int64_t i) { return i % 1024; };
  NormRef ref = norm_ref(values(x), sets, col, values(w), {}, 1e-5);
  expect_close(values(out[0]), ref.y, 2e-5, "y");
  auto d = dispatch(OpKind::LayerNormBackward, {g, x, w, out[1], out[2]});
  GradRef gr = norm_grad_ref(values(g), values(x), sets, col, values(w), ref, 1024);
  expect_close(values(d[0]), gr.dx, 1e-4, "dx");
  expect_close(values(d[1]), gr.dw, 1e-4, "dw");
  expect_close(values(d[2]), gr.db, 1e-4, "db");
}

TEST(LayerNorm, BackwardSumsAreTheSameBitsWhateverTheThreads) {
  // dw and db sum over 300 rows (five blocks, the last short): the blocks' sums are added in block
  // order, so 1, 3 or 8 threads, finishing in any order, give the same bits, run after run.
  Tensor x = random({300, 256}, DType::f32, 6), w = random({256}, DType::f32, 7), g = random({300, 256}, DType::f32, 8);
  auto out = dispatch(OpKind::LayerNorm, {x, w, Tensor()}, Attrs().set("eps", 1e-5).set("normalized_ndim", 1));
  const int threads_before = omp_get_max_threads();
  std::vector<std::vector<double>> first;
  for (int threads : {1, 3, 8, 8, 8}) {
    omp_set_num_threads(threads);
    auto d = dispatch(OpKind::LayerNormBackward, {g, x, w, out[1], out[2]});
    std::vector<std::vector<double>> now{values(d[0]), values(d[1]), values(d[2])};
    if (first.empty()) first = now;
    for (size_t k = 0; k < now.size(); ++k) EXPECT_EQ(now[k], first[k]) << "output " << k << ", " << threads << " threads";
  }
  omp_set_num_threads(threads_before);
}

TEST(LayerNorm, DispatchOutIntoStridedOutputs) {
  // dispatch_out may hand the kernel non-contiguous outputs; they are written through a buffer.
  Tensor x = random({4, 3}, DType::f32, 17);
  Tensor y = transpose(zeros({3, 4}), 0, 1), mean = zeros({4}), rstd = slice(zeros({8}), 0, 0, 8, 2);
  dispatch_out(OpKind::LayerNorm, {x, Tensor(), Tensor()}, {y, mean, rstd},
               Attrs().set("eps", 1e-5).set("normalized_ndim", 1));
  NormRef ref = norm_ref(
      values(x), layer_sets(4, 3), [](int64_t i) { return i % 3; }, {}, {}, 1e-5);
  expect_close(values(y), ref.y, 2e-5, "y");
  expect_close(values(rstd), ref.rstd, 2e-5, "rstd");
}

TEST(LayerNorm, BackwardWithoutWeightGivesUnitWeightGradients) {
  // Documented: without w, dw and db are the gradients of hypothetical affine parameters (w = 1).
  Tensor x = random({3, 4}, DType::f64, 9), g = random({3, 4}, DType::f64, 10);
  auto out = dispatch(OpKind::LayerNorm, {x, Tensor(), Tensor()}, Attrs().set("eps", 1e-5).set("normalized_ndim", 1));
  auto d = dispatch(OpKind::LayerNormBackward, {g, x, Tensor(), out[1], out[2]});
  auto col = [](int64_t i) { return i % 4; };
  NormRef ref = norm_ref(values(x), layer_sets(3, 4), col, {}, {}, 1e-5);
  GradRef gr = norm_grad_ref(values(g), values(x), layer_sets(3, 4), col, {}, ref, 4);
  expect_close(values(d[0]), gr.dx, 1e-12, "dx");
  expect_close(values(d[1]), gr.dw, 1e-12, "dw");
  expect_close(values(d[2]), gr.db, 1e-12, "db");
}

TEST(LayerNorm, HalfAndBFloat16MatchF32WithF32Statistics) {
  Tensor x = random({4, 16}, DType::f32, 11, 2.0, 1.0), w = random({16}, DType::f32, 12),
         b = random({16}, DType::f32, 13);
  for (auto [dt, tol] : {std::pair{DType::f16, 4e-3}, std::pair{DType::bf16, 3e-2}}) {
    Tensor xl = x.to(dt), wl = w.to(dt), bl = b.to(dt);
    auto out = dispatch(OpKind::LayerNorm, {xl, wl, bl}, Attrs().set("eps", 1e-5).set("normalized_ndim", 1));
    EXPECT_EQ(out[0].dtype(), dt);
    EXPECT_EQ(out[1].dtype(), DType::f32);
    EXPECT_EQ(out[2].dtype(), DType::f32);
    Tensor want = layer_norm(xl.to(DType::f32), {16}, wl.to(DType::f32), bl.to(DType::f32));
    expect_close(values(out[0]), values(want), tol, dtype_name(dt));
  }
}

TEST(LayerNorm, Errors) {
  Tensor x = random({2, 3, 4}, DType::f32, 14);
  expect_error([&] { layer_norm(x, {3}); }, {"layer_norm", "(3,)", "(2, 3, 4)"});
  expect_error([&] { layer_norm(x, {}); }, {"layer_norm", "normalized_shape"});
  expect_error([&] { layer_norm(x, {4}, random({3}, DType::f32, 15)); }, {"layer_norm", "weight", "(3,)", "(4,)"});
  expect_error([&] { layer_norm(x, {4}, Tensor(), random({4}, DType::f64, 16)); },
               {"layer_norm", "bias", "f64", "f32"});
  expect_error([&] { layer_norm(tensor_i64({1, 2}, {2}), {2}); }, {"layer_norm", "float", "i64"});
  expect_error(
      [&] {
        dispatch(OpKind::LayerNorm, {x, Tensor(), Tensor()}, Attrs().set("eps", 1e-5).set("normalized_ndim", 4));
      },
      {"layer_norm", "normalized_ndim 4", "(2, 3, 4)"});
}

// The fused ops' 16-bit operands (a GEMM's result read as its widening): only with an f32 x, of x's
// shape, and a dropped addend stays f32.
TEST(LayerNorm, FusedOpsSixteenBitOperandErrors) {
  const Attrs a = Attrs().set("eps", 1e-5).set("normalized_ndim", 1).set("dtype", DType::bf16);
  Tensor x = random({2, 8}, DType::f32, 17), w = random({8}, DType::f32, 18);
  expect_error(
      [&] {
        dispatch(OpKind::LayerNormCast, {x, w, Tensor(), random({2, 4}, DType::bf16, 19)}, a);
      },
      {"layer_norm_cast", "addend", "(2, 4) bf16", "(2, 8)"});
  expect_error(
      [&] {
        Attrs d = Attrs(a).set("dropout_p", 0.1).set("dropout_seed", 1).set("dropout_offset", 0);
        dispatch(OpKind::LayerNormCast, {x, w, Tensor(), random({2, 8}, DType::bf16, 19)}, d);
      },
      {"layer_norm_cast", "addend", "(2, 8) bf16", "dropout", "f32"});
  // A broadcast addend must be a suffix of x's shape (leading 1s aside) and carry no dropout.
  Tensor x3 = random({2, 3, 8}, DType::f32, 24);
  expect_error(
      [&] {
        dispatch(OpKind::LayerNormCast, {x3, w, Tensor(), random({2, 1, 8}, DType::f32, 25)}, a);
      },
      {"layer_norm_cast", "addend", "(2, 1, 8) f32", "(2, 3, 8)", "suffix"});
  expect_error(
      [&] {
        Attrs d = Attrs(a).set("dropout_p", 0.1).set("dropout_seed", 1).set("dropout_offset", 0);
        dispatch(OpKind::LayerNormCast, {x3, w, Tensor(), random({3, 8}, DType::f32, 26)}, d);
      },
      {"layer_norm_cast", "addend", "(3, 8) f32", "dropout", "(2, 3, 8)"});
  std::vector<Tensor> f =
      dispatch(OpKind::LayerNorm, {x, w, Tensor()}, Attrs().set("eps", 1e-5).set("normalized_ndim", 1));
  expect_error(
      [&] {
        dispatch(OpKind::LayerNormBackwardAdd, {random({2, 4}, DType::bf16, 20), x, w, f[1], f[2], Tensor()});
      },
      {"layer_norm_backward_add", "gradient", "(2, 4) bf16", "(2, 8) f32"});
  Tensor x64 = random({2, 8}, DType::f64, 21), w64 = random({8}, DType::f64, 22);
  std::vector<Tensor> f64 =
      dispatch(OpKind::LayerNorm, {x64, w64, Tensor()}, Attrs().set("eps", 1e-5).set("normalized_ndim", 1));
  expect_error(
      [&] {
        dispatch(OpKind::LayerNormBackwardAdd, {random({2, 8}, DType::bf16, 23), x64, w64, f64[1], f64[2], Tensor()});
      },
      {"layer_norm_backward", "gradient", "(2, 8) bf16", "f64"});
}

// ---------------------------------------------------------------- group norm

TEST(GroupNorm, ForwardMatchesLoop4D) {
  for (DType dt : {DType::f64, DType::f32}) {
    Tensor x = random({2, 6, 2, 3}, dt, 20, 1.5, -1.0), w = random({6}, dt, 21), b = random({6}, dt, 22);
    auto out = dispatch(OpKind::GroupNorm, {x, w, b}, Attrs().set("groups", 3).set("eps", 1e-5));
    NormRef ref = norm_ref(values(x), group_sets(2, 6, 6, 3), channel_of(6, 6), values(w), values(b), 1e-5);
    expect_close(values(out[0]), ref.y, tol_for(dt), "y");
    EXPECT_EQ(out[1].shape(), (Shape{2, 3}));
    expect_close(values(out[1]), ref.mean, tol_for(dt), "mean");
    expect_close(values(out[2]), ref.rstd, tol_for(dt), "rstd");
  }
}

TEST(GroupNorm, NonContiguousWithoutAffine) {
  for (DType dt : {DType::f64, DType::f32}) {
    Tensor x = permute(random({2, 3, 4}, dt, 23), {0, 2, 1});  // (N=2, C=4, S=3), channels-last storage
    ASSERT_FALSE(x.is_contiguous());
    for (int64_t G : {1, 2, 4}) {
      NormRef ref = norm_ref(values(x), group_sets(2, 4, 3, G), channel_of(4, 3), {}, {}, 1e-5);
      expect_close(values(group_norm(x, G)), ref.y, tol_for(dt), "G=" + std::to_string(G));
    }
  }
}

TEST(GroupNorm, LargeInputThreadedForwardAndBackward) {
  Tensor x = random({4, 8, 32, 32}, DType::f32, 24), w = random({8}, DType::f32, 25),
         g = random({4, 8, 32, 32}, DType::f32, 26);
  auto out = dispatch(OpKind::GroupNorm, {x, w, Tensor()}, Attrs().set("groups", 4).set("eps", 1e-5));
  Sets sets = group_sets(4, 8, 1024, 4);
  NormRef ref = norm_ref(values(x), sets, channel_of(8, 1024), values(w), {}, 1e-5);
  expect_close(values(out[0]), ref.y, 2e-5, "y");
  auto d = dispatch(OpKind::GroupNormBackward, {g, x, w, out[1], out[2]}, Attrs().set("groups", 4));
  GradRef gr = norm_grad_ref(values(g), values(x), sets, channel_of(8, 1024), values(w), ref, 8);
  expect_close(values(d[0]), gr.dx, 1e-4, "dx");
  expect_close(values(d[1]), gr.dw, 1e-3, "dw");
  expect_close(values(d[2]), gr.db, 1e-3, "db");
}

TEST(GroupNorm, HalfAndBFloat16MatchF32) {
  Tensor x = random({2, 4, 3, 3}, DType::f32, 27), w = random({4}, DType::f32, 28);
  for (auto [dt, tol] : {std::pair{DType::f16, 4e-3}, std::pair{DType::bf16, 3e-2}}) {
    Tensor y = group_norm(x.to(dt), 2, w.to(dt));
    EXPECT_EQ(y.dtype(), dt);
    expect_close(values(y), values(group_norm(x.to(dt).to(DType::f32), 2, w.to(dt).to(DType::f32))), tol,
                 dtype_name(dt));
  }
}

TEST(GroupNorm, Errors) {
  Tensor x = random({2, 6, 3}, DType::f32, 29);
  expect_error([&] { group_norm(x, 4); }, {"group_norm", "channels 6", "(2, 6, 3)", "groups 4"});
  expect_error([&] { group_norm(x, 0); }, {"group_norm", "groups must be >= 1"});
  expect_error([&] { group_norm(random({6}, DType::f32, 30), 2); }, {"group_norm", "(N, C, *)", "(6,)"});
  expect_error([&] { group_norm(x, 2, random({3}, DType::f32, 31)); }, {"group_norm", "weight", "(3,)", "(6,)"});
}

// ---------------------------------------------------------------- batch norm

TEST(BatchNorm, TrainingForwardMatchesLoop2DAnd4D) {
  for (DType dt : {DType::f64, DType::f32}) {
    for (Shape shape : {Shape{6, 3}, Shape{2, 3, 2, 2}}) {
      int64_t N = shape[0], C = 3, S = numel_of(shape) / (N * C);
      Tensor x = random(shape, dt, 40, 2.0, 0.5), w = random({3}, dt, 41), b = random({3}, dt, 42);
      auto out = dispatch(OpKind::BatchNorm, {x, w, b, Tensor(), Tensor()},
                          Attrs().set("training", true).set("momentum", 0.1).set("eps", 1e-5));
      NormRef ref = norm_ref(values(x), batch_sets(N, C, S), channel_of(C, S), values(w), values(b), 1e-5);
      expect_close(values(out[0]), ref.y, tol_for(dt), "y " + shape_str(shape));
      expect_close(values(out[1]), ref.mean, tol_for(dt), "save_mean");
      expect_close(values(out[2]), ref.rstd, tol_for(dt), "save_rstd");
      NormRef plain = norm_ref(values(x), batch_sets(N, C, S), channel_of(C, S), {}, {}, 1e-5);
      expect_close(values(batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true)), plain.y, tol_for(dt),
                   "no affine " + shape_str(shape));
    }
  }
}

TEST(BatchNorm, NonContiguousChannelsLastInput) {
  for (DType dt : {DType::f64, DType::f32}) {
    Tensor x = permute(random({2, 3, 2, 4}, dt, 43), {0, 3, 1, 2});  // NHWC storage seen as (2, 4, 3, 2)
    ASSERT_FALSE(x.is_contiguous());
    Tensor w = random({4}, dt, 44);
    NormRef ref = norm_ref(values(x), batch_sets(2, 4, 6), channel_of(4, 6), values(w), {}, 1e-5);
    expect_close(values(batch_norm(x, Tensor(), Tensor(), w, Tensor(), true)), ref.y, tol_for(dt), "y");
  }
}

TEST(BatchNorm, RunningStatisticsUpdateWithUnbiasedVariance) {
  const int64_t N = 3, C = 2, S = 4;
  const double m = 0.2;
  Tensor rm = random({C}, DType::f64, 45), rv = random({C}, DType::f64, 46, 0.1, 1.0);
  Vec want_m = values(rm), want_v = values(rv);
  for (uint64_t step = 0; step < 2; ++step) {
    Tensor x = random({N, C, 2, 2}, DType::f64, 47 + step, 1.5, 0.3);
    batch_norm(x, rm, rv, Tensor(), Tensor(), true, m);
    Vec xv = values(x);
    Sets sets = batch_sets(N, C, S);
    for (int64_t c = 0; c < C; ++c) {
      double sum = 0, sq = 0, n = double(N * S);
      for (int64_t i : sets[c]) sum += xv[i];
      for (int64_t i : sets[c]) sq += (xv[i] - sum / n) * (xv[i] - sum / n);
      want_m[c] = (1 - m) * want_m[c] + m * sum / n;
      want_v[c] = (1 - m) * want_v[c] + m * sq / (n - 1);
    }
    expect_close(values(rm), want_m, 1e-12, "running_mean");
    expect_close(values(rv), want_v, 1e-12, "running_var");
  }
}

TEST(BatchNorm, F32RunningStatisticsWithBFloat16Input) {
  Tensor x = random({4, 3}, DType::f32, 49).to(DType::bf16);
  Tensor rm = zeros({3}), rv = ones({3});
  batch_norm(x, rm, rv, Tensor(), Tensor(), true, 0.5);
  Tensor rm64 = zeros({3}, TensorOptions{DType::f64}), rv64 = ones({3}, TensorOptions{DType::f64});
  batch_norm(x.to(DType::f64), rm64, rv64, Tensor(), Tensor(), true, 0.5);
  expect_close(values(rm), values(rm64), 1e-6, "running_mean");
  expect_close(values(rv), values(rv64), 1e-6, "running_var");
}

TEST(BatchNorm, EvalUsesRunningStatisticsAndLeavesThemAlone) {
  for (DType dt : {DType::f64, DType::f32}) {
    Tensor x = random({2, 3, 4}, dt, 50), w = random({3}, dt, 51), b = random({3}, dt, 52);
    Tensor rm = random({3}, dt, 53), rv = random({3}, dt, 54, 0.2, 1.0);
    Vec rmv = values(rm), rvv = values(rv), xv = values(x), wv = values(w), bv = values(b), want(xv.size());
    for (size_t i = 0; i < xv.size(); ++i) {
      size_t c = (i / 4) % 3;
      want[i] = (xv[i] - rmv[c]) / std::sqrt(rvv[c] + 1e-5) * wv[c] + bv[c];
    }
    auto out = dispatch(OpKind::BatchNorm, {x, w, b, rm, rv},
                        Attrs().set("training", false).set("momentum", 0.1).set("eps", 1e-5));
    expect_close(values(out[0]), want, tol_for(dt), "y");
    expect_close(values(out[1]), rmv, tol_for(dt), "save_mean is the running mean");
    expect_close(values(rm), rmv, 0, "running_mean unchanged");
    expect_close(values(rv), rvv, 0, "running_var unchanged");
    // Eval backward: the statistics are constants, dx = g w rstd.
    Tensor g = random({2, 3, 4}, dt, 55);
    auto d = dispatch(OpKind::BatchNormBackward, {g, x, w, out[1], out[2]}, Attrs().set("training", false));
    Vec gv = values(g), dx(gv.size());
    for (size_t i = 0; i < gv.size(); ++i) dx[i] = gv[i] * wv[(i / 4) % 3] / std::sqrt(rvv[(i / 4) % 3] + 1e-5);
    expect_close(values(d[0]), dx, tol_for(dt), "eval dx");
  }
}

TEST(BatchNorm, LargeInputThreadedForwardAndBackward) {
  Tensor x = random({16, 4, 32, 32}, DType::f32, 56, 1.0, 2.0), g = random({16, 4, 32, 32}, DType::f32, 57);
  Tensor w = random({4}, DType::f32, 58), b = random({4}, DType::f32, 59);
  auto out = dispatch(OpKind::BatchNorm, {x, w, b, Tensor(), Tensor()},
                      Attrs().set("training", true).set("momentum", 0.1).set("eps", 1e-5));
  Sets sets = batch_sets(16, 4, 1024);
  NormRef ref = norm_ref(values(x), sets, channel_of(4, 1024), values(w), values(b), 1e-5);
  expect_close(values(out[0]), ref.y, 5e-5, "y");
  auto d = dispatch(OpKind::BatchNormBackward, {g, x, w, out[1], out[2]}, Attrs().set("training", true));
  GradRef gr = norm_grad_ref(values(g), values(x), sets, channel_of(4, 1024), values(w), ref, 4);
  expect_close(values(d[0]), gr.dx, 1e-4, "dx");
  expect_close(values(d[1]), gr.dw, 1e-3, "dw");
  expect_close(values(d[2]), gr.db, 1e-3, "db");
}

TEST(BatchNorm, HalfAndBFloat16MatchF32) {
  Tensor x = random({4, 3, 2, 2}, DType::f32, 60), w = random({3}, DType::f32, 61), b = random({3}, DType::f32, 62);
  for (auto [dt, tol] : {std::pair{DType::f16, 4e-3}, std::pair{DType::bf16, 3e-2}}) {
    Tensor y = batch_norm(x.to(dt), Tensor(), Tensor(), w.to(dt), b.to(dt), true);
    Tensor want =
        batch_norm(x.to(dt).to(DType::f32), Tensor(), Tensor(), w.to(dt).to(DType::f32), b.to(dt).to(DType::f32), true);
    EXPECT_EQ(y.dtype(), dt);
    expect_close(values(y), values(want), tol, dtype_name(dt));
  }
}

TEST(BatchNorm, Errors) {
  Tensor x = random({4, 3}, DType::f32, 63), rm = zeros({3}), rv = ones({3});
  expect_error(
      [&] {
        batch_norm(random({1, 3}, DType::f32, 64), rm, rv, Tensor(), Tensor(), true);
      },
      {"batch_norm", "more than 1 value per channel when training", "(1, 3)"});
  expect_error(
      [&] {
        batch_norm(random({1, 3, 1, 1}, DType::f32, 65), Tensor(), Tensor(), Tensor(), Tensor(), true);
      },
      {"batch_norm", "more than 1 value per channel", "(1, 3, 1, 1)"});
  expect_error([&] { batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), false); },
               {"batch_norm", "eval mode", "running_mean and running_var"});
  expect_error([&] { batch_norm(x, rm, Tensor(), Tensor(), Tensor(), true); },
               {"batch_norm", "running_mean and running_var must be given together"});
  expect_error([&] { batch_norm(x, zeros({4}), rv, Tensor(), Tensor(), true); },
               {"batch_norm", "running_mean", "(4,)", "(3,)", "(4, 3)"});
  expect_error([&] { batch_norm(x, rm, rv, random({2}, DType::f32, 66), Tensor(), true); },
               {"batch_norm", "weight", "(2,)", "(3,)"});
  expect_error([&] { batch_norm(random({5}, DType::f32, 67), rm, rv, Tensor(), Tensor(), true); },
               {"batch_norm", "(N, C, *)", "(5,)"});
}

// ---------------------------------------------------------------- dropout

namespace {
std::vector<Tensor> dropout_op(const Tensor& x, double p, int64_t seed, int64_t offset) {
  return dispatch(OpKind::Dropout, {x}, Attrs().set("p", p).set("seed", seed).set("offset", offset));
}
}  // namespace

TEST(Dropout, MaskFollowsPhiloxConventionAndScales) {
  for (DType dt : {DType::f64, DType::f32}) {
    Tensor x = transpose(random({5, 7}, dt, 70), 0, 1);  // non-contiguous (7, 5)
    const double p = 0.3, scale = 1 / (1 - p);
    auto out = dropout_op(x, p, 42, 12);
    Vec xv = values(x), y = values(out[0]), mask = values(out[1]);
    for (size_t i = 0; i < xv.size(); ++i) {
      bool kept = philox_uniform(42, 12, i) >= float(p);
      double mi = dt == DType::f32 ? double(float(kept ? scale : 0.0)) : (kept ? scale : 0.0);
      ASSERT_EQ(mask[i], mi) << i;
      ASSERT_NEAR(y[i], xv[i] * mi, 1e-6 * (1 + std::abs(y[i]))) << i;
    }
  }
}

TEST(Dropout, SameSeedAndOffsetSameMaskOtherOffsetOtherMask) {
  Tensor x = ones({1000});
  Vec a = values(dropout_op(x, 0.5, 3, 100)[1]), b = values(dropout_op(x, 0.5, 3, 100)[1]);
  Vec c = values(dropout_op(x, 0.5, 3, 101)[1]), e = values(dropout_op(x, 0.5, 4, 100)[1]);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, e);
}

TEST(Dropout, KeepRateWithinFewSigma) {
  const int64_t n = 100000;
  for (double p : {0.1, 0.5, 0.8}) {
    Vec mask = values(dropout_op(ones({n}), p, 11, 0)[1]);
    double kept = 0;
    for (double m : mask) kept += m != 0 ? 1 : 0;
    double sigma = std::sqrt(p * (1 - p) / double(n));
    EXPECT_NEAR(kept / double(n), 1 - p, 5 * sigma) << "p=" << p;
  }
}

TEST(Dropout, GradientIsGradTimesMask) {
  Tensor x = random({6, 5}, DType::f64, 71).set_requires_grad();
  Tensor g = random({6, 5}, DType::f64, 72);
  Generator gen(9);
  Tensor y = dropout(x, 0.4, true, &gen);
  EXPECT_EQ(gen.offset(), philox_uniform_counters(30));
  y.backward(g);
  Vec mask = values(dropout_op(x.detach(), 0.4, 9, 0)[1]), gv = values(g), dx = values(x.grad());
  for (size_t i = 0; i < gv.size(); ++i) ASSERT_DOUBLE_EQ(dx[i], gv[i] * mask[i]) << i;
}

TEST(Dropout, PublicFunctionIdentityAllZeroAndFreshMasks) {
  Tensor x = random({64}, DType::f32, 73);
  Generator gen(5);
  EXPECT_TRUE(dropout(x, 0.5, false, &gen).is_same(x));
  EXPECT_TRUE(dropout(x, 0.0, true, &gen).is_same(x));
  EXPECT_EQ(gen.offset(), 0u);  // no draw for the identity cases
  for (double v : values(dropout(x, 1.0, true, &gen))) EXPECT_EQ(v, 0.0);
  for (double v : values(dropout_op(x, 1.0, 5, 0)[1])) EXPECT_EQ(v, 0.0);
  // Consecutive draws advance the generator: different masks.
  EXPECT_NE(values(dropout(x, 0.5, true, &gen)), values(dropout(x, 0.5, true, &gen)));
}

TEST(Dropout, HalfAndBFloat16KeepTheSameElements) {
  Tensor x = random({200}, DType::f32, 74);
  Vec m32 = values(dropout_op(x, 0.25, 1, 7)[1]);
  for (DType dt : {DType::f16, DType::bf16}) {
    auto out = dropout_op(x.to(dt), 0.25, 1, 7);
    Vec m = values(out[1]), y = values(out[0]), xv = values(x.to(dt));
    for (size_t i = 0; i < m.size(); ++i) {
      ASSERT_EQ(m[i] != 0, m32[i] != 0) << i;
      ASSERT_NEAR(m[i], m32[i], 1e-2) << i;
      ASSERT_NEAR(y[i], xv[i] * m[i], 1e-2 * (1 + std::abs(y[i]))) << i;
    }
  }
}

TEST(Dropout, Errors) {
  Tensor x = ones({4});
  expect_error([&] { dropout(x, 1.5); }, {"dropout", "[0, 1]", "1.5"});
  expect_error([&] { dropout(x, -0.1, false); }, {"dropout", "[0, 1]", "-0.1"});
  expect_error([&] { dropout_op(x, 2.0, 0, 0); }, {"dropout", "[0, 1]", "2"});
  expect_error([&] { dropout(tensor_i64({1, 2}, {2}), 0.5); }, {"dropout", "float", "i64"});
}
