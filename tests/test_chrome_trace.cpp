// Chrome trace output (compile/runtime/chrome_trace.h): one training step of a small GPT traced
// compiled and eagerly, and `reel bench --trace`, parsed back as JSON. Every event well formed, one
// kernel event per plan kernel, a span per micro-batch and one for the optimizer, every kernel inside
// its phase's span on its row. The GPU case also checks the device row against the host's launches.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "cli_run.h"
#include "compile/runtime/chrome_trace.h"
#include "compile/runtime/train_step.h"
#include "compile_test_util.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "test_util.h"

using namespace reel;
using nlohmann::json;

namespace {

constexpr int kAccum = 3;

// A gpt-tiny-shaped step, small enough to trace in a moment: AdamW with clipping over kAccum
// micro-batches, its training step compiled and run until it replays a plan.
struct TracedStep {
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<optim::AdamW> opt;
  std::vector<optim::MicroBatch> micro;
  std::optional<compile::CompiledFunction> step;
  std::vector<Tensor> flat;

  explicit TracedStep(Device device) {
    Generator gen(5);
    model = nn::gpt(nn::GptConfig{32, 16, 32, 2, 2}, &gen);
    model->to(device);
    opt = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions(1e-3).weight_decay(0.01));
    opt->set_accum_steps(kAccum).set_max_grad_norm(1.0);
    micro = testing_util::token_batches(kAccum, 2, 16, 32, device);
    flat = compile::flatten_micro(micro);
  }
  optim::LossFn loss_fn() {
    nn::Module* m = model.get();
    return [m](const Tensor& x, const Tensor& y) { return nn::model_loss(*m, x, y); };
  }
  compile::Plan& compiled_plan(compile::Mode mode) {
    step.emplace(compile::compile_train_step(*opt, loss_fn(), compile::CompileOptions(mode)));
    for (int i = 0; i < 3; ++i) (*step)(flat);  // warm-up, trace, first replay
    EXPECT_NE(step->last_plan(), nullptr);
    return const_cast<compile::Plan&>(*step->last_plan());
  }
};

struct Span {
  std::string name, cat, phase;
  double begin, end;
  int pid, tid;
  json args;
};

// The trace's "X" events, after checking that every event is well formed.
std::vector<Span> parse_spans(const std::string& text, std::map<std::pair<int, int>, std::string>* rows = nullptr) {
  const json doc = json::parse(text);
  EXPECT_EQ(doc.value("displayTimeUnit", ""), "ms");
  EXPECT_TRUE(doc.at("traceEvents").is_array());
  std::map<int, std::string> processes;
  std::vector<Span> spans;
  for (const json& e : doc.at("traceEvents")) {
    EXPECT_TRUE(e.at("name").is_string()) << e;
    EXPECT_TRUE(e.at("pid").is_number_integer()) << e;
    EXPECT_TRUE(e.at("tid").is_number_integer()) << e;
    const std::string ph = e.at("ph");
    if (ph == "M") {
      if (e["name"] == "process_name") processes[e["pid"]] = e["args"]["name"];
      if (e["name"] == "thread_name" && rows) (*rows)[{e["pid"], e["tid"]}] = e["args"]["name"];
      continue;
    }
    EXPECT_EQ(ph, "X") << e;
    EXPECT_TRUE(e.at("cat").is_string()) << e;
    EXPECT_TRUE(e.at("ts").is_number()) << e;
    EXPECT_TRUE(e.at("dur").is_number()) << e;
    EXPECT_GE(e["ts"].get<double>(), 0) << e;
    EXPECT_GE(e["dur"].get<double>(), 0) << e;
    const double ts = e["ts"];
    spans.push_back({e["name"], e["cat"], e["args"].value("phase", ""), ts, ts + e["dur"].get<double>(), e["pid"],
                     e["tid"], e["args"]});
  }
  if (rows)
    for (auto& [row, thread] : *rows) thread = processes[row.first] + "/" + thread;
  return spans;
}

