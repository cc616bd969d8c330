// Elementwise fusion (compile/passes/fuse_elementwise.cpp), its CPU executor, CUDA source generation and the
// kernel caches — everything that runs without a GPU:
//   - the pass groups what it should: a traced add -> gelu -> mul chain becomes one node; nodes that
//     are not consecutive, change shape, or read a value written in the group through another
//     geometry end a group; intermediates nobody else reads are not written;
//   - a fused plan computes what the unfused one does: to the bit in f32 and f64 (the same formulas
//     in the same types), within a tolerance in f16/bf16 (intermediates stay in float);
//   - a compiled GPT step with fusion follows eager for 20 steps, with fewer kernels;
//   - the NVRTC formulas (kernels/jit/nvrtc_math.h) equal kernels/elementwise_math.h bit for bit;
//   - the generated CUDA source has the expected shape and (where the CUDA backend is built; no GPU
//     needed) compiles with NVRTC, through a disk cache that serves the second compilation.
// GPU execution is tested in test_compile_fusion_cuda.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "kernels/jit/codegen_cuda.h"
#include "compile/runtime/compile.h"
#include "compile/passes/passes.h"
#include "kernels/jit/kernel_cache.h"
#include "kernels/jit/nvrtc.h"
#include "kernels/jit/nvrtc_math.h"
#include "compile/runtime/train_step.h"
#include "kernels/dispatch.h"
#include "kernels/elementwise_math.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "tensor/cuda.h"
#include "test_util.h"
#include "compile_test_util.h"

using namespace reel;
using reel::testing_util::token_batches;

namespace reel::fusion_test {

// Inputs of elementwise_chain: x, y (3, 5, 7), a bias z (7,) and w (7, 5, 3) (read transposed).
std::vector<Tensor> chain_inputs(DType dt, Device device) {
  Generator gen(21);
  auto make = [&](const Shape& s) { return randn(s, {DType::f32}, &gen).to(dt).to(device); };
  return {make({3, 5, 7}), make({3, 5, 7}), make({7}), make({7, 5, 3})};
}

// Every fusable op, all iterating (3, 5, 7): broadcast, strided and 0-dim-free inputs, the scalar
// attrs, comparisons on the inputs (so 16-bit rounding cannot flip them), casts through f32.
std::vector<Tensor> elementwise_chain(const std::vector<Tensor>& in) {
  auto d = [](OpKind op, const std::vector<Tensor>& a, const Attrs& at = Attrs()) { return dispatch1(op, a, at); };
  auto v = [](double x) { return Attrs().set("value", x); };
  const Tensor &x = in[0], &y = in[1], &z = in[2];
  const Tensor wt = in[3].permute({2, 1, 0});
  const DType dt = x.dtype();
  Tensor c = d(OpKind::Mul, {d(OpKind::Gelu, {d(OpKind::Add, {x, z})}), wt});
  Tensor p = d(OpKind::AddScalar, {d(OpKind::Abs, {y})}, v(0.5));
  Tensor l = d(OpKind::Log, {p}), s = d(OpKind::Sqrt, {p}), r = d(OpKind::Rsqrt, {p});
  Tensor pw = d(OpKind::PowScalar, {p}, Attrs().set("exponent", 1.5));
  Tensor e = d(OpKind::Exp, {d(OpKind::MulScalar, {c}, v(-0.5))});
  Tensor t = d(OpKind::Tanh, {c}), sg = d(OpKind::Sigmoid, {c}), rl = d(OpKind::Relu, {c}), ng = d(OpKind::Neg, {c});
  Tensor wh = d(OpKind::Where, {d(OpKind::Gt, {x, y}), l, s});
  Tensor mf = d(OpKind::MaskedFill, {r, d(OpKind::Lt, {x, y})}, v(2.0));
  Tensor cl = d(OpKind::ClampScalar, {pw}, Attrs().set("min", -1.0).set("max", 1.2));
  Tensor gb = d(OpKind::GeluBackward, {t, c}), rb = d(OpKind::ReluBackward, {sg, rl});
  Tensor tb = d(OpKind::TanhBackward, {ng, t}), sb = d(OpKind::SigmoidBackward, {e, sg});
  Tensor cmp = d(OpKind::Add, {d(OpKind::Eq, {x, x}), d(OpKind::Ne, {x, y})});
  cmp = d(OpKind::Sub, {cmp, d(OpKind::Mul, {d(OpKind::Le, {x, y}), d(OpKind::Ge, {x, y})})});
  Tensor sum = d(OpKind::Add, {d(OpKind::Add, {gb, rb}), d(OpKind::Sub, {tb, sb})});
  sum = d(OpKind::Div, {d(OpKind::Add, {sum, d(OpKind::Mul, {wh, mf})}), p});
  Tensor f32 = d(OpKind::Copy, {d(OpKind::Add, {sum, cl})}, Attrs().set("dtype", DType::f32));
  Tensor out = d(OpKind::Copy, {d(OpKind::MulScalar, {f32}, v(0.25))}, Attrs().set("dtype", dt));
  return {d(OpKind::Add, {out, cmp}), c};  // c: an intermediate that is also a result
}

}  // namespace reel::fusion_test

