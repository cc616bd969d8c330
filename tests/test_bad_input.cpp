// Bad input, tried as a user would: every mistake is a reel::Error naming what was wrong (or, from the
// command line, one line and exit code 1), and nothing it touched changed. (Threads: test_threads.cpp.)
#include <gtest/gtest.h>

#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>

#include "compile/runtime/compile.h"
#include "compile/runtime/memory_budget.h"
#include "data/fashion_mnist.h"
#include "kernels/cpu/thread_binding.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "tensor/file_io.h"
#include "cli_run.h"
#include "test_util.h"

using namespace reel;
using reel::testing_util::expect_error;
using reel::testing_util::reel_cli;
using reel::testing_util::CliRun;

TEST(BadInput, ShapesWhoseSizeOverflowsAreRefused) {
  expect_error([] { zeros({(int64_t(1) << 62) + 1, 4}); }, {"(4611686018427387905, 4)", "2^63"});
  expect_error([] { zeros({int64_t(1) << 62}, TensorOptions{DType::f64}); }, {"needs more bytes"});
}

TEST(BadInput, CreationArgumentsAreChecked) {
  expect_error([] { arange(-5); }, {"arange", "opposite directions"});
  expect_error([] { arange(0.0, 1.0, NAN); }, {"arange", "finite"});
  expect_error([] { uniform({3}, 5.0, 1.0); }, {"uniform", "low <= high"});
  expect_error([] { normal({3}, 0.0, -1.0); }, {"normal", "std"});
  EXPECT_EQ(arange(0.0, 0.0, 1.0).numel(), 0) << "an empty range stays empty";
}

TEST(BadInput, OptimizerAndScalerSettingsAreChecked) {
  expect_error([] { optim::GradScaler(optim::GradScalerOptions().growth_factor(INFINITY)); }, {"growth_factor", "inf"});
  expect_error([] { optim::GradScaler(optim::GradScalerOptions().init_scale(NAN)); }, {"init_scale"});
  Tensor p = zeros({3}, TensorOptions().with_requires_grad());
  optim::AdamW opt({p}, optim::AdamWOptions(1e-3));
  expect_error([&] { opt.set_max_grad_norm(NAN); }, {"max_norm", "NaN"});
  opt.set_max_grad_norm(0.0);  // no clipping, as documented
}

// Attention masks, as a user builds them wrongly: a shape that does not broadcast to (B, H, T, T)
// (the message shows both), a 0/1 padding passed as the additive mask, a learned mask (masks are
// constants), a padding of the wrong rank, and a mask of the right shape on a module. Nothing runs.
TEST(BadInput, AttentionMasksAreCheckedWithTheirShapes) {
  Generator gen(3);
  nn::SelfAttention vit(12, 3, false, &gen);  // d 12, 3 heads
  Tensor x = randn({2, 7, 12}, {}, &gen);
  expect_error([&] { vit.forward(x, zeros({2, 1, 5, 7})); },
               {"attention: mask (2, 1, 5, 7) f32 does not broadcast to (B, H, T, T) = (2, 3, 7, 7)"});
  expect_error([&] { vit.forward(x, zeros({7, 1, 7})); }, {"attention: mask (7, 1, 7)", "(2, 3, 7, 7)"});
  expect_error([&] { vit.forward(x, zeros({2, 7})); }, {"attention: mask (2, 7) f32 does not broadcast"});
  expect_error([&] { vit.forward(x, tensor_i64(std::vector<int64_t>(14, 0), {2, 7})); },
               {"attention: mask (2, 7) is i64", "additive", "key_padding_mask"});
  Tensor learned = zeros({7, 7}, TensorOptions().with_requires_grad());
  expect_error([&] { vit.forward(x, learned); }, {"attention: mask (7, 7) f32 requires grad", "constants"});
  expect_error([&] { nn::key_padding_mask(zeros({2, 7, 1})); }, {"key_padding_mask: padding (2, 7, 1)", "(B, T)"});
  EXPECT_EQ(vit.forward(x, nn::key_padding_mask(tensor_i64(std::vector<int64_t>(14, 0), {2, 7}))).shape(),
            (Shape{2, 7, 12}));
}

// A NaN must reach the fp16 scaler's inf check: relu passes it on, as PyTorch's does.
// Without a usable GPU, an op asked to run there says why: the build (no CUDA backend: the op's
// kernel lookup says so) or no visible device (a CUDA build: its allocator says so).
TEST(BadInput, AGpuThatIsNotThereIsNamedWithTheReason) {
  if (cuda::is_available()) GTEST_SKIP() << "a GPU is usable here";
  expect_error([] { randn({2}).to(Device::cuda()); }, {"cuda:0", cuda::unavailable_reason()});
  expect_error([] { zeros({2}, {DType::f32, Device::cuda()}); }, {"cuda:0", cuda::unavailable_reason()});
}

