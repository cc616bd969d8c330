// The bias gradient summed by the layer-norm backward's own pass over the rows, on the GPU
// (the layer_norm_backward_add op, compile/passes/fuse_norm_backward_add.cpp):
//   - layer_norm_bwd_add with sums16 writes out, dw, db and out16 to the bit as without it, and sums
//     out16's values per normalised column: against a double sum of out16 on the host, for rows in
//     registers (512 columns, also as (2, 256)) and the generic kernels (96 as well as (2, 48), and
//     1500 columns: the sums are a launch of their own there);
//     accumulating, the bits of the sums and then an f32 add; the same bits every run;
//   - a sums tensor of the wrong size is a reel::Error that names the op and shows the shapes;
//   - the pass folds the bias-gradient pass's column sums of the cast into the norm's node when the
//     traced function is shaped like a pre-norm block's backward (not when the norm's columns are
//     not the bias's), and the compiled function equals eager (to the bit but for the sums, near
//     there: their summands are rounded to bf16).
// Skips without a GPU; compiled only with the CUDA backend.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "compile/runtime/compile.h"
#include "kernels/dispatch.h"
#include "reel.h"
#include "test_util.h"

#ifdef REEL_CUDA

using namespace reel;

namespace {

const Device kGpu = Device::cuda(0);

// Column sums of a (rows, cols) bf16 tensor on the host, in double.
Tensor host_column_sums(const Tensor& x16, int64_t cols) {
  std::vector<double> v = to_dtype(x16, DType::f64).to_vector<double>(), want(size_t(cols), 0.0);
  for (size_t k = 0; k < v.size(); ++k) want[k % size_t(cols)] += v[k];
  return Tensor::from_vector<double>(want, {cols});
}

struct NormBackwardOut {
  Tensor out, dw, db, out16, sums;
};

// layer_norm_bwd_add on x, normalised over w's dims (its last ones); sums16 given when `sums`,
// holding `start` (accumulating onto it when `accumulate`).
NormBackwardOut run(const Tensor& g, const Tensor& x, const Tensor& w, const Tensor& r, bool sums, const Tensor& start,
                    bool accumulate) {
  std::vector<Tensor> f = dispatch(OpKind::LayerNorm, {x, w, Tensor()},
                                   Attrs().set("eps", 1e-5).set("normalized_ndim", w.dim()));
  NormBackwardOut o;
  o.out = Tensor::empty(x.shape(), DType::f32, kGpu);
  o.dw = Tensor::empty(w.shape(), DType::f32, kGpu);
  o.db = Tensor::empty(w.shape(), DType::f32, kGpu);
  o.out16 = Tensor::empty(x.shape(), DType::bf16, kGpu);
  std::vector<Tensor> in{g, x, w, f[1], f[2], r}, out{o.out, o.dw, o.db, o.out16};
  Attrs a = Attrs().set("dtype", DType::bf16);
  if (sums) {
    o.sums = start.clone();
    if (o.sums.numel() == w.numel()) o.sums = o.sums.reshape({w.numel()});  // one sum per normalised column
    out.push_back(o.sums);
    a.set("column_sums", true).set("accumulate", accumulate);
    if (accumulate) in.push_back(o.sums);
  }
  dispatch_out(OpKind::LayerNormBackwardAdd, in, out, a);
  return o;
}

size_t nodes_fused_as(const compile::Plan& p, const std::vector<std::string>& ops) {
  size_t n = 0;
  for (const compile::Node& node : p.graph().nodes) n += node.fused == ops;
  return n;
}

}  // namespace

TEST(LayerNormBiasSumsCuda, KernelSumsTheSixteenBitCopyPerColumn) {
  REEL_REQUIRE_GPU();
  Generator gen(44);
  // Rows in registers; a warp per row; a block per row; then norms over the last two dims, whose
  // sums are one per normalised column, not per last-dim column (rows in registers, a warp per row).
  for (const Shape& norm : {Shape{512}, Shape{96}, Shape{1500}, Shape{2, 256}, Shape{2, 48}}) {
    SCOPED_TRACE("normalised over " + shape_str(norm));
    const int64_t C = numel_of(norm);
    Shape shape{4, 75};
    shape.insert(shape.end(), norm.begin(), norm.end());
    Tensor x = randn(shape, {}, &gen).to(kGpu), g = randn(shape, {}, &gen).to(kGpu);
    Tensor r = randn(shape, {}, &gen).to(kGpu), w = randn(norm, {}, &gen).to(kGpu);
    Tensor start = randn({C}, {}, &gen).to(kGpu);
    const NormBackwardOut plain = run(g, x, w, r, false, Tensor(), false);
    const NormBackwardOut with = run(g, x, w, r, true, start, false);
    const NormBackwardOut again = run(g, x, w, r, true, start, false);
    const NormBackwardOut added = run(g, x, w, r, true, start, true);
    // The other outputs are those of the kernel without the sums, to the bit.
    EXPECT_EQ(with.out.to_vector<double>(), plain.out.to_vector<double>());
    EXPECT_EQ(with.dw.to_vector<double>(), plain.dw.to_vector<double>());
    EXPECT_EQ(with.db.to_vector<double>(), plain.db.to_vector<double>());
    EXPECT_EQ(to_dtype(with.out16, DType::f32).to_vector<double>(), to_dtype(plain.out16, DType::f32).to_vector<double>());
    // The sums: of out16's values (f32 accumulation), and the same bits on a second run.
    EXPECT_LT(testing_util::max_rel_diff(with.sums, host_column_sums(with.out16, C)), 1e-5);
    EXPECT_EQ(with.sums.to_vector<double>(), again.sums.to_vector<double>());
    // Accumulating: start + the sums, one f32 add per column.
    std::vector<float> s = with.sums.to_vector<float>(), s0 = start.to_vector<float>(), a = added.sums.to_vector<float>();
    for (size_t j = 0; j < s.size(); ++j) ASSERT_EQ(a[j], s0[j] + s[j]) << "column " << j;
  }
}

