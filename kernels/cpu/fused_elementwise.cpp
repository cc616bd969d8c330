// The CPU kernel of fused_elementwise (kernels/fused_expr.h): an interpreter of the op's program.
//
// It runs the program over blocks of up to kBlock consecutive elements of one row of the merged loop:
// each instruction is one tight loop over the block, in SIMD lanes (registers, inputs and outputs
// never overlap), with loads and stores at the row's inner strides and ops through the shared scalar
// formulas of kernels/elementwise_math.h, so the interpretation costs
// one switch per instruction per block rather than per element. Registers live in per-thread pools,
// one per accumulation type. Blocks are spread over OpenMP threads once the loop is large enough.
// For f32 and f64 every op computes what its own kernel computes (GELU and its backward through
// vector_math.h's packets in both), so a fused CPU plan gives eager's bits.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cpu/compose.h"
#include "kernels/cpu/vector_math.h"
#include "kernels/dispatch.h"
#include "kernels/elementwise_math.h"
#include "kernels/fused_expr.h"
#include "tensor/rng.h"

namespace reel {

namespace {

constexpr int64_t kBlock = 256;
constexpr int64_t kParallelGrain = 1 << 15;  // elements below which one thread runs the loop

// One thread's registers: a block-sized slot per register, in the pool of its type.
class RegisterFile {
 public:
  explicit RegisterFile(const FusedExpr& e) : slot_(e.code.size(), -1) {
    int count[3] = {0, 0, 0};
    for (size_t r = 0; r < e.code.size(); ++r)
      if (e.code[r].kind != InstrKind::Store) slot_[r] = count[int(e.code[r].type)]++;
    f_.resize(size_t(count[0] * kBlock));
    d_.resize(size_t(count[1] * kBlock));
    i_.resize(size_t(count[2] * kBlock));
  }
  template <typename A>
  A* at(int reg) {
    const size_t base = size_t(slot_[size_t(reg)]) * kBlock;
    if constexpr (std::is_same_v<A, float>) return f_.data() + base;
    else if constexpr (std::is_same_v<A, double>) return d_.data() + base;
    else return i_.data() + base;
  }

