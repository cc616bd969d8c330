// Extreme values for every reduction that stabilises itself numerically: softmax, log_softmax and
// cross_entropy (max-shifted exp and log-sum-exp), masked_softmax and fused causal attention (max
// shift per query row, and across key tiles on the GPU), layer_norm, group_norm and batch_norm
// (two-pass statistics). reel has no public logsumexp or rms_norm op; cross_entropy's loss is the
// log-sum-exp it exposes.
//
// Inputs: logits near +1000 and -1000 (exp overflows to inf, or underflows to 0, without the max
// shift), rows mixing both with the maximum anywhere in the row, all-equal rows, 3e4 logits; norm
// inputs of scale 1e4, offset 1e4 with a small spread (where E[x^2] - E[x]^2 cancels to nothing or
// to a negative variance), tiny variances below eps and with a tiny eps, all-equal sets. Every
// forward value and every gradient is compared with long double loops written in this file from
// the definitions (softmax, its Jacobian, softmax - onehot, the two-pass mean and variance and the
// norm's analytic gradient, attention's softmax(q k^T / sqrt(hd)) v and its gradient), computed
// from the inputs as rounded to the tested dtype; nothing may be inf or NaN. Each case runs on the
// CPU and, when one is usable, on the GPU (inputs moved there, results read back), in f64 and f32,
// and in f16 and bf16 where the op takes them, with tolerances of a few roundings of the dtype (at
// the magnitude of the inputs where that is what bounds any implementation). Two allowances follow
// the ops' formulation and are explained where they are made: cross_entropy's gradient recomputes
// softmax from its rounded log-sum-exp, and group_norm and batch_norm fold the affine map.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <limits>
#include <string>
#include <vector>

#include "kernels/dispatch.h"
#include "reel.h"
#include "tensor/cuda.h"
#include "test_util.h"

using namespace reel;

namespace {

using LD = long double;
using Vec = std::vector<double>;
using LVec = std::vector<LD>;

using testing_util::test_devices;

const std::vector<DType> kAllFloat = {DType::f64, DType::f32, DType::f16, DType::bf16};

std::string where(Device dev, DType dt) { return dev.str() + " " + dtype_name(dt); }

// Unit roundoff of a dtype, and of the dtype its reductions accumulate in.
double unit(DType dt) {
  switch (dt) {
    case DType::f64: return 0x1p-53;
    case DType::f32: return 0x1p-24;
    case DType::f16: return 0x1p-11;
    default: return 0x1p-8;  // bf16
  }
}
double acc_unit(DType dt) { return dt == DType::f64 ? 0x1p-53 : 0x1p-24; }

struct Tol {
  double atol, rtol;
};

// Results of O(1): a few roundings of the dtype (16-bit results are rounded once on the way out).
Tol tol_of(DType dt) {
  switch (dt) {
    case DType::f64: return {1e-13, 1e-13};
    case DType::f32: return {2e-6, 2e-6};
    case DType::f16: return {2e-3, 2e-3};
    default: return {1.6e-2, 1.6e-2};
  }
}

// Deterministic standard normal draws (splitmix64 and Box-Muller), independent of reel's generator.
struct Draws {
  uint64_t state;
  explicit Draws(uint64_t seed) : state(seed) {}
  double uniform() {  // (0, 1)
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double(z >> 11) + 0.5) * 0x1p-53;
  }
  double normal() { return std::sqrt(-2 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()); }
  Vec normals(size_t n) {
    Vec v(n);
    for (double& x : v) x = normal();
    return v;
  }
};

Tensor make(const Vec& v, const Shape& s, DType dt, Device dev, bool requires_grad = false) {
  return tensor(v, s, TensorOptions().with_dtype(dt).with_device(dev).with_requires_grad(requires_grad));
}

// The values of t as the library holds them (rounded to its dtype), read back to the host.
Vec host(const Tensor& t) { return t.to_vector<double>(); }