TEST(BadInput, ReluPassesNaNOn) {
  Tensor x = Tensor::from_vector<float>({NAN, -1.f, 2.f}, {3});
  std::vector<float> y = relu(x).to_vector<float>();
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], 0.f);
  EXPECT_EQ(y[2], 2.f);
}

TEST(BadInput, CheckpointsAreWrittenWholeAndReadOnlyFromFiles) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("reel_bad_input_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  nn::Linear model(3, 2);
  const std::vector<double> before = model.parameters()[0].to_vector<double>();
  // A folder is not a checkpoint: a clear error, and the module is untouched.
  expect_error([&] { nn::load_state_dict(model, dir.string()); }, {"load_state_dict", "is not a file"});
  EXPECT_EQ(model.parameters()[0].to_vector<double>(), before);
  // A folder that does not exist: the error names it, nothing is left behind.
  expect_error([&] { nn::save_state_dict(model, (dir / "missing" / "ckpt").string()); }, {"save_state_dict", "cannot"});
  EXPECT_FALSE(std::filesystem::exists(dir / "missing"));
  expect_error([&] { check_writable((dir / "missing" / "ckpt").string(), "train: --checkpoint"); },
               {"--checkpoint", "does not exist"});
  expect_error([&] { check_writable(dir.string(), "train: --checkpoint"); }, {"is a folder"});
  // A save leaves exactly the file, no temporary, and it loads back.
  const std::string path = (dir / "ckpt").string();
  nn::save_state_dict(model, path);
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);
  nn::load_state_dict(model, path);
  EXPECT_EQ(model.parameters()[0].to_vector<double>(), before);
  std::filesystem::remove_all(dir);
}

TEST(BadInput, CommandLineNumbersAreCheckedAndNothingAborts) {
  std::optional<CliRun> r = reel_cli("plan --micro-batch abc");
  REQUIRE_CLI(r);
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("plan: --micro-batch expects an integer >= 1, got \"abc\""), std::string::npos) << r->out;
  EXPECT_EQ(r->out.find("plan: plan:"), std::string::npos) << "the command named twice: " << r->out;
  r = reel_cli("plan --micro-batch 0");
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("got \"0\""), std::string::npos) << r->out;
  r = reel_cli("bench --steps 3x");
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("bench: --steps expects an integer"), std::string::npos) << r->out;
  r = reel_cli("train --clip nan");
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("--clip expects a finite number"), std::string::npos) << r->out;
  r = reel_cli("train --epochs 99999999999999999999");
  EXPECT_EQ(r->code, 1) << r->out;
  // An effective batch no micro-batch can be planned for: the planner says which candidate and why.
  r = reel_cli("train --model cnn-small --dataset random --device cpu --effective-batch 9223372036854775807 "
               "--memory-budget 1GiB");
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("memory budget: planning micro-batch"), std::string::npos) << r->out;
  EXPECT_NE(r->out.find("of the effective batch 9223372036854775807"), std::string::npos) << r->out;
  // A text batch too large to exist, and a sample that would never end.
  r = reel_cli("train --model gpt-tiny --dataset random --micro-batch 4611686018427387904 --accum 1 --steps 1 --device cpu");
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("TextSampler::next: a batch of 4611686018427387904 windows of 128 tokens"), std::string::npos)
      << r->out;
  r = reel_cli("train --model gpt-tiny --sample-bytes 9223372036854775807");
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("--sample-bytes expects an integer"), std::string::npos) << r->out;
  // A memory limit is a size, and caps a compiled step only.
  r = reel_cli("train --model gpt-tiny --memory-limit 8MiB");
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("train: --memory-limit caps a compiled step's memory"), std::string::npos) << r->out;
  r = reel_cli("plan --memory-limit lots");
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("lots"), std::string::npos) << r->out;
  // Dropout is a probability below 1, and only the GPTs have it.
  r = reel_cli("bench --dropout 1.5");
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("bench: --dropout expects a finite number"), std::string::npos) << r->out;
  r = reel_cli("bench --dropout 0.1 --models cnn-small --precisions fp32 --device cpu --steps 1 --warmup 0");
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("bench: --dropout applies to the GPT models, not cnn-small"), std::string::npos) << r->out;
  r = reel_cli("bench --json /nonexistent-folder/x.jsonl --models cnn-small --precisions fp32 --device cpu");
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("cannot write --json"), std::string::npos) << r->out;
}

