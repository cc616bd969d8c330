// Communicator: the checks and conversions every backend shares, the single-process backend, and the
// process's default communicator (see distributed/communicator.h).
#include "distributed/communicator.h"

#include <cstdlib>
#include <mutex>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "distributed/mpi_communicator.h"
#include "kernels/dispatch.h"
#include "tensor/error.h"

namespace reel::dist {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::mean: return "mean";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

namespace {

double default_timeout() {
  const char* env = std::getenv("REEL_DIST_TIMEOUT");
  if (!env || !*env) return 600.0;
  char* end = nullptr;
  double s = std::strtod(env, &end);
  REEL_CHECK(end && *end == '\0' && s > 0, "REEL_DIST_TIMEOUT must be a positive number of seconds, got \"", env,
             "\"");
  return s;
}

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v && *v;
}

std::string describe_tensor(const Tensor& t) {
  return detail::cat(shape_str(t.shape()), " ", dtype_name(t.dtype()), " on ", t.device().str());
}

}  // namespace

// ---- the registry behind the AllReduce op: id -> communicator, and the op's kernels ----

namespace {
std::mutex g_registry_mutex;
std::vector<Communicator*> g_registry;  // by id; null once destroyed

Communicator& registered(int64_t id) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  REEL_CHECK(id >= 0 && id < int64_t(g_registry.size()) && g_registry[size_t(id)] != nullptr,
             "all_reduce: communicator ", id, " does not exist (a plan replayed after its communicator died?)");
  return *g_registry[size_t(id)];
}

// What the AllReduce and AllGather ops take (kernels/schema/optim.cpp).
bool op_takes(const Tensor& t) {
  return t.defined() && t.is_contiguous() &&
         (t.dtype() == DType::f32 || t.dtype() == DType::f64 || t.dtype() == DType::i64);
}

ReduceOp op_of(int64_t code) { return code == 1 ? ReduceOp::max : code == 2 ? ReduceOp::min : ReduceOp::sum; }
int64_t code_of(ReduceOp op) { return op == ReduceOp::max ? 1 : op == ReduceOp::min ? 2 : 0; }

}  // namespace

// The kernels of kernels/ops.def's AllReduce, AllGather and Broadcast, on the CPU (MPI) and on CUDA
// (NCCL, enqueued on the current stream: capturable), registered with the first communicator. Each
// counts its collective, as the host-side calls do.
struct CollectiveKernels {
  static void begin(Communicator& comm, const char* op) {
    REEL_CHECK(comm.broken_.empty(), op, " on rank ", comm.rank(), ": this communicator is unusable since an "
               "earlier collective failed (", comm.broken_, ")");
    ++comm.collectives_;
  }
  static void all_reduce(const KernelCall& c) {
    Communicator& comm = registered(c.attrs.i("comm"));
    begin(comm, "all_reduce");
    if (comm.world_size() > 1) comm.do_all_reduce(c.out[0], op_of(c.attrs.i("op")));
  }
  static void all_gather(const KernelCall& c) {
    Communicator& comm = registered(c.attrs.i("comm"));
    REEL_CHECK(c.attrs.i("world") == comm.world_size(), "all_gather: traced for ", c.attrs.i("world"),
               " ranks, run with ", comm.world_size());
    begin(comm, "all_gather");
    comm.do_all_gather(c.in[0], c.out[0]);
  }
  static void broadcast(const KernelCall& c) {
    Communicator& comm = registered(c.attrs.i("comm"));
    begin(comm, "broadcast");
    if (comm.world_size() > 1) comm.do_broadcast(c.out[0], int(c.attrs.i("root")));
  }
};

namespace {
void register_collective_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (DeviceType d : {DeviceType::CPU, DeviceType::CUDA}) {
      register_kernel(d, OpKind::AllReduce, CollectiveKernels::all_reduce);
      register_kernel(d, OpKind::AllGather, CollectiveKernels::all_gather);
      register_kernel(d, OpKind::Broadcast, CollectiveKernels::broadcast);
    }
  });
}
}  // namespace

Communicator::Communicator() : timeout_s_(default_timeout()) {
  register_collective_kernels();
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  id_ = int64_t(g_registry.size());
  g_registry.push_back(this);
}

Communicator::~Communicator() {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  g_registry[size_t(id_)] = nullptr;
}

void Communicator::all_reduce_op(const Tensor& t, ReduceOp op) {
  REEL_CHECK(op != ReduceOp::mean, "all_reduce_op: mean is sum then a division; dispatch the division");
  if (!op_takes(t)) return all_reduce(t, op);
  dispatch_out(OpKind::AllReduce, {t}, {t}, Attrs().set("comm", id_).set("op", code_of(op)));
}

Tensor Communicator::all_gather_op(const Tensor& t) {
  if (!op_takes(t)) return all_gather(t);
  return dispatch(OpKind::AllGather, {t}, Attrs().set("comm", id_).set("world", int64_t(world_size())))[0];
}

void Communicator::broadcast_op(const Tensor& t, int root) {
  if (!t.defined() || !t.is_contiguous()) return broadcast(t, root);
  REEL_CHECK(root >= 0 && root < world_size(), "broadcast: root ", root, " is not a rank of a world of size ",
             world_size());
  dispatch_out(OpKind::Broadcast, {t}, {t}, Attrs().set("comm", id_).set("root", int64_t(root)));
}

