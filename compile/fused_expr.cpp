// FusedExpr and its CPU executor (see fused_expr.h).
//
// The executor runs the program over blocks of up to kBlock consecutive elements of one row of the
// merged loop: each instruction is one tight loop over the block (loads and stores with the row's
// inner strides, ops through the shared scalar formulas), so the interpretation costs one switch
// per instruction per block rather than per element. Registers live in per-thread pools, one per
// accumulation type. Blocks are spread over OpenMP threads once the loop is large enough.
#include "compile/fused_expr.h"

#include <cmath>
#include <sstream>
#include <type_traits>

#include "kernels/elementwise_math.h"

namespace reel::compile {

ValueType value_type_of(DType t) {
  if (t == DType::f64) return ValueType::F64;
  if (t == DType::i64) return ValueType::I64;
  return ValueType::F32;
}

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::F32: return "float";
    case ValueType::F64: return "double";
    case ValueType::I64: return "long long";
  }
  return "?";
}

int fusable_arity(OpKind op) {
  switch (op) {
    case OpKind::Neg: case OpKind::Exp: case OpKind::Log: case OpKind::Sqrt: case OpKind::Rsqrt:
    case OpKind::Abs: case OpKind::Tanh: case OpKind::Sigmoid: case OpKind::Relu: case OpKind::Gelu:
    case OpKind::PowScalar: case OpKind::AddScalar: case OpKind::MulScalar: case OpKind::ClampScalar:
      return 1;
    case OpKind::ReluBackward: case OpKind::GeluBackward: case OpKind::TanhBackward: case OpKind::SigmoidBackward:
    case OpKind::Add: case OpKind::Sub: case OpKind::Mul: case OpKind::Div: case OpKind::Eq: case OpKind::Ne:
    case OpKind::Lt: case OpKind::Le: case OpKind::Gt: case OpKind::Ge: case OpKind::MaskedFill:
      return 2;
    case OpKind::Where:
      return 3;
    default:
      return 0;
  }
}

bool is_fusable_op(OpKind op) { return fusable_arity(op) > 0; }

// ---- building -------------------------------------------------------------------------------

int FusedExpr::load(int input, DType dtype) {
  if (int(inputs.size()) <= input) inputs.resize(size_t(input) + 1, DType::f32);
  inputs[size_t(input)] = dtype;
  Instr i{InstrKind::Load};
  i.type = value_type_of(dtype);
  i.dtype = dtype;
  i.index = input;
  code.push_back(i);
  return int(code.size()) - 1;
}

int FusedExpr::op(OpKind op, const std::vector<int>& args, DType out, double p0, double p1) {
  REEL_ASSERT(is_fusable_op(op) && int(args.size()) == fusable_arity(op), "fused expr: ", op_name(op));
  Instr i{InstrKind::Op};
  i.op = op;
  i.type = value_type_of(out);
  i.dtype = out;
  for (size_t k = 0; k < args.size(); ++k) {
    REEL_ASSERT(args[k] >= 0 && args[k] < int(code.size()) && code[size_t(args[k])].type == i.type,
                "fused expr: operand ", k, " of ", op_name(op), " has the wrong type");
    i.args[k] = args[k];
  }
  i.p0 = p0;
  i.p1 = p1;
  code.push_back(i);
  return int(code.size()) - 1;
}

int FusedExpr::cast(int reg, DType to) {
  REEL_ASSERT(reg >= 0 && reg < int(code.size()), "fused expr: cast of r", reg);
  const bool narrow16 = to == DType::f16 || to == DType::bf16;
  if (code[size_t(reg)].type == value_type_of(to) && !narrow16) return reg;  // nothing to convert
  Instr i{InstrKind::Cast};
  i.type = value_type_of(to);
  i.dtype = to;
  i.args[0] = reg;
  code.push_back(i);
  return int(code.size()) - 1;
}

void FusedExpr::store(int output, int reg, DType dtype) {
  REEL_ASSERT(reg >= 0 && reg < int(code.size()) && code[size_t(reg)].type == value_type_of(dtype),
              "fused expr: store of r", reg, " as ", dtype_name(dtype));
  if (int(outputs.size()) <= output) outputs.resize(size_t(output) + 1, DType::f32);
  outputs[size_t(output)] = dtype;
  Instr i{InstrKind::Store};
  i.type = value_type_of(dtype);
  i.dtype = dtype;
  i.index = output;
  i.args[0] = reg;
  code.push_back(i);
}

