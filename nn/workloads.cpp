#include "nn/workloads.h"

#include <algorithm>

#include "autograd/ops.h"

namespace reel::nn {

const std::vector<std::string>& benchmark_model_names() {
  static const std::vector<std::string> names{"cnn-small", "gpt-tiny", "gpt-small", "resnet18-cifar", "vit-tiny",
                                              "yolov8n-cls"};
  return names;
}

bool is_benchmark_model(const std::string& name) {
  const auto& names = benchmark_model_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

namespace {
std::string known_models() {
  std::string s;
  const auto& names = benchmark_model_names();
  for (size_t i = 0; i < names.size(); ++i) s += (i ? (i + 1 == names.size() ? " or " : ", ") : "") + names[i];
  return s;
}
}  // namespace

std::shared_ptr<Module> make_benchmark_model(const std::string& name, Generator* gen) {
  if (name == "cnn-small") return cnn_small(gen);
  if (name == "gpt-tiny") return gpt_tiny(gen);
  if (name == "gpt-small") return gpt_small(gen);
  if (name == "resnet18-cifar") return resnet18_cifar(gen);
  if (name == "vit-tiny") return vit_tiny(gen);
  if (name == "yolov8n-cls") return yolov8n_cls(gen);
  throw Error("make_workload: unknown model " + name + " (expected " + known_models() + ")");
}

int64_t benchmark_image_side(const std::string& name) {
  if (name.rfind("gpt", 0) == 0) return 0;
  return name == "yolov8n-cls" ? 64 : 32;
}

Workload make_workload(const std::string& name, Device device, int64_t accum, int64_t micro_batch, uint64_t seed) {
  REEL_CHECK(accum > 0, "make_workload: accum must be positive, got ", accum);
  Generator gen(seed);
  Workload w;
  w.model = make_benchmark_model(name, &gen);
  const bool gpt = benchmark_image_side(name) == 0;
  w.model->to(device);
  const int64_t B = micro_batch > 0 ? micro_batch : (gpt ? 16 : 32);
  const int64_t T = gpt ? std::static_pointer_cast<Gpt>(w.model)->config().block_size : 0;
  const int64_t S = benchmark_image_side(name);
  const TensorOptions f32{DType::f32, device};
  for (int64_t i = 0; i < accum; ++i) {
    if (gpt) {
      // ids: (B, T) i64 in [0, 256); targets likewise
      w.micro.emplace_back(to_dtype(uniform({B, T}, 0, 256, f32, &gen), DType::i64),
                           to_dtype(uniform({B, T}, 0, 256, f32, &gen), DType::i64));
    } else {
      // images: (B, 3, S, S); labels: (B) i64 in [0, 10)
      w.micro.emplace_back(randn({B, 3, S, S}, f32, &gen), to_dtype(uniform({B}, 0, 10, f32, &gen), DType::i64));
    }
    w.items_per_step += gpt ? B * T : B;
  }
  return w;
}

}  // namespace reel::nn