LD max_abs(const LVec& v) {
  LD m = 0;
  for (LD x : v) m = std::max(m, std::fabs(x));
  return m;
}

// Every value of `got` finite and within atol + rtol |want| of `want`; reports the first few misses.
void expect_close(const Vec& got, const LVec& want, Tol tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int misses = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double w = double(want[i]);
    const double err = std::fabs(got[i] - w);
    if (std::isfinite(got[i]) && err <= tol.atol + tol.rtol * std::fabs(w)) continue;
    if (++misses > 4) continue;
    ADD_FAILURE() << what << " [" << i << "]: got " << std::setprecision(17) << got[i] << ", want " << w
                  << " (error " << err << ", allowed " << tol.atol + tol.rtol * std::fabs(w) << ")";
  }
  if (misses > 4) ADD_FAILURE() << what << ": " << misses << " values out of tolerance in all";
}

// The same with the absolute part scaled by the largest reference magnitude (gradients whose scale
// follows 1/std or a sum over a set).
void expect_close_scaled(const Vec& got, const LVec& want, Tol tol, const std::string& what) {
  expect_close(got, want, {tol.atol * std::max<double>(1.0, double(max_abs(want))), tol.rtol}, what);
}

// |got - want| <= rel * terms + tiny for every value (terms: the sum of |term| of the reference's
// sum, the magnitude a rounding error of relative size rel in its terms reaches).
void expect_close_terms(const Vec& got, const LVec& want, const LVec& terms, double rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int misses = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - double(want[i])), allowed = rel * double(terms[i]) + 1e-300;
    if (std::isfinite(got[i]) && err <= allowed) continue;
    if (++misses > 4) continue;
    ADD_FAILURE() << what << " [" << i << "]: got " << std::setprecision(17) << got[i] << ", want "
                  << double(want[i]) << " (error " << err << ", allowed " << allowed << ")";
  }
  if (misses > 4) ADD_FAILURE() << what << ": " << misses << " values out of tolerance in all";
}