// Every event of `cat` on (pid, tid) with a phase lies within a span of that phase on the same row,
// and the row holds spans of `phases` phases in all: exactly one each with `one_span_each`, else at
// least one (a compiled step's host launches a micro-batch's first forward kernels, which run ahead
// on a side stream, among the kernels of the micro-batch before it).
void expect_nested_in_phases(const std::vector<Span>& spans, const std::string& cat, int pid, int tid, size_t phases,
                             bool one_span_each = true) {
  std::map<std::string, std::vector<const Span*>> by_phase;
  for (const Span& s : spans)
    if (s.cat == "phase" && s.pid == pid && s.tid == tid) by_phase[s.name].push_back(&s);
  EXPECT_EQ(by_phase.size(), phases);
  for (int i = 0; i < kAccum; ++i) {
    const size_t n = by_phase["micro-batch " + std::to_string(i)].size();
    if (one_span_each) {
      EXPECT_EQ(n, 1u) << i;
    } else {
      EXPECT_GE(n, 1u) << i;
    }
  }
  EXPECT_EQ(by_phase["optimizer"].size(), 1u);
  size_t inside = 0;
  for (const Span& s : spans) {
    if (s.cat != cat || s.pid != pid || s.tid != tid || s.phase.empty()) continue;
    if (one_span_each) {
      ASSERT_EQ(by_phase[s.phase].size(), 1u) << s.name << " in phase " << s.phase;
    }
    const bool within = std::any_of(by_phase[s.phase].begin(), by_phase[s.phase].end(), [&](const Span* p) {
      return s.begin >= p->begin - 1e-3 && s.end <= p->end + 1e-3;
    });
    EXPECT_TRUE(within) << s.name << " lies outside every span of " << s.phase;
    ++inside;
  }
  EXPECT_GT(inside, 0u);
}

using testing_util::CliRun;
using testing_util::reel_cli;

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()) + ".json")).string();
}

size_t count(const std::vector<Span>& spans, const std::string& cat, int pid, int tid) {
  return size_t(std::count_if(spans.begin(), spans.end(),
                              [&](const Span& s) { return s.cat == cat && s.pid == pid && s.tid == tid; }));
}

// The (pid, tid) of the row named "process/thread".
std::pair<int, int> row_named(const std::map<std::pair<int, int>, std::string>& rows, const std::string& name) {
  for (const auto& [row, n] : rows)
    if (n == name) return row;
  ADD_FAILURE() << "no row " << name;
  return {-1, -1};
}

}  // namespace

TEST(ChromeTrace, CompiledStepOnTheCpu) {
  TracedStep t(Device::cpu());
  compile::Plan& plan = t.compiled_plan(compile::Mode::Default);
  // Every node knows its phase, fused ones (which passes build anew) included.
  size_t fused = 0;
  for (const compile::Node& n : plan.graph().nodes) {
    EXPECT_TRUE(n.phase == "optimizer" || n.phase.rfind("micro-batch ", 0) == 0) << op_name(n.op) << ": " << n.phase;
    fused += !n.fused.empty();
  }
  ASSERT_GT(fused, 0u) << "the passes fused nothing: the test would not see fused labels";

  const std::string path = temp_path("reel-trace");
  compile::trace_plan_call(plan, t.flat).write(path);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  std::map<std::pair<int, int>, std::string> rows;
  const std::vector<Span> spans = parse_spans(read_file(path), &rows);
  std::filesystem::remove(path);
  const auto [hp, ht] = row_named(rows, "host/host");
  const auto [kp, kt] = row_named(rows, "host/kernels");
  EXPECT_EQ(rows.size(), 2u) << "no device row on the CPU";

  // One event per kernel of the plan, in its order, one after the other (the CPU runs them in turn).
  EXPECT_EQ(count(spans, "kernel", kp, kt), plan.kernels());
  size_t k = 0, fused_events = 0;
  double end = 0;
  for (const Span& s : spans) {
    if (s.cat != "kernel") continue;
    const compile::Node& n = plan.graph().nodes[k];
    EXPECT_EQ(s.args.value("node", ""), "k" + std::to_string(k));
    EXPECT_EQ(s.phase, n.phase);
    if (!n.fused.empty()) {
      EXPECT_EQ(s.name.rfind("fused[", 0), 0u) << s.name;
      EXPECT_FALSE(s.args.value("ops", "").empty()) << s.name;
      ++fused_events;
    } else {
      EXPECT_EQ(s.name, op_name(n.op));
    }
    EXPECT_GE(s.begin, end - 1e-3) << s.name;
    end = s.end;
    ++k;
  }
  EXPECT_EQ(fused_events, fused);
  // The phases: a span per micro-batch and one for the optimizer, on both rows, each kernel inside
  // its own; nothing is launched from the host on the CPU.
  expect_nested_in_phases(spans, "kernel", kp, kt, kAccum + 1);
  EXPECT_EQ(count(spans, "phase", hp, ht), size_t(kAccum + 1));
  EXPECT_EQ(count(spans, "launch", hp, ht), 0u);
}

