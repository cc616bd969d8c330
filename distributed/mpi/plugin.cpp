// libreel_mpi.so — the only object of reel that links MPI (see distributed/mpi_plugin_abi.h for why).
//
// Built by the Makefile with $(CXX) and `mpicc --showme` flags (the C bindings only: its one
// dependency is libmpi.so.40), loaded by distributed/mpi_communicator.cpp with dlopen.
//
// Collectives are MPI's nonblocking ones (MPI_Iallreduce, MPI_Ibcast, MPI_Iallgather, MPI_Ibarrier)
// followed by a polling wait: MPI_Test until the request completes or a deadline passes. A peer that
// died or never arrives therefore costs at most timeout_s, after which the caller gets an error naming
// the collective and the rank instead of a hang. The wait yields the core first and then sleeps in
// growing steps up to 200 us, so two ranks sharing two cores (CI's mpirun -np 2) do not starve each other.
// The communicators are set to MPI_ERRORS_RETURN, so an MPI failure becomes a message, not an abort.
// MPI counts are int: larger buffers go in pieces of at most 2^30 elements (all_gather refuses them).
// The C API only: no dependency on libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "distributed/mpi_plugin_abi.h"

namespace {

constexpr int64_t kMaxChunk = int64_t(1) << 30;
std::vector<MPI_Comm> g_dups;             // made by dup and not yet freed (freed before MPI_Finalize)
std::vector<MPI_Request> g_abandoned;     // requests of collectives that timed out
char g_version[MPI_MAX_LIBRARY_VERSION_STRING + 1];

double now_seconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

MPI_Comm as_comm(reel_mpi_comm c) { return *static_cast<MPI_Comm*>(c); }

int world_rank() {
  int r = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int fail(int rc, const char* what, char* err, int err_len) {
  char text[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(rc, text, &len);
  std::snprintf(err, size_t(err_len), "%s failed on rank %d: %s", what, world_rank(), text);
  return REEL_MPI_ERROR;
}

// Polls `req` until it completes or `timeout_s` passes (then the request is abandoned).
int wait(MPI_Request* req, double deadline, double timeout_s, const char* what, char* err, int err_len) {
  long sleep_ns = 1000;
  for (int polls = 0;; ++polls) {
    int done = 0;
    int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return fail(rc, what, err, err_len);
    if (done) return REEL_MPI_OK;
    if (now_seconds() > deadline) {
      g_abandoned.push_back(*req);
      std::snprintf(err, size_t(err_len),
                    "%s timed out on rank %d after %g s: a peer did not join (it died, hangs, or ran a different "
                    "sequence of collectives)",
                    what, world_rank(), timeout_s);
      return REEL_MPI_TIMEOUT;
    }
    if (polls < 100) {
      sched_yield();
    } else {
      timespec ts{0, sleep_ns};
      nanosleep(&ts, nullptr);
      sleep_ns = std::min(sleep_ns * 2, 200000L);
    }
  }
}

MPI_Datatype mpi_type(int dtype) {
  switch (dtype) {
    case REEL_MPI_F32: return MPI_FLOAT;
    case REEL_MPI_F64: return MPI_DOUBLE;
    default: return MPI_INT64_T;
  }
}

size_t type_bytes(int dtype) { return dtype == REEL_MPI_F32 ? 4 : 8; }

MPI_Op mpi_op(int op) { return op == REEL_MPI_MAX ? MPI_MAX : op == REEL_MPI_MIN ? MPI_MIN : MPI_SUM; }

int p_init(char* err, int err_len) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) {
      std::snprintf(err, size_t(err_len), "MPI_Init_thread failed with code %d", rc);
      return REEL_MPI_ERROR;
    }
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return REEL_MPI_OK;
}

void p_finalize() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // Abandoned requests get a last chance to complete (a late peer), then are left to MPI_Finalize.
  for (MPI_Request& r : g_abandoned) {
    int done = 0;
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
  }
  for (MPI_Comm& c : g_dups) MPI_Comm_free(&c);
  g_dups.clear();
  MPI_Finalize();
}

void p_abort_world(int code) { MPI_Abort(MPI_COMM_WORLD, code); }

const char* p_library_version() {
  int len = 0;
  MPI_Get_library_version(g_version, &len);
  g_version[std::min(len, MPI_MAX_LIBRARY_VERSION_STRING)] = '\0';
  if (char* nl = std::strchr(g_version, '\n')) *nl = '\0';
  if (char* comma = std::strchr(g_version, ',')) *comma = '\0';
  return g_version;
}

