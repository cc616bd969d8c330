// The command line's numbers: one checked parser for every command's options, so that a value that
// is not a number, has trailing characters, is out of its range or (for reals) is NaN or infinite
// is a reel::Error naming the command, the option and what was expected — never a std::stoll
// exception that would end the program.
//   int64_t steps = int_arg("bench", "--steps", "0x", 1);   // bench: --steps expects an integer >= 1, got "0x"
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

namespace reel::tools {

int64_t int_arg(const char* command, const std::string& option, const std::string& value, int64_t lo = 0,
                int64_t hi = std::numeric_limits<int64_t>::max());
// A finite real in [lo, hi] (NaN and infinities are refused whatever the range).
double real_arg(const char* command, const std::string& option, const std::string& value,
                double lo = -std::numeric_limits<double>::max(), double hi = std::numeric_limits<double>::max());

// A memory size ("512MiB", "1GiB", "2.5GB": compile::parse_memory_size), its errors naming the
// command and option.
size_t size_arg(const char* command, const std::string& option, const std::string& value);

}  // namespace reel::tools