TEST(ChromeTrace, EagerStepOnTheCpu) {
  TracedStep t(Device::cpu());
  optim::train_step(*t.opt, t.loss_fn(), t.micro);  // the optimizer's state made: the traced step is a steady one
  const uint64_t k0 = kernel_count();
  const compile::ChromeTrace trace =
      compile::trace_eager_call([&] { optim::train_step(*t.opt, t.loss_fn(), t.micro); }, Device::cpu());
  const uint64_t ops = kernel_count() - k0;
  std::map<std::pair<int, int>, std::string> rows;
  const std::vector<Span> spans = parse_spans(trace.json(), &rows);
  const auto [hp, ht] = row_named(rows, "host/host");
  EXPECT_EQ(count(spans, "op", hp, ht), ops) << "one span per op that ran a kernel";
  expect_nested_in_phases(spans, "op", hp, ht, kAccum + 1);
  // The optimizer's ops come after every micro-batch's.
  double last_micro = 0, first_optimizer = 1e300;
  for (const Span& s : spans) {
    if (s.cat != "op") continue;
    if (s.phase == "optimizer") first_optimizer = std::min(first_optimizer, s.begin);
    else last_micro = std::max(last_micro, s.end);
  }
  EXPECT_LE(last_micro, first_optimizer + 1e-3);
}

TEST(ChromeTrace, NamesAreEscapedAndRowsNamed) {
  compile::ChromeTrace t;
  const auto a = t.row("host", "host"), b = t.row("cuda:0", "stream"), c = t.row("host", "kernels");
  EXPECT_EQ(t.row("cuda:0", "stream").pid, b.pid);
  EXPECT_EQ(a.pid, c.pid);
  EXPECT_NE(a.pid, b.pid);
  EXPECT_NE(a.tid, c.tid);
  const std::string odd = "a \"quoted\" back\\slash\nnew line\t\x01";
  t.span(a, odd, "kernel", 10, 12.5, {{"ops", odd}});
  t.phase_spans(c, {{"p", 1, 2}, {"p", 2, 3}, {"", 3, 4}, {"q", 4, 5}, {"p", 5, 6}});
  std::map<std::pair<int, int>, std::string> rows;
  const std::vector<Span> spans = parse_spans(t.json(), &rows);
  EXPECT_EQ(rows.at({b.pid, b.tid}), "cuda:0/stream");
  ASSERT_EQ(spans.size(), 4u);
  EXPECT_EQ(spans[0].name, odd);
  EXPECT_EQ(spans[0].args.value("ops", ""), odd);
  EXPECT_NEAR(spans[0].end - spans[0].begin, 2.5, 1e-9);
  // Runs of one phase: p over [1, 3], q, and p again; the unnamed item in no span.
  EXPECT_EQ(spans[1].name, "p");
  EXPECT_NEAR(spans[1].end - spans[1].begin, 2, 1e-9);
  EXPECT_EQ(spans[2].name, "q");
  EXPECT_EQ(spans[3].name, "p");
}

TEST(ChromeTrace, ArgumentsOfAnotherSignatureAreRefused) {
  TracedStep t(Device::cpu());
  compile::Plan& plan = t.compiled_plan(compile::Mode::Default);
  std::vector<Tensor> other = compile::flatten_micro(testing_util::token_batches(kAccum, 3, 16, 32));
  testing_util::expect_error([&] { compile::trace_plan_call(plan, other); },
                             {"trace: argument 0 is (3, 16) i64", "traced with (2, 16) i64"});
}