Vec transpose(const Vec& a, int64_t rows, int64_t cols) {
  Vec t(a.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = a[size_t(r * cols + c)];
  return t;
}

// ---------------------------------------------------------------- softmax-like references

// softmax, log_softmax and log-sum-exp of one row, in long double, from the definitions.
struct RowRef {
  LVec p, logp;
  LD lse;
};
RowRef row_ref(const Vec& x) {
  LD m = -std::numeric_limits<LD>::infinity();
  for (double v : x) m = std::max<LD>(m, v);
  LD s = 0;
  for (double v : x) s += std::exp(LD(v) - m);
  RowRef r{LVec(x.size()), LVec(x.size()), m + std::log(s)};
  for (size_t i = 0; i < x.size(); ++i) {
    r.p[i] = std::exp(LD(x[i]) - m) / s;
    r.logp[i] = (LD(x[i]) - m) - std::log(s);
  }
  return r;
}

// Logit rows (6 classes): near +1000, near -1000, mixed (maximum in the middle, at the end, first
// element -1000), all equal (high, low, zero), far past exp's range.
const int64_t kClasses = 6;
const std::vector<Vec> kLogitRows = {
    {1000, 999, 998.5, 1000.25, 990, 1001},
    {-1000, -999, -1001.5, -1000.25, -1010, -998},
    {1000, -1000, 0, 1000, -1000, 999},
    {-1000, 1000, -1000, -1000, -1000, -1000},
    {-1000, -1000, 1000, -999.5, 999.75, 1000},
    {1000, 1000, 1000, 1000, 1000, 1000},
    {-1000, -1000, -1000, -1000, -1000, -1000},
    {0, 0, 0, 0, 0, 0},
    {30000, -30000, 29999, 0, -1, 29998.5},
};

Vec flat_rows(const std::vector<Vec>& rows) {
  Vec v;
  for (const Vec& r : rows) v.insert(v.end(), r.begin(), r.end());
  return v;
}

// softmax or log_softmax of the logit rows, forward and backward (dy = g, a fixed pattern in
// [-1, 1]) against the reference, along the last dim of (rows, C) and along dim 0 of (C, rows) (the
// strided, panel path).
void check_softmax_like(bool log) {
  const int64_t R = int64_t(kLogitRows.size()), C = kClasses;
  const Vec x_rows = flat_rows(kLogitRows);
  Vec g_rows(x_rows.size());
  for (size_t i = 0; i < g_rows.size(); ++i) g_rows[i] = std::sin(1.0 + 0.7 * double(i));
  for (Device dev : test_devices())
    for (DType dt : kAllFloat)
      for (bool along_rows : {true, false}) {
        SCOPED_TRACE(where(dev, dt) + (along_rows ? ", along the last dim" : ", along dim 0"));
        const Shape shape = along_rows ? Shape{R, C} : Shape{C, R};
        const int64_t dim = along_rows ? 1 : 0;
        auto layout = [&](const Vec& rows_major) { return along_rows ? rows_major : transpose(rows_major, R, C); };
        auto unlayout = [&](const Vec& v) { return along_rows ? v : transpose(v, C, R); };
        Tensor x = make(layout(x_rows), shape, dt, dev, true);
        Tensor g = make(layout(g_rows), shape, dt, dev);
        Tensor y = log ? log_softmax(x, dim) : softmax(x, dim);
        y.backward(g);
        ASSERT_TRUE(x.grad().defined());
        const Vec xr = unlayout(host(x)), gr = unlayout(host(g));
        LVec want_y, want_dx;
        for (int64_t r = 0; r < R; ++r) {
          const Vec row(xr.begin() + r * C, xr.begin() + (r + 1) * C);
          const RowRef ref = row_ref(row);
          LD sum_g = 0, sum_gp = 0;
          for (int64_t c = 0; c < C; ++c) {
            sum_g += gr[size_t(r * C + c)];
            sum_gp += gr[size_t(r * C + c)] * ref.p[size_t(c)];
          }
          for (int64_t c = 0; c < C; ++c) {
            const LD gc = gr[size_t(r * C + c)], pc = ref.p[size_t(c)];
            want_y.push_back(log ? ref.logp[size_t(c)] : pc);
            // d/dx of sum g softmax = p (g - sum g p);  of sum g log_softmax = g - p sum g.
            want_dx.push_back(log ? gc - pc * sum_g : pc * (gc - sum_gp));
          }
        }
        expect_close(unlayout(host(y)), want_y, tol_of(dt), log ? "log_softmax" : "softmax");
        expect_close(unlayout(host(x.grad())), want_dx, tol_of(dt), log ? "d log_softmax" : "d softmax");
      }
}

TEST(ExtremeValues, SoftmaxOfHugeAndMixedLogitsMatchesLongDouble) { check_softmax_like(false); }

TEST(ExtremeValues, LogSoftmaxOfHugeAndMixedLogitsMatchesLongDouble) { check_softmax_like(true); }

// ---------------------------------------------------------------- cross-entropy

// Cross-entropy's loss: its error is the rounding of the log-sum-exp, which is of the logits'
// magnitude (1000), in the accumulation dtype, then the loss's own rounding.
Tol ce_tol(DType dt) {
  switch (dt) {
    case DType::f64: return {1e-12, 1e-13};
    case DType::f32: return {1.5e-4, 2e-6};
    case DType::f16: return {2e-3, 2e-3};
    default: return {1.6e-2, 1.6e-2};
  }
}

TEST(ExtremeValues, CrossEntropyWithLogitsNear1000MatchesLongDouble) {
  // Rows of kLogitRows with a target each (at the maximum, at -1000 beside +1000, in all-equal
  // rows, at -30000 beside 30000: losses from log 6 to 60000), and one extra row of +-1e4 whose
  // target is ignore_index.
  const std::vector<int64_t> targets_of_rows = {5, 1, 1, 0, 2, 3, 4, 2, 1};
  std::vector<Vec> rows = kLogitRows;
  rows.push_back({1e4, -1e4, 1e4, -1e4, 0, 5});
  std::vector<int64_t> target = targets_of_rows;
  target.push_back(-100);
  const int64_t N = int64_t(rows.size()), C = kClasses;
  for (Device dev : test_devices())
    for (DType dt : kAllFloat)
      for (const char* reduction : {"mean", "sum"}) {
        SCOPED_TRACE(where(dev, dt) + ", reduction " + reduction);
        const bool mean = std::string(reduction) == "mean";
        Tensor logits = make(flat_rows(rows), {N, C}, dt, dev, true);
        Tensor t = tensor_i64(target, {N}, dev);
        Tensor loss = cross_entropy(logits, t, reduction);
        const double upstream = mean ? 1.0 : 0.75;
        loss.backward(full({}, upstream, TensorOptions().with_dtype(dt).with_device(dev)));
        ASSERT_TRUE(logits.grad().defined());
        const Vec x = host(logits);
        // loss_n = lse_n - x[n, t_n]; dlogits = (softmax - onehot) * upstream / count, 0 where ignored.
        LD total = 0;
        int64_t count = 0;
        LVec want_dx(size_t(N * C), 0), per_row;
        for (int64_t n = 0; n < N; ++n) {
          if (target[size_t(n)] == -100) continue;
          ++count;
          const RowRef ref = row_ref(Vec(x.begin() + n * C, x.begin() + (n + 1) * C));
          const LD l = ref.lse - LD(x[size_t(n * C + target[size_t(n)])]);
          per_row.push_back(l);
          total += l;
        }
        // The op's backward forms softmax as exp(x - lse) from the lse its forward saved, rounded to
        // the accumulation dtype: p is then off by up to u |lse| relatively (what a relative
        // perturbation u of the logits causes), 2e-5 at logits of 1000 and 5e-4 at 3e4 in f32, where
        // the softmax op itself stays within tol_of on the same rows. The allowance adds that to
        // the result's own rounding.
        const LD scale = LD(upstream) / (mean ? LD(count) : 1.0L);
        const Tol t16 = tol_of(dt);
        LVec allowed(size_t(N * C), LD(t16.atol));
        for (int64_t n = 0; n < N; ++n) {
          if (target[size_t(n)] == -100) continue;
          const RowRef ref = row_ref(Vec(x.begin() + n * C, x.begin() + (n + 1) * C));
          for (int64_t c = 0; c < C; ++c) {
            const size_t i = size_t(n * C + c);
            want_dx[i] = (ref.p[size_t(c)] - (c == target[size_t(n)] ? 1 : 0)) * scale;
            allowed[i] += LD(t16.rtol) * std::fabs(want_dx[i]) +
                          4 * LD(acc_unit(dt)) * std::fabs(ref.lse) * ref.p[size_t(c)] * scale;
          }
        }
        expect_close({loss.item()}, {mean ? total / LD(count) : total}, ce_tol(dt), "loss");
        expect_close_terms(host(logits.grad()), want_dx, allowed, 1.0, "dlogits");
        // Each row alone: the loss of one row near 1000 is lse - x_t (small, or about 2000).
        if (!mean) continue;
        size_t k = 0;
        for (int64_t n = 0; n < N; ++n) {
          if (target[size_t(n)] == -100) continue;
          NoGradGuard no_grad;
          Tensor one = cross_entropy(logits.slice(0, n, n + 1), t.slice(0, n, n + 1), "sum");
          expect_close({one.item()}, {per_row[k++]}, ce_tol(dt), "loss of row " + std::to_string(n));
        }
      }
}

TEST(ExtremeValues, CrossEntropyLossModuleAgreesOnHugeLogits) {
  // The nn module over the same op: logits 1000 apart, targets at the low logit.
  for (Device dev : test_devices())
    for (DType dt : {DType::f64, DType::f32}) {
      SCOPED_TRACE(where(dev, dt));
      Tensor logits = make({1000, -1000, -1000, 1000, 500, -500}, {3, 2}, dt, dev, true);
      Tensor t = tensor_i64({1, 0, 1}, {3}, dev);
      nn::CrossEntropyLoss ce;
      Tensor loss = ce(logits, t);
      loss.backward();
      // Per row: lse = max + log(1 + exp(-gap)) with gap 2000, 2000, 1000, so the losses are
      // 2000, 2000 and 1000 plus log1p(exp(-gap)) (0 in any dtype); mean 5000 / 3.
      expect_close({loss.item()}, {5000.0L / 3}, ce_tol(dt), "mean loss");
      // softmax is one-hot at the maximum: dlogits = (onehot(max) - onehot(target)) / 3.
      const LD third = 1.0L / 3;
      expect_close(host(logits.grad()), {third, -third, -third, third, third, -third}, tol_of(dt), "dlogits");
    }
}

// ---------------------------------------------------------------- masked softmax

TEST(ExtremeValues, MaskedSoftmaxOfHugeLogitsMatchesLongDouble) {
  // x (B, T, C) f32 (the op's only dtype), the (T, C) causal mask plus one more masked entry, fill
  // -inf; rows near +1000, near -1000 and mixed, so each row's maximum is far from 0.
  const int64_t B = 2, T = 6, C = 6;
  Draws d(41);
  Vec x(size_t(B * T * C)), mask(size_t(T * C), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const double base = (t + b) % 3 == 0 ? 1000 : (t + b) % 3 == 1 ? -1000 : ((c % 2) ? 1000 : -1000);
        x[size_t((b * T + t) * C + c)] = base + 2 * d.normal();
      }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) mask[size_t(t * C + c)] = c > t ? 1 : 0;
  mask[size_t(5 * C + 0)] = 1;
  Vec g = d.normals(x.size());
  const double inf = std::numeric_limits<double>::infinity();
  for (Device dev : test_devices()) {
    SCOPED_TRACE(dev.str());
    Tensor xt = make(x, {B, T, C}, DType::f32, dev), mt = make(mask, {T, C}, DType::f32, dev);
    Tensor gt = make(g, {B, T, C}, DType::f32, dev);
    std::vector<Tensor> y = dispatch(OpKind::MaskedSoftmax, {xt, mt}, Attrs().set("value", -inf));
    ASSERT_EQ(y.size(), 1u);
    std::vector<Tensor> dx = dispatch(OpKind::MaskedSoftmaxBackward, {gt, y[0], mt}, Attrs());
    ASSERT_EQ(dx.size(), 1u);
    const Vec xr = host(xt), gr = host(gt);
    LVec want_y(x.size(), 0), want_dx(x.size(), 0);
    for (int64_t row = 0; row < B * T; ++row) {
      const int64_t t = row % T;
      Vec kept;
      for (int64_t c = 0; c < C; ++c)
        if (mask[size_t(t * C + c)] == 0) kept.push_back(xr[size_t(row * C + c)]);
      const RowRef ref = row_ref(kept);
      LD sum_gp = 0;
      for (int64_t c = 0, k = 0; c < C; ++c)
        if (mask[size_t(t * C + c)] == 0) sum_gp += gr[size_t(row * C + c)] * ref.p[size_t(k++)];
      for (int64_t c = 0, k = 0; c < C; ++c) {
        if (mask[size_t(t * C + c)] != 0) continue;  // masked: y = 0, dx = 0
        const LD p = ref.p[size_t(k++)];
        want_y[size_t(row * C + c)] = p;
        want_dx[size_t(row * C + c)] = p * (gr[size_t(row * C + c)] - sum_gp);
      }
    }
    expect_close(host(y[0]), want_y, tol_of(DType::f32), "masked softmax");
    expect_close(host(dx[0]), want_dx, tol_of(DType::f32), "masked softmax backward");
  }
}

