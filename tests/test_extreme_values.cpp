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
// This file holds the softmax-like ops and attention; the norms are in test_extreme_values_norm.cpp,
// the shared tolerances and comparisons in extreme_values_util.h.
#include "extreme_values_util.h"

using namespace reel;
using namespace reel::extreme_values;

namespace {

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

}  // namespace