namespace {

using compile::BufferKind;
using compile::Graph;
using compile::Node;
using compile::TensorRef;

// ---- hand-made graphs -----------------------------------------------------------------------

constexpr auto add_buffer = testing_util::graph_floats;

// f32, contiguous unless strides are given.
TensorRef ref(int buffer, const Shape& shape, Shape strides = {}, int64_t offset = 0) {
  TensorRef r = testing_util::graph_ref(buffer, shape);
  if (!strides.empty()) r.strides = std::move(strides);
  r.offset = offset;
  return r;
}

Node node(OpKind op, std::vector<TensorRef> in, TensorRef out, bool in_place = false) {
  return testing_util::graph_node(op, std::move(in), std::move(out), in_place);
}

size_t fuse(Graph& g) {
  compile::PassStats st;
  compile::fuse_elementwise(g, st);
  return st.fused;
}

TEST(FusionPass, ChainWritesOnlyWhatOthersRead) {
  Graph g;
  const int x = add_buffer(g, BufferKind::Input, 12), t = add_buffer(g, BufferKind::Internal, 12),
            u = add_buffer(g, BufferKind::Internal, 12), y = add_buffer(g, BufferKind::Internal, 12);
  g.nodes = {node(OpKind::Add, {ref(x, {3, 4}), ref(x, {3, 4})}, ref(t, {3, 4})),
             node(OpKind::Relu, {ref(t, {3, 4})}, ref(u, {3, 4})),
             node(OpKind::Mul, {ref(u, {3, 4}), ref(t, {3, 4})}, ref(y, {3, 4}))};
  g.outputs = {ref(y, {3, 4})};
  EXPECT_EQ(fuse(g), 2u);
  ASSERT_EQ(g.nodes.size(), 1u);
  const Node& n = g.nodes[0];
  EXPECT_EQ(n.fused, std::vector<std::string>({"add", "relu", "mul"}));
  EXPECT_EQ(n.op, OpKind::FusedElementwise);
  ASSERT_EQ(n.inputs.size(), 1u) << "x is loaded once, t and u come from registers";
  EXPECT_EQ(n.inputs[0]->buffer, x);
  ASSERT_EQ(n.outputs.size(), 1u) << "t and u are read by nobody else: not written";
  EXPECT_EQ(n.outputs[0].buffer, y);
}

TEST(FusionPass, IntermediateReadLaterIsStillWritten) {
  Graph g;
  const int x = add_buffer(g, BufferKind::Input, 4), t = add_buffer(g, BufferKind::Internal, 4),
            u = add_buffer(g, BufferKind::Internal, 4), s = add_buffer(g, BufferKind::Internal, 1);
  g.nodes = {node(OpKind::Exp, {ref(x, {4})}, ref(t, {4})), node(OpKind::Neg, {ref(t, {4})}, ref(u, {4})),
             node(OpKind::Sum, {ref(t, {4})}, ref(s, {}))};
  g.outputs = {ref(u, {4}), ref(s, {})};
  EXPECT_EQ(fuse(g), 1u);
  ASSERT_EQ(g.nodes.size(), 2u);
  ASSERT_EQ(g.nodes[0].outputs.size(), 2u);
  EXPECT_EQ(g.nodes[0].outputs[0].buffer, t);  // sum reads it after the group
  EXPECT_EQ(g.nodes[0].outputs[1].buffer, u);
  EXPECT_EQ(g.nodes[1].op, OpKind::Sum);
}

TEST(FusionPass, GroupsEndWhereTheRewriteWouldBeUnsafe) {
  Graph g;
  const int x = add_buffer(g, BufferKind::Input, 16), t = add_buffer(g, BufferKind::Internal, 16),
            u = add_buffer(g, BufferKind::Internal, 16), s = add_buffer(g, BufferKind::Internal, 1),
            w = add_buffer(g, BufferKind::Internal, 16), o = add_buffer(g, BufferKind::External, 16);
  g.nodes = {
      node(OpKind::Exp, {ref(x, {4, 4})}, ref(t, {4, 4})),
      node(OpKind::Sum, {ref(x, {4, 4})}, ref(t, {})),               // not elementwise, and writes t: neg stays after it
      node(OpKind::Neg, {ref(t, {4, 4})}, ref(u, {4, 4})),
      node(OpKind::Add, {ref(u, {4, 4}, {1, 4}), ref(x, {4, 4})}, ref(w, {4, 4})),  // reads u transposed
      node(OpKind::Relu, {ref(w, {8})}, ref(o, {8})),                 // another size (a reshape alone would fuse)
      node(OpKind::Add, {ref(o, {4}), ref(x, {16})}, ref(o, {16}), true),  // o read broadcast, then written
  };
  g.outputs = {ref(s, {}), ref(o, {16})};
  EXPECT_EQ(fuse(g), 0u) << g.str();
  EXPECT_EQ(g.nodes.size(), 6u);
}

TEST(FusionPass, AConsumerOfAReshapedResultJoinsItsProducer) {
  // (B, T, H, hd) -> (B, T, H hd): the transpose-copy merging heads, then the cast for the next GEMM.
  Graph g;
  const int x = add_buffer(g, BufferKind::Input, 24), t = add_buffer(g, BufferKind::Internal, 24),
            o = add_buffer(g, BufferKind::External, 24);
  g.nodes = {node(OpKind::Copy, {ref(x, {2, 3, 4}, {4, 8, 1})}, ref(t, {2, 3, 4})),
             node(OpKind::Neg, {ref(t, {2, 12})}, ref(o, {2, 12}))};
  g.outputs = {ref(o, {2, 12})};
  EXPECT_EQ(fuse(g), 1u) << g.str();
  ASSERT_EQ(g.nodes.size(), 1u);
  EXPECT_EQ(g.nodes[0].outputs[0].buffer, o);
  EXPECT_EQ(g.nodes[0].outputs[0].shape, (Shape{2, 3, 4}));  // written in the producer's shape: same bytes
}

TEST(FusionPass, AConsumerMovesUpToItsProducerAcrossUnrelatedNodes) {
  // q = x * 0.125; k = copy(y); q16 = cast(q): the cast joins the scale (attention's q), the copy of
  // k stays between neither. Not when a node in between touches the consumer's output. (q is 8 KiB:
  // a smaller scale would sink to its cast instead, across the blocking node: sink_producers.)
  for (bool blocked : {false, true}) {
    Graph g;
    const int x = add_buffer(g, BufferKind::Input, 2048), y = add_buffer(g, BufferKind::Input, 16),
              q = add_buffer(g, BufferKind::Internal, 2048), k = add_buffer(g, BufferKind::External, 16),
              q16 = add_buffer(g, BufferKind::External, 2048);
    Node scale = node(OpKind::MulScalar, {ref(x, {32, 64})}, ref(q, {32, 64}));
    scale.attrs.set("value", 0.125);
    g.nodes = {scale, node(OpKind::Sum, {ref(y, {4, 4})}, ref(blocked ? q16 : k, {})),
               node(OpKind::Copy, {ref(q, {32, 64})}, ref(q16, {32, 64}))};
    g.outputs = {ref(k, {}), ref(q16, {32, 64})};
    EXPECT_EQ(fuse(g), blocked ? 0u : 1u) << g.str();
    ASSERT_EQ(g.nodes.size(), blocked ? 3u : 2u);
    if (!blocked) {
      EXPECT_EQ(g.nodes[0].fused, (std::vector<std::string>{"mul_scalar", "copy"}));
      EXPECT_EQ(g.nodes[1].op, OpKind::Sum);
    }
  }
}

// A micro-batch's end as autograd leaves it: each norm's weight gradient added into its accumulated
// gradient, widths interleaved (32, 64, 32), none reading another's result. The second 32-wide add
// moves up to the first: two kernels, not three. Not across a node that reads what it writes or
// writes what it reads, nor when it would make a buffer earlier.
TEST(FusionPass, IndependentUpdatesOfOneShapeGatherAcrossOtherShapes) {
  enum Case { kFree, kGradReadBetween, kInputWrittenBetween, kMakesABuffer };
  for (Case c : {kFree, kGradReadBetween, kInputWrittenBetween, kMakesABuffer}) {
    SCOPED_TRACE(int(c));
    Graph g;
    const int ga = add_buffer(g, BufferKind::External, 32), gb = add_buffer(g, BufferKind::External, 64),
              gc = add_buffer(g, BufferKind::External, 32), da = add_buffer(g, BufferKind::Input, 32),
              db = add_buffer(g, BufferKind::Input, 64), dc = add_buffer(g, BufferKind::Internal, 32),
              s = add_buffer(g, BufferKind::External, 1), made = add_buffer(g, BufferKind::Internal, 32);
    g.nodes = {node(OpKind::Sum, {ref(db, {64})}, ref(dc, {32})),  // dc made by a node of another kind
               node(OpKind::Add, {ref(ga, {32}), ref(da, {32})}, ref(ga, {32}), true),
               node(OpKind::Add, {ref(gb, {64}), ref(db, {64})}, ref(gb, {64}), true)};
    if (c == kGradReadBetween) g.nodes.push_back(node(OpKind::Sum, {ref(gc, {32})}, ref(s, {})));
    if (c == kInputWrittenBetween) g.nodes.push_back(node(OpKind::Sum, {ref(db, {64})}, ref(dc, {32})));
    if (c == kMakesABuffer) {
      g.nodes.push_back(node(OpKind::MulScalar, {ref(da, {32})}, ref(made, {32})));
      g.nodes.back().attrs.set("value", 2.0);
    } else {
      g.nodes.push_back(node(OpKind::Add, {ref(gc, {32}), ref(dc, {32})}, ref(gc, {32}), true));
    }
    g.outputs = {ref(s, {}), ref(made, {32})};
    const size_t fused = fuse(g);
    std::vector<std::string> listing;
    for (const Node& n : g.nodes) listing.push_back(n.op == OpKind::FusedElementwise ? "fused" : op_name(n.op));
    if (c == kFree) {
      EXPECT_EQ(fused, 1u);
      EXPECT_EQ(listing, (std::vector<std::string>{"sum", "fused", "add"})) << g.str();
      EXPECT_EQ(g.nodes[1].outputs.size(), 2u) << "ga and gc";
    } else {
      EXPECT_EQ(fused, 0u) << g.str();
      EXPECT_EQ(listing.back(), c == kMakesABuffer ? "mul_scalar" : "add") << g.str();
    }
  }
}

// The mean loss as a step traces it: s1 = l0 + l1 after the second micro-batch, s2 = s1 + l2 after
// the third, mean = (s2 + l3) * 0.25 at the end, each l made by a node of another kind (the
// cross-entropy). The adds sink to the mean: one kernel. Not past a node that writes an add's input.
TEST(FusionPass, ASmallChainSpreadOverTheStepSinksToItsEnd) {
  for (bool blocked : {false, true}) {
    SCOPED_TRACE(blocked ? "l2 rewritten between" : "free");
    Graph g;
    const int x = add_buffer(g, BufferKind::Input, 8);
    int l[4], s1 = add_buffer(g, BufferKind::Internal, 1), s2 = add_buffer(g, BufferKind::Internal, 1),
              t = add_buffer(g, BufferKind::Internal, 1), mean = add_buffer(g, BufferKind::External, 1);
    for (int& b : l) b = add_buffer(g, BufferKind::Internal, 1);
    auto loss = [&](int b) { return node(OpKind::Sum, {ref(x, {8})}, ref(b, {})); };
    g.nodes = {loss(l[0]),
               loss(l[1]),
               node(OpKind::Add, {ref(l[0], {}), ref(l[1], {})}, ref(s1, {})),
               loss(l[2]),
               node(OpKind::Add, {ref(s1, {}), ref(l[2], {})}, ref(s2, {})),
               loss(l[3])};
    if (blocked) g.nodes.push_back(node(OpKind::Sum, {ref(x, {8})}, ref(l[2], {})));
    g.nodes.push_back(node(OpKind::Add, {ref(s2, {}), ref(l[3], {})}, ref(t, {})));
    Node scale = node(OpKind::MulScalar, {ref(t, {})}, ref(mean, {}));
    scale.attrs.set("value", 0.25);
    g.nodes.push_back(scale);
    g.outputs = {ref(mean, {})};
    fuse(g);
    const Node& last = g.nodes.back();
    ASSERT_EQ(last.op, OpKind::FusedElementwise) << g.str();
    if (!blocked) {
      EXPECT_EQ(g.nodes.size(), 5u) << g.str();
      EXPECT_EQ(last.fused, (std::vector<std::string>{"add", "add", "add", "mul_scalar"})) << g.str();
    } else {
      // s1's add still sinks (nothing writes l0, l1 or s1 after it); s2's add stays before l2's rewrite.
      EXPECT_EQ(last.fused, (std::vector<std::string>{"add", "mul_scalar"})) << g.str();
    }
  }
}

TEST(FusionPass, InPlaceUpdatesOfOneGeometryFuseAndKeepTheirOutputs) {
  // Gradient accumulation: g1 += a; g2 += b, both External and updated through the same ref.
  Graph g;
  const int g1 = add_buffer(g, BufferKind::External, 8), a = add_buffer(g, BufferKind::Internal, 8),
            g2 = add_buffer(g, BufferKind::External, 8), b = add_buffer(g, BufferKind::Internal, 8);
  g.nodes = {node(OpKind::Add, {ref(g1, {8}), ref(a, {8})}, ref(g1, {8}), true),
             node(OpKind::Add, {ref(g2, {8}), ref(b, {8})}, ref(g2, {8}), true)};
  EXPECT_EQ(fuse(g), 1u);
  ASSERT_EQ(g.nodes.size(), 1u);
  EXPECT_TRUE(g.nodes[0].in_place);
  EXPECT_EQ(g.nodes[0].inputs.size(), 4u);
  ASSERT_EQ(g.nodes[0].outputs.size(), 2u);
  EXPECT_EQ(g.nodes[0].outputs[0].buffer, g1);
  EXPECT_EQ(g.nodes[0].outputs[1].buffer, g2);
}

TEST(FusionPass, OtherOpsAndCrossDeviceCopiesAreLeftAlone) {
  Graph g;
  const int x = add_buffer(g, BufferKind::Input, 4), t = add_buffer(g, BufferKind::Internal, 4),
            u = add_buffer(g, BufferKind::Internal, 4);
  g.nodes = {node(OpKind::Exp, {ref(x, {4})}, ref(t, {4})), node(OpKind::Neg, {ref(t, {4})}, ref(u, {4}))};
  g.nodes[1].op = OpKind::Softmax;  // not elementwise: the chain ends at it
  g.nodes[1].attrs.set("dim", int64_t(0));
  g.outputs = {ref(u, {4})};
  EXPECT_EQ(fuse(g), 0u);
  // A copy to another device is a transfer, not an elementwise kernel.
  Graph h;
  const int a = add_buffer(h, BufferKind::Input, 4), b = add_buffer(h, BufferKind::Internal, 4),
            c = add_buffer(h, BufferKind::Internal, 4);
  h.buffers[size_t(c)].device = Device::cuda(0);
  h.nodes = {node(OpKind::Exp, {ref(a, {4})}, ref(b, {4})), node(OpKind::Copy, {ref(b, {4})}, ref(c, {4}))};
  h.outputs = {ref(c, {4})};
  EXPECT_EQ(fuse(h), 0u);
}

// ---- traced functions: grouping and results ---------------------------------------------------

compile::CompiledFunction compiled(compile::StepFn fn, bool fuse) {
  return compile::compile(std::move(fn), {compile::Mode::Default, 8, fuse});
}

std::vector<Tensor> run3(compile::CompiledFunction& f, const std::vector<Tensor>& in) {
  f(in);
  f(in);
  return f(in);  // the first replay of the plan
}

TEST(FusionTrace, AddGeluMulBecomesOneKernel) {
  Tensor bias = full({8}, 0.25), scale = full({4, 8}, -1.5);
  auto fn = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{gelu(in[0] + bias) * scale}; };
  auto f = compiled(fn, true);
  Generator gen(5);
  Tensor x = randn({4, 8}, {}, &gen);
  std::vector<Tensor> out = run3(f, {x});
  const compile::Plan* plan = f.last_plan();
  ASSERT_NE(plan, nullptr);
  EXPECT_EQ(plan->stats().fused, 2u);
  ASSERT_EQ(plan->kernels(), 1u) << plan->graph().str();
  EXPECT_EQ(plan->graph().nodes[0].fused, std::vector<std::string>({"add", "gelu", "mul"}));
  EXPECT_EQ(out[0].to_vector<double>(), fn({x})[0].to_vector<double>());
}

