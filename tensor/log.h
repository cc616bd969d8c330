// Logging in the manner of TORCH_LOGS: REEL_LOG is a comma-separated list of topics
//   recompiles    why a call traced again (a guard missed) or hit the cache limit
//   graph_breaks  ops a replay cannot honour, with the reason
//   plan          each plan built: kernels, graphs, buffers
//   memory        each plan's memory: arena bytes per device against no reuse
//   fusion        what each fusion pass fused, and why it declined each candidate it looked at
//   passes        the nodes each pass of the pipeline left, and the passes turned off
//   kernels       NVRTC compilations, disk-cache hits and writes of generated kernels; cuDNN attention
//                 plans built or refused, and autotuning's choice between cuDNN and reel's kernels
// ("all" turns every topic on). Lines go to stderr as "[reel:<topic>] ...".
#pragma once
#include <string>

namespace reel {

bool log_enabled(const char* topic);
void log_line(const char* topic, const std::string& message);
// Re-reads REEL_LOG (tests change it between cases).
void reload_log_topics();

}  // namespace reel