void Communicator::set_timeout_seconds(double seconds) {
  REEL_CHECK(seconds > 0, "Communicator::set_timeout_seconds: the timeout must be positive, got ", seconds);
  timeout_s_ = seconds;
}

bool Communicator::begin(const char* op, const Tensor* t) {
  REEL_CHECK(broken_.empty(), op, " on rank ", rank(), ": this communicator is unusable since an earlier collective failed (",
             broken_, ")");
  if (t) REEL_CHECK(t->defined(), op, ": the tensor is undefined");
  // Planning a step in meta mode: there are no values to send, and no peer is planning with us.
  if (meta_mode() || (t && t->storage()->is_meta())) return false;
  REEL_CHECK(world_size() == 1 || dispatch_observer() == nullptr, op, " on rank ", rank(), " of ", world_size(),
             ": a collective cannot be recorded by the compiler (it is not an op, so a replayed plan would skip it "
             "and the ranks would drift apart); run data-parallel steps eagerly (without --compile)");
  ++collectives_;
  return true;
}

void Communicator::all_reduce(const Tensor& t, ReduceOp op) {
  if (!begin("all_reduce", &t)) return;
  REEL_CHECK(op != ReduceOp::mean || is_floating(t.dtype()), "all_reduce: mean of an i64 tensor ",
             describe_tensor(t), " is not an integer; use sum");
  NoGradGuard no_grad;
  // f16/bf16: MPI and the host path have no 16-bit float; reduce in f32 and round once at the end.
  const bool half = t.dtype() == DType::f16 || t.dtype() == DType::bf16;
  Tensor work = half ? to_dtype(t, DType::f32) : contiguous(t.detach());
  do_all_reduce(work, op == ReduceOp::mean ? ReduceOp::sum : op);
  if (op == ReduceOp::mean && world_size() > 1) mul_(work, 1.0 / double(world_size()));
  if (!work.shares_storage(t) || half) copy_(t, work);
}

void Communicator::broadcast(const Tensor& t, int root) {
  if (!begin("broadcast", &t)) return;
  REEL_CHECK(root >= 0 && root < world_size(), "broadcast: root ", root, " is not a rank of a world of size ",
             world_size());
  NoGradGuard no_grad;
  Tensor work = contiguous(t.detach());
  do_broadcast(work, root);
  if (!work.shares_storage(t)) copy_(t, work);
}

Tensor Communicator::all_gather(const Tensor& t) {
  Shape shape{int64_t(world_size())};
  if (t.defined()) shape.insert(shape.end(), t.shape().begin(), t.shape().end());
  if (!begin("all_gather", &t)) return zeros(shape, TensorOptions().with_dtype(t.dtype()).with_device(t.device()));
  NoGradGuard no_grad;
  Tensor in = contiguous(t.detach());
  Tensor out = Tensor::empty(shape, t.dtype(), t.device());
  do_all_gather(in, out);
  return out;
}

void Communicator::barrier() {
  if (!begin("barrier", nullptr)) return;
  do_barrier();
}

void SingleProcessCommunicator::do_all_gather(const Tensor& in, const Tensor& out) {
  copy_(out, in.reshape(out.shape()));
}

// ---- the default communicator ----
namespace {

std::mutex g_mutex;
std::shared_ptr<Communicator> g_world;
Backend g_backend = Backend::automatic;

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::automatic: return "automatic";
    case Backend::single: return "single";
    case Backend::mpi: return "mpi";
  }
  return "?";
}

Backend resolve(Backend b) {
  if (b != Backend::automatic) return b;
  if (const char* env = std::getenv("REEL_DIST_BACKEND"); env && *env) {
    std::string v = env;
    REEL_CHECK(v == "single" || v == "mpi", "REEL_DIST_BACKEND must be single or mpi, got \"", v, "\"");
    return v == "mpi" ? Backend::mpi : Backend::single;
  }
  return launched_by_mpirun() ? Backend::mpi : Backend::single;
}

}  // namespace

Communicator& init(Backend backend) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const Backend want = resolve(backend);
  if (g_world) {
    REEL_CHECK(backend == Backend::automatic || want == g_backend, "dist::init(", backend_name(backend),
               "): the process's communicator already exists with backend ", backend_name(g_backend));
    return *g_world;
  }
  if (want == Backend::mpi) g_world = make_mpi_communicator();
  else g_world = std::make_shared<SingleProcessCommunicator>();
  g_backend = want;
  return *g_world;
}

Communicator& world() { return *world_ptr(); }

std::shared_ptr<Communicator> world_ptr() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_world) return g_world;
  }
  init(Backend::automatic);
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_world;
}

int rank() { return world().rank(); }
int world_size() { return world().world_size(); }

bool launched_by_mpirun() { return env_set("OMPI_COMM_WORLD_SIZE") || env_set("PMIX_RANK"); }

int local_rank() {
  const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  return v && *v ? std::atoi(v) : 0;
}

void abort_job(int code) {
  std::shared_ptr<Communicator> w;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    w = g_world;
  }
  if (w && g_backend == Backend::mpi && w->world_size() > 1) mpi_abort_job(code);
}

}  // namespace reel::dist
