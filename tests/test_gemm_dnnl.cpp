// The CPU matmul kernels on their two f32 GEMM backends (kernels/cpu/sgemm.h): oneDNN's sgemm (the
// default) and Eigen's GEMM (REEL_CPU_GEMM=eigen), each against a plain triple loop in f64 over the
// logical values, on 1x1, vector, tall, wide, odd, long-K and threaded shapes, all four transpose
// layouts, sliced rows (leading dimension > columns), broadcast and expanded batch dims, and the
// accumulate-into op (matmul_into), in f32, bf16 and f16; and cpu::gemm's output stride and alpha.
//
// Tolerance. Each output is a dot product s = sum_k a_k b_k of length K. Summed in f32 in any order,
// with or without FMA, blocked over K or split over threads, |fl(s) - s| <= gamma_K sum_k |a_k b_k|,
// gamma_K = K u / (1 - K u), u = 2^-24 (Higham, Accuracy and Stability of Numerical Algorithms,
// §3.1). That bound holds for every backend and thread count, so the tests use it, computed per
// element from the same loop (the f64 reference's own error, ~K 2^-53, is far inside it). A 16-bit
// result is rounded once more: |round(x) - x| <= u16 |x| (u16 = 2^-8 for bf16, 2^-11 for f16), so
// bound16 = gamma_K S + u16 (|s| + gamma_K S). The inputs are exact in every dtype (the reference reads
// the stored values), so nothing else enters. The two backends are not compared bit for bit with
// each other (their blockings differ); each is compared bit for bit with the library it claims to run.
#include <gtest/gtest.h>

#include <dnnl.h>

#include <Eigen/Dense>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cpu/compose.h"
#include "kernels/cpu/sgemm.h"
#include "reel.h"
#include "tests/test_util.h"

using namespace reel;
using cpu::CpuGemm;
using testing_util::random;

namespace {

// Runs its scope on one backend, then restores the one before.
struct BackendScope {
  CpuGemm saved;
  explicit BackendScope(CpuGemm b) : saved(cpu::cpu_gemm()) { cpu::set_cpu_gemm(b); }
  ~BackendScope() { cpu::set_cpu_gemm(saved); }
};

struct Ref {
  Shape shape;
  std::vector<double> value, abs_sum;  // s and sum_k |a_k b_k| per output element
};

// a (..., M, K) @ b (..., K, N), batch dims broadcast, by triple loop over the logical values.
Ref reference(const Tensor& a, const Tensor& b) {
  const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
  const Shape &sa = a.shape(), &sb = b.shape();
  const int64_t M = sa[sa.size() - 2], K = sa.back(), N = sb.back();
  const Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  const size_t nb = std::max(ba.size(), bb.size());
  Shape batch(nb);
  for (size_t d = 0; d < nb; ++d) {
    const int64_t x = d < nb - ba.size() ? 1 : ba[d - (nb - ba.size())];
    const int64_t y = d < nb - bb.size() ? 1 : bb[d - (nb - bb.size())];
    batch[d] = std::max(x, y);
  }
  Ref r{batch, {}, {}};
  r.shape.push_back(M);
  r.shape.push_back(N);
  const int64_t count = numel_of(batch);
  r.value.assign(size_t(count * M * N), 0.0);
  r.abs_sum.assign(r.value.size(), 0.0);
  for (int64_t i = 0; i < count; ++i) {
    const std::vector<int64_t> idx = testing_util::unravel(i, batch);
    const double* pa = av.data() + testing_util::broadcast_flat(idx, ba) * M * K;
    const double* pb = bv.data() + testing_util::broadcast_flat(idx, bb) * K * N;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0, s_abs = 0;
        for (int64_t k = 0; k < K; ++k) {
          s += pa[m * K + k] * pb[k * N + n];
          s_abs += std::fabs(pa[m * K + k] * pb[k * N + n]);
        }
        r.value[size_t((i * M + m) * N + n)] = s;
        r.abs_sum[size_t((i * M + m) * N + n)] = s_abs;
      }
  }
  return r;
}

double unit_roundoff(DType t) {
  switch (t) {
    case DType::f32: return std::ldexp(1.0, -24);
    case DType::bf16: return std::ldexp(1.0, -8);
    case DType::f16: return std::ldexp(1.0, -11);
    default: return std::ldexp(1.0, -53);
  }
}

