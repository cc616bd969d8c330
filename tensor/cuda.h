// reel::cuda — the user-facing CUDA runtime API: availability, streams, memory statistics, graph
// memory pools, pinned host memory. Declared without CUDA headers so any code can include it; in a
// build without nvcc every query answers "not available" (tensor/cuda_none.cpp).
//
// Streams: every op runs on the current stream of its device. By default that is a non-blocking
// stream reel creates per device (never the legacy default stream, which cannot be captured into a
// CUDA graph). Handles are cudaStream_t values carried as void*.
//
// Memory: device tensors come from a caching allocator in the manner of PyTorch's: freed blocks are
// kept per (stream, pool) and reused for later requests of a similar size, so a steady training loop
// calls cudaMalloc only while warming up. REEL_CUDA_NO_CACHE=1 in the environment turns caching off
// (every tensor gets its own cudaMalloc/cudaFree) for debugging with compute-sanitizer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace reel::cuda {

bool is_built();              // reel was built with the CUDA backend
bool is_available();          // built, and at least one device is visible
int device_count();
std::string unavailable_reason();  // why is_available() is false ("" when it is true)
void synchronize(int device = 0);  // waits for all work on the device
// Marks the work between start and stop for a profiler started with collection off (Nsight Compute's
// `ncu --profile-from-start off`, cudaProfilerStart/Stop): e.g. one replayed step out of a run.
void profiler_start();
void profiler_stop();

using StreamHandle = void*;  // a cudaStream_t
StreamHandle current_stream(int device = 0);
void set_current_stream(StreamHandle stream, int device = 0);
StreamHandle create_stream();
void destroy_stream(StreamHandle stream);

// Makes `stream` current on `device` for the guard's lifetime.
// One device's ops must not run on two streams at once: the one-launch split reductions (column sums,
// layer norm's dw and db) share a per-device pool of finish counters (kernels/cuda/last_block.cuh).
// Switching streams between ops, with the work ordered between them, is fine. The one exception is
// StreamFork's side stream below, whose kernels count in a lane of counters of their own.
class StreamGuard {
 public:
  StreamGuard(StreamHandle stream, int device = 0);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  StreamHandle prev_;
  int device_;
};

// Side streams beside the current one: the kernels a compiled plan runs concurrently with its main
// stream (compile/passes/side_stream.h). Lane 1 takes a backward's weight gradients and sums; lane 2 a
// later micro-batch's first forward kernels, under the backward before it
// (compile/passes/overlap_micro_batches.h). begin_side(lane) makes this thread's stream of that lane on
// the device wait for everything enqueued on the current (main) stream so far, and makes it current;
// end_side() records how far the side stream has got (a mark) and makes the main stream current again;
// join(mark) makes the current stream wait for that mark. Inside a capture the waits become the graph's
// edges, so the replayed graph runs the side kernels on branches of their own. The side streams are one
// per lane, thread and device, like a capture's stream; kernels that count blocks in finish counters
// take the slots of their stream's lane (side_lane, kernels/cuda/last_block.cuh), so kernels of two
// lanes never share one; cuBLAS's GEMMs on the main stream and lane 1 have a workspace each, and lane 2's
// take their algorithm's bytes per call (kernels/cuda/cuda_common.cuh).
constexpr int kSideLanes = 2;  // lanes 1 and 2; lane 0 is the main stream
class StreamFork {
 public:
  explicit StreamFork(int device = 0);
  ~StreamFork();
  StreamFork(const StreamFork&) = delete;
  StreamFork& operator=(const StreamFork&) = delete;
  void begin_side(int lane = 1);
  int end_side();
  void join(int mark);
  void clear() { used_ = 0; }  // forgets the marks; their events are reused

 private:
  int device_;
  int lane_ = 0;                // begin_side()'s lane until end_side()
  void* main_ = nullptr;        // the stream begin_side() found current
  void* fork_event_ = nullptr;  // cudaEvent_t
  std::vector<void*> marks_;    // cudaEvent_t, reused across clear()
  size_t used_ = 0;
};
// The lane of `stream` on `device`: 1..kSideLanes for this thread's side streams (once StreamFork made
// them), 0 for any other stream.
int side_lane(StreamHandle stream, int device = 0);
// Whether `stream` is one of this thread's side streams on `device`.
inline bool is_side_stream(StreamHandle stream, int device = 0) { return side_lane(stream, device) != 0; }