TEST(BadInput, ARunThatWouldNeverStepIsAnErrorBeforeTraining) {
  std::optional<CliRun> r = reel_cli("train --model cnn-small --dataset random --device cpu --limit 64 --epochs 1");
  REQUIRE_CLI(r);
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("no step would be taken"), std::string::npos) << r->out;
  EXPECT_EQ(r->out.find("final loss"), std::string::npos) << "it must not train: " << r->out;
  r = reel_cli("train --model cnn-small --dataset random --device cpu --checkpoint /nonexistent-folder/ckpt --epochs 1");
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("--checkpoint"), std::string::npos) << r->out;
  EXPECT_EQ(r->out.find("epoch 1"), std::string::npos) << "checked before training: " << r->out;
}

namespace {

// An idx file of `magic` with `dims` declared in its header and `data_bytes` bytes after it.
std::string idx_file(uint32_t magic, const std::vector<uint32_t>& dims, size_t data_bytes) {
  std::string bytes;
  auto be = [&](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) bytes.push_back(char((v >> s) & 0xff));
  };
  be(magic);
  for (uint32_t d : dims) be(d);
  bytes.append(data_bytes, '\0');
  const std::string path =
      (std::filesystem::temp_directory_path() / ("reel_idx_" + std::to_string(::getpid()) + "_" + std::to_string(magic))).string();
  write_file_atomically(path, bytes, "test");
  return path;
}

}  // namespace

// Headers that declare more than the file holds are reported from what was read, without first
// allocating what they declared; sizes whose product overflows are refused outright.
TEST(BadInput, IdxHeadersAreCheckedBeforeTheyCostMemory) {
  const std::string lying = idx_file(2051, {0xFFFFFFFFu, 28, 28}, 1000);
  expect_error([&] { data::read_idx(lying, 2051); }, {"is truncated", "(4294967295, 28, 28)", "found 1000"});
  const std::string huge = idx_file(2051, {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu}, 16);
  expect_error([&] { data::read_idx(huge, 2051); }, {"(4294967295, 4294967295, 4294967295)", "than a file can hold"});
  // A magic whose low byte declares no dimensions has no item count to read.
  const std::string dimensionless = idx_file(0x800, {}, 4);
  expect_error([&] { data::read_idx(dimensionless, 0x800); }, {"read_idx", "magic number 2048", "declares no dimensions"});
  std::filesystem::remove(lying);
  std::filesystem::remove(huge);
  std::filesystem::remove(dimensionless);
}

TEST(BadInput, TheBudgetPlannersCandidatesStopBeforeOverflowing) {
  const std::vector<int64_t> c = compile::candidate_micro_batches(std::numeric_limits<int64_t>::max());
  ASSERT_EQ(c.size(), 64u);  // 1, 2, ..., 2^62 and N itself
  EXPECT_EQ(c[62], int64_t(1) << 62);
  EXPECT_EQ(c.back(), std::numeric_limits<int64_t>::max());
}

// AdamW's first step from zero state moves each parameter by lr g / (|g| + eps): with (1 - beta2)
// formed in f32 (1.0000124e-3 for beta2 = 0.999) it came out 6.4e-6 relative too small.
TEST(PaperCuts, AdamWsFirstStepIsLrTimesTheGradientsSign) {
  for (float g : {1.0f, -0.5f, 3e-3f}) {
    Tensor p = zeros({1}), grad = Tensor::from_vector<float>({g}, {1}), m = zeros({1}), v = zeros({1});
    const Attrs a = Attrs().set("beta1", 0.9).set("beta2", 0.999).set("eps", 1e-8).set("weight_decay", 0.0);
    dispatch_out(OpKind::AdamWStep, {p, grad, m, v, Tensor(), full({}, 1e-3, TensorOptions{DType::f64}),
                                     full({}, 1.0, TensorOptions{DType::f64})},
                 {p, m, v}, a);
    const double want = -1e-3 * double(g) / (std::abs(double(g)) + 1e-8);
    EXPECT_NEAR(p.item() / want, 1.0, 5e-7) << "g = " << g;
  }
}

