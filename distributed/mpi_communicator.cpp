// The MPI backend: finding and loading libmpi and the plugin, and the Communicator over it
// (see distributed/mpi_communicator.h).
#include "distributed/mpi_communicator.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "distributed/nccl.h"
#include "tensor/error.h"

namespace reel::dist {
namespace {

constexpr int kErrLen = 1024;

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string dirname_of(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

std::string realpath_or_empty(const std::string& path) {
  char buf[PATH_MAX];
  return ::realpath(path.c_str(), buf) ? std::string(buf) : std::string();
}

// Where libmpi.so.40 may be, most explicit first (see the top of mpi_communicator.h).
std::vector<std::string> libmpi_candidates() {
  std::vector<std::string> out;
  if (std::string v = env_or_empty("REEL_MPI_LIB"); !v.empty()) out.push_back(v);
  out.push_back("libmpi.so.40");
  if (std::string v = env_or_empty("OPAL_PREFIX"); !v.empty()) {
    out.push_back(v + "/lib/libmpi.so.40");
    out.push_back(v + "/lib64/libmpi.so.40");
  }
  std::string path = env_or_empty("PATH");
  for (size_t start = 0; start <= path.size();) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    start = end + 1;
    if (dir.empty() || ::access((dir + "/mpirun").c_str(), X_OK) != 0) continue;
    for (const std::string& bin : {dir, dirname_of(realpath_or_empty(dir + "/mpirun"))}) {
      if (bin.empty() || bin == ".") continue;
      out.push_back(bin + "/../lib/libmpi.so.40");
      out.push_back(bin + "/../lib64/libmpi.so.40");
    }
  }
  return out;
}

std::vector<std::string> plugin_candidates() {
  std::vector<std::string> out;
  if (std::string v = env_or_empty("REEL_MPI_PLUGIN"); !v.empty()) return {v};
  if (std::string exe = realpath_or_empty("/proc/self/exe"); !exe.empty()) out.push_back(dirname_of(exe) + "/libreel_mpi.so");
  out.push_back("libreel_mpi.so");
  return out;
}

const char* last_dlerror() {
  const char* e = dlerror();
  return e ? e : "unknown reason";
}

// Loads libmpi globally, or returns the list of what was tried and why each failed.
bool load_libmpi(std::string& tried) {
  for (const std::string& c : libmpi_candidates()) {
    if (dlopen(c.c_str(), RTLD_NOW | RTLD_GLOBAL)) return true;
    tried += "\n  " + c + ": " + last_dlerror();
  }
  return false;
}

const reel_mpi_plugin* g_plugin = nullptr;
std::mutex g_plugin_mutex;

void finalize_at_exit() {
  if (g_plugin) g_plugin->finalize();
}

}  // namespace

const reel_mpi_plugin& open_mpi_plugin(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  REEL_CHECK(handle != nullptr, "dist: cannot load the MPI plugin ", path, ": ", last_dlerror());
  auto entry = reinterpret_cast<reel_mpi_plugin_entry>(dlsym(handle, REEL_MPI_PLUGIN_SYMBOL));
  REEL_CHECK(entry != nullptr, "dist: ", path, " is not reel's MPI plugin of this version (no symbol ",
             REEL_MPI_PLUGIN_SYMBOL, "); rebuild it with make");
  const reel_mpi_plugin* table = entry();
  REEL_CHECK(table && table->abi_version == REEL_MPI_PLUGIN_ABI_VERSION, "dist: the MPI plugin ", path,
             " has interface version ", table ? table->abi_version : -1, ", this binary expects ",
             REEL_MPI_PLUGIN_ABI_VERSION, "; rebuild it with make");
  return *table;
}

const reel_mpi_plugin& mpi_plugin() {
  std::lock_guard<std::mutex> lock(g_plugin_mutex);
  if (g_plugin) return *g_plugin;
  std::string libmpi_tried;
  const bool have_libmpi = load_libmpi(libmpi_tried);
  std::string tried;
  const reel_mpi_plugin* table = nullptr;
  for (const std::string& c : plugin_candidates()) {
    try {
      table = &open_mpi_plugin(c);
      break;
    } catch (const Error& e) {
      tried += std::string("\n  ") + e.what();
    }
  }
  if (!table) {
    if (!have_libmpi)
      throw Error("dist: cannot start MPI: Open MPI's libmpi.so.40 was not found. Tried:" + libmpi_tried +
                  "\nSet REEL_MPI_LIB to its path, or put Open MPI's lib folder on LD_LIBRARY_PATH.");
    throw Error("dist: cannot start MPI: reel's MPI plugin could not be loaded (build it with make; it is "
                "build/libreel_mpi.so, expected beside the executable, or set REEL_MPI_PLUGIN). Tried:" + tried);
  }
  char err[kErrLen] = "";
  REEL_CHECK(table->init(err, kErrLen) == REEL_MPI_OK, "dist: cannot start MPI: ", err);
  g_plugin = table;
  std::atexit(finalize_at_exit);
  return *g_plugin;
}

void mpi_abort_job(int code) {
  if (g_plugin) g_plugin->abort_world(code);
}

namespace {

int mpi_dtype(DType t) {
  switch (t) {
    case DType::f32: return REEL_MPI_F32;
    case DType::f64: return REEL_MPI_F64;
    case DType::i64: return REEL_MPI_I64;
    default: break;
  }
  throw InternalError(detail::cat("dist: no MPI type for ", dtype_name(t)));
}

int mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::max: return REEL_MPI_MAX;
    case ReduceOp::min: return REEL_MPI_MIN;
    default: return REEL_MPI_SUM;
  }
}

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(const reel_mpi_plugin& p, reel_mpi_comm comm, bool owned)
      : p_(p), comm_(comm), owned_(owned), rank_(p.rank(comm)), size_(p.size(comm)) {}
  ~MpiCommunicator() override {
    // The world communicator dies during static destruction, when the CUDA runtime may already be
    // gone: its NCCL communicator is left to the process's exit rather than destroyed then.
    if (owned_) p_.free(comm_);
    else (void)nccl_.release();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  std::string describe() const override {
    std::string s = detail::cat("mpi, ", size_, " ranks (", p_.library_version(), ")");
    if (nccl_) s += ", CUDA tensors via " + nccl_->describe();
    return s;
  }
  std::unique_ptr<Communicator> dup() override {
    reel_mpi_comm c = nullptr;
    char err[kErrLen] = "";
    check(p_.dup(comm_, &c, err, kErrLen), err);
    auto out = std::make_unique<MpiCommunicator>(p_, c, true);
    out->set_timeout_seconds(timeout_seconds());
    return out;
  }

 protected:
  void do_all_reduce(const Tensor& t, ReduceOp op) override {
    if (t.device().is_cuda()) {
      if (DeviceCollectives* d = device_collectives(t.device())) return d->all_reduce(t, op);
      return through_host(t, [&](const Tensor& host) { do_all_reduce(host, op); });
    }
    char err[kErrLen] = "";
    check(p_.all_reduce(comm_, t.data_ptr(), t.numel(), mpi_dtype(t.dtype()), mpi_op(op), timeout_seconds(), err,
                        kErrLen),
          err);
  }
  void do_broadcast(const Tensor& t, int root) override {
    if (t.device().is_cuda()) {
      if (DeviceCollectives* d = device_collectives(t.device())) return d->broadcast(t, root);
      return through_host(t, [&](const Tensor& host) { do_broadcast(host, root); });
    }
    char err[kErrLen] = "";
    check(p_.broadcast(comm_, t.data_ptr(), int64_t(t.nbytes()), root, timeout_seconds(), err, kErrLen), err);
  }
  void do_all_gather(const Tensor& in, const Tensor& out) override {
    if (in.device().is_cuda()) {
      if (DeviceCollectives* d = device_collectives(in.device())) return d->all_gather(in, out);
      return through_host(out, [&](const Tensor& host) { do_all_gather(in.to(Device::cpu()), host); }, false);
    }
    char err[kErrLen] = "";
    check(p_.all_gather(comm_, in.data_ptr(), out.data_ptr(), int64_t(in.nbytes()), timeout_seconds(), err, kErrLen),
          err);
  }
  void do_barrier() override {
    char err[kErrLen] = "";
    check(p_.barrier(comm_, timeout_seconds(), err, kErrLen), err);
  }

 private:
  // A collective on CUDA tensors without device collectives, staged through host memory: `run` gets
  // a host tensor like `result` (holding its values when `in_place`: reduced or broadcast there; else
  // uninitialised, gathered into) and what it leaves there is copied back.
  template <typename Run>
  static void through_host(const Tensor& result, Run run, bool in_place = true) {
    Tensor host = in_place ? result.to(Device::cpu()) : Tensor::empty(result.shape(), result.dtype());
    run(host);
    copy_(result, host);
  }

  void check(int rc, const char* err) {
    if (rc == REEL_MPI_OK) return;
    if (rc == REEL_MPI_TIMEOUT) mark_broken(err);
    throw Error(detail::cat("dist: ", err));
  }

  // NCCL for `device`, created on the first collective on it (every rank reaches that collective at
  // the same point, which is what ncclCommInitRank needs); nullptr means host staging.
  DeviceCollectives* device_collectives(Device device) {
    if (nccl_tried_) return nccl_ && nccl_->device() == device ? nccl_.get() : nullptr;
    nccl_tried_ = true;
    nccl_ = make_nccl_collectives(*this, device);
    return nccl_.get();
  }

  const reel_mpi_plugin& p_;
  reel_mpi_comm comm_;
  bool owned_;
  int rank_, size_;
  bool nccl_tried_ = false;
  std::unique_ptr<DeviceCollectives> nccl_;
};

}  // namespace

std::shared_ptr<Communicator> make_mpi_communicator() {
  const reel_mpi_plugin& p = mpi_plugin();
  return std::make_shared<MpiCommunicator>(p, p.world(), false);
}

}  // namespace reel::dist
