// `reel train --trace FILE.json`: after training, one more optimizer step, traced as a Chrome trace
// (compile/runtime/chrome_trace.h: host and device rows, each micro-batch and the optimizer a span).
// Compiled, the step's plan runs kernel by kernel outside any CUDA graph (Plan::trace); eager, or a
// compiled step that runs eagerly (a graph break), its ops are recorded at the dispatch door. The
// extra step updates the model like any other, after everything the run reports and saves.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "compile/runtime/compile.h"
#include "nn/nn.h"
#include "optim/optim.h"

namespace reel::tools {

// The step on `micro` (a step's micro-batches, shaped as the training steps'), written to `path` by
// rank 0; under mpirun every rank runs it, its gradients all-reduced as in training.
void write_train_trace(const std::string& path, std::optional<compile::CompiledFunction>& compiled,
                       nn::Module& model, optim::Optimizer& opt, const std::vector<optim::MicroBatch>& micro,
                       Device device);

}  // namespace reel::tools
