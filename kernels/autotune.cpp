// The kernels' algorithm-choice switches (see autotune.h).
#include "kernels/autotune.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace reel {

namespace {
std::atomic<bool> autotune{false};
std::atomic<bool> deterministic{true};
std::atomic<CudnnAttention> cudnn_attention{[] {
  const char* v = std::getenv("REEL_CUDNN_ATTENTION");
  if (v && std::strcmp(v, "0") == 0) return CudnnAttention::Off;
  if (v && std::strcmp(v, "1") == 0) return CudnnAttention::On;
  return CudnnAttention::Auto;
}()};
std::atomic<bool> split_k{[] {
  const char* v = std::getenv("REEL_SPLIT_K");
  return v && std::strcmp(v, "1") == 0;
}()};
}

void set_deterministic_algorithms(bool on) { deterministic.store(on); }
bool deterministic_algorithms() { return deterministic.load(); }

void set_autotune(bool on) { autotune.store(on); }
bool autotune_enabled() { return autotune.load(); }

void set_cudnn_attention(CudnnAttention mode) { cudnn_attention.store(mode); }
CudnnAttention cudnn_attention_mode() { return cudnn_attention.load(); }

void set_split_k(bool on) { split_k.store(on); }
bool split_k_enabled() { return split_k.load(); }

}  // namespace reel
