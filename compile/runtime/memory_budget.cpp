// Memory budget (see memory_budget.h).
#include "compile/runtime/memory_budget.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <optional>
#include <set>
#include <sstream>

#include "compile/runtime/describe.h"
#include "compile/passes/memory_plan.h"
#include "compile/passes/step_cost.h"
#include "compile/ir/trace.h"
#include "compile/runtime/train_step.h"
#include "kernels/dispatch.h"
#include "kernels/library_workspaces.h"
#include "optim/accumulation.h"
#include "tensor/storage.h"

namespace reel::compile {

namespace {

// The workspace cuBLAS and cuBLASLt share, one per device (the CUDA backend allocates it once and
// keeps it, under this name, for eager and compiled GEMMs alike).
constexpr size_t kBlasWorkspaceBytes = size_t(32) << 20;

// Sets the parameters' gradients aside for the traced step and puts them back after it, so that
// planning neither drops a caller's accumulated gradients nor leaves a meta tensor in any .grad.
class GradsSetAside {
 public:
  explicit GradsSetAside(const std::vector<Tensor>& params) : params_(params) {
    for (const Tensor& p : params_) {
      saved_.push_back(p.grad());
      if (p.grad().defined()) p.set_grad(Tensor());
    }
  }
  ~GradsSetAside() {
    for (size_t i = 0; i < params_.size(); ++i) params_[i].set_grad(saved_[i]);
  }
  GradsSetAside(const GradsSetAside&) = delete;
  GradsSetAside& operator=(const GradsSetAside&) = delete;

