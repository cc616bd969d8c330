// `reel gradcheck`: runs gradcheck over the whole op-case catalogue (autograd/cases/) in f64 on the
// CPU and prints, per case, the worst absolute and relative error over its inputs.
#include <cstdio>
#include <cstring>
#include <string>

#include "autograd/cases/op_cases.h"
#include "tensor/error.h"
#include "tools/commands.h"

namespace reel::tools {

int gradcheck_command(int argc, char** argv) {
  std::string filter;
  for (int i = 0; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--filter") && i + 1 < argc) filter = argv[++i];
    else throw Error(std::string("gradcheck: unknown option ") + argv[i]);
  }
  int failed = 0, run = 0;
  std::printf("%-46s %7s %12s %12s  %s\n", "case", "inputs", "max abs err", "max rel err", "result");
  for (const OpCase& c : all_op_cases()) {
    if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
    std::vector<Tensor> inputs = c.make_inputs(Device::cpu(), DType::f64);
    GradcheckResult r = gradcheck(c.fn, inputs, c.opts);
    double abs_err = 0, rel_err = 0;
    for (const auto& in : r.inputs) {
      abs_err = std::max(abs_err, in.max_abs_error);
      rel_err = std::max(rel_err, in.max_rel_error);
    }
    std::printf("%-46s %7zu %12.3e %12.3e  %s\n", c.name.c_str(), r.inputs.size(), abs_err, rel_err,
                r.ok ? "ok" : "FAILED");
    ++run;
    failed += r.ok ? 0 : 1;
  }
  std::printf("\n%d cases, %d passed, %d failed\n", run, run - failed, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace reel::tools
