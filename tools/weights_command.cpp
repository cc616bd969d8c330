// `reel weights`: a benchmark model's weights in and out of files, for round trips with PyTorch
// (bench/peer_safetensors_roundtrip.py).
//
//   reel weights --model NAME [--seed N] [--init-from FILE] [--save OUT.safetensors|OUT.reelsd]
//                [--compare FILE]
// Builds the model as `reel train` does (nn::make_benchmark_model from Generator(seed), on the CPU,
// f32), then, in this order: loads FILE (either format: nn::load_weights), saves (".safetensors":
// safetensors, anything else: reel's state_dict), and compares its state with FILE's bit for bit.
// The comparison loads FILE into a second copy of the model, so a file with other keys, shapes or
// dtypes fails as a load would; then every tensor's bytes must be equal (NaNs compare by their bits).
// It prints "same bits: K tensors", or fails listing the keys that differ (exit code 1).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "nn/nn.h"
#include "tensor/file_io.h"
#include "tools/arg_numbers.h"
#include "tools/commands.h"

namespace reel::tools {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor x = a.detach().cpu().contiguous(), y = b.detach().cpu().contiguous();
  return x.nbytes() == 0 || std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

// The keys whose tensors differ, checked after a strict load made the key sets, shapes and dtypes equal.
void compare(const nn::Module& model, const std::string& model_name, uint64_t seed, const std::string& path) {
  Generator gen(seed);
  std::shared_ptr<nn::Module> other = nn::make_benchmark_model(model_name, &gen);
  nn::load_weights(*other, path);
  const nn::NamedTensors mine = model.named_state(), theirs = other->named_state();
  std::vector<std::string> differ;
  for (size_t i = 0; i < mine.size(); ++i)
    if (!same_bits(mine[i].second, theirs[i].second)) differ.push_back(mine[i].first);
  if (differ.empty()) {
    std::printf("same bits: %zu tensors\n", mine.size());
    return;
  }
  std::string list;
  for (size_t i = 0; i < differ.size() && i < 16; ++i) list += (i ? ", " : "") + differ[i];
  if (differ.size() > 16) list += detail::cat(" and ", differ.size() - 16, " more");
  throw Error(detail::cat("weights: ", differ.size(), " of ", mine.size(), " tensors differ from ", path, ": ", list));
}

}  // namespace

int weights_command(int argc, char** argv) {
  std::string model_name, init_from, save, compare_with;
  uint64_t seed = 0;
  for (int i = 0; i < argc; ++i) {
    const std::string k = argv[i];
    REEL_CHECK(i + 1 < argc, "weights: ", k, " needs a value");
    const std::string v = argv[++i];
    if (k == "--model") model_name = v;
    else if (k == "--seed") seed = uint64_t(int_arg("weights", k, v, 0));
    else if (k == "--init-from") init_from = v;
    else if (k == "--save") save = v;
    else if (k == "--compare") compare_with = v;
    else throw Error("weights: unknown option " + k + " (expected --model, --seed, --init-from, --save, --compare)");
  }
  REEL_CHECK(!model_name.empty(), "weights: --model NAME is needed (", nn::benchmark_model_names().front(), ", ...)");
  if (!save.empty()) check_writable(save, "weights");  // before any work, as train does for its outputs

  Generator gen(seed);
  std::shared_ptr<nn::Module> model = nn::make_benchmark_model(model_name, &gen);
  const size_t count = model->named_state().size();
  if (!init_from.empty()) {
    nn::load_weights(*model, init_from);
    std::printf("init: %zu tensors loaded from %s\n", count, init_from.c_str());
  }
  if (!save.empty()) {
    if (ends_with(save, ".safetensors")) nn::save_safetensors(*model, save);
    else nn::save_state_dict(*model, save);
    std::printf("saved %zu tensors (%s) to %s\n", count, ends_with(save, ".safetensors") ? "safetensors" : "REELSD01",
                save.c_str());
  }
  if (!compare_with.empty()) compare(*model, model_name, seed, compare_with);
  return 0;
}

}  // namespace reel::tools
