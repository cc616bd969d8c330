// Counter-based random numbers (Philox4x32-10) and the Generator that hands out (seed, offset) pairs.
//
// Philox maps (key = seed, counter) to four independent 32-bit words, with no state between calls,
// so element i of a random tensor is a pure function of (seed, offset, i): the CPU and a GPU kernel
// produce the same numbers, any thread can compute any element, and a replayed CUDA graph draws fresh
// numbers just by advancing `offset`. Conventions (shared by every backend):
//   uniform: element i uses word i%4 of philox(seed, offset + i/4); value = (w >> 8) * 2^-24 in [0, 1)
//   normal:  element i uses words 0,1 of philox(seed, offset + i/2) through Box-Muller; cos for even
//            i, sin for odd i
// The function is host/device so the CUDA kernels include this same file.
#pragma once
#include <atomic>
#include <math.h>

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define REEL_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define REEL_HOST_DEVICE inline
#endif

namespace reel {

struct Philox4 {
  uint32_t w[4];
};

REEL_HOST_DEVICE Philox4 philox4x32_10(uint64_t seed, uint64_t counter) {
  uint32_t c0 = uint32_t(counter), c1 = uint32_t(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t(0xD2511F53u) * c0;
    uint64_t p1 = uint64_t(0xCD9E8D57u) * c2;
    uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0;
    uint32_t n1 = uint32_t(p1);
    uint32_t n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    uint32_t n3 = uint32_t(p0);
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

REEL_HOST_DEVICE float philox_uniform(uint64_t seed, uint64_t offset, uint64_t i) {
  Philox4 r = philox4x32_10(seed, offset + i / 4);
  return float(r.w[i % 4] >> 8) * (1.0f / 16777216.0f);
}

REEL_HOST_DEVICE float philox_normal(uint64_t seed, uint64_t offset, uint64_t i) {
  Philox4 r = philox4x32_10(seed, offset + i / 2);
  float u1 = (float(r.w[0] >> 8) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]: log is finite
  float u2 = float(r.w[1] >> 8) * (1.0f / 16777216.0f);
  // In double, then rounded once: the host's libm and the device's math functions differ in the last
  // bit of float results, but their double results round to the same float (so both backends draw
  // the same normals, barring a once-in-billions double-rounding tie).
  double radius = ::sqrt(-2.0 * ::log(double(u1)));
  double theta = 6.283185307179586 * double(u2);
  return float((i % 2 == 0) ? radius * ::cos(theta) : radius * ::sin(theta));
}

// Counters consumed by a draw of n values, so consecutive draws never overlap.
REEL_HOST_DEVICE uint64_t philox_uniform_counters(uint64_t n) { return (n + 3) / 4; }
REEL_HOST_DEVICE uint64_t philox_normal_counters(uint64_t n) { return (n + 1) / 2; }

// Where a random kernel takes its Philox key and first counter from. An eager op passes both as
// attrs (state null). In a compiled plan the op also reads `state`, two values on its device that the
// plan writes before each run: the generator's seed and the offset it reserved for the run; `offset`
// is then the op's distance from that base, fixed when tracing. So a replayed CUDA graph draws fresh
// numbers each time, the same ones an eager run of the step would draw.
struct PhiloxArgs {
  uint64_t seed = 0, offset = 0;
  const uint64_t* state = nullptr;  // null, or {seed, base offset}
  REEL_HOST_DEVICE uint64_t key() const { return state ? state[0] : seed; }
  REEL_HOST_DEVICE uint64_t start() const { return (state ? state[1] : 0) + offset; }
};

class Generator;

// Sees every draw (Generator::advance) made on its thread: the compiler's tracer, which ties each
// draw to the random op that follows it, and reports a draw no op follows (host code using random
// numbers, which a replay could not redraw).
class DrawObserver {
 public:
  virtual ~DrawObserver() = default;
  virtual void on_draw(Generator& gen, uint64_t offset, uint64_t counters) = 0;
};
// Installs `observer` for the calling thread (nullptr removes it); returns the previous one.
DrawObserver* set_draw_observer(DrawObserver* observer);
DrawObserver* draw_observer();

// Hands out (seed, offset) pairs: each draw advances the offset past the counters it used. The offset
// is atomic: threads drawing from one generator (the default one, say) each get counters of their
// own, never the same ones twice; a single thread sees exactly the offsets of a plain counter.
// manual_seed is not meant to race with draws.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  Generator(const Generator& o) : seed_(o.seed_), offset_(o.offset()) {}
  Generator& operator=(const Generator& o) {
    seed_ = o.seed_;
    offset_.store(o.offset(), std::memory_order_relaxed);
    return *this;
  }
  void manual_seed(uint64_t seed) {
    seed_ = seed;
    offset_.store(0, std::memory_order_relaxed);
  }
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_.load(std::memory_order_relaxed); }
  // Moves the offset to `offset`: a step traced without running gives back the counters its trace
  // reserved, so that its first real run draws those same numbers (compile/runtime/compile.h).
  void set_offset(uint64_t offset) { offset_.store(offset, std::memory_order_relaxed); }
  // Reserves `counters` counters and returns the offset where they start.
  uint64_t advance(uint64_t counters) {
    const uint64_t at = offset_.fetch_add(counters, std::memory_order_relaxed);
    if (DrawObserver* o = draw_observer()) o->on_draw(*this, at, counters);
    return at;
  }

 private:
  uint64_t seed_ = 0;
  std::atomic<uint64_t> offset_{0};
};

// The process-wide default generator (reel::manual_seed sets it).
Generator& default_generator();
inline void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace reel
