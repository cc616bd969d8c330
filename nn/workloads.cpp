#include "nn/workloads.h"

#include "autograd/ops.h"

namespace reel::nn {

Workload make_workload(const std::string& name, Device device, int64_t accum, int64_t micro_batch, uint64_t seed) {
  REEL_CHECK(accum > 0, "make_workload: accum must be positive, got ", accum);
  Generator gen(seed);
  Workload w;
  const bool gpt = name.rfind("gpt", 0) == 0;
  if (name == "cnn-small") w.model = cnn_small(&gen);
  else if (name == "gpt-tiny") w.model = gpt_tiny(&gen);
  else if (name == "gpt-small") w.model = gpt_small(&gen);
  else throw Error("make_workload: unknown model " + name + " (expected cnn-small, gpt-tiny or gpt-small)");
  w.model->to(device);
  const int64_t B = micro_batch > 0 ? micro_batch : (gpt ? 16 : 32);
  const int64_t T = gpt ? std::static_pointer_cast<Gpt>(w.model)->config().block_size : 0;
  const TensorOptions f32{DType::f32, device};
  for (int64_t i = 0; i < accum; ++i) {
    if (gpt) {
      // ids: (B, T) i64 in [0, 256); targets likewise
      w.micro.emplace_back(to_dtype(uniform({B, T}, 0, 256, f32, &gen), DType::i64),
                           to_dtype(uniform({B, T}, 0, 256, f32, &gen), DType::i64));
    } else {
      // images: (B, 3, 32, 32); labels: (B) i64 in [0, 10)
      w.micro.emplace_back(randn({B, 3, 32, 32}, f32, &gen), to_dtype(uniform({B}, 0, 10, f32, &gen), DType::i64));
    }
    w.items_per_step += gpt ? B * T : B;
  }
  return w;
}

}  // namespace reel::nn
