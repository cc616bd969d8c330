// The CUDA runtime side of reel (built only with the CUDA backend): device queries, per-device
// current streams, the caching allocator with its statistics and graph pools, pinned host memory.
//
// Caching allocator. Requests are rounded (512 B granules up to 1 MiB, 2 MiB granules above) and
// served from per-device free lists keyed by (pool, stream, size): a cached block of the same pool
// and stream and of exactly the rounded size. A larger one would hold bytes the request cannot use,
// which the statistics (they count whole blocks) and so the memory planner's predictions would have
// to guess at; a training loop asks for the same sizes step after step, so after the first step
// exact fits are the rule. Only when none is cached does it call cudaMalloc; on out-of-memory it returns the cache to the device and tries once more. A block freed
// on a stream is reused only on that stream, so stream order alone keeps reuse safe (no events). A
// block is never split, which keeps the code short at the price of some fragmentation.
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <cuda_profiler_api.h>

#include "tensor/cuda.h"
#include "tensor/cuda_check.h"

namespace reel::cuda {
namespace {

constexpr size_t kSmallLimit = size_t(1) << 20;   // up to here, 512 B granules
constexpr size_t kSmallGranule = 512;
constexpr size_t kLargeGranule = size_t(2) << 20;
constexpr int kMaxDevices = 16;

size_t round_size(size_t n) {
  size_t g = n <= kSmallLimit ? kSmallGranule : kLargeGranule;
  return (n + g - 1) / g * g;
}

// Sets the calling thread's device for a scope, restoring the previous one.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    REEL_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) REEL_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() { cudaSetDevice(prev_); }

 private:
  int prev_ = 0;
};

cudaStream_t default_stream(int device) {
  static std::mutex m;
  static cudaStream_t streams[kMaxDevices] = {};
  std::lock_guard<std::mutex> lock(m);
  if (!streams[device]) {
    DeviceScope scope(device);
    REEL_CUDA_CHECK(cudaStreamCreateWithFlags(&streams[device], cudaStreamNonBlocking));
  }
  return streams[device];
}

thread_local cudaStream_t current_streams[kMaxDevices] = {};

// The calling thread's capture stream on `device`, made on first use and kept for the thread's
// lifetime (a graph's pool blocks are keyed by it; it is never reused by another thread).
cudaStream_t capture_stream(int device) {
  thread_local cudaStream_t streams[kMaxDevices] = {};
  if (!streams[device]) {
    DeviceScope scope(device);
    REEL_CUDA_CHECK(cudaStreamCreateWithFlags(&streams[device], cudaStreamNonBlocking));
  }
  return streams[device];
}
thread_local int current_pool = 0;

struct Block {
  void* ptr;
  size_t size;
  int device;
  cudaStream_t stream;
  int pool;
};

using FreeKey = std::tuple<int, cudaStream_t, size_t>;  // (pool, stream, size)

class CachingAllocator : public Allocator {
 public:
  CachingAllocator() {
    const char* env = std::getenv("REEL_CUDA_NO_CACHE");
    caching_ = !(env && env[0] && env[0] != '0');
  }

  void* allocate(size_t nbytes, Device device) override {
    if (nbytes == 0) return nullptr;
    const int d = device.index;
    REEL_CHECK(d >= 0 && d < device_count(), "cuda allocator: device cuda:", d, " does not exist (",
               device_count(), " visible", device_count() == 0 ? ": " + unavailable_reason() : std::string(), ")");
    size_t size = round_size(nbytes);
    cudaStream_t stream = static_cast<cudaStream_t>(current_stream(d));
    std::lock_guard<std::mutex> lock(m_);
    DeviceState& st = state_[d];
    st.stats.requests++;
    Block* b = caching_ ? take_cached(st, current_pool, stream, size) : nullptr;
    if (b) st.stats.cache_hits++;
    else b = fresh_block(st, d, size, stream);
    live_[b->ptr] = b;
    st.stats.allocated_bytes += b->size;
    st.stats.peak_allocated_bytes = std::max(st.stats.peak_allocated_bytes, st.stats.allocated_bytes);
    return b->ptr;
  }

  void deallocate(void* ptr, size_t, Device) override {
    if (!ptr) return;
    std::lock_guard<std::mutex> lock(m_);
    auto it = live_.find(ptr);
    REEL_ASSERT(it != live_.end(), "cuda allocator: freeing an unknown pointer");
    Block* b = it->second;
    live_.erase(it);
    DeviceState& st = state_[b->device];
    st.stats.allocated_bytes -= b->size;
    if (!caching_) {
      release(st, b);
      return;
    }
    if (b->pool != 0 && !live_pools_.count(b->pool)) b->pool = 0;  // its graph pool is gone
    st.free.emplace(FreeKey{b->pool, b->stream, b->size}, b);
  }

