// Options of `reel train`, parsed from the command line (defaults are `make run`'s job: the
// Fashion-MNIST CNN on the GPU when one is visible, else on the CPU).
#pragma once
#include <cstdint>
#include <string>

namespace reel::tools {

// Each sampled byte is a forward pass: past this a sample would outlast any training run.
constexpr int64_t kMaxSampleBytes = int64_t(1) << 20;

struct TrainOptions {
  std::string model = "fashion-cnn";  // fashion-cnn or a benchmark model (nn/workloads.h: cnn-small,
                                      // gpt-tiny, gpt-small, resnet18-cifar, vit-tiny, yolov8n-cls)
  std::string dataset;                // fashion-mnist | text | random (default: by model)
  std::string text_path;              // a text file for --dataset text (default: the fortunes)
  // --items windows|lines: the GPTs' training items, fixed windows of the text (data::TextSampler) or
  // its lines, each its own length, padded per micro-batch and counted by real tokens (data::LineSampler).
  std::string items = "windows";
  // --items lines compiled: each micro-batch in its own length bucket (a step in pieces,
  // compile/runtime/bucketed_step.h), or the whole step in the bucket of its longest line (one plan).
  std::string buckets = "micro-batch";
  std::string device = "auto";        // auto | cpu | cuda | cuda:N
  int64_t epochs = 4;                 // image models
  int64_t steps = 200;                // text models: optimizer steps
  int64_t micro_batch = 64;
  int64_t accum = 2;
  std::string precision = "fp32";     // fp32 | bf16 | fp16
  std::string compile = "none";       // none | default | reduce-overhead | max-autotune
  double lr = 2e-3;
  std::string schedule = "cosine";    // constant | cosine (linear warm-up then cosine)
  int64_t warmup = 50;                // optimizer steps of warm-up
  double clip = 1.0;                  // max global grad norm, <= 0 for none
  std::string remainder = "drop";     // drop | step: an epoch's partial accumulation
  uint64_t seed = 0;
  int64_t limit = -1;                 // use only the first N training items (quick runs)
  // --checkpoint DIR: the run saved there (tools/train_checkpoint.h) at the end, every --save-every N
  // optimizer steps (text models) or at each epoch's end (image models), and at --stop-at.
  std::string checkpoint;
  std::string resume;                 // --resume DIR: continue the run saved there
  int64_t save_every = 0;             // 0: only at the end
  int64_t stop_at = 0;                // stop (saving) after this optimizer step or epoch, as a preempted job; 0: never
  std::string log;                    // --log FILE.jsonl: one line per step and evaluation, FILE.png drawn at the end
  std::string init_from;              // load a state_dict file (strict: every key, shape, dtype) before training
  int64_t sample_bytes = 200;         // text models: length of the sample printed at the end
  // --effective-batch N --memory-budget SIZE: the micro-batch and ACCUM are planned (compile/runtime/memory_budget.h)
  // instead of given; both or neither, and not with --micro-batch or --accum.
  int64_t effective_batch = 0;        // 0: not planned
  size_t memory_budget = 0;           // bytes
  // --memory-limit SIZE (with --compile): the compiled step's arena at most SIZE, recomputing
  // activations in the backward to fit (compile/passes/recompute.cpp); 0: no limit.
  size_t memory_limit = 0;
  bool micro_batch_given = false, accum_given = false;
  // Under mpirun: BatchNorm statistics over every rank's batch (nn/sync_batch_norm.h) instead of each
  // rank's own, with rank 0's running statistics broadcast at each step.
  bool sync_bn = false;
  // --trace FILE.json: after training, one more optimizer step traced as a Chrome trace (tools/train_trace.h).
  std::string trace;
};

// Parses argv (after the subcommand); throws reel::Error on an unknown or malformed option.
TrainOptions parse_train_options(int argc, char** argv);
const char* train_usage();

}  // namespace reel::tools