TEST(LayerNormBiasSumsCuda, SumsOfTheWrongSizeAreAnError) {
  REEL_REQUIRE_GPU();
  Generator gen(45);
  Tensor x = randn({8, 256}, {}, &gen).to(kGpu), g = randn({8, 256}, {}, &gen).to(kGpu);
  Tensor r = randn({8, 256}, {}, &gen).to(kGpu), w = randn({256}, {}, &gen).to(kGpu);
  Tensor wrong = zeros({255}, TensorOptions{DType::f32, kGpu});
  try {
    run(g, x, w, r, true, wrong, false);
    FAIL() << "expected reel::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("layer_norm_backward_add"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(255,)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(256,)"), std::string::npos) << msg;
  }
}

// A pre-norm block's backward as traced: the norm's dx plus the residual branch's gradient is the
// gradient of the layer before's Linear output, cast to bf16 for its GEMMs, and its bias gradient
// sums it over the rows. Variant: a norm over the last two dims, (50, C) values per row, whose
// pass sums 50 C columns, not the bias's C (the column sums stay a launch of their own).
TEST(LayerNormBiasSumsCuda, PassFoldsTheBiasSumsIntoTheNorm) {
  REEL_REQUIRE_GPU();
  Generator gen(46);
  const int64_t C = 256;
  for (const int64_t ndim : {int64_t(1), int64_t(2)}) {
    SCOPED_TRACE("a norm over the last " + std::to_string(ndim) + " dims");
    const Shape param = ndim == 1 ? Shape{C} : Shape{50, C};
    Tensor w = randn(param, {}, &gen).to(kGpu), b = randn(param, {}, &gen).to(kGpu);
    Tensor Wh = to_dtype(randn({C, 32}, {}, &gen).to(kGpu), DType::bf16);
    auto fn = [&, ndim](const std::vector<Tensor>& in) -> std::vector<Tensor> {
      const Tensor &x = in[0], &g = in[1];
      Tensor r = in[2] * 0.5;
      std::vector<Tensor> f = dispatch(OpKind::LayerNorm, {x, w, b}, Attrs().set("eps", 1e-5).set("normalized_ndim", ndim));
      std::vector<Tensor> d = dispatch(OpKind::LayerNormBackward, {g, x, w, f[1], f[2]});
      Tensor sum_dx = d[0] + r;
      Tensor db = sum(sum_dx, {0, 1});
      Tensor g16 = to_dtype(sum_dx, DType::bf16);
      return {sum_dx, d[1], d[2], matmul(g16, Wh), db};
    };
    compile::CompiledFunction f = compile::compile(fn, {compile::Mode::ReduceOverhead, 8, true});
    std::vector<Tensor> in = {randn({3, 50, C}, {}, &gen).to(kGpu), randn({3, 50, C}, {}, &gen).to(kGpu),
                              randn({3, 50, C}, {}, &gen).to(kGpu)};
    std::vector<Tensor> eager = fn(in), out;
    for (int i = 0; i < 3; ++i) out = f(in);
    ASSERT_NE(f.last_plan(), nullptr);
    const compile::Plan& p = *f.last_plan();
    const bool fold = ndim == 1;
    EXPECT_EQ(nodes_fused_as(p, {"layer_norm_backward", "add", "copy", "sum"}), fold ? 1u : 0u) << p.graph().str();
    EXPECT_EQ(nodes_fused_as(p, {"layer_norm_backward", "add", "copy"}), fold ? 0u : 1u) << p.graph().str();
    size_t sums_alone = 0;
    for (const compile::Node& n : p.graph().nodes) sums_alone += n.op == OpKind::Sum || n.op == OpKind::ColumnSums;
    EXPECT_EQ(sums_alone, fold ? 0u : 1u) << p.graph().str();
    ASSERT_EQ(out.size(), eager.size());
    for (size_t k = 0; k < 4; ++k)
      EXPECT_EQ(out[k].to_vector<double>(), eager[k].to_vector<double>()) << "output " << k;
    EXPECT_LT(testing_util::max_rel_diff(out[4], eager[4]), 1e-2);  // summands rounded to bf16
  }
}

#endif  // REEL_CUDA