 private:
  std::vector<int> slot_;
  std::vector<float> f_;
  std::vector<double> d_;
  std::vector<int64_t> i_;
};

// Calls fn.template operator()<A>() with A the C++ type of register type t.
template <typename Fn>
void visit_value_type(ValueType t, Fn&& fn) {
  switch (t) {
    case ValueType::F32: return fn.template operator()<float>();
    case ValueType::F64: return fn.template operator()<double>();
    case ValueType::I64: return fn.template operator()<int64_t>();
  }
}

template <OpKind Op, typename A>
void unary_block(A* y, const A* x, A p, int64_t n) {
  // GELU in f32: vector_math.h's packets, as the eager kernel runs it (the same bits).
  if constexpr (Op == OpKind::Gelu && std::is_same_v<A, float>) return cpu::gelu_f32(x, y, n);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = math::unary<Op, A>(x[i], p);
}

template <typename A>
void unary_op(OpKind op, A* y, const A* x, A p, int64_t n) {
  switch (op) {
    case OpKind::Neg: return unary_block<OpKind::Neg>(y, x, p, n);
    case OpKind::Exp: return unary_block<OpKind::Exp>(y, x, p, n);
    case OpKind::Log: return unary_block<OpKind::Log>(y, x, p, n);
    case OpKind::Sqrt: return unary_block<OpKind::Sqrt>(y, x, p, n);
    case OpKind::Rsqrt: return unary_block<OpKind::Rsqrt>(y, x, p, n);
    case OpKind::Abs: return unary_block<OpKind::Abs>(y, x, p, n);
    case OpKind::Tanh: return unary_block<OpKind::Tanh>(y, x, p, n);
    case OpKind::Sigmoid: return unary_block<OpKind::Sigmoid>(y, x, p, n);
    case OpKind::Relu: return unary_block<OpKind::Relu>(y, x, p, n);
    case OpKind::Gelu: return unary_block<OpKind::Gelu>(y, x, p, n);
    case OpKind::GeluErf: return unary_block<OpKind::GeluErf>(y, x, p, n);
    case OpKind::Silu: return unary_block<OpKind::Silu>(y, x, p, n);
    case OpKind::PowScalar: return unary_block<OpKind::PowScalar>(y, x, p, n);
    case OpKind::AddScalar: return unary_block<OpKind::AddScalar>(y, x, p, n);
    case OpKind::MulScalar: return unary_block<OpKind::MulScalar>(y, x, p, n);
    default: REEL_ASSERT(false, "fused expr: ", op_name(op), " is not unary");
  }
}

template <OpKind Op, typename A>
void binary_block(A* y, const A* a, const A* b, int64_t n) {
  if constexpr (Op == OpKind::GeluBackward && std::is_same_v<A, float>) return cpu::gelu_backward_f32(a, b, y, n);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = math::binary<Op, A>(a[i], b[i]);
}

template <typename A>
void binary_op(OpKind op, A* y, const A* a, const A* b, int64_t n) {
  switch (op) {
    case OpKind::Add: return binary_block<OpKind::Add>(y, a, b, n);
    case OpKind::Sub: return binary_block<OpKind::Sub>(y, a, b, n);
    case OpKind::Mul: return binary_block<OpKind::Mul>(y, a, b, n);
    case OpKind::Div: return binary_block<OpKind::Div>(y, a, b, n);
    case OpKind::Eq: return binary_block<OpKind::Eq>(y, a, b, n);
    case OpKind::Ne: return binary_block<OpKind::Ne>(y, a, b, n);
    case OpKind::Lt: return binary_block<OpKind::Lt>(y, a, b, n);
    case OpKind::Le: return binary_block<OpKind::Le>(y, a, b, n);
    case OpKind::Gt: return binary_block<OpKind::Gt>(y, a, b, n);
    case OpKind::Ge: return binary_block<OpKind::Ge>(y, a, b, n);
    case OpKind::ReluBackward: return binary_block<OpKind::ReluBackward>(y, a, b, n);
    case OpKind::GeluBackward: return binary_block<OpKind::GeluBackward>(y, a, b, n);
    case OpKind::GeluErfBackward: return binary_block<OpKind::GeluErfBackward>(y, a, b, n);
    case OpKind::SiluBackward: return binary_block<OpKind::SiluBackward>(y, a, b, n);
    case OpKind::TanhBackward: return binary_block<OpKind::TanhBackward>(y, a, b, n);
    case OpKind::SigmoidBackward: return binary_block<OpKind::SigmoidBackward>(y, a, b, n);
    default: REEL_ASSERT(false, "fused expr: ", op_name(op), " is not binary");
  }
}

// One op instruction over a block, in its register type A. where, masked_fill and clamp_scalar
// use the same expressions as their CPU kernels (kernels/cpu/elementwise.cpp, optim.cpp).
template <typename A>
void run_op(const Instr& ins, int reg, RegisterFile& rf, int64_t n) {
  A* y = rf.at<A>(reg);
  const A* a = rf.at<A>(ins.args[0]);
  switch (ins.op) {
    case OpKind::Where: {
      const A* b = rf.at<A>(ins.args[1]);
      const A* c = rf.at<A>(ins.args[2]);
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) y[i] = a[i] != A(0) ? b[i] : c[i];
      return;
    }
    case OpKind::MaskedFill: {
      const A* m = rf.at<A>(ins.args[1]);
      const A v = A(ins.p0);
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) y[i] = m[i] != A(0) ? v : a[i];
      return;
    }
    case OpKind::ClampScalar: {
      const A lo = A(ins.p0), hi = A(ins.p1);
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) y[i] = a[i] < lo ? lo : (a[i] > hi ? hi : a[i]);
      return;
    }
    default:
      if (fusable_arity(ins.op) == 1) unary_op<A>(ins.op, y, a, A(ins.p0), n);
      else binary_op<A>(ins.op, y, a, rf.at<A>(ins.args[1]), n);
  }
}

