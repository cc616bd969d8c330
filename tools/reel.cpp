// The `reel` command line. Subcommands:
//   reel gradcheck [--filter TEXT]   gradcheck every differentiable op (f64, CPU) and print a table
//   reel train [options]             train a model end to end (tools/train_command.cpp)
//   reel bench [options]             time MODELS.md's training step (tools/bench_command.cpp)
//   reel plan [options]              print the compiled plan of that step (tools/plan_command.cpp)
//   reel weights [options]           a model's weights to and from safetensors / state_dict files
//                                    (tools/weights_command.cpp)
#include <cstring>
#include <exception>
#include <iostream>
#include <new>
#include <string>

#include "distributed/communicator.h"
#include "tensor/error.h"
#include "tools/commands.h"

namespace {

void usage() {
  std::cout << "usage: reel <command> [options]\n"
               "commands:\n"
               "  gradcheck [--filter TEXT]   check every op's gradient against finite differences\n"
               "  train [options]             train a model (reel train --help for the options)\n"
               "  bench [options]             time the training step of the benchmark models\n"
               "  plan [options]              print the compiled plan of a model's training step\n"
               "  weights --model NAME [--seed N] [--init-from FILE] [--save OUT] [--compare FILE]\n"
               "                              load, save (.safetensors or REELSD01) and compare a model's weights\n";
}

// The one way out on an error: one line on stderr, exit code 1. Under mpirun the other ranks would wait
// in their next collective until its timeout: end the job.
int fail(const std::string& cmd, const std::string& message) {
  // Most messages already open with the command ("train: --clip expects ..."): not twice.
  const bool named = message.rfind(cmd + ": ", 0) == 0;
  std::cerr << "reel " << cmd << ": " << (named ? message.substr(cmd.size() + 2) : message) << "\n";
  reel::dist::abort_job(1);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 1 : 0;
  }
  std::string cmd = argv[1];
  try {
    if (cmd == "gradcheck") return reel::tools::gradcheck_command(argc - 2, argv + 2);
    if (cmd == "train") return reel::tools::train_command(argc - 2, argv + 2);
    if (cmd == "bench") return reel::tools::bench_command(argc - 2, argv + 2);
    if (cmd == "plan") return reel::tools::plan_command(argc - 2, argv + 2);
    if (cmd == "weights") return reel::tools::weights_command(argc - 2, argv + 2);
    std::cerr << "reel: unknown command '" << cmd << "'\n";
    usage();
    return 1;
  } catch (const reel::Error& e) {
    return fail(cmd, e.what());
  } catch (const std::bad_alloc&) {
    return fail(cmd, "out of host memory");
  } catch (const std::exception& e) {
    // Not a reel::Error: a library below reel threw. Still one line and exit code 1, never an abort.
    return fail(cmd, std::string("unexpected error: ") + e.what());
  }
}
