// The fixed workloads of MODELS.md's training step: a benchmark model and its ACCUM micro-batches of
// random inputs (images or token ids, made once and reused every step, so a step measures compute
// alone). Shared by `reel bench`, `reel plan`, `reel train` (which builds its models by these names)
// and the Google Benchmark suite of training steps.
//
//   model            inputs                       targets          micro-batch   items
//   cnn-small        images (B, 3, 32, 32) f32    (B) i64 < 10     32            images
//   resnet18-cifar   images (B, 3, 32, 32) f32    (B) i64 < 10     32            images
//   vit-tiny         images (B, 3, 32, 32) f32    (B) i64 < 10     32            images
//   yolov8n-cls      images (B, 3, 64, 64) f32    (B) i64 < 10     32            images
//   gpt-tiny         ids (B, 128) i64 < 256       (B, 128) i64     16            tokens
//   gpt-small        ids (B, 256) i64 < 256       (B, 256) i64     16            tokens
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

// MODELS.md's models by name, in its order: cnn-small, gpt-tiny, gpt-small, resnet18-cifar, vit-tiny,
// yolov8n-cls.
const std::vector<std::string>& benchmark_model_names();
bool is_benchmark_model(const std::string& name);
// One of benchmark_model_names(), built on the CPU in f32 from `gen`; reel::Error names the known
// models otherwise.
std::shared_ptr<Module> make_benchmark_model(const std::string& name, Generator* gen = nullptr);
// The side of an image model's square inputs (32, or 64 for yolov8n-cls); 0 for the GPTs.
int64_t benchmark_image_side(const std::string& name);

// name: one of benchmark_model_names(). micro_batch <= 0 takes MODELS.md's (32 images, 16 sequences).
Workload make_workload(const std::string& name, Device device, int64_t accum = 4, int64_t micro_batch = -1,
                       uint64_t seed = 0);

}  // namespace reel::nn