// A copy's conversion, as kernels/cpu/memory.cpp's copy_strided does it: through double into the
// target's accumulation type, then (16-bit targets) rounded to the target and widened again.
template <typename S>
void run_cast(const Instr& ins, int reg, RegisterFile& rf, int64_t n) {
  const S* x = rf.at<S>(ins.args[0]);
  visit_dtype(ins.dtype, [&]<typename D>() {
    using AD = AccType<D>;
    AD* y = rf.at<AD>(reg);
    for (int64_t i = 0; i < n; ++i) {
      AD v = static_cast<AD>(static_cast<double>(x[i]));
      if constexpr (std::is_same_v<D, Half> || std::is_same_v<D, BFloat16>) v = load(static_cast<D>(v));
      y[i] = v;
    }
  });
}

struct BlockArgs {
  const std::vector<Tensor>* inputs;
  const std::vector<Tensor>* outputs;
  const std::vector<const uint64_t*>* states;  // each Philox state's {seed, base}
  const int64_t* offsets;        // per loop operand (0: outputs, 1 + k: input k) at the block's start
  const int64_t* inner_strides;  // per loop operand
  int64_t n;
};

void run_load(const Instr& ins, int reg, RegisterFile& rf, const BlockArgs& b) {
  const size_t k = size_t(ins.index) + 1;
  visit_dtype(ins.dtype, [&]<typename T>() {
    using A = AccType<T>;
    const T* p = static_cast<const T*>((*b.inputs)[size_t(ins.index)].data_ptr()) + b.offsets[k];
    const int64_t s = b.inner_strides[k];
    A* y = rf.at<A>(reg);
    if (s == 1) {
#pragma omp simd
      for (int64_t i = 0; i < b.n; ++i) y[i] = load(p[i]);
    } else {
      for (int64_t i = 0; i < b.n; ++i) y[i] = load(p[i * s]);
    }
  });
}

void run_store(const Instr& ins, RegisterFile& rf, const BlockArgs& b) {
  visit_dtype(ins.dtype, [&]<typename T>() {
    using A = AccType<T>;
    T* p = static_cast<T*>((*b.outputs)[size_t(ins.index)].data_ptr()) + b.offsets[0];
    const A* x = rf.at<A>(ins.args[0]);
#pragma omp simd
    for (int64_t i = 0; i < b.n; ++i) p[i] = store<T>(x[i]);  // outputs are contiguous: inner stride 1
  });
}

// Dropout's mask over the block, as kernels/cpu/norm.cpp's dropout draws it: element e of the loop
// (the outputs are contiguous, so the block starts at element offsets[0]) is element e of the mask.
void run_random(const Instr& ins, int reg, RegisterFile& rf, const BlockArgs& b) {
  const PhiloxArgs rng{ins.seed, ins.offset, ins.index >= 0 ? (*b.states)[size_t(ins.index)] : nullptr};
  const uint64_t key = rng.key(), start = rng.start(), e0 = uint64_t(b.offsets[0]);
  const float threshold = float(ins.p0);
  visit_value_type(ins.type, [&]<typename A>() {
    A* y = rf.at<A>(reg);
    const A keep = A(ins.p1);
    for (int64_t i = 0; i < b.n; ++i) y[i] = philox_uniform(key, start, e0 + uint64_t(i)) >= threshold ? keep : A(0);
  });
}

void run_block(const FusedExpr& e, RegisterFile& rf, const BlockArgs& b) {
  for (size_t r = 0; r < e.code.size(); ++r) {
    const Instr& ins = e.code[r];
    switch (ins.kind) {
      case InstrKind::Load: run_load(ins, int(r), rf, b); break;
      case InstrKind::Store: run_store(ins, rf, b); break;
      case InstrKind::Random: run_random(ins, int(r), rf, b); break;
      case InstrKind::Op:
        visit_value_type(ins.type, [&]<typename A>() { run_op<A>(ins, int(r), rf, b.n); });
        break;
      case InstrKind::Cast:
        visit_value_type(e.code[size_t(ins.args[0])].type, [&]<typename S>() { run_cast<S>(ins, int(r), rf, b.n); });
        break;
    }
  }
}

