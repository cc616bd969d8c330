// The C interface between libreel and its MPI plugin (build/libreel_mpi.so, from distributed/mpi/plugin.cpp).
//
// Why a plugin: build/reel and build/reel_tests must run on machines where Open MPI's libmpi.so.40
// is not on the loader path (or not installed at all), so libreel never links libmpi. The plugin is
// the one object that does; libreel dlopen()s it only when a process runs under mpirun (or is asked
// to), after loading libmpi itself with RTLD_GLOBAL from wherever mpirun lives (distributed/mpi_communicator.cpp).
//
// The interface is plain C over raw host buffers, so the plugin needs no reel header but this one and
// no C++ ABI is shared across the boundary. Every function that can fail returns 0 on success, or a
// nonzero code with a message (naming the MPI call, the rank and MPI's own error string) written
// into err[0..err_len). Collectives are nonblocking MPI calls polled until done or until
// timeout_s seconds have passed: then REEL_MPI_TIMEOUT is returned and the request is abandoned (the
// communicator is no longer usable; libreel refuses further collectives on it).
//
// Versioning: the plugin exports one symbol, reel_mpi_plugin_v<N>, returning a table whose
// abi_version is N; libreel refuses a table of another version (a stale plugin beside a new binary).
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define REEL_MPI_PLUGIN_ABI_VERSION 1
#define REEL_MPI_PLUGIN_SYMBOL "reel_mpi_plugin_v1"

enum reel_mpi_status { REEL_MPI_OK = 0, REEL_MPI_ERROR = 1, REEL_MPI_TIMEOUT = 2 };
enum reel_mpi_dtype { REEL_MPI_F32 = 0, REEL_MPI_F64 = 1, REEL_MPI_I64 = 2 };
enum reel_mpi_op { REEL_MPI_SUM = 0, REEL_MPI_MAX = 1, REEL_MPI_MIN = 2 };

typedef void* reel_mpi_comm;  // an MPI_Comm owned by the plugin

typedef struct reel_mpi_plugin {
  int abi_version;
  // MPI_Init_thread (FUNNELED) unless MPI is already initialised; errors return, not abort.
  int (*init)(char* err, int err_len);
  // MPI_Finalize unless already finalised (communicators made by dup are freed first).
  void (*finalize)(void);
  // Ends every process of the job (MPI_Abort on MPI_COMM_WORLD): for a tool's fatal error.
  void (*abort_world)(int code);
  // The MPI library's own version string (MPI_Get_library_version), for messages.
  const char* (*library_version)(void);
  // MPI_COMM_WORLD (with MPI_ERRORS_RETURN), and duplicates of a communicator (MPI_Comm_dup).
  reel_mpi_comm (*world)(void);
  int (*dup)(reel_mpi_comm comm, reel_mpi_comm* out, char* err, int err_len);
  void (*free)(reel_mpi_comm comm);
  int (*rank)(reel_mpi_comm comm);
  int (*size)(reel_mpi_comm comm);
  // In place over `count` elements (counts above INT_MAX are split into several calls).
  int (*all_reduce)(reel_mpi_comm comm, void* buf, int64_t count, int dtype, int op, double timeout_s, char* err,
                    int err_len);
  // `bytes` bytes of `buf` from rank `root` to every rank.
  int (*broadcast)(reel_mpi_comm comm, void* buf, int64_t bytes, int root, double timeout_s, char* err, int err_len);
  // recv (size * bytes) <- every rank's `bytes` bytes of send, in rank order.
  int (*all_gather)(reel_mpi_comm comm, const void* send, void* recv, int64_t bytes, double timeout_s, char* err,
                    int err_len);
  int (*barrier)(reel_mpi_comm comm, double timeout_s, char* err, int err_len);
} reel_mpi_plugin;

typedef const reel_mpi_plugin* (*reel_mpi_plugin_entry)(void);

#ifdef __cplusplus
}
#endif
