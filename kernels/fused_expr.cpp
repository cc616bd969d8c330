// FusedExpr: building, printing, the loop geometry and the attrs encoding (see fused_expr.h).
#include "kernels/fused_expr.h"

#include <algorithm>
#include <bit>

#include <cmath>
#include <sstream>
#include <type_traits>

#include "kernels/philox_args.h"
#include "kernels/schema/views.h"

namespace reel {

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
    case OpKind::GeluErf: case OpKind::Silu:
    case OpKind::PowScalar: case OpKind::AddScalar: case OpKind::MulScalar: case OpKind::ClampScalar:
      return 1;
    case OpKind::ReluBackward: case OpKind::GeluBackward: case OpKind::TanhBackward: case OpKind::SigmoidBackward:
    case OpKind::GeluErfBackward: case OpKind::SiluBackward:
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

int FusedExpr::random(int state, DType dtype, double p, uint64_t seed, uint64_t offset) {
  REEL_ASSERT(is_floating(dtype), "fused expr: a dropout mask of ", dtype_name(dtype));
  if (state >= 0) states = std::max(states, state + 1);
  Instr i{InstrKind::Random};
  i.type = value_type_of(dtype);
  i.dtype = dtype;
  i.index = state;
  i.p0 = p;
  i.p1 = dropout_kept_value(dtype, p);
  i.seed = seed;
  i.offset = offset;
  code.push_back(i);
  return int(code.size()) - 1;
}

std::string FusedExpr::str() const {
  std::ostringstream os;
  for (size_t r = 0; r < code.size(); ++r) {
    const Instr& i = code[r];
    switch (i.kind) {
      case InstrKind::Load: os << "r" << r << " = load in" << i.index << " " << dtype_name(i.dtype); break;
      case InstrKind::Cast: os << "r" << r << " = cast r" << i.args[0] << " to " << dtype_name(i.dtype); break;
      case InstrKind::Store: os << "store out" << i.index << " " << dtype_name(i.dtype) << " <- r" << i.args[0]; break;
      case InstrKind::Random:
        os << "r" << r << " = dropout_mask (p " << i.p0 << ", " << (i.index >= 0 ? "state" + std::to_string(i.index) : "seed " + std::to_string(i.seed))
           << " + " << i.offset << ") " << dtype_name(i.dtype);
        break;
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

std::string fused_label(const FusedExpr& expr) {
  std::string out;
  for (const Instr& i : expr.code) {
    if (i.kind == InstrKind::Load || i.kind == InstrKind::Store) continue;
    const char* name = i.kind == InstrKind::Op ? op_name(i.op) : i.kind == InstrKind::Cast ? "copy" : "dropout_mask";
    out += (out.empty() ? "" : " ") + std::string(name);
  }
  return out;
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

// ---- the attrs encoding ----------------------------------------------------------------------

namespace {
constexpr size_t kInstrInts = 12;  // kind, op, type, dtype, index, args[3], bits of p0 and p1, seed, offset

std::vector<int64_t> dtype_list(const std::vector<DType>& d) {
  std::vector<int64_t> out;
  for (DType t : d) out.push_back(int64_t(t));
  return out;
}

std::vector<DType> dtypes_of(const std::vector<int64_t>& l) {
  std::vector<DType> out;
  for (int64_t v : l) {
    REEL_ASSERT(v >= 0 && v <= int64_t(DType::i64), "fused_elementwise: dtype code ", v);
    out.push_back(static_cast<DType>(v));
  }
  return out;
}
}  // namespace

Attrs fused_elementwise_attrs(const FusedExpr& expr, const Shape& shape, Device device) {
  std::vector<int64_t> program;
  program.reserve(expr.code.size() * kInstrInts);
  for (const Instr& i : expr.code) {
    program.insert(program.end(), {int64_t(i.kind), int64_t(i.op), int64_t(i.type), int64_t(i.dtype), int64_t(i.index),
                                   i.args[0], i.args[1], i.args[2], std::bit_cast<int64_t>(i.p0),
                                   std::bit_cast<int64_t>(i.p1), int64_t(i.seed), int64_t(i.offset)});
  }
  return Attrs()
      .set("program", std::move(program))
      .set("inputs", dtype_list(expr.inputs))
      .set("outputs", dtype_list(expr.outputs))
      .set("states", int64_t(expr.states))
      .set("shape", std::vector<int64_t>(shape.begin(), shape.end()))
      .set("device_type", int64_t(device.type))
      .set("device_index", int64_t(device.index));
}

FusedExpr fused_expr_of(const Attrs& attrs) {
  const std::vector<int64_t>& p = attrs.ints("program");
  REEL_ASSERT(p.size() % kInstrInts == 0, "fused_elementwise: a program of ", p.size(), " values");
  FusedExpr e;
  e.inputs = dtypes_of(attrs.ints("inputs"));
  e.outputs = dtypes_of(attrs.ints("outputs"));
  e.states = int(attrs.i("states", 0));
  for (size_t k = 0; k < p.size(); k += kInstrInts) {
    Instr i{static_cast<InstrKind>(p[k])};
    i.op = static_cast<OpKind>(p[k + 1]);
    i.type = static_cast<ValueType>(p[k + 2]);
    i.dtype = static_cast<DType>(p[k + 3]);
    i.index = int(p[k + 4]);
    for (int a = 0; a < 3; ++a) i.args[a] = int(p[k + 5 + size_t(a)]);
    i.p0 = std::bit_cast<double>(p[k + 8]);
    i.p1 = std::bit_cast<double>(p[k + 9]);
    i.seed = uint64_t(p[k + 10]);
    i.offset = uint64_t(p[k + 11]);
    e.code.push_back(i);
  }
  return e;
}

Shape fused_shape_of(const Attrs& attrs) {
  const std::vector<int64_t>& s = attrs.ints("shape");
  return Shape(s.begin(), s.end());
}

std::vector<Tensor> loaded_inputs(const FusedExpr& expr, const std::vector<Tensor>& in) {
  REEL_ASSERT(in.size() >= expr.inputs.size() + size_t(expr.states), "fused_elementwise: ", in.size(),
              " inputs for a program of ", expr.inputs.size(), " loads and ", expr.states, " Philox states");
  return std::vector<Tensor>(in.begin(), in.begin() + int64_t(expr.inputs.size()));
}

FusedColumnSums fused_column_sums_of(const Attrs& attrs) {
  return {int(attrs.i("column_sums", -1)), attrs.b("accumulate", false)};
}

void set_fused_column_sums(Attrs& attrs, FusedColumnSums sums) {
  attrs.set("column_sums", int64_t(sums.output)).set("accumulate", sums.accumulate);
}

FusedLoop fused_loop_of(const Shape& shape, const std::vector<Tensor>& inputs) {
  std::vector<std::vector<int64_t>> strides;
  for (const Tensor& t : inputs) strides.push_back(broadcast_strides(t.shape(), t.strides(), shape));
  return make_fused_loop(shape, strides);
}

}  // namespace reel