// ---------------------------------------------------------------- fused causal attention

struct AttnRef {
  LVec y, dqkv;
  LVec y_terms, dqkv_terms;  // the same sums over |term|: the scale their rounding errors follow
};

// softmax(q k^T / sqrt(hd), causal) v per (batch, head) and its gradient for dy, in long double:
//   S_ts = scale q_t.k_s (s <= t), P = softmax_s(S), y_t = sum_s P_ts v_s;
//   dP_ts = dy_t.v_s, dS_ts = P_ts (dP_ts - sum_s' P_ts' dP_ts'), dq_t = scale sum_s dS_ts k_s,
//   dk_s = scale sum_t dS_ts q_t, dv_s = sum_t P_ts dy_t.
AttnRef attention_ref(const Vec& qkv, const Vec& dy, int64_t B, int64_t T, int64_t d, int64_t H) {
  const int64_t hd = d / H, W = 3 * d;
  const LD scale = 1.0L / std::sqrt(LD(hd));
  AttnRef r{LVec(size_t(B * T * d), 0), LVec(size_t(B * T * W), 0), LVec(size_t(B * T * d), 0),
            LVec(size_t(B * T * W), 0)};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      auto at = [&](int64_t t, int64_t part, int64_t c) { return size_t((b * T + t) * W + part * d + h * hd + c); };
      auto yat = [&](int64_t t, int64_t c) { return size_t((b * T + t) * d + h * hd + c); };
      std::vector<LVec> P(size_t(T), LVec(size_t(T), 0));
      for (int64_t t = 0; t < T; ++t) {
        LVec s(size_t(t + 1));
        LD m = -std::numeric_limits<LD>::infinity();
        for (int64_t j = 0; j <= t; ++j) {
          LD dot = 0;
          for (int64_t c = 0; c < hd; ++c) dot += LD(qkv[at(t, 0, c)]) * LD(qkv[at(j, 1, c)]);
          s[size_t(j)] = scale * dot;
          m = std::max(m, s[size_t(j)]);
        }
        LD z = 0;
        for (int64_t j = 0; j <= t; ++j) z += std::exp(s[size_t(j)] - m);
        for (int64_t j = 0; j <= t; ++j) P[size_t(t)][size_t(j)] = std::exp(s[size_t(j)] - m) / z;
        for (int64_t c = 0; c < hd; ++c)
          for (int64_t j = 0; j <= t; ++j) {
            r.y[yat(t, c)] += P[size_t(t)][size_t(j)] * LD(qkv[at(j, 2, c)]);
            r.y_terms[yat(t, c)] += P[size_t(t)][size_t(j)] * std::fabs(LD(qkv[at(j, 2, c)]));
          }
      }
      for (int64_t t = 0; t < T; ++t) {
        LVec dP(size_t(t + 1));
        LD D = 0;
        for (int64_t j = 0; j <= t; ++j) {
          LD dot = 0;
          for (int64_t c = 0; c < hd; ++c) dot += LD(dy[yat(t, c)]) * LD(qkv[at(j, 2, c)]);
          dP[size_t(j)] = dot;
          D += P[size_t(t)][size_t(j)] * dot;
        }
        for (int64_t j = 0; j <= t; ++j) {
          const LD p = P[size_t(t)][size_t(j)], dS = p * (dP[size_t(j)] - D);
          for (int64_t c = 0; c < hd; ++c) {
            const LD q = qkv[at(t, 0, c)], k = qkv[at(j, 1, c)], g = dy[yat(t, c)];
            r.dqkv[at(t, 0, c)] += scale * dS * k;
            r.dqkv[at(j, 1, c)] += scale * dS * q;
            r.dqkv[at(j, 2, c)] += p * g;
            // dS itself sums terms of P |dP| and P |D|.
            const LD dS_terms = p * (std::fabs(dP[size_t(j)]) + std::fabs(D));
            r.dqkv_terms[at(t, 0, c)] += scale * dS_terms * std::fabs(k);
            r.dqkv_terms[at(j, 1, c)] += scale * dS_terms * std::fabs(q);
            r.dqkv_terms[at(j, 2, c)] += p * std::fabs(g);
          }
        }
      }
    }
  return r;
}

