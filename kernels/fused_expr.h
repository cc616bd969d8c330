// FusedExpr — what one fused_elementwise op computes for every element e of its loop, as a small
// straight-line program. The compiler's elementwise fusion builds it from a chain of elementwise
// nodes and stores it in the op's attrs (fused_elementwise_attrs); the CPU kernel interprets it
// (kernels/cpu/fused_elementwise.cpp) and the CUDA kernel is generated from it as CUDA C and compiled
// by NVRTC (kernels/jit/).
//
//   load   r = in_k[offset_k(e)]           widened to the accumulation type of in_k's dtype
//   op     r = f(r_a[, r_b[, r_c]]; p0, p1) the op's formula (kernels/elementwise_math.h) in the
//                                           accumulation type of its output's dtype
//   cast   r = as_dtype(r_a)               a copy's conversion: through double, then rounded to the
//                                           target dtype (16-bit targets are rounded, then widened)
//   store  out_k[e] = narrow(r_a)
//   random r = dropout's mask value of element e: keep if philox_uniform(key, start, e) >= float(p),
//               else 0 (tensor/rng.h; kernels/cpu/norm.cpp's dropout), where key and start come from
//               the Philox state input `index` (PhiloxArgs: {seed, base} + offset) or, without one,
//               from the seed and offset in the instruction. The mask is drawn again wherever it is
//               read rather than stored: element e of the loop is element e of the mask.
// Scalar attrs (an exponent, a fill value, clamp bounds) travel in the op instruction (p0, p1)
// rather than as separate constants: the CPU converts them to the op's type as its kernel does, and
// the CUDA source spells them as exact bit patterns.
//
// Conventions:
//   - registers are SSA: instruction i defines register i (a store defines none);
//   - accumulation types, as the unfused kernels use them: float for f32, f16 and bf16, double for
//     f64, int64 for i64. For f32 and f64 every op therefore computes exactly what its own kernel
//     computes (bit for bit); f16/bf16 intermediates stay in float instead of being rounded to 16
//     bits between ops (that is much of the point of fusing; compare with a tolerance);
//   - every output has the loop's shape and is contiguous, so element e of the loop is element e of
//     each output; inputs are read through strides over that shape (0 on broadcast dims);
//   - the op's inputs are the loaded ones (`inputs`), then `states` Philox states ((2,) i64, read
//     whole by random instructions, not part of the loop).
#pragma once
#include <string>
#include <vector>

#include "kernels/attrs.h"
#include "kernels/op.h"
#include "tensor/tensor.h"

namespace reel {

enum class ValueType : uint8_t { F32, F64, I64 };
ValueType value_type_of(DType t);          // the accumulation type of a storage dtype
const char* value_type_name(ValueType t);  // "float", "double", "long long"

enum class InstrKind : uint8_t { Load, Op, Cast, Store, Random };

struct Instr {
  InstrKind kind;
  OpKind op = OpKind::Add;     // Op: which formula
  ValueType type = ValueType::F32;  // the type of the register it defines (Store: of its operand)
  DType dtype = DType::f32;    // Load: the input's dtype; Cast/Store: the target dtype
  int index = -1;              // Load: input index; Store: output index; Random: state index or -1
  int args[3] = {-1, -1, -1};  // operand registers
  double p0 = 0, p1 = 0;       // attrs: pow's exponent, a scalar value, masked_fill's value, clamp's min/max;
                               // Random: p, and the kept value (already a value of `dtype`)
  uint64_t seed = 0, offset = 0;  // Random: the Philox key and counter (PhiloxArgs' attrs)
};

struct FusedExpr {
  std::vector<Instr> code;
  std::vector<DType> inputs, outputs;  // dtypes, by index
  int states = 0;                      // Philox state inputs after the loaded ones

