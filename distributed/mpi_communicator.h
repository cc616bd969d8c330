// The MPI backend of dist::Communicator, through the plugin build/libreel_mpi.so (distributed/mpi_plugin_abi.h).
//
// Loading, in order, so that a missing piece is a reel::Error saying what was tried and how to fix it:
//   1. libmpi.so.40 with RTLD_GLOBAL (Open MPI's own components need its symbols global): from
//      $REEL_MPI_LIB, else the loader path, else $OPAL_PREFIX/lib, else the lib folder beside each
//      mpirun found on $PATH (also through symlinks) — the GPU machine has Open MPI there but not on
//      the loader path;
//   2. the plugin: $REEL_MPI_PLUGIN, else libreel_mpi.so beside the running executable, else the
//      loader path;
//   3. MPI_Init_thread (once per process; MPI_Finalize runs at exit).
// CPU tensors go straight to MPI. CUDA tensors go through NCCL when distributed/nccl.h can provide a
// communicator for their device, else through host memory (a copy each way, correct but slow).
#pragma once
#include <memory>
#include <string>

#include "distributed/communicator.h"
#include "distributed/mpi_plugin_abi.h"

namespace reel::dist {

// The loaded plugin (loading it, libmpi and MPI_Init the first time). Throws reel::Error on failure.
const reel_mpi_plugin& mpi_plugin();
// Opens one plugin file and returns its table without initialising MPI: an error names the path and
// dlerror's reason, or a wrong ABI version. For tests and diagnostics.
const reel_mpi_plugin& open_mpi_plugin(const std::string& path);

// MPI_COMM_WORLD of this process as a Communicator.
std::shared_ptr<Communicator> make_mpi_communicator();
// MPI_Abort on MPI_COMM_WORLD (only if the plugin is loaded).
void mpi_abort_job(int code);

}  // namespace reel::dist