TEST(ChromeTrace, BenchWritesOneStep) {
  // gpt-tiny's step at micro-batch 1 (its shapes otherwise), compiled on the CPU.
  const std::string path = temp_path("reel-bench-trace");
  std::optional<CliRun> r = reel_cli("bench --models gpt-tiny --precisions fp32 --compile default --device cpu "
                                     "--steps 1 --warmup 0 --micro-batch 1 --trace " + path);
  if (!r) GTEST_SKIP() << "REEL_BIN does not name the reel binary (make test sets it)";
  ASSERT_EQ(r->code, 0) << r->out;
  const size_t at = r->out.find("trace of gpt-tiny fp32 default: " + path + " (");
  ASSERT_NE(at, std::string::npos) << r->out;
  const size_t kernels = std::stoul(r->out.substr(r->out.find('(', at) + 1));
  std::map<std::pair<int, int>, std::string> rows;
  const std::vector<Span> spans = parse_spans(read_file(path), &rows);
  std::filesystem::remove(path);
  const auto [kp, kt] = row_named(rows, "host/kernels");
  EXPECT_GT(kernels, 100u);
  EXPECT_EQ(count(spans, "kernel", kp, kt), kernels);
  // bench's step: 4 micro-batches, then the optimizer.
  std::map<std::string, int> phases;
  for (const Span& s : spans)
    if (s.cat == "phase" && s.pid == kp && s.tid == kt) phases[s.name]++;
  EXPECT_EQ(phases, (std::map<std::string, int>{{"micro-batch 0", 1}, {"micro-batch 1", 1}, {"micro-batch 2", 1},
                                                {"micro-batch 3", 1}, {"optimizer", 1}}));
  r = reel_cli("bench --models gpt-tiny --device cpu --trace /no/such/folder/t.json");
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("bench: --trace /no/such/folder/t.json: no folder /no/such/folder"), std::string::npos) << r->out;
}

TEST(ChromeTrace, BenchWritesAFilePerConfiguration) {
  const std::string path = temp_path("reel-bench-traces");
  std::optional<CliRun> r = reel_cli("bench --models cnn-small --precisions fp32 --compile eager,default --device cpu "
                                     "--steps 1 --warmup 0 --micro-batch 1 --trace " + path);
  if (!r) GTEST_SKIP() << "REEL_BIN does not name the reel binary (make test sets it)";
  ASSERT_EQ(r->code, 0) << r->out;
  EXPECT_FALSE(std::filesystem::exists(path));
  const std::string stem = path.substr(0, path.size() - 5);
  for (const std::string mode : {"eager", "default"}) {
    const std::string file = stem + "-cnn-small-fp32-" + mode + ".json";
    EXPECT_NE(r->out.find("trace of cnn-small fp32 " + mode + ": " + file), std::string::npos) << r->out;
    std::map<std::pair<int, int>, std::string> rows;
    const std::vector<Span> spans = parse_spans(read_file(file), &rows);
    std::filesystem::remove(file);
    // Eager: ops on the host row; compiled: kernels on the kernels row. Each inside its phase.
    const bool eager = mode == "eager";
    const auto [p, t] = row_named(rows, eager ? "host/host" : "host/kernels");
    std::map<std::string, int> phases;
    for (const Span& s : spans)
      if (s.cat == "phase" && s.pid == p && s.tid == t) phases[s.name]++;
    EXPECT_EQ(phases.size(), 5u) << mode;
    EXPECT_GT(count(spans, eager ? "op" : "kernel", p, t), 50u) << mode;
  }
}

