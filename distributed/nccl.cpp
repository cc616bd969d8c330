// NCCL for CUDA tensors, loaded with dlopen (see distributed/nccl.h).
//
// NCCL's C API is declared here rather than taken from nccl.h, so that a CUDA build needs no NCCL
// header and no link-time NCCL: the few functions used, the 128-byte unique id, and the enum values,
// which NCCL 2.x keeps stable (ncclInt8 0, ncclInt64 4, ncclFloat32 7, ncclFloat64 8; ncclSum 0,
// ncclMax 2, ncclMin 3; ncclSuccess 0, ncclInProgress 7).
//
// Agreement: every decision that changes which collectives a rank issues is all-reduced over the
// bootstrap communicator first (NCCL usable here? the id made? the communicator initialised?), so
// either every rank uses NCCL for the device or none does. Waiting: after enqueueing a collective on
// the current stream the host records an event and polls it (with ncclCommGetAsyncError) until done
// or the deadline — the same timeout as MPI's, at the price of a host wait per collective (once per
// optimizer step for the gradients). REEL_NCCL_ASYNC=1 skips the wait (no timeout, no host wait).
#include "distributed/nccl.h"

#include <dlfcn.h>
#include <glob.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "autograd/ops.h"
#include "tensor/cuda.h"
#include "tensor/error.h"

#ifdef REEL_CUDA
#include <cuda_runtime_api.h>
#endif

namespace reel::dist {
namespace {

// ---- the NCCL C API, as used here ----
using NcclComm = void*;
struct NcclUniqueId {
  char internal[128];
};
using NcclStream = void*;  // cudaStream_t
enum : int { kNcclSuccess = 0, kNcclInProgress = 7 };
enum : int { kNcclInt8 = 0, kNcclInt64 = 4, kNcclFloat32 = 7, kNcclFloat64 = 8 };
enum : int { kNcclSum = 0, kNcclMax = 2, kNcclMin = 3 };

struct NcclApi {
  std::string path;
  int version = 0;
  int (*get_version)(int*);
  int (*get_unique_id)(NcclUniqueId*);
  int (*comm_init_rank)(NcclComm*, int, NcclUniqueId, int);
  int (*comm_destroy)(NcclComm);
  int (*comm_abort)(NcclComm);
  int (*comm_get_async_error)(NcclComm, int*);
  const char* (*get_error_string)(int);
  int (*all_reduce)(const void*, void*, size_t, int, int, NcclComm, NcclStream);
  int (*broadcast)(const void*, void*, size_t, int, int, NcclComm, NcclStream);
  int (*all_gather)(const void*, void*, size_t, int, NcclComm, NcclStream);
};

std::vector<std::string> nccl_candidates() {
  std::vector<std::string> out;
  if (const char* v = std::getenv("REEL_NCCL_LIB"); v && *v) return {v};
  out.push_back("libnccl.so.2");
  if (const char* home = std::getenv("CUDA_HOME"); home && *home) out.push_back(std::string(home) + "/lib64/libnccl.so.2");
  out.push_back("/usr/local/cuda/lib64/libnccl.so.2");
  // PyTorch's wheel (nvidia-nccl-cu*) in the usual Python environments.
  for (const char* pattern : {"/usr/local/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so.2",
                              "/usr/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
                              "/opt/conda/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
                              "/usr/local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2"}) {
    glob_t g{};
    if (glob(pattern, 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) out.push_back(g.gl_pathv[i]);
    globfree(&g);
  }
  return out;
}

template <typename F>
bool bind(void* h, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(h, name));
  return fn != nullptr;
}

// The loaded API, or nullptr with `why` saying what was tried.
const NcclApi* load_nccl(std::string& why) {
  static std::mutex m;
  static std::unique_ptr<NcclApi> api;
  static std::string failure;
  std::lock_guard<std::mutex> lock(m);
  if (api) return api.get();
  if (!failure.empty()) {
    why = failure;
    return nullptr;
  }
  std::string tried;
  for (const std::string& path : nccl_candidates()) {
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = dlerror();
      tried += "\n  " + path + ": " + (e ? e : "not found");
      continue;
    }
    auto a = std::make_unique<NcclApi>();
    a->path = path;
    bool ok = bind(h, "ncclGetVersion", a->get_version) && bind(h, "ncclGetUniqueId", a->get_unique_id) &&
              bind(h, "ncclCommInitRank", a->comm_init_rank) && bind(h, "ncclCommDestroy", a->comm_destroy) &&
              bind(h, "ncclCommAbort", a->comm_abort) && bind(h, "ncclCommGetAsyncError", a->comm_get_async_error) &&
              bind(h, "ncclGetErrorString", a->get_error_string) && bind(h, "ncclAllReduce", a->all_reduce) &&
              bind(h, "ncclBroadcast", a->broadcast) && bind(h, "ncclAllGather", a->all_gather);
    if (!ok || a->get_version(&a->version) != kNcclSuccess) {
      tried += "\n  " + path + ": not a usable NCCL 2 library";
      continue;
    }
    api = std::move(a);
    return api.get();
  }
  failure = "libnccl.so.2 was not found (set REEL_NCCL_LIB to its path). Tried:" + tried;
  why = failure;
  return nullptr;
}

std::string version_string(int v) {
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch; older ones major*1000 + minor*100 + patch.
  int major = v >= 10000 ? v / 10000 : v / 1000, minor = v >= 10000 ? (v / 100) % 100 : (v / 100) % 10;
  return detail::cat("NCCL ", major, ".", minor, ".", v % 100);
}

[[maybe_unused]] bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::string(v) == value;
}