TEST(FusionTrace, NonConsecutiveAndRegeometrisedChainsStayApart) {
  auto fn = [](const std::vector<Tensor>& in) {
    Tensor a = exp(in[0]);
    Tensor s = in[0].sum();     // a reduction between exp and the mul that reads exp's result
    Tensor b = a * s;
    Tensor c = b.t() + in[0];   // reads b transposed: same shape, another geometry
    return std::vector<Tensor>{c};
  };
  auto f = compiled(fn, true);
  // 64 x 64: exp's result (16 KiB) is past what sink_producers moves (a small one would sink to the mul).
  Tensor x = arange(4096).reshape({64, 64}) * 0.001;
  std::vector<Tensor> out = run3(f, {x});
  ASSERT_NE(f.last_plan(), nullptr);
  EXPECT_EQ(f.last_plan()->stats().fused, 0u) << f.last_plan()->graph().str();
  EXPECT_EQ(out[0].to_vector<double>(), fn({x})[0].to_vector<double>());
}

std::vector<double> rel_errors(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  std::vector<double> out;
  for (size_t i = 0; i < a.size(); ++i) {
    std::vector<double> x = a[i].to_vector<double>(), y = b[i].to_vector<double>();
    double num = 0, den = 0;
    for (size_t k = 0; k < x.size(); ++k) {
      num += (x[k] - y[k]) * (x[k] - y[k]);
      den += y[k] * y[k];
    }
    out.push_back(std::sqrt(num / std::max(den, 1e-30)));
  }
  return out;
}

