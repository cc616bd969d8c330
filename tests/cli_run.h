// Running the `reel` binary from a test: `reel <args>` (the binary `make test` names in REEL_BIN),
// its exit code and everything it printed; tests skip (REQUIRE_CLI) where REEL_BIN is not set.
#pragma once
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

namespace reel::testing_util {

struct CliRun {
  int code = -1;
  std::string out;
};

inline std::optional<CliRun> reel_cli(const std::string& args) {
  const char* bin = std::getenv("REEL_BIN");
  if (!bin || !std::filesystem::exists(bin)) return std::nullopt;
  const std::string cmd = std::string(bin) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return std::nullopt;
  CliRun r;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

}  // namespace reel::testing_util

#define REQUIRE_CLI(run) \
  if (!(run)) GTEST_SKIP() << "REEL_BIN does not name the reel binary (make test sets it)"