  MemoryStats stats(int device) const {
    std::lock_guard<std::mutex> lock(m_);
    return state_[device].stats;
  }
  size_t block_size(size_t nbytes) const override { return nbytes == 0 ? 0 : round_size(nbytes); }
  size_t allocated_bytes(Device device) const override { return stats(device.index).allocated_bytes; }
  size_t peak_bytes(Device device) const override { return stats(device.index).peak_allocated_bytes; }
  void reset_peak(Device device) override { reset_peak(device.index); }
  void reset_peak(int device) {
    std::lock_guard<std::mutex> lock(m_);
    state_[device].stats.peak_allocated_bytes = state_[device].stats.allocated_bytes;
  }
  void empty_cache() {
    std::lock_guard<std::mutex> lock(m_);
    for (int d = 0; d < kMaxDevices; ++d) release_cached(state_[d]);
  }
  bool caching() const { return caching_; }

  int new_pool() {
    std::lock_guard<std::mutex> lock(m_);
    live_pools_.insert({next_pool_, true});
    return next_pool_++;
  }
  void end_pool(int pool) {
    std::lock_guard<std::mutex> lock(m_);
    live_pools_.erase(pool);
    for (auto& st : state_) {  // its cached blocks join the common cache
      std::vector<Block*> moved;
      for (auto it = st.free.begin(); it != st.free.end();) {
        if (std::get<0>(it->first) == pool) {
          moved.push_back(it->second);
          it = st.free.erase(it);
        } else {
          ++it;
        }
      }
      for (Block* b : moved) {
        b->pool = 0;
        st.free.emplace(FreeKey{0, b->stream, b->size}, b);
      }
    }
  }

 private:
  struct DeviceState {
    std::multimap<FreeKey, Block*> free;
    MemoryStats stats;
  };

  // The smallest cached block of this pool and stream that holds `size` without wasting more than
  // the request itself (small requests) or one large granule (large ones).
  Block* take_cached(DeviceState& st, int pool, cudaStream_t stream, size_t size) {
    auto it = st.free.find(FreeKey{pool, stream, size});
    if (it == st.free.end()) return nullptr;
    Block* b = it->second;
    st.free.erase(it);
    b->pool = pool;
    return b;
  }

  // cudaMalloc is refused while a stream of this thread is being captured in the global or
  // thread-local mode; memory is not a graph node, so the allocator switches the thread to the relaxed
  // mode around the call (the mechanism CUDA provides for libraries).
  static cudaError_t malloc_capture_safe(void** ptr, size_t size) {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudaError_t err = cudaMalloc(ptr, size);
    cudaThreadExchangeStreamCaptureMode(&mode);
    return err;
  }

  Block* fresh_block(DeviceState& st, int device, size_t size, cudaStream_t stream) {
    DeviceScope scope(device);
    void* ptr = nullptr;
    cudaError_t err = malloc_capture_safe(&ptr, size);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear it, give the cache back and try once more
      cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
      cudaStreamIsCapturing(stream, &capturing);
      if (capturing == cudaStreamCaptureStatusNone) {
        release_cached(st);
        err = malloc_capture_safe(&ptr, size);
      }
    }
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw Error(detail::cat("cuda allocator: out of memory on cuda:", device, " asking for ", size,
                              " bytes (allocated ", st.stats.allocated_bytes, ", reserved ", st.stats.reserved_bytes,
                              ", device free ", free_b, " of ", total_b, ")"));
    }
    REEL_CUDA_CHECK(err);
    st.stats.device_allocs++;
    st.stats.reserved_bytes += size;
    return new Block{ptr, size, device, stream, current_pool};
  }

  void release(DeviceState& st, Block* b) {
    DeviceScope scope(b->device);
    REEL_CUDA_CHECK(cudaFree(b->ptr));
    st.stats.device_frees++;
    st.stats.reserved_bytes -= b->size;
    delete b;
  }

  void release_cached(DeviceState& st) {
    for (auto& kv : st.free) release(st, kv.second);
    st.free.clear();
  }

  mutable std::mutex m_;
  bool caching_ = true;
  DeviceState state_[kMaxDevices];
  std::unordered_map<void*, Block*> live_;
  std::map<int, bool> live_pools_;
  int next_pool_ = 1;
};

CachingAllocator& caching_allocator() {
  static CachingAllocator* a = new CachingAllocator();  // never destroyed: tensors may outlive main()
  return *a;
}

class PinnedAllocator : public Allocator {
 public:
  void* allocate(size_t nbytes, Device) override {
    void* p = nullptr;
    REEL_CUDA_CHECK(cudaHostAlloc(&p, nbytes ? nbytes : 1, cudaHostAllocDefault));
    return p;
  }
  void deallocate(void* ptr, size_t, Device) override { cudaFreeHost(ptr); }
};