std::string FusedExpr::str() const {
  std::ostringstream os;
  for (size_t r = 0; r < code.size(); ++r) {
    const Instr& i = code[r];
    switch (i.kind) {
      case InstrKind::Load: os << "r" << r << " = load in" << i.index << " " << dtype_name(i.dtype); break;
      case InstrKind::Cast: os << "r" << r << " = cast r" << i.args[0] << " to " << dtype_name(i.dtype); break;
      case InstrKind::Store: os << "store out" << i.index << " " << dtype_name(i.dtype) << " <- r" << i.args[0]; break;
      case InstrKind::Op:
        os << "r" << r << " = " << op_name(i.op);
        for (int a : i.args)
          if (a >= 0) os << " r" << a;
        if (i.op == OpKind::PowScalar || i.op == OpKind::AddScalar || i.op == OpKind::MulScalar ||
            i.op == OpKind::MaskedFill)
          os << " (" << i.p0 << ")";
        if (i.op == OpKind::ClampScalar) os << " (" << i.p0 << ", " << i.p1 << ")";
        os << " : " << value_type_name(i.type);
        break;
    }
    os << "\n";
  }
  return os.str();
}

FusedLoop make_fused_loop(const Shape& shape, const std::vector<std::vector<int64_t>>& input_strides) {
  FusedLoop l;
  l.shape = shape;
  l.numel = numel_of(shape);
  std::vector<std::vector<int64_t>> all{contiguous_strides(shape)};
  all.insert(all.end(), input_strides.begin(), input_strides.end());
  l.strides.resize(all.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !l.sizes.empty();
    for (size_t k = 0; k < all.size() && merge; ++k) merge = l.strides[k].back() == all[k][d] * shape[d];
    if (merge) {
      l.sizes.back() *= shape[d];
      for (size_t k = 0; k < all.size(); ++k) l.strides[k].back() = all[k][d];
    } else {
      l.sizes.push_back(shape[d]);
      for (size_t k = 0; k < all.size(); ++k) l.strides[k].push_back(all[k][d]);
    }
  }
  if (l.sizes.empty()) {  // a single element
    l.sizes.push_back(1);
    for (auto& s : l.strides) s.push_back(1);
  }
  return l;
}

// ---- the CPU executor -----------------------------------------------------------------------

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
    case OpKind::PowScalar: return unary_block<OpKind::PowScalar>(y, x, p, n);
    case OpKind::AddScalar: return unary_block<OpKind::AddScalar>(y, x, p, n);
    case OpKind::MulScalar: return unary_block<OpKind::MulScalar>(y, x, p, n);
    default: REEL_ASSERT(false, "fused expr: ", op_name(op), " is not unary");
  }
}

template <OpKind Op, typename A>
void binary_block(A* y, const A* a, const A* b, int64_t n) {
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
      for (int64_t i = 0; i < n; ++i) y[i] = a[i] != A(0) ? b[i] : c[i];
      return;
    }
    case OpKind::MaskedFill: {
      const A* m = rf.at<A>(ins.args[1]);
      const A v = A(ins.p0);
      for (int64_t i = 0; i < n; ++i) y[i] = m[i] != A(0) ? v : a[i];
      return;
    }
    case OpKind::ClampScalar: {
      const A lo = A(ins.p0), hi = A(ins.p1);
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
    for (int64_t i = 0; i < b.n; ++i) p[i] = store<T>(x[i]);  // outputs are contiguous: inner stride 1
  });
}

void run_block(const FusedExpr& e, RegisterFile& rf, const BlockArgs& b) {
  for (size_t r = 0; r < e.code.size(); ++r) {
    const Instr& ins = e.code[r];
    switch (ins.kind) {
      case InstrKind::Load: run_load(ins, int(r), rf, b); break;
      case InstrKind::Store: run_store(ins, rf, b); break;
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
                   const std::vector<Tensor>& outputs) {
  REEL_ASSERT(inputs.size() == expr.inputs.size() && outputs.size() == expr.outputs.size() &&
                  loop.strides.size() == inputs.size() + 1,
              "fused kernel: ", inputs.size(), " inputs and ", outputs.size(), " outputs for an expression of ",
              expr.inputs.size(), " and ", expr.outputs.size());
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
      BlockArgs b{&inputs, &outputs, off.data(), inner_strides.data(), std::min(kBlock, inner - c0)};
      run_block(expr, rf, b);
    }
  }
}

}  // namespace reel::compile
