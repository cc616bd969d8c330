// Extreme values for the norms: layer_norm, group_norm and batch_norm (two-pass statistics) on
// inputs of scale 1e4, offset 1e4 with a small spread (where E[x^2] - E[x]^2 cancels to nothing or to
// a negative variance), tiny variances below eps and with a tiny eps, and all-equal sets; forward
// values and gradients against long double loops of the two-pass mean and variance and the norm's
// analytic gradient, on the CPU and the GPU when usable (tests/test_extreme_values.cpp says how
// tolerances are set). group_norm and batch_norm fold the affine map, as explained where allowed.
#include "extreme_values_util.h"

using namespace reel;
using namespace reel::extreme_values;

namespace {

// ---------------------------------------------------------------- norms

using Sets = std::vector<std::vector<int64_t>>;  // each normalised set as flat row-major indices

struct NormRef {
  LVec y, dx, dw, db, mean, var;
};

// The norm's definition in long double, per set: mean = sum x / n, var = sum (x - mean)^2 / n
// (biased, two passes), xhat = (x - mean) / sqrt(var + eps), y = xhat w + b; and its gradient for
// dy = g: dx = rstd (g w - mean(g w) - xhat mean(g w xhat)), dw = sum g xhat, db = sum g.
NormRef norm_ref(const Vec& x, const Vec& g, const Vec& w, const Vec& b, const Sets& sets,
                 const std::function<int64_t(int64_t)>& feature, int64_t features, LD eps) {
  NormRef r{LVec(x.size()), LVec(x.size()), LVec(size_t(features), 0), LVec(size_t(features), 0), {}, {}};
  for (const auto& set : sets) {
    const LD n = LD(set.size());
    LD sum = 0;
    for (int64_t i : set) sum += x[size_t(i)];
    const LD mean = sum / n;
    LD sq = 0;
    for (int64_t i : set) sq += (LD(x[size_t(i)]) - mean) * (LD(x[size_t(i)]) - mean);
    const LD var = sq / n, rstd = 1 / std::sqrt(var + eps);
    LD mean_gw = 0, mean_gwx = 0;
    for (int64_t i : set) {
      const int64_t f = feature(i);
      const LD xhat = (LD(x[size_t(i)]) - mean) * rstd, gw = LD(g[size_t(i)]) * LD(w[size_t(f)]);
      r.y[size_t(i)] = xhat * LD(w[size_t(f)]) + LD(b[size_t(f)]);
      mean_gw += gw / n;
      mean_gwx += gw * xhat / n;
      r.dw[size_t(f)] += LD(g[size_t(i)]) * xhat;
      r.db[size_t(f)] += LD(g[size_t(i)]);
    }
    for (int64_t i : set) {
      const LD xhat = (LD(x[size_t(i)]) - mean) * rstd;
      r.dx[size_t(i)] = rstd * (LD(g[size_t(i)]) * LD(w[size_t(feature(i))]) - mean_gw - xhat * mean_gwx);
    }
    r.mean.push_back(mean);
    r.var.push_back(var);
  }
  return r;
}

// One set of norm inputs: x = offset + spread * N(0, 1), normalised with eps.
struct NormCase {
  std::string name;
  double offset, spread, eps;
};

// The cases for a dtype. Offset 1e4 with a small spread: E[x^2] = 1e8 leaves nothing of the
// variance at f32 (its ulp there is 8) and only 1e-2 of it at f64 (spread 1e-3), so a one-pass
// variance fails, and a two-pass one is limited only by the mean's rounding. 16-bit inputs hold
// fewer digits: offsets and spreads they can represent.
std::vector<NormCase> norm_cases(DType dt) {
  std::vector<NormCase> c = {{"scale 1e4", 0, 1e4, 1e-5}, {"all equal", 1000, 0, 1e-5}};
  switch (dt) {
    case DType::f64:
      c.push_back({"offset 1e4, spread 1e-3", 1e4, 1e-3, 1e-5});
      c.push_back({"variance 1e-12 under eps 1e-5", 1, 1e-6, 1e-5});
      c.push_back({"variance 1e-12 with eps 1e-15", 1, 1e-6, 1e-15});
      break;
    case DType::f32:
      c.push_back({"offset 1e4, spread 1", 1e4, 1, 1e-5});
      c.push_back({"variance 1e-8 under eps 1e-5", 1, 1e-4, 1e-5});
      c.push_back({"variance 1e-8 with eps 1e-12", 1, 1e-4, 1e-12});
      break;
    case DType::f16:
      c.push_back({"offset 1e3, spread 8", 1e3, 8, 1e-5});
      break;
    default:
      c.push_back({"offset 1e4, spread 256", 1e4, 256, 1e-5});
      break;
  }
  return c;
}

// Tolerances of a norm's outputs: the mean is rounded to the accumulation dtype at the inputs'
// magnitude, an error that xhat divides by sqrt(var + eps) (cond); 16-bit results are rounded once
// more on the way out. The factor is an estimate, not a bound (a sum of n terms may round by up to
// n units): how the sums round depends on which a*b + c the compiler fuses into FMAs, and where an
// -O2 build stays within 32 units, an -O1 (sanitizer) build reaches 80 on rows of 1000. A one-pass
// variance is still caught by orders of magnitude (a negative variance in f32, 3-14% in f64).
Tol norm_tol(DType dt, double cond) { return {128 * acc_unit(dt) * cond + 4 * unit(dt), 4 * unit(dt)}; }

// cond of the norm's sets: max |x| / sqrt(var + eps) (1 where every set is constant: its mean is
// exact, and so are xhat = 0 and y = b).
double norm_cond(const Vec& x, const NormRef& ref, const Sets& sets, double eps) {
  double cond = 1;
  for (size_t k = 0; k < sets.size(); ++k) {
    if (ref.var[k] == 0) continue;
    double mx = 0;
    for (int64_t i : sets[k]) mx = std::max(mx, std::fabs(x[size_t(i)]));
    cond = std::max(cond, mx / double(std::sqrt(ref.var[k] + LD(eps))));
  }
  return cond;
}

// Inputs of one case: x (numel), g, and per-feature w, b around 1 and 0 (in the dtype, on dev).
struct NormInputs {
  Tensor x, g, w, b;
};
NormInputs norm_inputs(const NormCase& nc, const Shape& shape, int64_t features, DType dt, Device dev,
                       uint64_t seed) {
  Draws d(seed);
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  Vec x(static_cast<size_t>(n)), g = d.normals(static_cast<size_t>(n)), w(static_cast<size_t>(features)),
      b(static_cast<size_t>(features));
  for (double& v : x) v = nc.offset + nc.spread * d.normal();
  for (double& v : w) v = 1 + 0.5 * d.normal();
  for (double& v : b) v = 0.5 * d.normal();
  return {make(x, shape, dt, dev, true), make(g, shape, dt, dev), make(w, {features}, dt, dev, true),
          make(b, {features}, dt, dev, true)};
}

// group_norm and batch_norm apply the affine map folded, y = x (rstd w) + (b - mean rstd w), as
// PyTorch's CPU kernels do: exact in exact arithmetic, but rounded at the magnitude of x rstd w, so
// y carries an absolute error of a few u |x| rstd |w| even where the statistics are exact (an
// all-equal set: xhat = 0, y = b). That is the error a relative perturbation u of x itself causes;
// layer_norm forms (x - mean) rstd first and has none of it. The allowance for it, in y only:
double folded_affine_error(const Vec& x, const NormRef& ref, const Sets& sets, const Vec& w, double eps, DType dt) {
  double worst = 0, max_w = 0;
  for (double v : w) max_w = std::max(max_w, std::fabs(v));
  for (size_t k = 0; k < sets.size(); ++k) {
    double mx = 0;
    for (int64_t i : sets[k]) mx = std::max(mx, std::fabs(x[size_t(i)]));
    worst = std::max(worst, mx / double(std::sqrt(ref.var[k] + LD(eps))));
  }
  return 4 * acc_unit(dt) * worst * max_w;
}

void expect_norm(const NormInputs& in, const Tensor& y, const NormRef& ref, Tol tol, double y_fold = 0) {
  ASSERT_TRUE(in.x.grad().defined() && in.w.grad().defined() && in.b.grad().defined());
  expect_close(host(y), ref.y, {tol.atol * std::max<double>(1.0, double(max_abs(ref.y))) + y_fold, tol.rtol}, "y");
  expect_close_scaled(host(in.x.grad()), ref.dx, tol, "dx");
  expect_close_scaled(host(in.w.grad()), ref.dw, tol, "dw");
  expect_close_scaled(host(in.b.grad()), ref.db, tol, "db");
}

TEST(ExtremeValues, LayerNormOfHugeOffsetsAndTinyVariancesMatchesLongDouble) {
  // Rows of 64 and of 1000 values (long rows round their sums more).
  for (int64_t cols : {64, 1000}) {
    const int64_t rows = 3;
    Sets sets(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) sets[size_t(r)].push_back(r * cols + j);
    for (Device dev : test_devices())
      for (DType dt : kAllFloat)
        for (const NormCase& nc : norm_cases(dt)) {
          SCOPED_TRACE(where(dev, dt) + ", " + nc.name + ", rows of " + std::to_string(cols));
          NormInputs in = norm_inputs(nc, {rows, cols}, cols, dt, dev, 100 + uint64_t(cols));
          Tensor y = layer_norm(in.x, {cols}, in.w, in.b, nc.eps);
          y.backward(in.g);
          const Vec x = host(in.x);
          const NormRef ref = norm_ref(x, host(in.g), host(in.w), host(in.b), sets,
                                       [cols](int64_t i) { return i % cols; }, cols, nc.eps);
          expect_norm(in, y, ref, norm_tol(dt, norm_cond(x, ref, sets, nc.eps)));
        }
  }
}

TEST(ExtremeValues, GroupNormOfHugeOffsetsAndTinyVariancesMatchesLongDouble) {
  const int64_t N = 2, C = 4, S = 24, G = 2;  // sets of C/G * S = 48 values
  Sets sets(size_t(N * G));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t s = 0; s < S; ++s) sets[size_t(n * G + c / (C / G))].push_back((n * C + c) * S + s);
  for (Device dev : test_devices())
    for (DType dt : kAllFloat)
      for (const NormCase& nc : norm_cases(dt)) {
        SCOPED_TRACE(where(dev, dt) + ", " + nc.name);
        NormInputs in = norm_inputs(nc, {N, C, 4, 6}, C, dt, dev, 200);
        Tensor y = group_norm(in.x, G, in.w, in.b, nc.eps);
        y.backward(in.g);
        const Vec x = host(in.x);
        const NormRef ref = norm_ref(x, host(in.g), host(in.w), host(in.b), sets,
                                     [](int64_t i) { return (i / S) % C; }, C, nc.eps);
        expect_norm(in, y, ref, norm_tol(dt, norm_cond(x, ref, sets, nc.eps)),
                    folded_affine_error(x, ref, sets, host(in.w), nc.eps, dt));
      }
}