PinnedAllocator pinned_allocator;

}  // namespace

bool is_built() { return true; }

int device_count() {
  static int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      n = 0;
    }
    return n;
  }();
  return count;
}

bool is_available() { return device_count() > 0; }

std::string unavailable_reason() {
  if (is_available()) return "";
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  cudaGetLastError();
  return std::string("no CUDA device is visible (") + cudaGetErrorString(err) + ")";
}

void synchronize(int device) {
  DeviceScope scope(device);
  REEL_CUDA_CHECK(cudaDeviceSynchronize());
}

void profiler_start() { REEL_CUDA_CHECK(cudaProfilerStart()); }
void profiler_stop() { REEL_CUDA_CHECK(cudaProfilerStop()); }

StreamHandle current_stream(int device) {
  REEL_CHECK(device >= 0 && device < kMaxDevices, "cuda: device index ", device, " out of range");
  if (!current_streams[device]) current_streams[device] = default_stream(device);
  return current_streams[device];
}

void set_current_stream(StreamHandle stream, int device) {
  REEL_CHECK(device >= 0 && device < kMaxDevices, "cuda: device index ", device, " out of range");
  current_streams[device] = static_cast<cudaStream_t>(stream);
}

StreamHandle create_stream() {
  cudaStream_t s;
  REEL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void destroy_stream(StreamHandle stream) { cudaStreamDestroy(static_cast<cudaStream_t>(stream)); }

StreamGuard::StreamGuard(StreamHandle stream, int device) : prev_(current_stream(device)), device_(device) {
  set_current_stream(stream, device);
}
StreamGuard::~StreamGuard() { set_current_stream(prev_, device_); }

namespace {
// This thread's side streams per device and lane (StreamFork), made on first use and kept for the
// thread's lifetime, as capture_stream's: the caching allocator keys blocks by stream, so a workspace
// a side kernel frees is only ever reused by its own stream's later kernels, which run after it.
thread_local cudaStream_t side_streams[kMaxDevices][kSideLanes] = {};
// The calling thread's side stream of `lane` on `device` (the current device), made if this thread has
// none yet: a plan built on one thread may run on another.
cudaStream_t side_stream_of_thread(int device, int lane) {
  cudaStream_t& s = side_streams[device][lane - 1];
  if (!s) REEL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}
cudaEvent_t new_event() {
  cudaEvent_t e;
  REEL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}
}  // namespace

StreamFork::StreamFork(int device) : device_(device) {
  REEL_CHECK(device >= 0 && device < kMaxDevices, "cuda: device index ", device, " out of range");
  DeviceScope scope(device);
  for (int lane = 1; lane <= kSideLanes; ++lane) side_stream_of_thread(device, lane);  // outside any capture
  fork_event_ = new_event();
}
StreamFork::~StreamFork() {
  if (fork_event_) cudaEventDestroy(static_cast<cudaEvent_t>(fork_event_));
  for (void* e : marks_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}
void StreamFork::begin_side(int lane) {
  REEL_CHECK(main_ == nullptr, "cuda::StreamFork: begin_side twice without end_side");
  REEL_CHECK(lane >= 1 && lane <= kSideLanes, "cuda::StreamFork: no side lane ", lane, " (lanes 1..", kSideLanes,
             ")");
  DeviceScope scope(device_);
  main_ = current_stream(device_);
  cudaStream_t side = side_stream_of_thread(device_, lane);
  REEL_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(fork_event_), static_cast<cudaStream_t>(main_)));
  REEL_CUDA_CHECK(cudaStreamWaitEvent(side, static_cast<cudaEvent_t>(fork_event_), 0));
  set_current_stream(side, device_);
  lane_ = lane;
}
int StreamFork::end_side() {
  REEL_CHECK(main_ != nullptr, "cuda::StreamFork: end_side without begin_side");
  DeviceScope scope(device_);
  set_current_stream(main_, device_);
  main_ = nullptr;
  if (used_ == marks_.size()) marks_.push_back(new_event());
  REEL_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(marks_[used_]), side_streams[device_][lane_ - 1]));
  return int(used_++);
}
void StreamFork::join(int mark) {
  REEL_CHECK(mark >= 0 && size_t(mark) < used_, "cuda::StreamFork: no mark ", mark);
  DeviceScope scope(device_);
  REEL_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(current_stream(device_)),
                                      static_cast<cudaEvent_t>(marks_[size_t(mark)]), 0));
}
int side_lane(StreamHandle stream, int device) {
  if (device < 0 || device >= kMaxDevices || stream == nullptr) return 0;
  for (int lane = 1; lane <= kSideLanes; ++lane)
    if (stream == side_streams[device][lane - 1]) return lane;
  return 0;
}

