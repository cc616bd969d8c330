// The op harness (tests/op_harness/) as GoogleTest suites:
//   Cpu/OpHarness.Run/<case>_<dtype>         the CPU kernel: inferred metas, the same bits twice, and
//                                            the case's plain-loop reference where it has one
//   Cuda/OpHarness.Run/<case>_<dtype>        CUDA against the CPU; skips, saying why, where no GPU is
//                                            visible or the op has no CUDA kernel
//   Cpu/OpHarnessGradcheck.F64/<case>        gradcheck in f64 of the cases that carry a function
//   Cuda/OpHarnessGradcheck.F64/<case>       the same on the GPU
//   OpHarnessCoverage.*                      every op of ops.def has a case; case names are sound.
//                                            Prints the one summary line of the harness.
//   OpHarnessRunner.*                        the runner itself: the device comparison path run with the
//                                            CPU as both sides, and checks that must fail do
#include <gtest/gtest.h>

#include <cctype>
#include <iostream>
#include <memory>
#include <ostream>
#include <set>

#include "tensor/cuda.h"
#include "tests/op_harness/inputs.h"
#include "tests/op_harness/op_harness.h"

using namespace reel;
using namespace reel::harness;

namespace {

struct HarnessRun {
  const OpTestCase* c;
  DType dtype;
  DeviceType device;
};

// What a failure message shows for a parameter.
void PrintTo(const HarnessRun& run, std::ostream* os) {
  *os << run_name(*run.c, run.dtype) << " on " << (run.device == DeviceType::CPU ? "cpu" : "cuda");
}

std::vector<HarnessRun> runs(DeviceType device) {
  std::vector<HarnessRun> out;
  for (const OpTestCase& c : all_cases())
    for (DType t : c.dtypes) out.push_back({&c, t, device});
  return out;
}

std::vector<HarnessRun> gradcheck_runs(DeviceType device) {
  std::vector<HarnessRun> out;
  for (const OpTestCase& c : all_cases())
    if (c.grad) out.push_back({&c, DType::f64, device});
  return out;
}

std::string run_param_name(const testing::TestParamInfo<HarnessRun>& info) {
  return run_name(*info.param.c, info.param.dtype);
}
std::string gradcheck_param_name(const testing::TestParamInfo<HarnessRun>& info) { return info.param.c->name; }

// Skips the calling test where the run cannot happen on its device here.
#define SKIP_UNLESS_RUNNABLE(run)                                                                   \
  do {                                                                                              \
    if ((run).device == DeviceType::CUDA && !cuda::is_available())                                  \
      GTEST_SKIP() << "no CUDA device (" << cuda::unavailable_reason() << ")";                      \
    if (!runs_on(*(run).c, (run).device)) GTEST_SKIP() << "no kernel of " << op_name((run).c->op); \
  } while (0)

Device device_of(const HarnessRun& run) { return run.device == DeviceType::CPU ? Device::cpu() : Device::cuda(0); }

class OpHarness : public testing::TestWithParam<HarnessRun> {};
class OpHarnessGradcheck : public testing::TestWithParam<HarnessRun> {};

}  // namespace

TEST_P(OpHarness, Run) {
  const HarnessRun& run = GetParam();
  SKIP_UNLESS_RUNNABLE(run);
  Report r = run.device == DeviceType::CPU ? check_cpu(*run.c, run.dtype)
                                           : check_against_cpu(*run.c, run.dtype, device_of(run));
  EXPECT_TRUE(r.ok()) << run_name(*run.c, run.dtype) << " on " << device_of(run).str() << ":\n" << r.str();
}

TEST_P(OpHarnessGradcheck, F64) {
  const HarnessRun& run = GetParam();
  SKIP_UNLESS_RUNNABLE(run);
  Report r = check_gradcheck(*run.c, device_of(run));
  EXPECT_TRUE(r.ok()) << run.c->name << " on " << device_of(run).str() << ":\n" << r.str();
}

INSTANTIATE_TEST_SUITE_P(Cpu, OpHarness, testing::ValuesIn(runs(DeviceType::CPU)), run_param_name);
INSTANTIATE_TEST_SUITE_P(Cuda, OpHarness, testing::ValuesIn(runs(DeviceType::CUDA)), run_param_name);
INSTANTIATE_TEST_SUITE_P(Cpu, OpHarnessGradcheck, testing::ValuesIn(gradcheck_runs(DeviceType::CPU)),
                         gradcheck_param_name);
INSTANTIATE_TEST_SUITE_P(Cuda, OpHarnessGradcheck, testing::ValuesIn(gradcheck_runs(DeviceType::CUDA)),
                         gradcheck_param_name);

namespace {

// How many runs (case x dtype) a device takes here.
size_t runnable(DeviceType device) {
  size_t n = 0;
  for (const OpTestCase& c : all_cases())
    if (runs_on(c, device)) n += c.dtypes.size();
  return n;
}

}  // namespace

