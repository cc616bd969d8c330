// Every case of the op catalogue (autograd/cases/) through gradcheck in f64 on the CPU, plus tests of
// gradcheck itself: it must catch a wrong gradient and refuse non-f64 inputs.
#include <gtest/gtest.h>

#include "autograd/cases/op_cases.h"
#include "autograd/node.h"
#include "reel.h"

using namespace reel;

namespace {

std::string param_name(const testing::TestParamInfo<OpCase>& info) {
  std::string s = std::to_string(info.index) + "_";
  for (char ch : info.param.name) s += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return s;
}

class OpGradcheck : public testing::TestWithParam<OpCase> {};

}  // namespace

TEST_P(OpGradcheck, MatchesFiniteDifferences) {
  const OpCase& c = GetParam();
  std::vector<Tensor> inputs = c.make_inputs(Device::cpu(), DType::f64);
  GradcheckResult r = gradcheck(c.fn, inputs, c.opts);
  EXPECT_TRUE(r.ok) << c.name << "\n" << r.str();
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpGradcheck, testing::ValuesIn(all_op_cases()), param_name);

// A deliberately wrong backward (2x the true gradient) must be reported.
TEST(Gradcheck, CatchesAWrongGradient) {
  Tensor x = cases::leaf({3}, Device::cpu(), DType::f64, 1);
  auto wrong_square = [](const std::vector<Tensor>& in) {
    Tensor y;
    {
      NoGradGuard g;
      y = in[0] * in[0];
    }
    Tensor xs = autograd::saved(in[0]);
    autograd::record("wrong_square", {in[0]}, {y}, [xs](const autograd::Grads& g) -> autograd::Grads {
      return {g[0] * xs * 4.0};  // true gradient is 2x
    });
    return y;
  };
  GradcheckResult r = gradcheck(wrong_square, {x});
  EXPECT_FALSE(r.ok);
  ASSERT_EQ(r.inputs.size(), 1u);
  EXPECT_GT(r.inputs[0].max_abs_error, 0.1);
}

TEST(Gradcheck, ReportsPerInput) {
  Tensor a = cases::leaf({2, 2}, Device::cpu(), DType::f64, 1);
  Tensor b = cases::leaf({2, 2}, Device::cpu(), DType::f64, 2);
  GradcheckResult r = gradcheck([](const std::vector<Tensor>& in) { return in[0] * in[1] + in[0]; }, {a, b});
  EXPECT_TRUE(r.ok) << r.str();
  ASSERT_EQ(r.inputs.size(), 2u);
  EXPECT_LT(r.inputs[0].max_abs_error, 1e-8);
  EXPECT_LT(r.inputs[1].max_rel_error, 1e-6);
}

TEST(Gradcheck, RefusesNonF64Inputs) {
  Tensor x = ones({2}).set_requires_grad();
  try {
    gradcheck([](const std::vector<Tensor>& in) { return in[0] * 2.0; }, {x});
    FAIL() << "expected reel::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f64"), std::string::npos) << e.what();
  }
}