reel_mpi_comm p_world() {
  static MPI_Comm world = MPI_COMM_WORLD;
  return &world;
}

int p_dup(reel_mpi_comm comm, reel_mpi_comm* out, char* err, int err_len) {
  MPI_Comm* c = new MPI_Comm;
  int rc = MPI_Comm_dup(as_comm(comm), c);
  if (rc != MPI_SUCCESS) {
    delete c;
    return fail(rc, "MPI_Comm_dup", err, err_len);
  }
  MPI_Comm_set_errhandler(*c, MPI_ERRORS_RETURN);
  g_dups.push_back(*c);
  *out = c;
  return REEL_MPI_OK;
}

void p_free(reel_mpi_comm comm) {
  MPI_Comm* c = static_cast<MPI_Comm*>(comm);
  if (comm == p_world()) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  auto it = std::find(g_dups.begin(), g_dups.end(), *c);
  if (!finalized && it != g_dups.end()) {
    g_dups.erase(it);
    MPI_Comm_free(c);  // pending (abandoned) operations complete before MPI deallocates it
  }
  delete c;
}

int p_rank(reel_mpi_comm comm) {
  int r = -1;
  MPI_Comm_rank(as_comm(comm), &r);
  return r;
}

int p_size(reel_mpi_comm comm) {
  int s = 0;
  MPI_Comm_size(as_comm(comm), &s);
  return s;
}

int p_all_reduce(reel_mpi_comm comm, void* buf, int64_t count, int dtype, int op, double timeout_s, char* err,
                 int err_len) {
  const double deadline = now_seconds() + timeout_s;
  char* p = static_cast<char*>(buf);
  for (int64_t done = 0; done < count;) {
    const int n = int(std::min(count - done, kMaxChunk));
    MPI_Request req;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, p + size_t(done) * type_bytes(dtype), n, mpi_type(dtype), mpi_op(op),
                            as_comm(comm), &req);
    if (rc != MPI_SUCCESS) return fail(rc, "MPI_Iallreduce", err, err_len);
    if (int w = wait(&req, deadline, timeout_s, "all_reduce (MPI_Iallreduce)", err, err_len)) return w;
    done += n;
  }
  return REEL_MPI_OK;
}

int p_broadcast(reel_mpi_comm comm, void* buf, int64_t bytes, int root, double timeout_s, char* err, int err_len) {
  const double deadline = now_seconds() + timeout_s;
  char* p = static_cast<char*>(buf);
  for (int64_t done = 0; done < bytes;) {
    const int n = int(std::min(bytes - done, kMaxChunk));
    MPI_Request req;
    int rc = MPI_Ibcast(p + done, n, MPI_BYTE, root, as_comm(comm), &req);
    if (rc != MPI_SUCCESS) return fail(rc, "MPI_Ibcast", err, err_len);
    if (int w = wait(&req, deadline, timeout_s, "broadcast (MPI_Ibcast)", err, err_len)) return w;
    done += n;
  }
  return REEL_MPI_OK;
}

int p_all_gather(reel_mpi_comm comm, const void* send, void* recv, int64_t bytes, double timeout_s, char* err,
                 int err_len) {
  if (bytes > kMaxChunk) {
    std::snprintf(err, size_t(err_len), "all_gather of %lld bytes per rank: at most %lld are supported",
                  (long long)bytes, (long long)kMaxChunk);
    return REEL_MPI_ERROR;
  }
  MPI_Request req;
  int rc = MPI_Iallgather(send, int(bytes), MPI_BYTE, recv, int(bytes), MPI_BYTE, as_comm(comm), &req);
  if (rc != MPI_SUCCESS) return fail(rc, "MPI_Iallgather", err, err_len);
  return wait(&req, now_seconds() + timeout_s, timeout_s, "all_gather (MPI_Iallgather)", err, err_len);
}

int p_barrier(reel_mpi_comm comm, double timeout_s, char* err, int err_len) {
  MPI_Request req;
  int rc = MPI_Ibarrier(as_comm(comm), &req);
  if (rc != MPI_SUCCESS) return fail(rc, "MPI_Ibarrier", err, err_len);
  return wait(&req, now_seconds() + timeout_s, timeout_s, "barrier (MPI_Ibarrier)", err, err_len);
}

const reel_mpi_plugin kPlugin = {
    REEL_MPI_PLUGIN_ABI_VERSION, p_init, p_finalize, p_abort_world, p_library_version, p_world, p_dup, p_free,
    p_rank, p_size, p_all_reduce, p_broadcast, p_all_gather, p_barrier,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const reel_mpi_plugin* reel_mpi_plugin_v1(void) { return &kPlugin; }