// Whether every rank of `comm` passes `ok` (a min all-reduce of a flag on the host).
[[maybe_unused]] bool all_agree(Communicator& comm, bool ok) {
  Tensor flag = full({1}, ok ? 1.0 : 0.0, TensorOptions().with_dtype(DType::f64));
  comm.all_reduce(flag, ReduceOp::min);
  return flag.item() == 1.0;
}

#ifdef REEL_CUDA

class DeviceScope {  // makes `index` the current CUDA device for its lifetime
 public:
  explicit DeviceScope(int index) {
    cudaGetDevice(&previous_);
    cudaSetDevice(index);
  }
  ~DeviceScope() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

class NcclCollectives : public DeviceCollectives {
 public:
  NcclCollectives(const NcclApi& api, NcclComm comm, Device device, int rank, double timeout_s)
      : api_(api), comm_(comm), device_(device), rank_(rank), timeout_s_(timeout_s) {}
  ~NcclCollectives() override {
    if (comm_) api_.comm_destroy(comm_);
  }
  Device device() const override { return device_; }
  std::string describe() const override { return version_string(api_.version); }

  void all_reduce(const Tensor& t, ReduceOp op) override {
    int red = op == ReduceOp::max ? kNcclMax : op == ReduceOp::min ? kNcclMin : kNcclSum;
    run("all_reduce (ncclAllReduce)", [&](NcclStream s) {
      return api_.all_reduce(t.data_ptr(), t.data_ptr(), size_t(t.numel()), nccl_type(t), red, comm_, s);
    });
  }
  void broadcast(const Tensor& t, int root) override {
    run("broadcast (ncclBroadcast)", [&](NcclStream s) {
      return api_.broadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), kNcclInt8, root, comm_, s);
    });
  }
  void all_gather(const Tensor& in, const Tensor& out) override {
    run("all_gather (ncclAllGather)", [&](NcclStream s) {
      return api_.all_gather(in.data_ptr(), out.data_ptr(), in.nbytes(), kNcclInt8, comm_, s);
    });
  }

 private:
  static int nccl_type(const Tensor& t) {
    switch (t.dtype()) {
      case DType::f32: return kNcclFloat32;
      case DType::f64: return kNcclFloat64;
      case DType::i64: return kNcclInt64;
      default: break;
    }
    throw InternalError(detail::cat("nccl: no reduction type for ", dtype_name(t.dtype())));
  }

  template <typename Enqueue>
  void run(const char* what, Enqueue enqueue) {
    REEL_CHECK(!broken_, what, " on rank ", rank_, ": NCCL's communicator was aborted after an earlier timeout");
    DeviceScope scope(device_.index);
    NcclStream stream = cuda::current_stream(device_.index);
    int rc = enqueue(stream);
    REEL_CHECK(rc == kNcclSuccess, what, " failed on rank ", rank_, ": ", api_.get_error_string(rc));
    if (env_is("REEL_NCCL_ASYNC", "1")) return;
    // Being captured into a CUDA graph (a compiled step): the collective is a node of the graph, run
    // at each replay; nothing to wait for now, and an event query would break the capture.
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capturing) == cudaSuccess &&
        capturing != cudaStreamCaptureStatusNone)
      return;
    wait(what, stream);
  }

  // Polls an event recorded after the collective, and NCCL's asynchronous error, until the deadline.
  void wait(const char* what, NcclStream stream) {
    cudaEvent_t ev;
    REEL_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess, what, ": cudaEventCreate failed");
    cudaEventRecord(ev, static_cast<cudaStream_t>(stream));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
    for (int polls = 0;; ++polls) {
      cudaError_t q = cudaEventQuery(ev);
      if (q == cudaSuccess) break;
      int async = kNcclSuccess;
      api_.comm_get_async_error(comm_, &async);
      const bool failed = q != cudaErrorNotReady || (async != kNcclSuccess && async != kNcclInProgress);
      const bool late = std::chrono::steady_clock::now() > deadline;
      if (failed || late) {
        cudaEventDestroy(ev);
        api_.comm_abort(comm_);
        comm_ = nullptr;
        broken_ = true;
        if (late) throw Error(detail::cat(what, " timed out on rank ", rank_, " after ", timeout_s_,
                                          " s: a peer did not join (it died, hangs, or ran other collectives)"));
        throw Error(detail::cat(what, " failed on rank ", rank_, ": ",
                                q != cudaErrorNotReady ? cudaGetErrorString(q) : api_.get_error_string(async)));
      }
      if (polls > 100) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    cudaEventDestroy(ev);
  }

  const NcclApi& api_;
  NcclComm comm_;
  Device device_;
  int rank_;
  double timeout_s_;
  bool broken_ = false;
};

