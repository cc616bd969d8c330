// The fixed workloads of MODELS.md's training step: a benchmark model and its ACCUM micro-batches of
// random inputs (images or token ids, made once and reused every step, so a step measures compute
// alone). Shared by `reel bench` and the Google Benchmark suite of training steps.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/models.h"

namespace reel::nn {

struct Workload {
  std::shared_ptr<Module> model;
  std::vector<std::pair<Tensor, Tensor>> micro;  // (inputs, targets) per micro-batch, on the device
  int64_t items_per_step = 0;                    // images, or tokens for the GPTs
};

// name: cnn-small | gpt-tiny | gpt-small. micro_batch <= 0 takes MODELS.md's (32 images, 16 sequences).
Workload make_workload(const std::string& name, Device device, int64_t accum = 4, int64_t micro_batch = -1,
                       uint64_t seed = 0);

}  // namespace reel::nn
