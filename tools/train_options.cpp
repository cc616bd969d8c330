#include "tools/train_options.h"

#include <cstring>
#include <functional>
#include <map>

#include "compile/runtime/memory_budget.h"
#include "nn/workloads.h"
#include "tools/arg_numbers.h"
#include "tensor/error.h"

namespace reel::tools {
namespace {

size_t to_size(const std::string& name, const std::string& v) { return size_arg("train", name, v); }

// --effective-batch and --memory-budget come together, and replace --micro-batch and --accum.
void check_budget_options(const TrainOptions& o) {
  const bool planned = o.effective_batch != 0 || o.memory_budget != 0;
  if (!planned) return;
  REEL_CHECK(o.effective_batch != 0 && o.memory_budget != 0,
             "train: --effective-batch and --memory-budget go together (got only ",
             o.effective_batch != 0 ? "--effective-batch" : "--memory-budget", ")");
  REEL_CHECK(o.effective_batch > 0, "train: --effective-batch must be positive, got ", o.effective_batch);
  REEL_CHECK(!o.micro_batch_given && !o.accum_given, "train: --effective-batch ", o.effective_batch,
             " with --memory-budget chooses the micro-batch and ACCUM; drop ",
             o.micro_batch_given ? "--micro-batch" : "--accum", " (or drop --effective-batch to choose them yourself)");
}

}  // namespace

const char* train_usage() {
  return "reel train [options]\n"
         "  --model fashion-cnn|cnn-small|resnet18-cifar|vit-tiny|yolov8n-cls|gpt-tiny|gpt-small\n"
         "                                                     (default fashion-cnn)\n"
         "  --dataset fashion-mnist|text|random                (default: by model; random: synthetic images\n"
         "                                                     for the image benchmark models, 3x32x32 or 3x64x64\n"
         "                                                     for yolov8n-cls, uniform byte tokens for the GPTs)\n"
         "  --text PATH          text file for --dataset text (default: Debian's fortunes)\n"
         "  --items windows|lines   the GPTs' items: fixed windows of the text (default), or its lines, each\n"
         "                       its own length (padded, the loss over real tokens; compiled: one plan per\n"
         "                       length bucket, powers of two up to the context)\n"
         "  --buckets micro-batch|step   --items lines compiled: each micro-batch padded to its own bucket\n"
         "                       (the step in pieces: a plan per bucket and one for the optimizer; default), or\n"
         "                       the whole step to the bucket of its longest line (one plan per bucket)\n"
         "  --device auto|cpu|cuda[:N]                         (default auto: the GPU when visible)\n"
         "  --epochs N           image models (default 4)    --steps N   text models (default 200)\n"
         "  --micro-batch N      items per micro-batch (default 64)\n"
         "  --accum N            micro-batches per optimizer step (default 2)\n"
         "  --effective-batch N --memory-budget SIZE   plan the step for micro-batches 1, 2, 4, ..., N without\n"
         "                       running it (compiled: also with recomputation where that makes one fit) and\n"
         "                       train with the fastest by estimate that fits SIZE (512MiB, 1GiB, 2.5GB),\n"
         "                       ACCUM = ceil(N / micro-batch); replaces --micro-batch and --accum\n"
         "  --precision fp32|bf16|fp16 (default fp32)\n"
         "  --compile none|default|reduce-overhead|max-autotune   the step as a compiled plan (default none)\n"
         "  --memory-limit SIZE  with --compile: the step's own memory (activations, gradients) at most SIZE,\n"
         "                       activations recomputed in the backward to fit (the same results)\n"
         "  --lr X  --schedule constant|cosine  --warmup N  --clip X (<= 0: none)\n"
         "  --remainder drop|step   an epoch's partial accumulation (default drop)\n"
         "  --seed N  --limit N (first N training items)  --sample-bytes N\n"
         "  --checkpoint DIR     save the run in DIR (model.safetensors, optimizer.safetensors with the\n"
         "                       optimizer and scaler state, schedule, data and RNG positions) at the end,\n"
         "                       every --save-every N steps (text models) or each epoch (image models)\n"
         "  --resume DIR         continue the run saved in DIR (the same options; the same bits as never stopping)\n"
         "  --stop-at N          stop after step N (text) or epoch N (images), saving to --checkpoint\n"
         "  --log FILE.jsonl     one JSON line per optimizer step and evaluation; FILE.png plotted at the end\n"
         "  --init-from PATH     start from weights: a .safetensors file (PyTorch's state_dict keys) or a\n"
         "                       REELSD01 file (tools/torch_to_reel.py): every key, shape and dtype must match\n"
         "  --sync-bn 0|1        under mpirun: BatchNorm statistics over every rank's batch (default 0)\n"
         "  --trace FILE.json    after training, one more step traced for chrome://tracing or ui.perfetto.dev:\n"
         "                       host and device rows, each kernel (compiled) or op (eager) inside its\n"
         "                       micro-batch's or the optimizer's span\n"
         "Data parallel: mpirun -np K reel train ... (micro-batch and ACCUM are per rank; README: Data parallel)\n";
}

TrainOptions parse_train_options(int argc, char** argv) {
  TrainOptions o;
  std::map<std::string, std::function<void(const std::string&)>> setters = {
      {"--model", [&](const std::string& v) { o.model = v; }},
      {"--dataset", [&](const std::string& v) { o.dataset = v; }},
      {"--text", [&](const std::string& v) { o.text_path = v; }},
      {"--device", [&](const std::string& v) { o.device = v; }},
      {"--epochs", [&](const std::string& v) { o.epochs = int_arg("train", "--epochs", v, 1); }},
      {"--steps", [&](const std::string& v) { o.steps = int_arg("train", "--steps", v, 1); }},
      {"--micro-batch", [&](const std::string& v) { o.micro_batch = int_arg("train", "--micro-batch", v, 1); o.micro_batch_given = true; }},
      {"--accum", [&](const std::string& v) { o.accum = int_arg("train", "--accum", v, 1); o.accum_given = true; }},
      {"--effective-batch", [&](const std::string& v) { o.effective_batch = int_arg("train", "--effective-batch", v, 1); }},
      {"--memory-budget", [&](const std::string& v) { o.memory_budget = to_size("--memory-budget", v); }},
      {"--precision", [&](const std::string& v) { o.precision = v; }},
      {"--compile", [&](const std::string& v) { o.compile = v; }},
      {"--trace", [&](const std::string& v) { o.trace = v; }},
      {"--items", [&](const std::string& v) { o.items = v; }},
      {"--buckets", [&](const std::string& v) { o.buckets = v; }},
      {"--memory-limit", [&](const std::string& v) { o.memory_limit = to_size("--memory-limit", v); }},
      {"--lr", [&](const std::string& v) { o.lr = real_arg("train", "--lr", v, 0.0); }},
      {"--schedule", [&](const std::string& v) { o.schedule = v; }},
      {"--warmup", [&](const std::string& v) { o.warmup = int_arg("train", "--warmup", v, 0); }},
      {"--clip", [&](const std::string& v) { o.clip = real_arg("train", "--clip", v); }},
      {"--remainder", [&](const std::string& v) { o.remainder = v; }},
      {"--seed", [&](const std::string& v) { o.seed = uint64_t(int_arg("train", "--seed", v, 0)); }},
      {"--limit", [&](const std::string& v) { o.limit = int_arg("train", "--limit", v, 1); }},
      {"--checkpoint", [&](const std::string& v) { o.checkpoint = v; }},
      {"--init-from", [&](const std::string& v) { o.init_from = v; }},
      {"--resume", [&](const std::string& v) { o.resume = v; }},
      {"--save-every", [&](const std::string& v) { o.save_every = int_arg("train", "--save-every", v, 1); }},
      {"--stop-at", [&](const std::string& v) { o.stop_at = int_arg("train", "--stop-at", v, 1); }},
      {"--log", [&](const std::string& v) { o.log = v; }},
      {"--sample-bytes", [&](const std::string& v) { o.sample_bytes = int_arg("train", "--sample-bytes", v, 0, kMaxSampleBytes); }},
      {"--sync-bn", [&](const std::string& v) {
         REEL_CHECK(v == "0" || v == "1", "train: --sync-bn expects 0 or 1, got \"", v, "\"");
         o.sync_bn = v == "1";
       }},
  };
  for (int i = 0; i < argc; ++i) {
    auto it = setters.find(argv[i]);
    REEL_CHECK(it != setters.end(), "train: unknown option \"", argv[i], "\"\n", train_usage());
    REEL_CHECK(i + 1 < argc, "train: ", argv[i], " needs a value");
    it->second(argv[++i]);
  }
  REEL_CHECK(o.micro_batch > 0 && o.accum > 0, "train: --micro-batch and --accum must be positive, got ",
             o.micro_batch, " and ", o.accum);
  check_budget_options(o);
  REEL_CHECK(o.epochs > 0 && o.steps > 0, "train: --epochs and --steps must be positive");
  REEL_CHECK(o.remainder == "drop" || o.remainder == "step", "train: --remainder must be drop or step, got ",
             o.remainder);
  REEL_CHECK(o.schedule == "constant" || o.schedule == "cosine", "train: --schedule must be constant or cosine, got ",
             o.schedule);
  REEL_CHECK(o.compile == "none" || o.compile == "default" || o.compile == "reduce-overhead" ||
                 o.compile == "max-autotune",
             "train: --compile must be none, default, reduce-overhead or max-autotune, got ", o.compile);
  REEL_CHECK(o.items == "windows" || o.items == "lines", "train: --items must be windows or lines, got ", o.items);
  REEL_CHECK((o.save_every == 0 && o.stop_at == 0) || !o.checkpoint.empty(), "train: --",
             o.save_every ? "save-every" : "stop-at", " saves the run: give --checkpoint DIR");
  REEL_CHECK(o.buckets == "micro-batch" || o.buckets == "step", "train: --buckets must be micro-batch or step, got ",
             o.buckets);
  REEL_CHECK(o.items == "windows" || o.model.rfind("gpt", 0) == 0, "train: --items lines is for the GPTs, not ",
             o.model);
  REEL_CHECK(o.items == "windows" || o.effective_batch == 0,
             "train: --items lines does not plan a memory budget yet (its micro-batches have no fixed length)");
  REEL_CHECK(o.trace.empty() || o.items == "windows",
             "train: --trace does not trace --items lines yet (its step runs in pieces, a plan per length bucket)");
  REEL_CHECK(o.memory_limit == 0 || o.compile != "none",
             "train: --memory-limit caps a compiled step's memory: give --compile default|reduce-overhead|max-autotune");
  REEL_CHECK(o.model == "fashion-cnn" || nn::is_benchmark_model(o.model), "train: unknown model ", o.model,
             " (expected fashion-cnn, cnn-small, resnet18-cifar, vit-tiny, yolov8n-cls, gpt-tiny or gpt-small)");
  if (o.dataset.empty()) o.dataset = o.model == "fashion-cnn" ? "fashion-mnist"
                                     : o.model.rfind("gpt", 0) == 0 ? "text" : "random";
  REEL_CHECK(o.text_path.empty() || o.dataset == "text", "train: --text ", o.text_path,
             " is read only with --dataset text, got --dataset ", o.dataset);
  REEL_CHECK(o.items == "windows" || o.dataset == "text", "train: --items lines reads the lines of a text: give "
             "--dataset text, got --dataset ", o.dataset);
  return o;
}

}  // namespace reel::tools