#endif  // REEL_CUDA

}  // namespace

std::string nccl_library(std::string* why_not) {
  std::string why;
  const NcclApi* api = load_nccl(why);
  if (why_not) *why_not = why;
  return api ? version_string(api->version) + " (" + api->path + ")" : std::string();
}

std::unique_ptr<DeviceCollectives> make_nccl_collectives(Communicator& bootstrap, Device device) {
#ifndef REEL_CUDA
  return nullptr;
#else
  std::string why;
  const NcclApi* api = nullptr;
  if (env_is("REEL_DIST_NCCL", "0")) why = "REEL_DIST_NCCL=0";
  else api = load_nccl(why);
  auto fallback = [&](const std::string& reason) -> std::unique_ptr<DeviceCollectives> {
    if (!reason.empty()) std::fprintf(stderr, "dist: rank %d: NCCL not used, CUDA tensors go through host memory: %s\n",
                                      bootstrap.rank(), reason.c_str());
    return nullptr;
  };
  if (!all_agree(bootstrap, api != nullptr)) return fallback(api ? std::string() : why);
  // Rank 0 makes the id; it travels with a status word (16 x 8 bytes + 1 word).
  std::vector<int64_t> words(17, 0);
  if (bootstrap.rank() == 0) {
    NcclUniqueId id;
    int rc = api->get_unique_id(&id);
    words[16] = rc;
    std::memcpy(words.data(), id.internal, sizeof id.internal);
  }
  Tensor packed = tensor_i64(words, {17});
  bootstrap.broadcast(packed, 0);
  words = packed.to_vector<int64_t>();
  if (words[16] != kNcclSuccess) return fallback(detail::cat("ncclGetUniqueId failed on rank 0 (code ", words[16], ")"));
  NcclUniqueId id;
  std::memcpy(id.internal, words.data(), sizeof id.internal);
  NcclComm comm = nullptr;
  int rc;
  {
    DeviceScope scope(device.index);
    rc = api->comm_init_rank(&comm, bootstrap.world_size(), id, bootstrap.rank());
  }
  if (!all_agree(bootstrap, rc == kNcclSuccess)) {
    if (rc == kNcclSuccess) api->comm_destroy(comm);
    return fallback(rc == kNcclSuccess ? std::string() : std::string("ncclCommInitRank: ") + api->get_error_string(rc));
  }
  return std::make_unique<NcclCollectives>(*api, comm, device, bootstrap.rank(), bootstrap.timeout_seconds());
#endif
}

}  // namespace reel::dist
