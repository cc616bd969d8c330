// The optimizers' updates on the GPU give the CPU's bits. kernels/optim_math.h writes each update with
// its fused multiply-adds explicit, so no compiler is free to contract a product and an add on its
// own; the per-tensor CUDA kernels, the multi-tensor ones the compiler fuses a step into and the CPU's
// loops then round the same way. Checked here for AdamW and for SGD with each option, over several
// steps, in f32 and in bf16 (whose updates run in f32 too), on tensors small and large enough for every
// path through the kernels. f64 is left out: its step coefficients take pow() in double, whose last
// bit on the device is not glibc's. Skips without a GPU.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "optim/optim.h"
#include "reel.h"
#include "tensor/cuda.h"
#include "test_util.h"

using namespace reel;
using namespace reel::optim;

namespace {

// Parameters of the given sizes on `device`, with gradients set to step t's draws (the same on
// every device).
std::vector<Tensor> make_params(const std::vector<int64_t>& sizes, DType dt, Device device) {
  std::vector<Tensor> ps;
  Generator gen(7);
  for (int64_t n : sizes) ps.push_back(randn({n}, {}, &gen).to(dt).to(device).set_requires_grad());
  return ps;
}

void set_grads(std::vector<Tensor>& ps, int t) {
  Generator gen(uint64_t(100 + t));
  for (Tensor& p : ps) p.set_grad((randn(p.shape(), {}, &gen) * 0.3).to(p.dtype()).to(p.device()));
}

void expect_same_bits(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  EXPECT_EQ(gpu.to(Device::cpu()).to(DType::f64).to_vector<double>(), cpu.to(DType::f64).to_vector<double>()) << what;
}

const std::vector<int64_t> kSizes = {7, 1030, 70001};

// `steps` updates of the same parameters on the CPU and the GPU from the same gradients; after each,
// check(i, at) compares tensor i (`at` names the step and the tensor).
void step_side_by_side(optim::Optimizer& on_cpu, optim::Optimizer& on_gpu, std::vector<Tensor>& cpu,
                       std::vector<Tensor>& gpu, int steps,
                       const std::function<void(size_t, const std::string&)>& check) {
  for (int t = 1; t <= steps; ++t) {
    set_grads(cpu, t);
    set_grads(gpu, t);
    on_cpu.step();
    on_gpu.step();
    for (size_t i = 0; i < cpu.size(); ++i) {
      const std::string at = "step " + std::to_string(t) + ", tensor of " + std::to_string(kSizes[i]);
      expect_same_bits(gpu[i], cpu[i], "param, " + at);
      check(i, at);
    }
  }
}

}  // namespace

TEST(OptimBitsCuda, AdamWOnTheGpuGivesTheCpusBits) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<Tensor> cpu = make_params(kSizes, dt, Device::cpu()), gpu = make_params(kSizes, dt, Device::cuda(0));
    const AdamWOptions o = AdamWOptions(3e-3).betas(0.85, 0.99).eps(1e-7).weight_decay(0.05);
    AdamW on_cpu(cpu, o), on_gpu(gpu, o);
    step_side_by_side(on_cpu, on_gpu, cpu, gpu, 4, [&](size_t i, const std::string& at) {
      expect_same_bits(on_gpu.exp_avg(i), on_cpu.exp_avg(i), "exp_avg, " + at);
      expect_same_bits(on_gpu.exp_avg_sq(i), on_cpu.exp_avg_sq(i), "exp_avg_sq, " + at);
    });
  }
}

TEST(OptimBitsCuda, SgdOnTheGpuGivesTheCpusBitsWithEachOption) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  struct Case {
    double momentum, dampening, weight_decay;
    bool nesterov;
  };
  for (Case c : {Case{0, 0, 0, false}, Case{0.9, 0, 0, false}, Case{0.9, 0.3, 0.01, false}, Case{0.9, 0, 0.05, true}}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + ", momentum " + std::to_string(c.momentum) + ", dampening " +
                   std::to_string(c.dampening) + ", weight decay " + std::to_string(c.weight_decay) +
                   (c.nesterov ? ", nesterov" : ""));
      std::vector<Tensor> cpu = make_params(kSizes, dt, Device::cpu()), gpu = make_params(kSizes, dt, Device::cuda(0));
      const SGDOptions o = SGDOptions(0.05)
                               .momentum(c.momentum)
                               .dampening(c.dampening)
                               .weight_decay(c.weight_decay)
                               .nesterov(c.nesterov);
      SGD on_cpu(cpu, o), on_gpu(gpu, o);
      step_side_by_side(on_cpu, on_gpu, cpu, gpu, 3, [&](size_t i, const std::string& at) {
        if (c.momentum != 0) expect_same_bits(on_gpu.momentum_buffer(i), on_cpu.momentum_buffer(i), "buffer, " + at);
      });
    }
  }
}
