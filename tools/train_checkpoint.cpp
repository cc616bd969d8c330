// Training checkpoints (see train_checkpoint.h).
#include "tools/train_checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <map>

#include "autograd/grad_mode.h"
#include "nn/safetensors.h"
#include "tensor/error.h"
#include "tensor/rng.h"

namespace reel::tools {

namespace {

constexpr const char* kFormat = "reel-training-checkpoint-1";

std::string model_path(const std::string& dir) { return (std::filesystem::path(dir) / "model.safetensors").string(); }
std::string optimizer_path(const std::string& dir) {
  return (std::filesystem::path(dir) / "optimizer.safetensors").string();
}

std::string number(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// The options that decide what each step computes: a resumed run must have the same ones.
std::map<std::string, std::string> identity(const TrainOptions& o) {
  return {{"model", o.model},
          {"dataset", o.dataset},
          {"text", o.text_path},
          {"items", o.items},
          {"precision", o.precision},
          {"micro_batch", std::to_string(o.micro_batch)},
          {"accum", std::to_string(o.accum)},
          {"effective_batch", std::to_string(o.effective_batch)},
          {"lr", number(o.lr)},
          {"schedule", o.schedule},
          {"warmup", std::to_string(o.warmup)},
          {"clip", number(o.clip)},
          {"seed", std::to_string(o.seed)},
          {"limit", std::to_string(o.limit)},
          // The cosine schedule spans the whole run: its length is part of every step's lr.
          {"steps", std::to_string(o.steps)},
          {"epochs", std::to_string(o.epochs)}};
}

int64_t int_field(const std::map<std::string, std::string>& m, const std::string& key, const std::string& file) {
  auto it = m.find(key);
  REEL_CHECK(it != m.end(), "train: --resume: ", file, " has no '", key, "' in its metadata; not a checkpoint of reel train");
  try {
    size_t used = 0;
    const long long v = std::stoll(it->second, &used);
    REEL_CHECK(used == it->second.size(), "");
    return v;
  } catch (const std::exception&) {
    throw Error(detail::cat("train: --resume: ", file, ": '", key, "' is '", it->second, "', not an integer"));
  }
}

}  // namespace

void check_checkpoint_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path p(dir);
  std::error_code ec;
  if (fs::exists(p, ec)) {
    REEL_CHECK(fs::is_directory(p, ec), "train: --checkpoint ", dir,
               " is a file; it names a folder that will hold model.safetensors and optimizer.safetensors");
    return;
  }
  const fs::path parent = p.has_parent_path() ? p.parent_path() : fs::path(".");
  REEL_CHECK(fs::is_directory(parent, ec), "train: --checkpoint ", dir, ": its parent folder ", parent.string(),
             " does not exist");
  REEL_CHECK(fs::create_directory(p, ec) && !ec, "train: --checkpoint ", dir, ": cannot make the folder (",
             ec.message(), ")");
}

void save_training(const std::string& dir, const nn::Module& model, const optim::Optimizer& opt,
                   const RunPosition& at, const TrainOptions& o) {
  std::map<std::string, std::string> meta = identity(o);
  meta["format"] = kFormat;
  meta["steps_done"] = std::to_string(at.steps);
  meta["epochs_done"] = std::to_string(at.epochs);
  meta["sampler_draws"] = std::to_string(at.sampler_draws);
  meta["generator_offset"] = std::to_string(at.generator_offset);
  nn::NamedTensors model_state, opt_state;
  for (const auto& [name, t] : model.named_state()) model_state.push_back({name, t.detach().to(Device::cpu())});
  for (const auto& [name, t] : opt.state_dict()) opt_state.push_back({name, t.detach().to(Device::cpu())});
  // The model's file first, each carrying the step: see the top of train_checkpoint.h.
  nn::write_safetensors(model_path(dir), model_state,
                        {{"format", "pt"}, {"steps_done", meta["steps_done"]}, {"epochs_done", meta["epochs_done"]}});
  nn::write_safetensors(optimizer_path(dir), opt_state, meta);
}

RunPosition resume_training(const std::string& dir, nn::Module& model, optim::Optimizer& opt, const TrainOptions& o) {
  namespace fs = std::filesystem;
  REEL_CHECK(fs::is_directory(dir), "train: --resume ", dir, " is not a folder (reel train --checkpoint DIR makes one)");
  const std::string mpath = model_path(dir), opath = optimizer_path(dir);
  for (const std::string& p : {mpath, opath})
    REEL_CHECK(fs::is_regular_file(p), "train: --resume ", dir, ": ", p, " is missing");
  const nn::SafetensorsFile state = nn::read_safetensors(opath);
  const std::map<std::string, std::string>& meta = state.metadata;
  auto format = meta.find("format");
  REEL_CHECK(format != meta.end() && format->second == kFormat, "train: --resume: ", opath,
             " is not a reel training checkpoint (its metadata lacks format ", kFormat, ")");
  std::string mismatches;
  for (const auto& [key, value] : identity(o)) {
    auto it = meta.find(key);
    const std::string saved = it == meta.end() ? "(absent)" : it->second;
    if (saved != value)
      mismatches += detail::cat(mismatches.empty() ? "" : "; ", key, ": saved ", saved.empty() ? "''" : saved, ", now ",
                                value.empty() ? "''" : value);
  }
  REEL_CHECK(mismatches.empty(), "train: --resume ", dir, ": the run was saved with other options, so resuming would "
             "not continue it (", mismatches, ")");
  RunPosition at;
  at.steps = int_field(meta, "steps_done", opath);
  at.epochs = int_field(meta, "epochs_done", opath);
  at.sampler_draws = uint64_t(int_field(meta, "sampler_draws", opath));
  at.generator_offset = uint64_t(int_field(meta, "generator_offset", opath));
  const nn::SafetensorsFile weights_meta = nn::read_safetensors(mpath);
  const int64_t model_steps = int_field(weights_meta.metadata, "steps_done", mpath);
  const int64_t model_epochs = int_field(weights_meta.metadata, "epochs_done", mpath);
  REEL_CHECK(model_steps == at.steps && model_epochs == at.epochs, "train: --resume ", dir, ": the model was saved at step ",
             model_steps, " (epoch ", model_epochs, ") but the optimizer at step ", at.steps, " (epoch ", at.epochs,
             "): the save was cut between its two files; resume from another checkpoint");
  // Strict loads, each leaving its target untouched on an error (after which the run stops).
  nn::load_safetensors(model, mpath);
  opt.load_state_dict(state.tensors);
  default_generator().set_offset(at.generator_offset);
  return at;
}

}  // namespace reel::tools