TEST(FusionTrace, EveryOpMatchesTheUnfusedPlanBitForBitInF32AndF64) {
  for (DType dt : {DType::f32, DType::f64}) {
    std::vector<Tensor> in = fusion_test::chain_inputs(dt, Device::cpu());
    auto fused = compiled(fusion_test::elementwise_chain, true), plain = compiled(fusion_test::elementwise_chain, false);
    std::vector<Tensor> a = run3(fused, in), b = run3(plain, in);
    const compile::Plan* plan = fused.last_plan();
    ASSERT_NE(plan, nullptr);
    EXPECT_GT(plan->stats().fused, 30u) << dtype_name(dt);
    EXPECT_LE(plan->kernels(), 3u) << plan->graph().str();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].to_vector<double>(), b[i].to_vector<double>()) << dtype_name(dt) << " output " << i;
  }
}

TEST(FusionTrace, SixteenBitChainsKeepIntermediatesInFloat) {
  for (DType dt : {DType::f16, DType::bf16}) {
    std::vector<Tensor> in = fusion_test::chain_inputs(dt, Device::cpu());
    auto fused = compiled(fusion_test::elementwise_chain, true), plain = compiled(fusion_test::elementwise_chain, false);
    std::vector<Tensor> a = run3(fused, in), b = run3(plain, in);
    ASSERT_NE(fused.last_plan(), nullptr);
    EXPECT_GT(fused.last_plan()->stats().fused, 30u);
    // The unfused plan rounds every intermediate to 16 bits; the fused one only what it stores.
    const double tol = dt == DType::f16 ? 2e-3 : 1e-2;
    for (double e : rel_errors(a, b)) EXPECT_LT(e, tol) << dtype_name(dt);
  }
}

