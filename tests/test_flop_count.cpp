// `reel bench`'s model FLOPs a step (tools/flop_count.h), against counts written out by hand from the
// models' layers: every product counted 2 FLOPs a multiply-add, a layer's backward twice its forward
// (input and weight gradients) except where its input needs no gradient, causal attention over the
// T (T + 1) / 2 visible pairs. Eager and compiled configurations of a step report the same count.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_run.h"
#include "nn/models.h"

namespace reel {
namespace {

using testing_util::CliRun;
using testing_util::reel_cli;

constexpr double kAccum = 4, kMicroBatch = 2;

// The GFLOP a step of each JSON line `reel bench --json` wrote for these models and modes.
std::vector<nlohmann::json> bench_lines(const std::string& models, std::string* out) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("reel-flops-" + std::to_string(::getpid()) + ".jsonl")).string();
  std::optional<CliRun> r = reel_cli("bench --models " + models + " --precisions fp32 --compile eager,default --device cpu "
                                     "--steps 1 --warmup 0 --micro-batch 2 --json " + path);
  std::vector<nlohmann::json> lines;
  if (!r) return lines;
  *out = r->out;
  EXPECT_EQ(r->code, 0) << r->out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  std::filesystem::remove(path);
  return lines;
}

TEST(FlopCount, GptTinyAndCnnSmallAsCountedByHand) {
  std::string out;
  const std::vector<nlohmann::json> lines = bench_lines("gpt-tiny,cnn-small", &out);
  if (lines.empty() && out.empty()) GTEST_SKIP() << "REEL_BIN does not name the reel binary (make test sets it)";
  ASSERT_EQ(lines.size(), 4u) << out;

  // gpt-tiny: per token, the four Linear layers of a block (qkv d->3d, proj d->d, fc d->4d, fc2 4d->d:
  // 12 d^2 multiply-adds) and the head (d->V); attention 2 * 2 d FLOPs per visible (query, key) pair.
  const nn::GptConfig g;  // gpt-tiny's configuration
  const double d = double(g.dim), T = double(g.block_size), V = double(g.vocab), L = double(g.layers);
  const double tokens = kMicroBatch * T;
  const double linear_fwd = tokens * (L * 2 * 12 * d * d + 2 * d * V);
  const double attention_fwd = L * kMicroBatch * 4 * d * T * (T + 1) / 2;
  const double gpt = kAccum * 3 * (linear_fwd + attention_fwd);

  // cnn-small on 32x32 images: 3x3 convolutions 3->32, 32->64 /2, 64->64, 64->128 /2, 128->128, then
  // Linear 128->10. The first convolution's input (the image) needs no gradient: forward + weight
  // gradient only; every other layer three times its forward.
  auto conv = [](double hw, double cout, double cin) { return 2 * hw * hw * cout * cin * 9; };
  const double first = conv(32, 32, 3);
  const double rest = conv(16, 64, 32) + conv(16, 64, 64) + conv(8, 128, 64) + conv(8, 128, 128);
  const double cnn = kAccum * kMicroBatch * (2 * first + 3 * rest + 3 * 2 * 128 * 10);

  for (const nlohmann::json& j : lines) {
    const double want = j["model"] == "gpt-tiny" ? gpt : cnn;
    EXPECT_NEAR(j["gflop_per_step"].get<double>(), want / 1e9, 1e-3) << j.dump();
    EXPECT_NEAR(j["tflops"].get<double>(), want / (j["step_ms_median"].get<double>() / 1e3) / 1e12, 1e-3) << j.dump();
  }
  EXPECT_NE(out.find("model FLOPs: " + [&] {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", gpt / 1e9);
    return std::string(buf);
  }() + " GFLOP a step"), std::string::npos) << out;
}

}  // namespace
}  // namespace reel