// The header's bound for element i: f32 accumulation of K products, then one rounding to `out`.
double bound(const Ref& r, size_t i, int64_t K, DType out) {
  const double u = unit_roundoff(DType::f32), gamma = double(K) * u / (1.0 - double(K) * u);
  const double acc = gamma * r.abs_sum[i];
  return out == DType::f32 ? acc : acc + unit_roundoff(out) * (std::fabs(r.value[i]) + acc);
}

void expect_within_bound(const Tensor& got, const Ref& want, int64_t K, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape) << what;
  const std::vector<double> g = got.to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_LE(std::fabs(g[i] - want.value[i]), bound(want, i, K, got.dtype()))
        << what << ": element " << i << " = " << g[i] << ", reference " << want.value[i];
}

// An operand (..., rows, cols) in `dtype`: stored as is, transposed (a (..., cols, rows) tensor's
// transposed view: column-major), or sliced (the first cols columns of a wider tensor: row-major
// with a leading dimension > cols).
enum class Layout { plain, transposed, sliced };

Tensor operand(Shape shape, Layout layout, DType dtype, uint64_t seed) {
  const size_t n = shape.size();
  if (layout == Layout::transposed) {
    std::swap(shape[n - 1], shape[n - 2]);
    return random(shape, seed, dtype).transpose(-2, -1);
  }
  if (layout == Layout::sliced) {
    Shape wide = shape;
    wide[n - 1] += 5;
    return random(wide, seed, dtype).slice(int64_t(n) - 1, 0, shape[n - 1]);
  }
  return random(shape, seed, dtype);
}

const char* layout_name(Layout l) {
  return l == Layout::plain ? "plain" : l == Layout::transposed ? "transposed" : "sliced";
}

// matmul(a, b) on each backend, each within the bound of the f64 loop.
void check_both_backends(const Tensor& a, const Tensor& b, const std::string& what) {
  const Ref want = reference(a, b);
  const int64_t K = a.shape().back();
  for (CpuGemm backend : {CpuGemm::dnnl, CpuGemm::eigen}) {
    BackendScope scope(backend);
    expect_within_bound(matmul(a, b), want, K, what + " on " + cpu::cpu_gemm_name(backend));
  }
}

struct Mkn {
  int64_t M, K, N;
};

// 1x1, vectors both ways, tall, wide, odd sizes, K longer than any K block, and two shapes above
// the threading threshold (2^25 flops), which run on every thread.
const std::vector<Mkn> kShapes = {{1, 1, 1},      {1, 7, 1},      {1, 300, 257},   {300, 257, 1},
                                  {513, 3, 2},    {2, 3, 700},    {7, 13, 5},      {33, 65, 17},
                                  {130, 257, 71}, {64, 1000, 48}, {300, 300, 300}, {257, 1024, 129}};

class GemmDnnl : public ::testing::TestWithParam<DType> {};

TEST_P(GemmDnnl, TwoDimensionalShapesEveryLayout) {
  const DType dt = GetParam();
  uint64_t seed = 1;
  for (const Mkn& s : kShapes)
    for (Layout la : {Layout::plain, Layout::transposed, Layout::sliced})
      for (Layout lb : {Layout::plain, Layout::transposed, Layout::sliced}) {
        // The large shapes once per layout pair of the transposes only: they dominate the time.
        if (s.M * s.K * s.N > 1000000 && (la == Layout::sliced || lb == Layout::sliced)) continue;
        const Tensor a = operand({s.M, s.K}, la, dt, seed++), b = operand({s.K, s.N}, lb, dt, seed++);
        check_both_backends(a, b,
                            std::to_string(s.M) + "x" + std::to_string(s.K) + "x" + std::to_string(s.N) + " a " +
                                layout_name(la) + " b " + layout_name(lb) + " " + dtype_name(dt));
      }
}

