// Subcommands of the `reel` tool; each takes the arguments after its name and returns an exit code.
#pragma once

namespace reel::tools {

int gradcheck_command(int argc, char** argv);
int train_command(int argc, char** argv);
int bench_command(int argc, char** argv);
int plan_command(int argc, char** argv);
int weights_command(int argc, char** argv);

}  // namespace reel::tools
