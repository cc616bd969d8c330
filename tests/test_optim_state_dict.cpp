// Optimizer::state_dict / load_state_dict (optim/optimizer.h): a run stopped at a step boundary and
// continued in a fresh optimizer over a fresh copy of the model gives the parameters of the run that
// never stopped, to the bit; bad state is refused with the keys named and nothing changed.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <vector>

#include "nn/nn.h"
#include "optim/optim.h"
#include "reel.h"
#include "test_util.h"

namespace reel {
namespace {

using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(nn::Module&)>;

std::shared_ptr<nn::Sequential> model() { return testing_util::f64_mlp(5); }

Tensor mse_loss(const Tensor& out, const Tensor& target) {
  Tensor d = out - target;
  return mean(d * d);
}

// One step of 2 micro-batches on fixed inputs drawn from `step`.
void train_step(nn::Module& m, optim::Optimizer& opt, int step) {
  for (int i = 0; i < 2; ++i) {
    Tensor x = testing_util::random({4, 6}, uint64_t(100 + 2 * step + i));
    Tensor y = testing_util::random({4, 3}, uint64_t(300 + 2 * step + i));
    opt.scale_loss(mse_loss(m(x), y)).backward();
    opt.micro_step();
  }
}

std::vector<Tensor> copies(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(t.detach().clone());
  return out;
}

bool same_bits(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].to_vector<double>() != b[i].to_vector<double>()) return false;
  return true;
}

// 2N steps straight, against N steps, the state saved (copies, as a file would hold them), and N
// more in a fresh model and optimizer that loaded it.
void expect_resume_is_exact(const MakeOptimizer& make, int n) {
  auto straight = model();
  auto opt = make(*straight);
  for (int s = 0; s < 2 * n; ++s) train_step(*straight, *opt, s);

  auto first = model();
  auto opt_first = make(*first);
  for (int s = 0; s < n; ++s) train_step(*first, *opt_first, s);
  const std::vector<Tensor> params = copies(first->parameters());
  optim::Optimizer::NamedState state;
  for (const auto& [k, t] : opt_first->state_dict()) state.push_back({k, t.detach().clone()});

  auto resumed = model();
  {
    NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) copy_(resumed->parameters()[i], params[i]);
  }
  auto opt_resumed = make(*resumed);
  opt_resumed->load_state_dict(state);
  EXPECT_EQ(opt_resumed->step_count(), n);
  EXPECT_DOUBLE_EQ(opt_resumed->lr(), [&] {
    auto probe = model();
    auto o = make(*probe);
    for (int s = 0; s < n; ++s) train_step(*probe, *o, s);
    return o->lr();
  }());
  for (int s = n; s < 2 * n; ++s) train_step(*resumed, *opt_resumed, s);
  EXPECT_TRUE(same_bits(resumed->parameters(), straight->parameters()));
  EXPECT_EQ(opt_resumed->update_count(), opt->update_count());
  // The state's keys are the ones PyTorch's optimizers use, numbered by parameter.
  bool has_state = false;
  for (const auto& [k, t] : state) has_state |= k.rfind("state.0.", 0) == 0;
  EXPECT_TRUE(has_state);
}

std::unique_ptr<optim::Optimizer> adamw_scaled(nn::Module& m) {
  auto o = std::make_unique<optim::AdamW>(m.parameters(), optim::AdamWOptions(1e-2));
  o->set_accum_steps(2).set_max_grad_norm(0.5);
  o->set_grad_scaler(std::make_shared<optim::GradScaler>(optim::GradScalerOptions().init_scale(1024).growth_interval(2)));
  o->set_schedule(std::make_shared<optim::LinearWarmupCosine>(2, 8, 1e-4));
  return o;
}

std::unique_ptr<optim::Optimizer> sgd_momentum(nn::Module& m) {
  auto o = std::make_unique<optim::SGD>(m.parameters(), optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
  o->set_accum_steps(2);
  return o;
}

TEST(OptimizerState, AdamWWithScalerAndScheduleResumesToTheSameBits) { expect_resume_is_exact(adamw_scaled, 4); }

TEST(OptimizerState, SgdWithMomentumResumesToTheSameBits) { expect_resume_is_exact(sgd_momentum, 3); }

TEST(OptimizerState, AdamWStateHasTorchsNames) {
  auto m = model();
  auto opt = adamw_scaled(*m);
  train_step(*m, *opt, 0);
  std::vector<std::string> keys;
  for (const auto& [k, t] : opt->state_dict()) keys.push_back(k);
  const size_t n = m->parameters().size();
  ASSERT_EQ(keys.size(), 2 + 2 * n + 2);
  EXPECT_EQ(keys[0], "step");
  EXPECT_EQ(keys[1], "updates");
  EXPECT_EQ(keys[2], "state.0.exp_avg");
  EXPECT_EQ(keys[3], "state.0.exp_avg_sq");
  EXPECT_EQ(keys[keys.size() - 2], "scaler.scale");
  EXPECT_EQ(keys.back(), "scaler.growth_tracker");
}

TEST(OptimizerState, BadStateIsRefusedAndChangesNothing) {
  auto m = model();
  auto opt = adamw_scaled(*m);
  train_step(*m, *opt, 0);
  train_step(*m, *opt, 1);
  auto other = model();
  auto target = adamw_scaled(*other);
  train_step(*other, *target, 5);
  const std::vector<Tensor> before = [&] {
    std::vector<Tensor> out;
    for (const auto& [k, t] : target->state_dict()) out.push_back(t.clone());
    return out;
  }();
  auto unchanged = [&] {
    std::vector<Tensor> now;
    for (const auto& [k, t] : target->state_dict()) now.push_back(t);
    EXPECT_TRUE(same_bits(now, before));
  };
  optim::Optimizer::NamedState good = opt->state_dict();

  optim::Optimizer::NamedState extra = good;
  extra.push_back({"state.99.exp_avg", zeros({2})});
  testing_util::expect_error([&] { target->load_state_dict(extra); }, {"AdamW: load_state_dict", "unexpected key 'state.99.exp_avg'"});
  unchanged();

  optim::Optimizer::NamedState wrong_shape = good;
  wrong_shape[2].second = zeros({7, 7}, TensorOptions().with_dtype(DType::f64));
  testing_util::expect_error([&] { target->load_state_dict(wrong_shape); },
                             {"'state.0.exp_avg' is f64 (7, 7), expected f64"});
  unchanged();

  optim::Optimizer::NamedState missing(good.begin(), good.end() - 1);  // no scaler.growth_tracker
  testing_util::expect_error([&] { target->load_state_dict(missing); }, {"missing key 'scaler.growth_tracker'"});
  unchanged();

  optim::Optimizer::NamedState wrong_dtype = good;
  wrong_dtype[0].second = zeros({}, TensorOptions().with_dtype(DType::f32));
  testing_util::expect_error([&] { target->load_state_dict(wrong_dtype); }, {"'step' is f32 (), expected f64 ()"});
  unchanged();

  // Mid-step: a micro-batch pending.
  Tensor x = testing_util::random({4, 6}, 1), y = testing_util::random({4, 3}, 2);
  opt->scale_loss(mse_loss((*m)(x), y)).backward();
  opt->micro_step();
  testing_util::expect_error([&] { opt->state_dict(); }, {"state_dict at a step boundary only (1 micro-batches"});
  testing_util::expect_error([&] { opt->load_state_dict(good); }, {"load_state_dict at a step boundary only"});
}

}  // namespace
}  // namespace reel