TEST_P(GemmDnnl, BatchedWithBroadcast) {
  const DType dt = GetParam();
  // Broadcast both ways: (3, 1) against (1, 4).
  check_both_backends(operand({3, 1, 9, 11}, Layout::plain, dt, 11), operand({1, 4, 11, 6}, Layout::transposed, dt, 12),
                      "(3, 1, 9, 11) @ (1, 4, 11, 6)^T");
  // A shared right operand: folded into one (2*3*9, 11) GEMM.
  check_both_backends(operand({2, 3, 9, 11}, Layout::plain, dt, 13), operand({11, 6}, Layout::transposed, dt, 14),
                      "(2, 3, 9, 11) @ (11, 6)^T");
  // A shared left operand, b batched and transposed.
  check_both_backends(operand({9, 11}, Layout::sliced, dt, 15), operand({5, 11, 6}, Layout::transposed, dt, 16),
                      "(9, 11) @ (5, 11, 6)^T");
  // An expanded operand: batch stride 0 with size > 1.
  check_both_backends(operand({5, 9, 11}, Layout::transposed, dt, 17),
                      operand({1, 11, 6}, Layout::plain, dt, 18).expand({5, 11, 6}),
                      "(5, 9, 11)^T @ (1, 11, 6) expanded");
  // Enough work to split the batch over threads, one GEMM each (the in-region path), with a's
  // batch dims permuted (not mergeable with its rows).
  const Tensor a = operand({16, 4, 64, 48}, Layout::plain, dt, 19).permute({1, 0, 2, 3});
  check_both_backends(a, operand({4, 1, 48, 40}, Layout::transposed, dt, 20),
                      "(4, 16, 64, 48) permuted @ (4, 1, 48, 40)^T");
}

