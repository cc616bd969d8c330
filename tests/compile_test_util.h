// Helpers shared by the compiler's test files: reproducible token micro-batches, bit-exact comparison
// that counts NaN equal to NaN, and a scoped kernel-cache directory.
#pragma once
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "compile/runtime/train_step.h"
#include "optim/optim.h"
#include "reel.h"

namespace reel::testing_util {

// `accum` micro-batches of (B, T) token ids and targets below `vocab`, from a small LCG: token ids
// need no quality, only reproducibility.
inline std::vector<optim::MicroBatch> token_batches(int accum, int64_t B, int64_t T, int64_t vocab,
                                                    Device device = Device::cpu(), uint64_t seed = 11) {
  uint64_t state = seed;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return int64_t((state >> 33) % uint64_t(vocab));
  };
  std::vector<optim::MicroBatch> micro;
  for (int i = 0; i < accum; ++i) {
    std::vector<int64_t> x(size_t(B * T)), y(size_t(B * T));
    for (auto& v : x) v = next();
    for (auto& v : y) v = next();
    micro.push_back({tensor_i64(x, {B, T}, device), tensor_i64(y, {B, T}, device)});
  }
  return micro;
}

// The mean losses of `steps` training steps over `micro`: through the compiled step when given
// (compile::compile_train_step of the same optimizer and loss), else eagerly (optim::train_step).
inline std::vector<double> step_losses(optim::Optimizer& opt, const optim::LossFn& loss_fn,
                                       const std::vector<optim::MicroBatch>& micro, int steps,
                                       compile::CompiledFunction* compiled) {
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    if (compiled) {
      losses.push_back((*compiled)(compile::flatten_micro(micro))[0].item());
    } else {
      Tensor mean_loss;
      optim::train_step(opt, loss_fn, micro, &mean_loss);
      losses.push_back(mean_loss.item());
    }
  }
  return losses;
}

// Equal to the bit, NaN included (a planted overflow leaves NaN in losses or BatchNorm's running
// statistics, in eager as in PyTorch, and NaN != NaN).
inline bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
  return true;
}

// Points REEL_CACHE_DIR at a fresh directory for a test's lifetime.
class TempCacheDir {
 public:
  TempCacheDir() {
    char tmpl[] = "/tmp/reel-kernel-cache-XXXXXX";
    REEL_ASSERT(mkdtemp(tmpl) != nullptr, "mkdtemp failed");
    dir_ = tmpl;
    if (const char* old = std::getenv("REEL_CACHE_DIR")) old_ = old;
    setenv("REEL_CACHE_DIR", dir_.c_str(), 1);
  }
  ~TempCacheDir() {
    if (old_) setenv("REEL_CACHE_DIR", old_->c_str(), 1);
    else unsetenv("REEL_CACHE_DIR");
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  TempCacheDir(const TempCacheDir&) = delete;
  TempCacheDir& operator=(const TempCacheDir&) = delete;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::optional<std::string> old_;
};

}  // namespace reel::testing_util
