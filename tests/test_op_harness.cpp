// The op harness (tests/op_harness/) as GoogleTest suites:
//   Cpu/OpHarness.Run/<case>_<dtype>         the CPU kernel: inferred metas, the same bits twice, and
//                                            the case's plain-loop reference where it has one
//   Cuda/OpHarness.Run/<case>_<dtype>        CUDA against the CPU; skips, saying why, where no GPU is
//                                            visible or the op has no CUDA kernel
//   Cpu/OpHarnessGradcheck.F64/<case>        gradcheck in f64 of the cases that carry a function
//   Cuda/OpHarnessGradcheck.F64/<case>       the same on the GPU
//   OpHarnessCoverage.*                      every op of ops.def has a case; case names are sound.
//                                            Prints the one summary line of the harness.
#include <gtest/gtest.h>

#include <cctype>
#include <iostream>
#include <ostream>
#include <set>

#include "tensor/cuda.h"
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
