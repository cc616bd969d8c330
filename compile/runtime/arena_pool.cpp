// ArenaPool (see arena_pool.h).
#include "compile/runtime/arena_pool.h"

#include <algorithm>

namespace reel::compile {

std::shared_ptr<Storage> ArenaPool::acquire(Device device, size_t bytes, User* user) {
  bytes = std::max<size_t>(bytes, 1);
  auto e = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& x) { return x.device == device; });
  if (e == entries_.end()) {
    entries_.push_back(Entry{device, nullptr, {}});
    e = entries_.end() - 1;
  }
  if (!e->block || e->block->nbytes() < bytes) {
    if (e->block) {
      // Everyone lets go first, so that the old block is freed before the larger one is made.
      std::vector<User*> holders = std::move(e->users);
      e->users.clear();
      for (User* u : holders) u->release_arena(device);
      e->block.reset();
      ++growths_;
    }
    e->block = std::make_shared<Storage>(bytes, device);
  }
  if (std::find(e->users.begin(), e->users.end(), user) == e->users.end()) e->users.push_back(user);
  return e->block;
}

void ArenaPool::forget(User* user) {
  for (Entry& e : entries_) e.users.erase(std::remove(e.users.begin(), e.users.end(), user), e.users.end());
}

size_t ArenaPool::bytes(Device device) const {
  for (const Entry& e : entries_)
    if (e.device == device && e.block) return e.block->nbytes();
  return 0;
}

}  // namespace reel::compile