struct MemoryStats {
  size_t allocated_bytes = 0;       // in live tensors now (rounded block sizes)
  size_t peak_allocated_bytes = 0;  // the most allocated since start or the last reset
  size_t reserved_bytes = 0;        // held from the device (live plus cached)
  uint64_t device_allocs = 0;       // cudaMalloc calls so far
  uint64_t device_frees = 0;        // cudaFree calls so far
  uint64_t requests = 0;            // allocations asked of the allocator so far
  uint64_t cache_hits = 0;          // of those, served from the cache
};
MemoryStats memory_stats(int device = 0);
void reset_peak_memory_stats(int device = 0);
// Returns every cached, unused block to the device (synchronises the device).
void empty_cache();
bool caching_enabled();

// A private memory pool for a captured CUDA graph: blocks allocated while a GraphPoolGuard for this
// pool is alive are only ever reused by allocations in the same pool, so memory the graph's
// replays write is never handed to other tensors. When the pool dies its free blocks return to the
// common cache (live blocks do so when they are freed).
class GraphPool {
 public:
  GraphPool();
  ~GraphPool();
  GraphPool(const GraphPool&) = delete;
  GraphPool& operator=(const GraphPool&) = delete;
  int id() const { return id_; }

 private:
  int id_;
};

class GraphPoolGuard {
 public:
  explicit GraphPoolGuard(const GraphPool& pool);
  ~GraphPoolGuard();
  GraphPoolGuard(const GraphPoolGuard&) = delete;
  GraphPoolGuard& operator=(const GraphPoolGuard&) = delete;

 private:
  int prev_;
};

// A CUDA graph captured from this thread's work on `device` and replayed on its current stream.
// Capture runs on a stream of the capturing thread's own (the thread's current stream is switched
// to it until capture_end()): the default stream is shared by every thread, and a kernel another
// thread enqueued on a stream being captured would become part of the graph, while its
// synchronisation would invalidate the capture. The thread-local capture mode leaves other
// threads' CUDA calls alone, and every allocation made meanwhile comes from the graph's own pool, so
// a replay never writes memory handed to other tensors. Work enqueued while capturing does not run:
// replay() after capture_end() to run it.
class Graph {
 public:
  explicit Graph(int device = 0);
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void capture_begin();
  void capture_end();  // ends the capture and instantiates the executable graph
  void replay();       // launches it on the current stream (asynchronous, like any kernel)
  size_t num_nodes() const { return num_nodes_; }

 private:
  int device_;
  GraphPool pool_;
  GraphPoolGuard* pool_guard_ = nullptr;
  void* stream_ = nullptr;         // the capture stream (this thread's own)
  void* origin_stream_ = nullptr;  // the thread's current stream before capture_begin()
  void* graph_ = nullptr;   // cudaGraph_t
  void* exec_ = nullptr;    // cudaGraphExec_t
  size_t num_nodes_ = 0;
};

// Device time between two points of the current stream, measured with CUDA events (no host clock,
// no synchronisation until elapsed_ms() is asked for).
class EventTimer {
 public:
  explicit EventTimer(int device = 0);
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start();        // records the start event on the current stream
  void stop();         // records the stop event on the current stream
  double elapsed_ms();  // waits for the stop event; milliseconds between the two

 private:
  int device_;
  void* start_ = nullptr;  // cudaEvent_t
  void* stop_ = nullptr;
};

// A sequence of time stamps on the current stream: mark() records one (no synchronisation);
// intervals_ms() waits for the last and returns the device time between consecutive marks. Events are
// pooled, so marking after every op of a training step is cheap enough for a profiler.
class EventLog {
 public:
  explicit EventLog(int device = 0);
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;
  void mark();
  size_t size() const { return used_; }
  std::vector<double> intervals_ms();  // size() - 1 entries
  void clear() { used_ = 0; }

 private:
  int device_;
  std::vector<void*> events_;  // cudaEvent_t, reused across clear()
  size_t used_ = 0;
};

// A host tensor in page-locked memory (cudaHostAlloc): host<->device copies from it are truly
// asynchronous, as data loaders want. Keep it alive until the copies that read it have finished.
Tensor pinned_empty(const Shape& shape, DType dtype = DType::f32);
bool is_pinned(const Tensor& t);

}  // namespace reel::cuda