// Element offsets of every operand at the start of row `row` (rows count the innermost merged dim).
void row_offsets(const FusedLoop& l, int64_t row, std::vector<int64_t>& off) {
  std::fill(off.begin(), off.end(), 0);
  for (int64_t d = int64_t(l.sizes.size()) - 2; d >= 0; --d) {
    const int64_t i = row % l.sizes[size_t(d)];
    row /= l.sizes[size_t(d)];
    for (size_t k = 0; k < off.size(); ++k) off[k] += i * l.strides[k][size_t(d)];
  }
}

}  // namespace

void run_fused_cpu(const FusedExpr& expr, const FusedLoop& loop, const std::vector<Tensor>& inputs,
                   const std::vector<Tensor>& outputs, const std::vector<Tensor>& states) {
  REEL_ASSERT(inputs.size() == expr.inputs.size() && outputs.size() == expr.outputs.size() &&
                  states.size() == size_t(expr.states) && loop.strides.size() == inputs.size() + 1,
              "fused kernel: ", inputs.size(), " inputs, ", states.size(), " states and ", outputs.size(),
              " outputs for an expression of ", expr.inputs.size(), ", ", expr.states, " and ", expr.outputs.size());
  std::vector<const uint64_t*> state_ptrs;
  for (const Tensor& s : states) state_ptrs.push_back(static_cast<const uint64_t*>(s.data_ptr()));
  if (loop.numel == 0) return;
  const size_t nops = loop.strides.size();
  const int64_t inner = loop.sizes.back();
  const int64_t per_row = (inner + kBlock - 1) / kBlock;
  const int64_t units = loop.numel / inner * per_row;
  std::vector<int64_t> inner_strides(nops);
  for (size_t k = 0; k < nops; ++k) inner_strides[k] = loop.strides[k].back();
#pragma omp parallel if (loop.numel >= kParallelGrain)
  {
    RegisterFile rf(expr);
    std::vector<int64_t> off(nops);
#pragma omp for schedule(static)
    for (int64_t u = 0; u < units; ++u) {
      const int64_t row = u / per_row, c0 = (u % per_row) * kBlock;
      row_offsets(loop, row, off);
      for (size_t k = 0; k < nops; ++k) off[k] += c0 * inner_strides[k];
      BlockArgs b{&inputs, &outputs, &state_ptrs, off.data(), inner_strides.data(), std::min(kBlock, inner - c0)};
      run_block(expr, rf, b);
    }
  }
}

namespace {
// The program over the loop, then (attrs column_sums) the column_sums op over the summed output:
// the reference the CUDA kernel's one-pass sums are compared with.
void fused_elementwise_kernel(const KernelCall& c) {
  const FusedExpr expr = fused_expr_of(c.attrs);
  const FusedColumnSums sums = fused_column_sums_of(c.attrs);
  const std::vector<Tensor> loaded = loaded_inputs(expr, c.in);
  const auto states_end = c.in.begin() + int64_t(loaded.size()) + expr.states;
  const std::vector<Tensor> states(c.in.begin() + int64_t(loaded.size()), states_end);
  const std::vector<Tensor> outputs(c.out.begin(), c.out.begin() + int64_t(expr.outputs.size()));
  run_fused_cpu(expr, fused_loop_of(fused_shape_of(c.attrs), loaded), loaded, outputs, states);
  if (!sums.on()) return;
  std::vector<Tensor> in{c.out[size_t(sums.output)]};  // (..., C): the op sums over every dim but the last
  if (sums.accumulate) in.push_back(c.in.back());
  cpu::run_op(OpKind::ColumnSums, in, {c.out.back()}, Attrs().set("accumulate", sums.accumulate));
}
}  // namespace

void register_fused_elementwise_cpu_kernel() {
  register_kernel(DeviceType::CPU, OpKind::FusedElementwise, fused_elementwise_kernel);
}

}  // namespace reel