// Lists every op of ops.def that no case covers, and prints the harness's summary line.
TEST(OpHarnessCoverage, EveryOpHasACase) {
  std::vector<OpKind> missing = ops_without_cases();
  size_t gradchecks = 0;
  for (const OpTestCase& c : all_cases()) gradchecks += c.grad ? 1 : 0;
  const bool gpu = cuda::is_available();
  std::cout << "op harness: " << kNumOps << " ops (" << kNumOps - int(missing.size()) << " with cases), "
            << runnable(DeviceType::CPU) << " cases on cpu, " << runnable(DeviceType::CUDA) << " on cuda"
            << (gpu ? "" : " (no GPU)") << ", " << gradchecks << " gradchecks" << std::endl;
  std::string names;
  for (OpKind op : missing) names += std::string(" ") + op_name(op);
  EXPECT_TRUE(missing.empty()) << missing.size() << " ops of kernels/ops.def have no op-harness case:" << names
                               << "\n(add cases to tests/op_harness/cases_<family>.cpp)";
}

// Names are what the tests are called by: snake_case, starting with the op's name, unique.
TEST(OpHarnessCoverage, CaseNamesAreUniqueAndStartWithTheirOp) {
  std::set<std::string> seen;
  for (const OpTestCase& c : all_cases()) {
    EXPECT_EQ(c.name.rfind(op_name(c.op), 0), 0u) << c.name << " does not start with " << op_name(c.op);
    for (char ch : c.name)
      EXPECT_TRUE(std::islower(static_cast<unsigned char>(ch)) || std::isdigit(static_cast<unsigned char>(ch)) ||
                  ch == '_')
          << c.name;
    EXPECT_TRUE(seen.insert(c.name).second) << "two cases are named " << c.name;
    EXPECT_FALSE(c.dtypes.empty()) << c.name << " runs in no dtype";
  }
}

// The comparison behind Cuda/OpHarness.Run, with the CPU on both sides: for one case of every op the
// two builds of a call must agree (CI has no GPU, so this is where that path runs there).
TEST(OpHarnessRunner, DevicePathAgreesWithItselfOnTheCpu) {
  std::set<OpKind> done;
  for (const OpTestCase& c : all_cases()) {
    if (!done.insert(c.op).second || !runs_on(c, DeviceType::CPU)) continue;
    Report r = check_against_cpu(c, c.dtypes[0], Device::cpu());
    EXPECT_TRUE(r.ok()) << run_name(c, c.dtypes[0]) << ":\n" << r.str();
  }
}

namespace {

// An add whose second input is 0 on the first build and `delta` on every later one.
OpTestCase drifting_add(DType dtype, double delta) {
  auto builds = std::make_shared<int>(0);
  return {.op = OpKind::Add,
          .name = "add_drifting",
          .dtypes = {dtype},
          .make =
              [builds, delta](Device, DType t) {
                const double b = (*builds)++ == 0 ? 0.0 : delta;
                return OpCall{{values_input({1, 2, 3}, {3}, t), values_input({b, b, b}, {3}, t)}};
              }};
}

}  // namespace

TEST(OpHarnessRunner, ReportsOutputsBeyondTheTolerance) {
  EXPECT_TRUE(check_against_cpu(drifting_add(DType::f32, 1e-7), DType::f32, Device::cpu()).ok());
  Report r = check_against_cpu(drifting_add(DType::f32, 1e-3), DType::f32, Device::cpu());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.str().find("relative L2 error"), std::string::npos) << r.str();
  Report whole = check_against_cpu(drifting_add(DType::i64, 1), DType::i64, Device::cpu());
  ASSERT_FALSE(whole.ok()) << "i64 values must agree exactly";
  EXPECT_NE(whole.str().find("(exactly)"), std::string::npos) << whole.str();
}

TEST(OpHarnessRunner, ReportsAWrongReferenceAndAnUnrepeatableCall) {
  OpTestCase c = drifting_add(DType::f64, 1.0);
  c.reference = [](const OpCall&) { return Expected{{1, 2, 4}}; };
  Report r = check_cpu(c, DType::f64);
  EXPECT_NE(r.str().find("against the plain-loop reference"), std::string::npos) << r.str();
  EXPECT_NE(r.str().find("differs between two runs"), std::string::npos) << r.str();
}

TEST(OpHarnessRunner, ReportsAGradcheckFunctionThatMissesTheOp) {
  OpTestCase c = drifting_add(DType::f64, 0.0);
  c.grad = [](const std::vector<Tensor>& x) { return mul(x[0], x[1]); };
  Report r = check_gradcheck(c, Device::cpu());
  EXPECT_NE(r.str().find("never dispatches add"), std::string::npos) << r.str();
}
