// Training checkpoints of `reel train --checkpoint DIR` and `--resume DIR`: what a run saves at an
// optimizer step's boundary so that a later run continues it as if it had never stopped.
//
//   DIR/model.safetensors      the module's named_state(), PyTorch's key names (nn/safetensors.h):
//                              also what `--init-from` and PyTorch's load_file read
//   DIR/optimizer.safetensors  Optimizer::state_dict(): the step counters (the LR schedule's position),
//                              AdamW's moments as state.<i>.exp_avg / exp_avg_sq, the GradScaler's
//                              scale and growth tracker; its "__metadata__" holds the run's position
//                              (steps or epochs done, the training sampler's draws, the default
//                              generator's offset) and the options that make the run what it is
// Each file is written to a temporary name, synced and renamed (nn::write_safetensors), the model's
// first; both carry the step they were saved at, so a crash between the two renames is found at
// resume (the step numbers differ) rather than resumed from a mix.
//
// What resuming restores, and why that is enough for the same bits: the parameters and buffers
// (BatchNorm's running statistics and counter), the optimizer's state and counters (so the lr of
// the next step and AdamW's bias correction), the scaler's scale and growth tracker, the sampler's
// Philox counter (the next batches are those the stopped run would have drawn) and the default
// generator's offset (dropout's masks). Everything else a step computes follows from these. The
// options that change what a step computes (model, precision, batch split, lr and its schedule,
// clipping, seed, the number of steps the schedule spans) must match: a mismatch is an error naming
// the option and both values, since the result would not be the run that was saved.
#pragma once
#include <cstdint>
#include <string>

#include "nn/module.h"
#include "optim/optimizer.h"
#include "tools/train_options.h"

namespace reel::tools {

// Where a run stands at a step boundary, besides the model and optimizer.
struct RunPosition {
  int64_t steps = 0;            // optimizer steps done (text models)
  int64_t epochs = 0;           // epochs done (image models; checkpoints at epoch ends)
  uint64_t sampler_draws = 0;   // the training sampler's draws (text: TextSampler/LineSampler::draws)
  uint64_t generator_offset = 0;  // reel::default_generator()'s offset
};

// `--checkpoint DIR`: a folder, made if missing; its parent must exist. Checked before training.
void check_checkpoint_dir(const std::string& dir);

// Saves the run (rank 0 only under data parallel: the caller's choice) into `dir`.
void save_training(const std::string& dir, const nn::Module& model, const optim::Optimizer& opt,
                   const RunPosition& at, const TrainOptions& o);

// Loads `dir` into `model` and `opt` (strict: every key, shape and dtype; nothing changed on any
// error) after checking the options match; returns where the run stood. Sets the default
// generator's offset.
RunPosition resume_training(const std::string& dir, nn::Module& model, optim::Optimizer& opt, const TrainOptions& o);

}  // namespace reel::tools
