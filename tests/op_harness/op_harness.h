// The op harness: cases for every op of kernels/ops.def, run on every backend and dtype the op
// supports, with the CPU kernel as the reference (in the manner of ggml's tests/test-backend-ops.cpp).
//
// A case (OpTestCase) names an op, the dtypes it runs in and a `make` function that builds one call:
// inputs, attrs and, for ops run through dispatch_out, the given outputs (which may alias inputs).
// Conventions:
//   - make builds every tensor on the CPU from seeded draws (tests/op_harness/inputs.h), so a call
//     is the same wherever it runs; its Device argument only fills attrs that name a device (the
//     creation ops). The runner places the tensors on the device under test, keeping shapes,
//     strides, offsets and which tensors share storage.
//   - The CPU run is the reference. Another backend must give every output, and every input after
//     the call (in-place updates such as batch norm's running statistics), within the dtype's
//     relative-L2 tolerance (f64 1e-12, f32 2e-5, f16 5e-3, bf16 3e-2) times tol_scale; i64 values
//     exactly; tol_scale = 0 asks for exact values in every dtype (comparisons, Philox draws).
//   - On every backend the outputs must have the metas infer_outputs() predicts; on the CPU the
//     kernel must give the same bits twice, and a case's `reference` (a plain-loop formula, where
//     the op has a simple one) must agree with it.
//   - A case of a differentiable op carries `grad`, a GradcheckFn through the op's autograd
//     function: the harness marks the call's inputs as leaves and runs gradcheck in f64.
// Families: one file tests/op_harness/cases_<family>.cpp per family of ops.def, each one function
// `<family>_cases()`, listed once in kFamilies (op_harness.cpp). Adding ops to a family means adding
// cases to its file; a new family is one file, one declaration below and one line in kFamilies.
#pragma once
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "kernels/dispatch.h"

namespace reel::harness {

// One call of an op. `outputs` empty: run through dispatch, which allocates the outputs (or makes
// the view). Otherwise run through dispatch_out into these tensors.
struct OpCall {
  std::vector<Tensor> inputs = {};
  Attrs attrs = {};
  std::vector<Tensor> outputs = {};
};

// Expected values of the first outputs (row-major), computed by plain loops from the call's inputs
// before it runs.
using Expected = std::vector<std::vector<double>>;
using ReferenceFn = std::function<Expected(const OpCall&)>;

struct OpTestCase {
  OpKind op;
  std::string name;  // snake_case, starting with the op's name: "layer_norm_rows_3x5"
  std::vector<DType> dtypes;
  std::function<OpCall(Device, DType)> make;
  GradcheckFn grad = {};                 // optional: gradcheck of the op's autograd function in f64
  std::vector<size_t> grad_inputs = {};  // which inputs gradcheck varies (empty: every float input
                                         // that no stride-0 dim repeats)
  double tol_scale = 1;                  // 0: exact in every dtype
  ReferenceFn reference = {};            // optional: plain-loop check of the CPU kernel
  GradcheckOptions grad_options = {};
};

// The dtype lists cases run in (constant-initialised: usable from any static).
inline constexpr std::initializer_list<DType> kFloatTypes{DType::f32, DType::f64, DType::f16, DType::bf16};
inline constexpr std::initializer_list<DType> kAllTypes{DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64};
// f32, f64, i64: what the collectives take.
inline constexpr std::initializer_list<DType> kWideTypes{DType::f32, DType::f64, DType::i64};

// ---- the registry ----
std::vector<OpTestCase> memory_cases();
std::vector<OpTestCase> views_cases();
std::vector<OpTestCase> elementwise_cases();
std::vector<OpTestCase> reduce_cases();
std::vector<OpTestCase> linalg_cases();
std::vector<OpTestCase> pool_cases();
std::vector<OpTestCase> norm_cases();
std::vector<OpTestCase> dropout_cases();  // the norm family's random ops (cases_dropout.cpp)
std::vector<OpTestCase> attention_cases();
std::vector<OpTestCase> optim_cases();
std::vector<OpTestCase> fused_cases();         // the fused ops of the other families (cases_fused.cpp)
std::vector<OpTestCase> fused_reduce_cases();  // the reduce family's fused ops (cases_fused_reduce.cpp)
std::vector<OpTestCase> fused_norm_cases();    // the layer norm's fused ops (cases_fused_norm.cpp)

// Every family's cases, built once.
const std::vector<OpTestCase>& all_cases();
// The ops of ops.def that no case covers, in enum order.
std::vector<OpKind> ops_without_cases();
// "layer_norm_rows_3x5_f32": a case in one dtype, as the tests name it.
std::string run_name(const OpTestCase& c, DType dtype);

// ---- the runner ----
// What a check found wrong: empty when it passed.
struct Report {
  std::vector<std::string> problems;
  bool ok() const { return problems.empty(); }
  std::string str() const;
  void add(std::string problem) { problems.push_back(std::move(problem)); }
};

// Whether the case runs on `device` here: the device type has a kernel for the op and is usable.
bool runs_on(const OpTestCase& c, DeviceType device);
// The CPU on its own: metas as inferred, the same bits twice, and the plain-loop reference.
Report check_cpu(const OpTestCase& c, DType dtype);
// `device` against the CPU: metas as inferred there, and every output and input after the call
// within tolerance of the CPU's.
Report check_against_cpu(const OpTestCase& c, DType dtype, Device device);
// gradcheck of c.grad in f64 on `device`, after checking that the function reaches c.op.
Report check_gradcheck(const OpTestCase& c, Device device);

// The relative-L2 tolerance of a dtype, before a case's tol_scale.
double tolerance(DType dtype);

}  // namespace reel::harness