TEST(FusionTrace, LargeStridedLoopsSplitAcrossThreadsGiveTheSameBits) {
  Generator gen(8);
  Tensor x = randn({64, 33, 17}, {}, &gen), bias = randn({17}, {}, &gen), w = randn({17, 33, 64}, {}, &gen);
  auto fn = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{tanh(gelu(in[0] + bias) * w.permute({2, 1, 0})) - in[0]};
  };
  auto fused = compiled(fn, true), plain = compiled(fn, false);
  std::vector<Tensor> a = run3(fused, {x}), b = run3(plain, {x});
  ASSERT_NE(fused.last_plan(), nullptr);
  EXPECT_EQ(fused.last_plan()->kernels(), 1u);
  EXPECT_EQ(a[0].to_vector<double>(), b[0].to_vector<double>());
}

// ---- a training step ----------------------------------------------------------------------------

TEST(FusionTraining, GptStepWithFusionFollowsEagerWithFewerKernels) {
  nn::GptConfig cfg{16, 8, 16, 2, 2};
  auto make = [&] {
    Generator gen(3);
    return nn::gpt(cfg, &gen);
  };
  auto eager_model = make(), fused_model = make();
  auto setup = [](optim::AdamW& opt) {
    opt.set_accum_steps(2).set_max_grad_norm(1.0);
    opt.set_schedule(std::make_shared<optim::LinearWarmupCosine>(2, 20));
  };
  optim::AdamW opt_e(eager_model->parameters(), optim::AdamWOptions(3e-3).weight_decay(0.01));
  optim::AdamW opt_f(fused_model->parameters(), optim::AdamWOptions(3e-3).weight_decay(0.01));
  setup(opt_e);
  setup(opt_f);
  nn::Module* me = eager_model.get();
  nn::Module* mf = fused_model.get();
  auto loss_e = [me](const Tensor& x, const Tensor& y) { return nn::model_loss(*me, x, y); };
  auto step = compile::compile_train_step(opt_f, [mf](const Tensor& x, const Tensor& y) { return nn::model_loss(*mf, x, y); },
                                          {compile::Mode::Default, 8, true});
  auto micro = token_batches(2, 2, 8, 16, Device::cpu(), 17);
  for (int s = 0; s < 20; ++s) {
    Tensor mean_loss;
    optim::train_step(opt_e, loss_e, micro, &mean_loss);
    const double fused_loss = step(compile::flatten_micro(micro))[0].item();
    EXPECT_NEAR(fused_loss, mean_loss.item(), 1e-5 * std::abs(mean_loss.item())) << "step " << s;
  }
  const compile::Plan* plan = step.last_plan();
  ASSERT_NE(plan, nullptr);
  EXPECT_GT(plan->stats().fused, 0u);
  EXPECT_LT(plan->kernels(), plan->stats().traced - plan->stats().dead - plan->stats().folded);
  // The Linear layers' bias adds run in their GEMM's epilogue, as on the GPU (the same graph).
  int gemm_bias = 0;
  for (const Node& n : plan->graph().nodes)
    gemm_bias += n.op == OpKind::GemmEpilogue && n.fused == std::vector<std::string>({"matmul", "add"});
  EXPECT_GT(gemm_bias, 0) << "no Linear's bias add went into its GEMM";
  auto pe = eager_model->parameters(), pf = fused_model->parameters();
  for (size_t i = 0; i < pe.size(); ++i)
    EXPECT_LT(testing_util::max_abs_diff(pf[i].to_vector<double>(), pe[i].to_vector<double>()), 1e-5) << "parameter " << i;
}

}  // namespace
