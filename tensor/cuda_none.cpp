// The CUDA runtime API in a build without nvcc: nothing is available, and asking for device memory
// is a clear error.
#include "tensor/cuda.h"

namespace reel::cuda {

bool is_built() { return false; }
bool is_available() { return false; }
int device_count() { return 0; }
std::string unavailable_reason() { return "reel was built without the CUDA backend (nvcc was not found)"; }
void synchronize(int) {}
void profiler_start() {}
void profiler_stop() {}
StreamHandle current_stream(int) { return nullptr; }
void set_current_stream(StreamHandle, int) {}
StreamHandle create_stream() { throw Error("cuda: reel was built without the CUDA backend"); }
void destroy_stream(StreamHandle) {}
StreamGuard::StreamGuard(StreamHandle, int device) : prev_(nullptr), device_(device) {}
StreamGuard::~StreamGuard() = default;
StreamFork::StreamFork(int device) : device_(device) { throw Error("cuda: reel was built without the CUDA backend"); }
StreamFork::~StreamFork() = default;
void StreamFork::begin_side(int) {}
int StreamFork::end_side() { return 0; }
void StreamFork::join(int) {}
int side_lane(StreamHandle, int) { return 0; }
MemoryStats memory_stats(int) { return {}; }
void reset_peak_memory_stats(int) {}
void empty_cache() {}
bool caching_enabled() { return false; }
GraphPool::GraphPool() : id_(0) {}
GraphPool::~GraphPool() = default;
GraphPoolGuard::GraphPoolGuard(const GraphPool&) : prev_(0) {}
GraphPoolGuard::~GraphPoolGuard() = default;
EventTimer::EventTimer(int device) : device_(device) {}
EventTimer::~EventTimer() = default;
void EventTimer::start() { throw Error("EventTimer: reel was built without the CUDA backend"); }
void EventTimer::stop() { throw Error("EventTimer: reel was built without the CUDA backend"); }
double EventTimer::elapsed_ms() { throw Error("EventTimer: reel was built without the CUDA backend"); }
Graph::Graph(int device) : device_(device) {}
Graph::~Graph() = default;
void Graph::capture_begin() { throw Error("cuda::Graph: reel was built without the CUDA backend"); }
void Graph::capture_end() { throw Error("cuda::Graph: reel was built without the CUDA backend"); }
void Graph::replay() { throw Error("cuda::Graph: reel was built without the CUDA backend"); }
EventLog::EventLog(int device) : device_(device) {}
EventLog::~EventLog() = default;
void EventLog::mark() { throw Error("EventLog: reel was built without the CUDA backend"); }
std::vector<double> EventLog::intervals_ms() { return {}; }
Tensor pinned_empty(const Shape&, DType) { throw Error("pinned_empty: reel was built without the CUDA backend"); }
bool is_pinned(const Tensor&) { return false; }

}  // namespace reel::cuda