// --dataset random gives a GPT uniform byte tokens (what the benchmark's step trains on), and the
// pairings that do not exist still name the ones that do; --text only with --dataset text.
TEST(PaperCuts, GptsTrainOnRandomTokens) {
  std::optional<CliRun> r =
      reel_cli("train --model gpt-tiny --dataset random --device cpu --steps 2 --micro-batch 2 --sample-bytes 4");
  REQUIRE_CLI(r);
  EXPECT_EQ(r->code, 0) << r->out;
  EXPECT_NE(r->out.find("random tokens: 1048576 bytes"), std::string::npos) << r->out;
  EXPECT_NE(r->out.find("done: 2 steps"), std::string::npos) << r->out;
  r = reel_cli("train --model nope");
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("unknown model nope (expected fashion-cnn, cnn-small, resnet18-cifar, vit-tiny, yolov8n-cls, gpt-tiny or "
                           "gpt-small)"), std::string::npos)
      << r->out;
  r = reel_cli("train --model fashion-cnn --dataset random --device cpu");
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("yolov8n-cls on random images"), std::string::npos) << r->out;
  r = reel_cli("train --model gpt-tiny --dataset random --text /etc/hostname --device cpu");
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("--text /etc/hostname is read only with --dataset text"), std::string::npos) << r->out;
}

// The seed's model families train from `reel train` on random images of their size (64x64 for
// yolov8n-cls), and --init-from loads a state_dict strictly before training: a file of the same model
// loads every tensor; another model's file is refused, naming the keys, before any step.
TEST(PaperCuts, ImageFamiliesTrainAndStartFromAStateDict) {
  const std::string path = (std::filesystem::temp_directory_path() / ("reel_init_" + std::to_string(::getpid()))).string();
  auto yolo = nn::yolov8n_cls();
  nn::save_state_dict(*yolo, path);
  // 158 tensors: 80 parameters and 78 buffers (26 BatchNorms' running_mean, running_var, num_batches_tracked).
  const std::string loaded = "init: " + std::to_string(yolo->named_state().size()) + " tensors loaded from " + path +
                             " (" + std::to_string(yolo->named_parameters().size()) + " parameters, " +
                             std::to_string(yolo->named_buffers().size()) + " buffers)";
  EXPECT_EQ(yolo->named_state().size(), 158u);
  std::optional<CliRun> r = reel_cli("train --model yolov8n-cls --dataset random --device cpu --limit 8 --micro-batch 4 "
                                     "--accum 2 --epochs 1 --compile default --init-from " + path);
  REQUIRE_CLI(r);
  EXPECT_EQ(r->code, 0) << r->out;
  EXPECT_NE(r->out.find(loaded), std::string::npos) << loaded << "\n" << r->out;
  EXPECT_NE(r->out.find("model yolov8n-cls: 1451098 parameters"), std::string::npos) << r->out;
  EXPECT_NE(r->out.find("done: 1 epochs"), std::string::npos) << r->out;
  r = reel_cli("train --model resnet18-cifar --dataset random --device cpu --limit 8 --micro-batch 4 --accum 2 "
               "--epochs 1 --init-from " + path);
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("lacks keys the module has: conv1.weight"), std::string::npos) << r->out;
  EXPECT_EQ(r->out.find("epoch 1"), std::string::npos) << "refused before training: " << r->out;
  std::filesystem::remove(path);
}