TEST(ExtremeValues, AttentionWithScoresNear1000MatchesLongDouble) {
  // q = a + noise, k = +-a + noise and scale a^2 hd = 1000, so every score is near +1000 or -1000
  // with O(1) differences: batch 0 mixes signs within each row; in batch 1 the first keys (the
  // whole first 64-key tile when T = 70) score near -1000 and the later ones near +1000, so a
  // running maximum must move from -1000 to +1000 between key tiles. Head size 4 (the GPU's row
  // kernels) and 32 with T = 70 (its tiled 16-bit kernels and a partial second tile).
  struct Config {
    int64_t B, T, d, H;
  };
  for (Config cf : {Config{2, 9, 8, 2}, Config{2, 70, 64, 2}}) {
    const int64_t hd = cf.d / cf.H, W = 3 * cf.d, split = cf.T > 64 ? 64 : cf.T / 2;
    const double a = std::sqrt(1000.0 / std::sqrt(double(hd))), noise = 1.5 / a;
    Draws dr(7 + uint64_t(cf.T));
    Vec qkv(size_t(cf.B * cf.T * W)), dy = dr.normals(size_t(cf.B * cf.T * cf.d));
    for (int64_t b = 0; b < cf.B; ++b)
      for (int64_t t = 0; t < cf.T; ++t) {
        const double sign = b == 0 ? (t % 3 == 1 ? -1.0 : 1.0) : (t < split ? -1.0 : 1.0);
        for (int64_t c = 0; c < cf.d; ++c) {
          const size_t base = size_t((b * cf.T + t) * W);
          qkv[base + size_t(c)] = a + noise * dr.normal();
          qkv[base + size_t(cf.d + c)] = sign * a + noise * dr.normal();
          qkv[base + size_t(2 * cf.d + c)] = dr.normal();
        }
      }
    for (Device dev : test_devices())
      for (DType dt : kAllFloat) {
        SCOPED_TRACE(where(dev, dt) + ", T " + std::to_string(cf.T) + ", head size " + std::to_string(hd));
        Tensor x = make(qkv, {cf.B, cf.T, W}, dt, dev, true);
        Tensor g = make(dy, {cf.B, cf.T, cf.d}, dt, dev);
        Tensor y = scaled_causal_attention(x, cf.H);
        y.backward(g);
        ASSERT_TRUE(x.grad().defined());
        const AttnRef ref = attention_ref(host(x), host(g), cf.B, cf.T, cf.d, cf.H);
        // A score of 1000 is a sum of hd products, rounded in the accumulation dtype: an absolute
        // error up to hd u 1000, which exp turns into that relative error of P. 16-bit compute also
        // rounds P and dS (and the results) to the dtype.
        const double rel = 4 * acc_unit(dt) * 1000 * double(hd) + 8 * unit(dt);
        expect_close_terms(host(y), ref.y, ref.y_terms, rel, "y");
        const Vec dx = host(x.grad());
        for (int part = 0; part < 3; ++part) {
          Vec got;
          LVec want, terms;
          for (int64_t bt = 0; bt < cf.B * cf.T; ++bt)
            for (int64_t c = 0; c < cf.d; ++c) {
              const size_t i = size_t(bt * W + part * cf.d + c);
              got.push_back(dx[i]);
              want.push_back(ref.dqkv[i]);
              terms.push_back(ref.dqkv_terms[i]);
            }
          expect_close_terms(got, want, terms, rel, part == 0 ? "dq" : part == 1 ? "dk" : "dv");
        }
      }
  }
}

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