INSTANTIATE_TEST_SUITE_P(CpuGemm, GemmDnnl, ::testing::Values(DType::f32, DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// matmul_into, on each backend: within the bound of the loop, and the same bits as matmul followed
// by the add and transpose as separate ops (eager's params += equals the compiled plan's).
TEST(GemmDnnlInto, AccumulateAndTransposeMatchMatmulThenAdd) {
  for (CpuGemm backend : {CpuGemm::dnnl, CpuGemm::eigen}) {
    BackendScope scope(backend);
    for (bool transpose : {false, true}) {
      const Tensor a = operand({70, 300}, Layout::transposed, DType::f32, 31),
                   b = operand({300, 50}, Layout::plain, DType::f32, 32);
      const Tensor c0 = transpose ? random({50, 70}, 33, DType::f32) : random({70, 50}, 33, DType::f32);
      Tensor c = c0.clone();
      cpu::run_op(OpKind::MatmulInto, {a, b, c}, {c}, Attrs().set("transpose", transpose).set("accumulate", true));
      const Tensor product = transpose ? matmul(a, b).t() : matmul(a, b);
      const Tensor unfused = c0 + product;
      EXPECT_EQ(c.to_vector<float>(), unfused.to_vector<float>())
          << cpu::cpu_gemm_name(backend) << (transpose ? " transposed" : "");
      // Against the loop: the product's bound, plus the add's one rounding.
      const Ref want = reference(a, b);
      const std::vector<double> got = c.to_vector<double>(), base = c0.to_vector<double>();
      for (int64_t m = 0; m < 70; ++m)
        for (int64_t n = 0; n < 50; ++n) {
          const size_t i = size_t(m * 50 + n), j = transpose ? size_t(n * 70 + m) : i;
          const double exact = base[j] + want.value[i];
          ASSERT_LE(std::fabs(got[j] - exact),
                    bound(want, i, 300, DType::f32) * (1 + 0x1p-24) + 0x1p-24 * std::fabs(exact))
              << cpu::cpu_gemm_name(backend) << " element (" << m << ", " << n << ")";
        }
    }
  }
}

// 16-bit operands into an f32 gradient (matmul_cast then matmul_accumulate): the product in f32,
// never rounded to 16 bits, plus c.
TEST(GemmDnnlInto, Bf16OperandsIntoF32) {
  for (CpuGemm backend : {CpuGemm::dnnl, CpuGemm::eigen}) {
    BackendScope scope(backend);
    const Tensor a = operand({40, 96}, Layout::transposed, DType::bf16, 41),
                 b = operand({96, 24}, Layout::plain, DType::bf16, 42);
    const Tensor c0 = random({40, 24}, 43, DType::f32);
    Tensor c = c0.clone();
    cpu::run_op(OpKind::MatmulInto, {a, b, c}, {c}, Attrs().set("dtype", DType::f32).set("accumulate", true));
    const Tensor unfused = c0 + matmul(a.to(DType::f32), b.to(DType::f32));
    EXPECT_EQ(c.to_vector<float>(), unfused.to_vector<float>()) << cpu::cpu_gemm_name(backend);
  }
}

// The kernels hand over uninitialised outputs: sgemm must write them with beta = 0, never read them.
TEST(GemmDnnl, OutputIsWrittenNotRead) {
  BackendScope scope(CpuGemm::dnnl);
  const Tensor a = random({37, 50}, 51, DType::f32), b = random({50, 29}, 52, DType::f32);
  Tensor out = full({37, 29}, std::numeric_limits<double>::quiet_NaN(), TensorOptions{DType::f32});
  cpu::run_op(OpKind::Matmul, {a, b}, {out});
  expect_within_bound(out, reference(a, b), 50, "NaN-filled output");
}

// NaN and infinity in an operand reach exactly the outputs they touch, on both backends.
TEST(GemmDnnl, NonFiniteInputsPropagate) {
  for (CpuGemm backend : {CpuGemm::dnnl, CpuGemm::eigen}) {
    BackendScope scope(backend);
    std::vector<float> av(20 * 30, 0.5f), bv(30 * 10, 0.25f);
    av[3 * 30 + 7] = std::numeric_limits<float>::quiet_NaN();  // row 3 of the result
    bv[2 * 10 + 4] = std::numeric_limits<float>::infinity();   // column 4 of the result
    const std::vector<float> y =
        matmul(Tensor::from_vector(av, {20, 30}), Tensor::from_vector(bv, {30, 10})).to_vector<float>();
    for (int64_t m = 0; m < 20; ++m)
      for (int64_t n = 0; n < 10; ++n) {
        const float v = y[size_t(m * 10 + n)];
        if (m == 3)
          EXPECT_TRUE(std::isnan(v)) << cpu::cpu_gemm_name(backend) << " (" << m << ", " << n << ")";
        else if (n == 4)
          EXPECT_EQ(v, std::numeric_limits<float>::infinity()) << cpu::cpu_gemm_name(backend);
        else
          EXPECT_EQ(v, 30 * 0.125f) << cpu::cpu_gemm_name(backend);
      }
  }
}

// Each backend is the library it names: matmul's bits equal a direct call of that library on the
// same operands (one thread, as matmul runs a GEMM below the threading threshold).
TEST(GemmDnnl, BackendSwitchRoutesTheGemm) {
  const int64_t M = 45, K = 70, N = 33;
  const Tensor a = random({K, M}, 61, DType::f32).t(), b = random({K, N}, 62, DType::f32);
  const std::vector<float> av = a.contiguous().to_vector<float>(), bv = b.to_vector<float>();
  std::vector<float> direct(size_t(M * N)), eigen(size_t(M * N));
#ifdef _OPENMP
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
#endif
  ASSERT_EQ(dnnl_sgemm('N', 'N', M, N, K, 1.0f, av.data(), K, bv.data(), N, 0.0f, direct.data(), N), dnnl_success);
  using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Eigen::Map<RowMat>(eigen.data(), M, N).noalias() =
      Eigen::Map<const RowMat>(av.data(), M, K) * Eigen::Map<const RowMat>(bv.data(), K, N);
#ifdef _OPENMP
  omp_set_num_threads(threads);
#endif
  {
    BackendScope scope(CpuGemm::dnnl);
    EXPECT_EQ(matmul(a.contiguous(), b).to_vector<float>(), direct);
  }
  {
    BackendScope scope(CpuGemm::eigen);
    EXPECT_EQ(matmul(a.contiguous(), b).to_vector<float>(), eigen);
  }
}

// The same call twice gives the same bits, threaded (above the threshold) and not.
TEST(GemmDnnl, RepeatedCallsAreBitwiseEqual) {
  BackendScope scope(CpuGemm::dnnl);
  for (int64_t n : {96, 400}) {
    const Tensor a = random({n, n}, 71, DType::f32).t(), b = random({n, n}, 72, DType::f32);
    EXPECT_EQ(matmul(a, b).to_vector<float>(), matmul(a, b).to_vector<float>()) << n;
  }
}

// sgemm called by the workers of a parallel region runs on the worker alone and leaves its team
// size as it found it.
TEST(GemmDnnl, InsideAParallelRegion) {
  const int64_t M = 64, K = 80, N = 48, count = 8;
  std::vector<Tensor> as, bs;
  for (int64_t i = 0; i < count; ++i) {
    as.push_back(random({M, K}, uint64_t(80 + i), DType::f32));
    bs.push_back(random({N, K}, uint64_t(90 + i), DType::f32));
  }
  std::vector<std::vector<float>> av(count), bv(count), out(count, std::vector<float>(size_t(M * N)));
  for (int64_t i = 0; i < count; ++i) {
    av[size_t(i)] = as[size_t(i)].to_vector<float>();
    bv[size_t(i)] = bs[size_t(i)].to_vector<float>();
  }
  std::vector<int> team_before(count, 0), team_after(count, 0);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) {
#ifdef _OPENMP
    team_before[size_t(i)] = omp_get_max_threads();
#endif
    // b (N, K) row-major read as (K, N) column-major: sgemm's 'T'.
    cpu::sgemm_dnnl(av[size_t(i)].data(), MatLayout{true, K}, bv[size_t(i)].data(), MatLayout{false, K},
                    out[size_t(i)].data(), M, K, N);
#ifdef _OPENMP
    team_after[size_t(i)] = omp_get_max_threads();
#endif
  }
  EXPECT_EQ(team_before, team_after);
  for (int64_t i = 0; i < count; ++i) {
    const Tensor got = Tensor::from_vector(out[size_t(i)], {M, N});
    expect_within_bound(got, reference(as[size_t(i)], bs[size_t(i)].t()), K, "worker " + std::to_string(i));
  }
}

// cpu::gemm's output stride and alpha (attention writes a head's product straight into its columns
// of y or dqkv, the scale in alpha), on each backend and in f64: every written element within the
// bound of alpha times the loop's product, and the columns between rows (ldc > N) left as they were.
TEST(GemmDnnl, OutputStrideAndAlpha) {
  const int64_t M = 37, K = 64, N = 24, ldc = 3 * N + 5;
  const Tensor a = random({M, K}, 301, DType::f32), b = random({N, K}, 302, DType::f32);
  const Ref want = reference(a, b.t());  // (M, N) in f64
  const std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>();
  const float alpha = 0.125f;
  for (CpuGemm backend : {CpuGemm::dnnl, CpuGemm::eigen}) {
    BackendScope scope(backend);
    std::vector<float> c(size_t(M * ldc), -7.0f);
    cpu::gemm(av.data(), MatLayout{true, K}, bv.data(), MatLayout{false, K}, c.data() + N, M, K, N, ldc, alpha);
    std::vector<float> got(size_t(M * N));
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < ldc; ++j) {
        const float v = c[size_t(i * ldc + j)];
        if (j >= N && j < 2 * N) got[size_t(i * N + j - N)] = v / alpha;  // alpha is a power of two: exact
        else ASSERT_EQ(v, -7.0f) << cpu::cpu_gemm_name(backend) << ": wrote (" << i << ", " << j << ") outside the block";
      }
    expect_within_bound(Tensor::from_vector(got, {M, N}), want, K, cpu::cpu_gemm_name(backend));
  }
  // f64 (Eigen): the same stride and alpha, against the same loop in f64.
  const std::vector<double> ad = a.to(DType::f64).to_vector<double>(), bd = b.to(DType::f64).to_vector<double>();
  std::vector<double> cd(size_t(M * ldc), -7.0);
  cpu::gemm(ad.data(), MatLayout{true, K}, bd.data(), MatLayout{false, K}, cd.data(), M, K, N, ldc, 0.5);
  const std::vector<double>& w = want.value;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      if (j < N) EXPECT_NEAR(cd[size_t(i * ldc + j)], 0.5 * w[size_t(i * N + j)], 1e-12) << i << ", " << j;
      else ASSERT_EQ(cd[size_t(i * ldc + j)], -7.0) << "f64 wrote (" << i << ", " << j << ")";
    }
}

TEST(GemmDnnl, BackendNames) {
  EXPECT_EQ(cpu::parse_cpu_gemm("eigen"), CpuGemm::eigen);
  EXPECT_EQ(cpu::parse_cpu_gemm("DNNL"), CpuGemm::dnnl);
  EXPECT_EQ(cpu::parse_cpu_gemm("oneDNN"), CpuGemm::dnnl);
  EXPECT_STREQ(cpu::cpu_gemm_name(CpuGemm::eigen), "eigen");
  testing_util::expect_error([] { cpu::parse_cpu_gemm("mkl"); }, {"REEL_CPU_GEMM=mkl", "dnnl", "eigen"});
}

// f64 stays on Eigen whatever the f32 backend: gradcheck's products keep f64 accuracy.
TEST(GemmDnnl, F64StaysExact) {
  BackendScope scope(CpuGemm::dnnl);
  const Tensor a = random({33, 200}, 101).t(), b = random({33, 17}, 102);
  const Ref want = reference(a, b);
  const std::vector<double> got = matmul(a, b).to_vector<double>();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want.value[i], 1e-13 * (1 + want.abs_sum[i])) << i;
}

}  // namespace