MemoryStats memory_stats(int device) { return caching_allocator().stats(device); }
void reset_peak_memory_stats(int device) { caching_allocator().reset_peak(device); }
void empty_cache() { caching_allocator().empty_cache(); }
bool caching_enabled() { return caching_allocator().caching(); }

GraphPool::GraphPool() : id_(caching_allocator().new_pool()) {}
GraphPool::~GraphPool() { caching_allocator().end_pool(id_); }
GraphPoolGuard::GraphPoolGuard(const GraphPool& pool) : prev_(current_pool) { current_pool = pool.id(); }
GraphPoolGuard::~GraphPoolGuard() { current_pool = prev_; }

EventTimer::EventTimer(int device) : device_(device) {
  DeviceScope scope(device);
  cudaEvent_t a, b;
  REEL_CUDA_CHECK(cudaEventCreate(&a));
  REEL_CUDA_CHECK(cudaEventCreate(&b));
  start_ = a;
  stop_ = b;
}
EventTimer::~EventTimer() {
  cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}
void EventTimer::start() {
  REEL_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(start_), static_cast<cudaStream_t>(current_stream(device_))));
}
void EventTimer::stop() {
  REEL_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(stop_), static_cast<cudaStream_t>(current_stream(device_))));
}
double EventTimer::elapsed_ms() {
  REEL_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_)));
  float ms = 0;
  REEL_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), static_cast<cudaEvent_t>(stop_)));
  return ms;
}

Graph::Graph(int device) : device_(device) {}
Graph::~Graph() {
  delete pool_guard_;
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
}
void Graph::capture_begin() {
  REEL_CHECK(graph_ == nullptr && pool_guard_ == nullptr, "cuda::Graph: already captured");
  DeviceScope scope(device_);
  origin_stream_ = current_stream(device_);
  stream_ = capture_stream(device_);
  set_current_stream(stream_, device_);
  pool_guard_ = new GraphPoolGuard(pool_);
  const cudaError_t err = cudaStreamBeginCapture(static_cast<cudaStream_t>(stream_), cudaStreamCaptureModeThreadLocal);
  if (err != cudaSuccess) {
    delete pool_guard_;
    pool_guard_ = nullptr;
    set_current_stream(origin_stream_, device_);
    REEL_CUDA_CHECK(err);
  }
}
void Graph::capture_end() {
  REEL_CHECK(pool_guard_ != nullptr, "cuda::Graph: capture_end without capture_begin");
  DeviceScope scope(device_);
  cudaGraph_t g = nullptr;
  cudaError_t err = cudaStreamEndCapture(static_cast<cudaStream_t>(stream_), &g);
  delete pool_guard_;
  pool_guard_ = nullptr;
  set_current_stream(origin_stream_, device_);
  REEL_CUDA_CHECK(err);
  graph_ = g;
  REEL_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &num_nodes_));
  cudaGraphExec_t exec = nullptr;
  REEL_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
  exec_ = exec;
}
void Graph::replay() {
  REEL_CHECK(exec_ != nullptr, "cuda::Graph: replay before a capture");
  DeviceScope scope(device_);
  REEL_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), static_cast<cudaStream_t>(current_stream(device_))));
}

EventLog::EventLog(int device) : device_(device) {}
EventLog::~EventLog() {
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}
void EventLog::mark() {
  DeviceScope scope(device_);
  if (used_ == events_.size()) {
    cudaEvent_t e;
    REEL_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
  REEL_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(events_[used_++]),
                                  static_cast<cudaStream_t>(current_stream(device_))));
}
std::vector<double> EventLog::intervals_ms() {
  std::vector<double> out;
  if (used_ < 2) return out;
  REEL_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(events_[used_ - 1])));
  for (size_t i = 1; i < used_; ++i) {
    float ms = 0;
    REEL_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(events_[i - 1]),
                                         static_cast<cudaEvent_t>(events_[i])));
    out.push_back(ms);
  }
  return out;
}

Tensor pinned_empty(const Shape& shape, DType dtype) {
  size_t n = size_t(numel_of(shape)) * dtype_size(dtype);
  return Tensor::from_storage(std::make_shared<Storage>(n, Device::cpu(), pinned_allocator), shape, dtype);
}

bool is_pinned(const Tensor& t) { return t.defined() && t.storage()->allocator() == &pinned_allocator; }

// Installs the allocator; called by the CUDA backend's registration.
void install_allocator() { set_allocator(DeviceType::CUDA, &caching_allocator()); }

}  // namespace reel::cuda