  int load(int input, DType dtype);
  // A fusable op (is_fusable_op) on registers of its input dtype; `out` is its output's dtype.
  int op(OpKind op, const std::vector<int>& args, DType out, double p0 = 0, double p1 = 0);
  int cast(int reg, DType to);
  void store(int output, int reg, DType dtype);  // reg must hold dtype's accumulation type
  // Dropout's mask in `dtype` (p, seed, offset as the dropout_mask op's attrs); `state` is the index of
  // a Philox state input (growing `states`), or -1 for none.
  int random(int state, DType dtype, double p, uint64_t seed, uint64_t offset);

  std::string str() const;  // one instruction a line, for logs and tests
};

// The ops of the program in order, casts as "copy": "add gelu copy", a name for logs and comments.
std::string fused_label(const FusedExpr& expr);

// The ops a FusedExpr can compute with `op`: kernels/ops.def's elementwise family and clamp_scalar.
bool is_fusable_op(OpKind op);
// How many tensor inputs the op takes (1, 2 or 3).
int fusable_arity(OpKind op);

// The loop of a fused kernel: `shape` with dims merged where every operand allows it (as
// kernels/loop_geometry.h does for a fixed operand count). Operand 0 is the outputs' contiguous
// layout, operands 1.. the inputs' broadcast strides.
struct FusedLoop {
  Shape shape;                                // the iteration shape, before merging
  std::vector<int64_t> sizes;                 // merged dims, outermost first (at least one)
  std::vector<std::vector<int64_t>> strides;  // per operand, per merged dim (elements)
  int64_t numel = 1;
};
FusedLoop make_fused_loop(const Shape& shape, const std::vector<std::vector<int64_t>>& input_strides);

// The loop of `inputs` (each broadcast to `shape`, read through its own strides) and the outputs
// (contiguous, of `shape`): what the kernels of a fused_elementwise call iterate.
FusedLoop fused_loop_of(const Shape& shape, const std::vector<Tensor>& inputs);
// The loaded inputs of a call's inputs: its first expr.inputs.size() (the Philox states follow, then
// the sums added to when the op's column sums accumulate).
std::vector<Tensor> loaded_inputs(const FusedExpr& expr, const std::vector<Tensor>& in);

// Runs `expr` over `loop` on CPU tensors (inputs in the geometry the loop was made for, outputs
// contiguous, `states` the Philox states), in blocks of elements spread over OpenMP threads
// (kernels/cpu/fused_elementwise.cpp).
void run_fused_cpu(const FusedExpr& expr, const FusedLoop& loop, const std::vector<Tensor>& inputs,
                   const std::vector<Tensor>& outputs, const std::vector<Tensor>& states = {});

// The fused_elementwise op's attrs (schema: kernels/schema/fused_elementwise.cpp):
//   program  ten values an instruction (kind, op, value type, dtype, index, three operand registers,
//            and the bit patterns of p0 and p1), so a plan's attrs carry the whole program
//   inputs, outputs  the dtypes of the op's loaded inputs and of its outputs
//   states   how many Philox state inputs follow the loaded ones (0 when absent)
//   shape    the loop's shape, which every output has
//   device_type, device_index  where it runs (a program may have no inputs to tell)
Attrs fused_elementwise_attrs(const FusedExpr& expr, const Shape& shape, Device device);
FusedExpr fused_expr_of(const Attrs& attrs);
Shape fused_shape_of(const Attrs& attrs);

// The column sums a fused_elementwise op may also write (attrs column_sums, accumulate): the sums over
// the rows of output `output` viewed as (rows, C), C the loop shape's last dim, of its stored values
// (16-bit outputs as rounded), accumulated in f32 into one more output, sums (C) f32, written after
// the program's outputs. With accumulate they are added to sums' values before the call, which come
// in as one more input after the Philox states (the same memory as that output). A Linear's bias
// gradient, summed by the kernel that computes the gradient it sums (the compiler's
// compile/passes/fuse_elementwise_column_sums.cpp): the column_sums op's value, up to f32 rounding.
struct FusedColumnSums {
  int output = -1;  // which program output is summed; -1: none
  bool accumulate = false;
  bool on() const { return output >= 0; }
};
FusedColumnSums fused_column_sums_of(const Attrs& attrs);
void set_fused_column_sums(Attrs& attrs, FusedColumnSums sums);

}  // namespace reel
