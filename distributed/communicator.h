// Communicator — collectives across the processes of a data-parallel job (torch.distributed's
// process group), behind one interface whatever carries the bytes.
//
//   all_reduce(t, op)   in place on every rank: t <- op over ranks r of t_r
//                       (sum, mean = sum / world_size, max, min; elementwise)
//   broadcast(t, root)  in place: t <- t_root
//   all_gather(t)       a new (world_size, *t.shape) tensor whose row r is t_r
//   barrier()           returns once every rank has entered it
// Every rank must issue the same collectives, in the same order, on tensors of the same shape and
// dtype (MPI's rule; breaking it hangs or corrupts, which is why reel checks parameter shapes with a
// fixed-size all_gather before anything else: parallel/data_parallel.h).
//
// Backends:
//   single   world size 1: every collective is the identity (all_gather adds the leading dim of 1);
//            always available, and what a process started without mpirun gets.
//   mpi      Open MPI through the plugin build/libreel_mpi.so (distributed/mpi_communicator.h), loaded only
//            when needed, so that reel's binaries never depend on libmpi. CPU tensors go to MPI
//            directly; CUDA tensors through NCCL when it is available (distributed/nccl.h), else they are
//            staged through host memory.
// The default communicator of the process, world(), is created on first use: mpi when the process
// was launched by mpirun (OMPI_COMM_WORLD_SIZE or PMIX_RANK in the environment), else single.
// init(Backend) chooses explicitly; REEL_DIST_BACKEND=single|mpi overrides the environment check.
//
// Conventions the base class enforces for every backend:
//   - Tensors may be on any device and need not be contiguous (a contiguous copy goes and comes
//     back); f16/bf16 reductions run in f32 (MPI has no 16-bit float types). i64 takes sum/max/min.
//   - Timeouts: each collective fails with reel::Error naming the op, the rank and the timeout when a
//     peer does not join within timeout_seconds() (default 600 s; REEL_DIST_TIMEOUT=SECONDS). After a
//     timeout the communicator is unusable (its collectives no longer line up across ranks) and says so.
//   - Meta mode (kernels/dispatch.h): collectives do nothing, so a step can be planned without peers.
//   - Under the compiler's tracer a collective of world size > 1 is an error: it is not an op, so a
//     replayed plan would skip it silently. Data-parallel steps run eagerly.
//   - collective_count() counts collectives issued (tests check "one all-reduce per optimizer step").
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "tensor/tensor.h"

namespace reel::dist {

enum class ReduceOp { sum, mean, max, min };
enum class Backend { automatic, single, mpi };

const char* reduce_op_name(ReduceOp op);

class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // "single", "mpi (Open MPI v4.1.4)", ...; for messages and print_setup.
  virtual std::string describe() const = 0;
  // A new communicator over the same ranks whose collectives never mix with this one's (MPI_Comm_dup).
  // Collective: every rank must call it.
  virtual std::unique_ptr<Communicator> dup() = 0;

  void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum);
  // The same as an op through the dispatch door (kernels/ops.def AllReduce, attrs comm = id()): a
  // traced step records it and a replayed plan runs it (a CUDA graph captures NCCL's kernel). op:
  // sum, max or min. A tensor the op does not take (not contiguous, or not f32, f64 or i64) goes
  // through all_reduce() instead, which a tracer refuses.
  void all_reduce_op(const Tensor& t, ReduceOp op = ReduceOp::sum);
  // all_gather and broadcast as ops likewise (AllGather, Broadcast), with the same fallback for the
  // gather; the broadcast takes any contiguous tensor (in place).
  Tensor all_gather_op(const Tensor& t);
  void broadcast_op(const Tensor& t, int root = 0);
  void broadcast(const Tensor& t, int root = 0);
  Tensor all_gather(const Tensor& t);
  void barrier();

  uint64_t collective_count() const { return collectives_; }
  // This communicator's id in the process's registry (the AllReduce op's "comm" attr).
  int64_t id() const { return id_; }
  double timeout_seconds() const { return timeout_s_; }
  void set_timeout_seconds(double seconds);

 protected:
  Communicator();
  // The backend's work, on contiguous tensors of a dtype it supports (the base class converts).
  virtual void do_all_reduce(const Tensor& t, ReduceOp op) = 0;  // op is sum, max or min
  virtual void do_broadcast(const Tensor& t, int root) = 0;
  virtual void do_all_gather(const Tensor& in, const Tensor& out) = 0;  // out: (world, *in.shape)
  virtual void do_barrier() = 0;
  // Called by backends when a collective timed out: later collectives refuse with `reason`.
  void mark_broken(const std::string& reason) { broken_ = reason; }

 private:
  // Counts the call, and says whether the backend should run it (false in meta mode).
  bool begin(const char* op, const Tensor* t);
  friend struct CollectiveKernels;  // the ops' kernels (communicator.cpp)
  uint64_t collectives_ = 0;
  int64_t id_ = -1;
  double timeout_s_;
  std::string broken_;
};

// World size 1: every collective is the identity.
class SingleProcessCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string describe() const override { return "single process"; }
  std::unique_ptr<Communicator> dup() override { return std::make_unique<SingleProcessCommunicator>(); }

 protected:
  void do_all_reduce(const Tensor&, ReduceOp) override {}
  void do_broadcast(const Tensor&, int) override {}
  void do_all_gather(const Tensor& in, const Tensor& out) override;
  void do_barrier() override {}
};

// ---- the process's default communicator ----
// Creates it (see the top of this file); an error when one already exists with another backend, or
// when the MPI plugin or libmpi cannot be loaded (the message says what was tried).
Communicator& init(Backend backend = Backend::automatic);
// The default communicator, created by init(automatic) on first use.
Communicator& world();
std::shared_ptr<Communicator> world_ptr();
int rank();
int world_size();
bool launched_by_mpirun();  // OMPI_COMM_WORLD_SIZE / PMIX_RANK in the environment
// This process's rank among those on its host (OMPI_COMM_WORLD_LOCAL_RANK; 0 without mpirun): which GPU it takes.
int local_rank();
// Ends every process of the job at once (MPI_Abort) when the default communicator is MPI's; returns
// otherwise. For a tool's fatal error: the other ranks would otherwise wait in a collective until
// their timeout. The library itself never calls it.
void abort_job(int code);

}  // namespace reel::dist
