// ArenaPool — the arenas shared by the plans of one compiled function.
//
// A compiled function (compile.h) keeps a plan per input signature: one per length bucket, one per
// recompile. Its calls run one at a time and every plan's Internal buffers (activations, gradients,
// temporaries) are dead between calls, so all its plans can place them in one block per device,
// sized by the largest plan: memory then grows with the largest plan, not with the number of plans.
//
//   A plan acquires a block of at least `bytes` on a device. A block as large is shared as it is.
//   A larger request first has every plan holding the smaller block let go of it (they drop their
//   bindings, and any CUDA graph they captured, since a graph holds the addresses it was captured
//   with); the old block is then freed and the larger one made, so the two are never held at once.
//   A plan that let go binds to the new block (and captures again) at its next run.
// Plans visited smallest first grow the block once per new largest; the largest first, never.
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "tensor/storage.h"

namespace reel::compile {

class ArenaPool {
 public:
  // A holder of a block: told to drop its references when the block is to be replaced.
  class User {
   public:
    virtual ~User() = default;
    virtual void release_arena(Device device) = 0;
  };

  ArenaPool() = default;
  ArenaPool(const ArenaPool&) = delete;
  ArenaPool& operator=(const ArenaPool&) = delete;

  // The block on `device`, at least `bytes` (>= 1) long, grown as described above; `user` is
  // registered as holding it.
  std::shared_ptr<Storage> acquire(Device device, size_t bytes, User* user);
  // `user` holds no block any more (a plan being destroyed).
  void forget(User* user);
  // The block's size on `device` (0: none yet), and how many times a block was replaced by a larger.
  size_t bytes(Device device) const;
  int growths() const { return growths_; }

 private:
  struct Entry {
    Device device;
    std::shared_ptr<Storage> block;
    std::vector<User*> users;
  };
  std::vector<Entry> entries_;
  int growths_ = 0;
};

}  // namespace reel::compile
