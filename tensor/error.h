// reel::Error — the one exception type for user mistakes.
//
// Every message names the op (or API) that refused, shows the offending shapes, dtypes, devices or
// values, and says what was expected: "matmul: shapes (4, 3) and (5, 2) cannot be multiplied".
// Internal invariants use REEL_ASSERT, which throws reel::InternalError (a bug in reel, not in the
// caller's code). The library never calls exit() or abort().
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace reel {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

class InternalError : public Error {
 public:
  explicit InternalError(const std::string& what) : Error(what) {}
};

namespace detail {
// Joins any streamable pieces into one string: cat("dim ", 3, " of ", shape).
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace reel

// REEL_CHECK(cond, pieces...) throws reel::Error with the pieces joined, when cond is false.
#define REEL_CHECK(cond, ...)                                     \
  do {                                                            \
    if (!(cond)) throw ::reel::Error(::reel::detail::cat(__VA_ARGS__)); \
  } while (0)

// REEL_ASSERT(cond, pieces...) guards reel's own invariants; the message carries file:line.
#define REEL_ASSERT(cond, ...)                                                           \
  do {                                                                                   \
    if (!(cond))                                                                         \
      throw ::reel::InternalError(::reel::detail::cat("internal error at ", __FILE__, ":", \
                                                      __LINE__, ": ", #cond, " ", ##__VA_ARGS__)); \
  } while (0)