TEST(BadInput, TrainingOnLinesIsCheckedAndRuns) {
  std::optional<CliRun> r = reel_cli("train --model gpt-tiny --items sentences");
  REQUIRE_CLI(r);
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("train: --items must be windows or lines, got sentences"), std::string::npos) << r->out;
  r = reel_cli("train --model cnn-small --items lines");
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("--items lines is for the GPTs, not cnn-small"), std::string::npos) << r->out;
  const std::string dir = testing::TempDir();
  const std::string one = dir + "/reel_one_line.txt", many = dir + "/reel_lines.txt";
  {
    std::ofstream(one) << "a single line\n";
    std::ofstream f(many);
    for (int i = 0; i < 40; ++i) f << "line number " << i << (i % 3 ? " has a few more words" : "") << "\n";
  }
  r = reel_cli("train --model gpt-tiny --dataset text --text " + one + " --items lines --device cpu");
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("needs a text of at least 2 lines, got 1"), std::string::npos) << r->out;
  r = reel_cli("train --model gpt-tiny --dataset text --text " + many +
               " --items lines --steps 2 --micro-batch 3 --accum 2 --device cpu");
  EXPECT_EQ(r->code, 0) << r->out;
  EXPECT_NE(r->out.find("lines: 38 for training, 2 for validation"), std::string::npos) << r->out;
  EXPECT_NE(r->out.find("with padding (overhead"), std::string::npos) << r->out;
  EXPECT_NE(r->out.find("done: 2 steps"), std::string::npos) << r->out;
  // Compiled: length buckets, at most one plan per bucket used. The whole step in the bucket of its
  // longest line (--buckets step), or each micro-batch in its own (the default), where the optimizer
  // has a plan of its own. AdamW's state is made up front, so every call is traced without running:
  // none runs eagerly, and the run's peak is the plans'.
  r = reel_cli("train --model gpt-tiny --dataset text --text " + many +
               " --items lines --steps 4 --micro-batch 3 --accum 2 --device cpu --compile default --buckets step");
  EXPECT_EQ(r->code, 0) << r->out;
  EXPECT_NE(r->out.find("length buckets (steps per bucket): 64: 4; plans traced 1, steps replayed 4, run eagerly 0"),
            std::string::npos)
      << r->out;
  r = reel_cli("train --model gpt-tiny --dataset text --text " + many +
               " --items lines --steps 4 --micro-batch 3 --accum 2 --device cpu --compile default");
  EXPECT_EQ(r->code, 0) << r->out;
  EXPECT_NE(r->out.find("length buckets (micro-batches per bucket): 16: 1 64: 7; plans traced 3 (2 for buckets, 1 "
                        "for the optimizer), micro-batches replayed 8, run eagerly 0"),
            std::string::npos)
      << r->out;
  EXPECT_NE(r->out.find("memory: planned peak "), std::string::npos) << r->out;
  EXPECT_EQ(r->out.find("warning: the measured peak differs"), std::string::npos) << r->out;
  EXPECT_NE(r->out.find("tokens: 726 real, 1392 with padding (overhead 1.92x)"), std::string::npos) << r->out;
  r = reel_cli("train --model gpt-tiny --items lines --compile default --buckets words");
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("--buckets must be micro-batch or step, got words"), std::string::npos) << r->out;
}

// `reel bench --threads N` sets the CPU kernels' threads (as torch.set_num_threads) and records them
// in each JSON line; a count below 1 is refused.
TEST(BadInput, BenchThreadsAreCheckedAndRecorded) {
  const std::string json = (std::filesystem::temp_directory_path() / ("reel_threads_" + std::to_string(::getpid()) + ".jsonl")).string();
  std::optional<CliRun> r = reel_cli("bench --models cnn-small --precisions fp32 --device cpu --steps 1 --warmup 0 "
                                     "--micro-batch 2 --threads 1 --json " + json);
  REQUIRE_CLI(r);
  EXPECT_EQ(r->code, 0) << r->out;
  std::ifstream in(json);
  std::string line;
  std::getline(in, line);
  EXPECT_NE(line.find("\"threads\": 1,"), std::string::npos) << line;
  std::filesystem::remove(json);
  r = reel_cli("bench --models cnn-small --device cpu --threads 0");
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("--threads"), std::string::npos) << r->out;
}

// `reel bench --bind-threads 1` pins its threads one to a CPU (kernels/cpu/thread_binding.h) and says
// which, the first of binding_order(), the allowed CPUs one per core first; more threads than allowed
// CPUs, or a value other than 0 and 1, is refused with the reason.
TEST(BadInput, BenchBindThreadsPinsOrRefuses) {
  const std::vector<int> order = cpu::binding_order();
  ASSERT_FALSE(order.empty());
  cpu_set_t allowed;  // the order is a permutation of the process's allowed CPUs
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  EXPECT_EQ(int(order.size()), CPU_COUNT(&allowed));
  for (size_t i = 0; i < order.size(); ++i) {
    EXPECT_TRUE(CPU_ISSET(order[i], &allowed)) << order[i];
    for (size_t j = 0; j < i; ++j) EXPECT_NE(order[i], order[j]);
  }
  std::optional<CliRun> r = reel_cli("bench --models cnn-small --precisions fp32 --device cpu --steps 1 --warmup 0 "
                                     "--micro-batch 2 --threads 1 --bind-threads 1");
  REQUIRE_CLI(r);
  EXPECT_EQ(r->code, 0) << r->out;
  EXPECT_NE(r->out.find("CPU threads pinned to CPUs " + std::to_string(order[0]) + "\n"), std::string::npos) << r->out;
  const std::string too_many = std::to_string(order.size() + 1);
  r = reel_cli("bench --models cnn-small --device cpu --threads " + too_many + " --bind-threads 1");
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("cannot pin " + too_many + " threads one to a CPU"), std::string::npos) << r->out;
  r = reel_cli("bench --models cnn-small --device cpu --bind-threads yes");
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("--bind-threads expects 0 or 1, got \"yes\""), std::string::npos) << r->out;
}