 private:
  std::vector<Tensor> params_, saved_;
};

// The allocator's bytes for every buffer of `kind` on `device`, each its own block.
size_t bytes_of_kind(const Graph& g, BufferKind kind, Device device) {
  size_t n = 0;
  for (const Buffer& b : g.buffers)
    if (b.kind == kind && b.device == device) n += allocation_bytes(device, b.nbytes);
  return n;
}

// The step's N items of inputs and targets, one block per input tensor of each micro-batch: the
// traced step's input buffers hold `traced` micro-batches of `micro_batch` items each.
size_t step_input_bytes(const Graph& g, Device device, int64_t traced, const BudgetCandidate& c) {
  const int per_micro = g.num_inputs / int(traced);
  size_t n = 0;
  for (int i = 0; i < per_micro; ++i) {
    const Buffer& b = g.buffers[g.inputs[i].buffer];
    if (b.device != device) continue;
    const size_t per_item = b.nbytes / size_t(c.micro_batch);
    n += size_t(c.accum - 1) * allocation_bytes(device, per_item * size_t(c.micro_batch)) +
         allocation_bytes(device, per_item * size_t(c.last_micro_batch));
  }
  return n;
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

std::pair<const char*, size_t> BudgetCandidate::largest_part() const {
  std::pair<const char*, size_t> parts[] = {
      {"activations, gradients and temporaries (the step)", arena_bytes},
      {"parameters and optimizer state (external buffers)", external_bytes},
      {"inputs and targets", input_bytes},
      {"library workspaces", workspace_bytes}};
  std::pair<const char*, size_t> best = parts[0];
  for (const auto& p : parts)
    if (p.second > best.second) best = p;
  return best;
}

std::vector<int64_t> candidate_micro_batches(int64_t effective_batch) {
  REEL_CHECK(effective_batch > 0, "memory budget: the effective batch must be positive, got ", effective_batch);
  std::vector<int64_t> out;
  // m doubles until it passes N, stopping before the doubling could overflow (N near 2^63).
  for (int64_t m = 1; m <= effective_batch; m *= 2) {
    out.push_back(m);
    if (m > effective_batch / 2) break;
  }
  if (out.back() != effective_batch) out.push_back(effective_batch);
  return out;
}

size_t library_workspace_bytes(Device device) {
  if (!device.is_cuda()) return 0;
  // The ones already made stay allocated whatever runs next; the step adds the GEMMs' one when it is
  // not made yet (eager and compiled steps both need it).
  std::map<std::string, size_t> ws = library_workspaces(device);
  ws.emplace("cublas", allocation_bytes(device, kBlasWorkspaceBytes));
  size_t n = 0;
  for (const auto& [name, bytes] : ws) n += bytes;
  return n;
}

namespace {
Allocator* allocator_or_null(Device device) {
  try {
    return &allocator_for(device);
  } catch (const Error&) {
    return nullptr;  // no backend for the device in this build: plan without its rounding
  }
}
}  // namespace

size_t allocation_bytes(Device device, size_t nbytes) {
  Allocator* a = allocator_or_null(device);
  return a ? a->block_size(nbytes) : nbytes;
}
size_t allocated_bytes(Device device) {
  Allocator* a = allocator_or_null(device);
  return a ? a->allocated_bytes(device) : 0;
}
size_t peak_bytes(Device device) {
  Allocator* a = allocator_or_null(device);
  return a ? a->peak_bytes(device) : 0;
}
void reset_peak_bytes(Device device) {
  if (Allocator* a = allocator_or_null(device)) a->reset_peak(device);
}

size_t plans_steady_peak(const std::vector<const Plan*>& plans, Device device) {
  size_t arena = 0, inputs = 0, external = 0;
  std::set<const Storage*> seen;
  for (const Plan* p : plans) {
    if (const Arena* a = p->memory().arena_for(device)) arena = std::max(arena, allocation_bytes(device, a->bytes));
    for (const Buffer& b : p->graph().buffers) {
      if (b.device != device) continue;
      if (b.kind == BufferKind::Input) inputs += allocation_bytes(device, b.nbytes);
      if (b.kind == BufferKind::External && seen.insert(b.storage.get()).second)
        external += allocation_bytes(device, b.nbytes);
    }
  }
  return arena + inputs + external + library_workspace_bytes(device);
}

std::string compare_planned_peak(size_t planned, size_t measured, double tolerance) {
  const double diff = planned ? (double(measured) - double(planned)) / double(planned) : 0.0;
  char line[160];
  std::snprintf(line, sizeof line, "memory: planned peak %s, measured %s (%+.1f%%)", bytes_str(planned).c_str(),
                bytes_str(measured).c_str(), 100 * diff);
  std::string out = line;
  if (std::abs(diff) > tolerance)
    out += "\nwarning: the measured peak differs from the plan by more than " + std::to_string(int(100 * tolerance)) +
           "% (not planned: cuDNN's per-call workspaces, kernels' own temporaries); leave headroom in --memory-budget";
  return out;
}

Graph trace_step_graph(const BudgetSetup& setup, int64_t micro_batch, int64_t count, bool meta,
                       int64_t last_micro_batch) {
  REEL_CHECK(micro_batch > 0 && count > 0, "memory budget: micro-batch ", micro_batch, " x ", count,
             " micro-batches: both must be positive");
  const bool smaller_last = last_micro_batch > 0 && last_micro_batch != micro_batch;
  // Made outside meta mode: its step counters (and a scaler's state) are real, as in training.
  std::unique_ptr<optim::Optimizer> opt = setup.make_optimizer();
  REEL_CHECK(opt != nullptr, "memory budget: the optimizer factory returned no optimizer");
  if (smaller_last) opt->set_items_per_step(micro_batch * (count - 1) + last_micro_batch);
  else opt->set_accum_steps(count);
  GradsSetAside aside(opt->parameters());
  std::optional<MetaModeGuard> meta_mode;
  if (meta) meta_mode.emplace();
  std::vector<optim::MicroBatch> micro = setup.make_micro(micro_batch, smaller_last ? count - 1 : count);
  if (smaller_last)
    for (optim::MicroBatch& m : setup.make_micro(last_micro_batch, 1)) micro.push_back(m);
  REEL_CHECK(int64_t(micro.size()) == count, "memory budget: asked for ", count, " micro-batches of ", micro_batch,
             ", got ", micro.size());
  if (smaller_last)
    for (size_t i = 0; i < micro.size(); ++i) micro[i].items = i + 1 < micro.size() ? micro_batch : last_micro_batch;
  Tracer tracer(flatten_micro(micro));
  tracer.start();
  Tensor mean_loss;
  optim::StepResult r = optim::train_step(*opt, setup.loss_fn, micro, &mean_loss);
  tracer.stop();
  // Finished while the optimizer lives, so that the state it keeps counts as External; the step's
  // results are its outputs, as in compile_train_step.
  std::vector<Tensor> outputs{mean_loss};
  for (const Tensor& t : {r.grad_norm, r.found_inf, r.lr_tensor})
    if (t.defined()) outputs.push_back(t);
  return tracer.finish(outputs);
}

namespace {

// Candidate `c` (its split, inputs, workspaces and eager calls filled in) completed from the traced
// step `g` by the passes of the compiled plan under `limit` (outside meta mode: constant folding runs
// its few kernels), with no kernel built; the fused graph's arena is one block.
BudgetCandidate plan_compiled(const BudgetSetup& setup, Graph g, BudgetCandidate c, size_t limit) {
  PassStats stats;
  Graph fused = optimize_graph(std::move(g), PassOptions{true, {}, limit}, stats);
  const MemoryPlan plan = plan_memory(fused);
  const Arena* arena = plan.arena_for(setup.device);
  c.arena_bytes = arena ? allocation_bytes(setup.device, arena->bytes) : 0;
  c.external_bytes = bytes_of_kind(fused, BufferKind::External, setup.device);
  c.memory_limit = limit;
  c.recomputed_nodes = stats.recomputed.size();
  c.recompute_flops = stats.recompute_flops;
  c.estimated_seconds = estimate_seconds(fused, setup.device, Launch::Replayed);
  return c;
}

// Micro-batch `micro_batch`'s candidates: the one at setup.memory_limit, and, for a compiled step
// with `budget` > 0 that it does not fit while its eager calls do, the one recomputing to fit it.
std::vector<BudgetCandidate> plan_micro_batch(const BudgetSetup& setup, int64_t micro_batch, size_t budget) {
  REEL_CHECK(micro_batch > 0 && micro_batch <= setup.effective_batch, "memory budget: micro-batch ", micro_batch,
             " is outside 1..", setup.effective_batch, " (the effective batch)");
  BudgetCandidate c;
  c.micro_batch = micro_batch;
  const optim::AccumulationSplit split = optim::split_accumulation(setup.effective_batch, micro_batch);
  c.accum = split.accum;
  c.last_micro_batch = split.last_micro_batch;
  // Eagerly, two micro-batches show the peak (see the top of this file); a compiled plan is traced
  // whole, as compile_train_step will trace it, since its arena is placed over all of it.
  const int64_t traced = setup.compile_mode ? c.accum : std::min<int64_t>(c.accum, 2);
  const Device device = setup.device;
  Graph g = trace_step_graph(setup, micro_batch, traced, true, setup.compile_mode ? c.last_micro_batch : 0);
  // The caller's micro-batches; a compiled plan binds all of them at once into buffers of its own.
  c.input_bytes = step_input_bytes(g, device, traced, c) * (setup.compile_mode ? 2 : 1);
  c.workspace_bytes = library_workspace_bytes(device);
  if (!setup.compile_mode) {
    c.arena_bytes = eager_peak_bytes(g, device, [&](size_t n) { return allocation_bytes(device, n); });
    c.external_bytes = bytes_of_kind(g, BufferKind::External, device);
    // The traced micro-batches stand for all ACCUM (the optimizer's part counted that many times too).
    c.estimated_seconds = estimate_seconds(g, device, Launch::Eager) * double(c.accum) / double(traced);
    return {c};
  }
  // Its first calls run eagerly, unless it is traced without running.
  if (!setup.trace_without_running) {
    BudgetSetup eager = setup;
    eager.compile_mode.reset();
    c.eager_calls_bytes = plan_micro_batch(eager, micro_batch, 0)[0].peak();
  }
  const bool try_recompute = budget > 0 && setup.recompute_to_fit && setup.memory_limit == 0;
  std::vector<BudgetCandidate> out{plan_compiled(setup, try_recompute ? g : std::move(g), c, setup.memory_limit)};
  const BudgetCandidate& plain = out[0];
  const size_t around = plain.external_bytes + plain.input_bytes + plain.workspace_bytes;
  if (!try_recompute || plain.peak() <= budget || c.eager_calls_bytes > budget || around >= budget) return out;
  // The arena may take what the budget leaves; the plan it places can exceed the limit by its
  // fragmentation, so the limit is lowered by any overshoot and the step planned again (three tries).
  size_t limit = budget - around;
  for (int attempt = 0; attempt < 3 && limit > 0; ++attempt) {
    BudgetCandidate r = plan_compiled(setup, g, c, limit);
    if (r.recomputed_nodes == 0) break;  // nothing the planner can recompute helps
    if (r.peak() <= budget || attempt == 2) {
      out.push_back(r);
      break;
    }
    const size_t over = r.peak() - budget;
    limit = limit > over + over / 8 ? limit - over - over / 8 : 0;
  }
  return out;
}

}  // namespace

BudgetCandidate plan_candidate(const BudgetSetup& setup, int64_t micro_batch) {
  return plan_micro_batch(setup, micro_batch, 0)[0];
}

std::vector<BudgetCandidate> plan_candidates_for(const BudgetSetup& setup, size_t budget) {
  std::vector<BudgetCandidate> out;
  for (int64_t m : candidate_micro_batches(setup.effective_batch)) {
    try {
      for (BudgetCandidate& c : plan_micro_batch(setup, m, budget)) out.push_back(std::move(c));
    } catch (const Error& e) {
      // Which candidate could not be planned (a micro-batch whose shapes overflow, say), and why.
      throw Error(detail::cat("memory budget: planning micro-batch ", m, " of the effective batch ",
                              setup.effective_batch, ": ", e.what()));
    }
  }
  return out;
}

std::vector<BudgetCandidate> plan_candidates(const BudgetSetup& setup) { return plan_candidates_for(setup, 0); }

namespace {
// Whether `a` is to be chosen over `b`: fewer estimated seconds per step (both cover the same effective
// batch), then the larger micro-batch, then the fewer recomputed FLOPs.
bool faster(const BudgetCandidate& a, const BudgetCandidate& b) {
  if (a.estimated_seconds > 0 && b.estimated_seconds > 0 && a.estimated_seconds != b.estimated_seconds)
    return a.estimated_seconds < b.estimated_seconds;
  if (a.micro_batch != b.micro_batch) return a.micro_batch > b.micro_batch;
  return a.recompute_flops < b.recompute_flops;
}
}  // namespace

BudgetChoice pick_micro_batch(std::vector<BudgetCandidate> candidates, int64_t effective_batch, size_t budget) {
  REEL_CHECK(effective_batch > 0, "memory budget: the effective batch must be positive, got ", effective_batch);
  REEL_CHECK(!candidates.empty(), "memory budget: no candidate micro-batches to choose from");
  BudgetChoice choice{effective_batch, budget, std::move(candidates), 0};
  bool any = false;
  const BudgetCandidate* smallest = &choice.candidates[0];
  for (size_t i = 0; i < choice.candidates.size(); ++i) {
    BudgetCandidate& c = choice.candidates[i];
    REEL_CHECK(c.micro_batch > 0 && c.micro_batch <= effective_batch, "memory budget: candidate micro-batch ",
               c.micro_batch, " is outside 1..", effective_batch);
    const optim::AccumulationSplit split = optim::split_accumulation(effective_batch, c.micro_batch);
    c.accum = split.accum;
    c.last_micro_batch = split.last_micro_batch;
    c.fits = c.peak() <= budget;
    if (c.micro_batch < smallest->micro_batch || (c.micro_batch == smallest->micro_batch && c.peak() < smallest->peak()))
      smallest = &c;
    if (c.fits && (!any || faster(c, choice.choice()))) {
      choice.chosen = i;
      any = true;
    }
  }
  if (!any) {
    auto [part, part_bytes] = smallest->largest_part();
    throw Error("memory budget: nothing fits " + bytes_str(budget) + " (" + std::to_string(budget) +
                " bytes): the smallest candidate, micro-batch " + std::to_string(smallest->micro_batch) + " x ACCUM " +
                std::to_string(smallest->accum) + ", has a planned peak of " + bytes_str(smallest->peak()) +
                ", of which " + part + " take " + bytes_str(part_bytes) + "; raise the budget");
  }
  return choice;
}

std::string budget_table(const BudgetChoice& choice) {
  std::ostringstream os;
  char line[260];
  bool estimated = false, recomputes = false, compiled = false;
  for (const BudgetCandidate& k : choice.candidates) {
    estimated = estimated || k.estimated_seconds > 0;
    recomputes = recomputes || k.memory_limit > 0;
    compiled = compiled || k.eager_calls_bytes > 0;
  }
  os << "memory budget " << bytes_str(choice.budget) << " for an effective batch of " << choice.effective_batch
     << ": candidates planned without running\n";
  std::snprintf(line, sizeof line, "  %11s %6s %5s %12s %12s %12s %11s", "micro-batch", "ACCUM", "last", "step",
                "external", "inputs", "workspaces");
  os << line;
  if (compiled) os << "   first calls";
  std::snprintf(line, sizeof line, " %13s %5s", "planned peak", "fits");
  os << line;
  if (recomputes) {
    std::snprintf(line, sizeof line, " %12s %9s %7s", "recompute to", "+GFLOP", "clones");
    os << line;
  }
  if (estimated) {
    std::snprintf(line, sizeof line, " %9s %10s", "est. ms", "est. items/s");
    os << line;
  }
  os << "\n";
  for (size_t i = 0; i < choice.candidates.size(); ++i) {
    const BudgetCandidate& c = choice.candidates[i];
    std::snprintf(line, sizeof line, "%s %11lld %6lld %5lld %12s %12s %12s %11s", i == choice.chosen ? "->" : "  ",
                  (long long)c.micro_batch, (long long)c.accum, (long long)c.last_micro_batch,
                  bytes_str(c.arena_bytes).c_str(), bytes_str(c.external_bytes).c_str(),
                  bytes_str(c.input_bytes).c_str(), bytes_str(c.workspace_bytes).c_str());
    os << line;
    if (compiled) {
      std::snprintf(line, sizeof line, " %13s", bytes_str(c.eager_calls_bytes).c_str());
      os << line;
    }
    std::snprintf(line, sizeof line, " %13s %5s", bytes_str(c.peak()).c_str(), c.fits ? "yes" : "no");
    os << line;
    if (recomputes) {
      if (c.memory_limit > 0)
        std::snprintf(line, sizeof line, " %12s %9.2f %7zu", bytes_str(c.memory_limit).c_str(), c.recompute_flops / 1e9,
                      c.recomputed_nodes);
      else
        std::snprintf(line, sizeof line, " %12s %9s %7s", "-", "-", "-");
      os << line;
    }
    if (estimated) {
      if (c.estimated_seconds > 0)
        std::snprintf(line, sizeof line, " %9.3f %10.0f", 1e3 * c.estimated_seconds,
                      double(choice.effective_batch) / c.estimated_seconds);
      else
        std::snprintf(line, sizeof line, " %9s %10s", "-", "-");
      os << line;
    }
    os << (i == choice.chosen ? "  <- chosen\n" : "\n");
  }
  const BudgetCandidate& c = choice.choice();
  os << "chosen: micro-batch " << c.micro_batch << " x ACCUM " << c.accum << " = " << choice.effective_batch
     << " items per optimizer step";
  if (c.memory_limit > 0)
    os << ", recomputing " << c.recomputed_nodes << " nodes in the backward (arena limit "
       << bytes_str(c.memory_limit) << ")";
  if (choice.counts_items())
    os << "\nremainder: the last micro-batch has " << c.last_micro_batch << " items; the optimizer counts items ("
       << choice.effective_batch << " per step), so each micro-batch's loss is weighted by its share and the step's "
       << "gradient stays the mean over all " << choice.effective_batch;
  os << "\nplanned peak = step (activations, gradients, temporaries at their most) + external (parameters, "
        "optimizer state) + inputs + library workspaces, each as the allocator rounds it; not counted: cuDNN's "
        "per-call workspaces, cached free blocks, the CUDA context\n";
  if (recomputes)
    os << "recompute to: the plan's arena limit (CompileOptions::memory_limit); the planner clones activations "
          "into the backward until the step's live bytes fit it, the same bits as without\n";
  if (estimated)
    os << "est.: a roofline estimate from the planned kernels (compile/passes/step_cost.h), used to rank the "
          "candidates that fit; not a measurement\n";
  if (compiled)
    os << "first calls: a compiled step's first two calls run eagerly (warm-up, and the trace the plan is built "
          "from); the planned peak is the larger of theirs and the plan's\n";
  return os.str();
}

std::string budget_advice(const BudgetChoice& choice) {
  const BudgetCandidate& c = choice.choice();
  return "the planner would choose micro-batch " + std::to_string(c.micro_batch) + " x ACCUM " +
         std::to_string(c.accum) + (c.memory_limit ? " recomputing to an arena of " + bytes_str(c.memory_limit) : "") +
         " for budget " + bytes_str(choice.budget) + " (planned peak " + bytes_str(c.peak()) +
         "; reel train --effective-batch " + std::to_string(choice.effective_batch) + " --memory-budget SIZE)";
}

bool is_out_of_memory(const std::exception& e) {
  const std::string what = e.what();
  return what.find("out of memory") != std::string::npos || what.find("out of host memory") != std::string::npos;
}

size_t parse_memory_size(const std::string& text) {
  const std::string bad = "memory size: cannot parse \"" + text +
                          "\" (expected a positive number and a unit: B, KiB, MiB, GiB, TiB or KB, MB, GB, TB, "
                          "e.g. 512MiB, 1GiB, 2.5GB)";
  size_t i = 0, digits = 0, dots = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) {
    text[i] == '.' ? ++dots : ++digits;
    ++i;
  }
  REEL_CHECK(digits > 0 && dots <= 1, bad);
  const double value = std::stod(text.substr(0, i));
  while (i < text.size() && text[i] == ' ') ++i;
  const std::string unit = lower(text.substr(i));
  const std::pair<const char*, double> units[] = {
      {"", 1},          {"b", 1},           {"kib", 1024.0},     {"mib", 1048576.0}, {"gib", 1073741824.0},
      {"tib", 1099511627776.0}, {"kb", 1e3}, {"mb", 1e6},        {"gb", 1e9},        {"tb", 1e12}};
  for (const auto& [name, scale] : units) {
    if (unit != name) continue;
    REEL_CHECK(scale != 1 || dots == 0, bad, ": a number of bytes must be whole");
    const double bytes = std::floor(value * scale);
    REEL_CHECK(bytes >= 1 && bytes < 1.8e19, bad, ": the size must be at least one byte");
    return size_t(bytes);
  }
  throw Error(bad);
}

}  // namespace reel::compile