TEST(ExtremeValues, BatchNormOfHugeOffsetsAndTinyVariancesMatchesLongDouble) {
  // Training mode: batch statistics per channel over (N, H, W), and the running statistics updated
  // from 0 and 1 with momentum 0.1 (running_var from the unbiased variance, var n / (n - 1)).
  const int64_t N = 5, C = 3, S = 12;
  Sets sets(static_cast<size_t>(C));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t s = 0; s < S; ++s) sets[size_t(c)].push_back((n * C + c) * S + s);
  const double momentum = 0.1;
  for (Device dev : test_devices())
    for (DType dt : kAllFloat)
      for (const NormCase& nc : norm_cases(dt)) {
        SCOPED_TRACE(where(dev, dt) + ", " + nc.name);
        NormInputs in = norm_inputs(nc, {N, C, 3, 4}, C, dt, dev, 300);
        const DType stat_dt = dt == DType::f64 ? DType::f64 : DType::f32;
        Tensor rm = make(Vec(size_t(C), 0.0), {C}, stat_dt, dev), rv = make(Vec(size_t(C), 1.0), {C}, stat_dt, dev);
        Tensor y = batch_norm(in.x, rm, rv, in.w, in.b, true, momentum, nc.eps);
        y.backward(in.g);
        const Vec x = host(in.x);
        const NormRef ref = norm_ref(x, host(in.g), host(in.w), host(in.b), sets,
                                     [](int64_t i) { return (i / S) % C; }, C, nc.eps);
        const Tol tol = norm_tol(dt, norm_cond(x, ref, sets, nc.eps));
        expect_norm(in, y, ref, tol, folded_affine_error(x, ref, sets, host(in.w), nc.eps, dt));
        LVec want_rm, want_rv;
        const LD n = LD(N * S);
        for (int64_t c = 0; c < C; ++c) {
          want_rm.push_back((1 - LD(momentum)) * 0 + LD(momentum) * ref.mean[size_t(c)]);
          want_rv.push_back((1 - LD(momentum)) * 1 + LD(momentum) * ref.var[size_t(c)] * n / (n - 1));
        }
        // The mean's rounding is at x's magnitude; the variance's error is that of xhat^2, relative.
        double max_x = 0;
        for (double v : x) max_x = std::max(max_x, std::fabs(v));
        expect_close(host(rm), want_rm, {momentum * 32 * acc_unit(dt) * max_x, 4 * acc_unit(dt)}, "running_mean");
        expect_close(host(rv), want_rv, {tol.atol, tol.atol + 4 * acc_unit(dt)}, "running_var");
      }
}

}  // namespace