TEST(ChromeTrace, TrainWritesOneMoreStep) {
  // Two compiled steps of cnn-small: call 0 warms up, call 1 traces; the step after them is the plan's.
  const std::string path = temp_path("reel-train-trace");
  std::optional<CliRun> r = reel_cli("train --model cnn-small --dataset random --device cpu --epochs 1 --limit 32 "
                                     "--micro-batch 8 --accum 2 --compile default --trace " + path);
  if (!r) GTEST_SKIP() << "REEL_BIN does not name the reel binary (make test sets it)";
  ASSERT_EQ(r->code, 0) << r->out;
  EXPECT_NE(r->out.find("trace: one more step written to " + path + " ("), std::string::npos) << r->out;
  EXPECT_NE(r->out.find("kernels of the plan)"), std::string::npos) << r->out;
  std::map<std::pair<int, int>, std::string> rows;
  const std::vector<Span> spans = parse_spans(read_file(path), &rows);
  std::filesystem::remove(path);
  const auto [kp, kt] = row_named(rows, "host/kernels");
  std::map<std::string, int> phases;
  for (const Span& s : spans)
    if (s.cat == "phase" && s.pid == kp && s.tid == kt) phases[s.name]++;
  EXPECT_EQ(phases, (std::map<std::string, int>{{"micro-batch 0", 1}, {"micro-batch 1", 1}, {"optimizer", 1}}));
  r = reel_cli("train --model gpt-tiny --items lines --trace " + path);
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("train: --trace does not trace --items lines yet"), std::string::npos) << r->out;
}

TEST(ChromeTraceCuda, CompiledStepOnTheGpu) {
  REEL_REQUIRE_GPU();
  TracedStep t(Device::cuda(0));
  compile::Plan& plan = t.compiled_plan(compile::Mode::ReduceOverhead);
  std::map<std::pair<int, int>, std::string> rows;
  const std::vector<Span> spans = parse_spans(compile::trace_plan_call(plan, t.flat).json(), &rows);
  const auto [hp, ht] = row_named(rows, "host/host");
  const auto [dp, dt] = row_named(rows, "cuda:0/stream");
  // The main stream's kernels on its row, each side lane's on a row of its own.
  size_t on_side = 0;
  for (const compile::Node& n : plan.graph().nodes) on_side += n.stream != 0;
  EXPECT_EQ(count(spans, "kernel", dp, dt), plan.kernels() - on_side);
  size_t side_kernels = 0;
  for (const char* lane : {"cuda:0/side stream 1", "cuda:0/side stream 2"})
    for (const auto& [row, name] : rows)
      if (name == lane) side_kernels += count(spans, "kernel", row.first, row.second);
  EXPECT_EQ(side_kernels, on_side);
  EXPECT_EQ(count(spans, "launch", hp, ht), plan.kernels());
  // Each kernel runs after its launch began, and the plan's trace runs them one after another (each
  // kernel, side-stream ones too, is waited for before the next is launched), whatever their rows.
  std::map<std::string, const Span*> launch;
  std::vector<const Span*> kernels;
  for (const Span& s : spans) {
    if (s.cat == "launch") launch[s.args.value("node", "")] = &s;
    if (s.cat == "kernel") kernels.push_back(&s);
  }
  std::sort(kernels.begin(), kernels.end(), [](const Span* a, const Span* b) { return a->begin < b->begin; });
  double end = 0;
  for (const Span* k : kernels) {
    const Span& s = *k;
    const Span* l = launch[s.args.value("node", "")];
    ASSERT_NE(l, nullptr) << s.name;
    EXPECT_GE(s.begin, l->begin - 1.0) << s.name << " ran before its launch";
    EXPECT_GE(s.begin, end - 1.0) << s.name << " overlaps the kernel before it";
    end = s.end;
  }
  expect_nested_in_phases(spans, "kernel", dp, dt, kAccum + 1);
  expect_nested_in_phases(spans, "launch", hp, ht, kAccum + 1, /*one_span_each=*/false);
}

TEST(ChromeTraceCuda, EagerStepOnTheGpu) {
  REEL_REQUIRE_GPU();
  TracedStep t(Device::cuda(0));
  optim::train_step(*t.opt, t.loss_fn(), t.micro);
  const compile::ChromeTrace trace =
      compile::trace_eager_call([&] { optim::train_step(*t.opt, t.loss_fn(), t.micro); }, Device::cuda(0));
  std::map<std::pair<int, int>, std::string> rows;
  const std::vector<Span> spans = parse_spans(trace.json(), &rows);
  const auto [hp, ht] = row_named(rows, "host/host");
  expect_nested_in_phases(spans, "op", hp, ht, kAccum + 1);
}
