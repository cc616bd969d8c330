// Variable-length text items for language models: one item per line, as sentences or fortunes come,
// instead of TextSampler's fixed windows (data/text.h).
//
// An item is a non-empty line of the text (the newline not included), cut to its first
// block_size + 1 bytes; an item of n bytes gives n - 1 positions: inputs = item[0 .. n-1),
// targets = item[1 .. n) (the next byte at every position), so items shorter than 2 bytes are left
// out. A batch of B items drawn at random (Philox(seed, draw k), as TextSampler draws its starts: a
// pure function of seed and draw number) is padded to one length L, at least its longest item's
// positions (a bucket's length, when the caller gives one):
//   inputs  (B, L) i64   the item's bytes, then kPadToken
//   targets (B, L) i64   the next bytes, then kIgnoreIndex: cross_entropy's ignore_index, so padded
//                        positions are counted out of the loss and of its mean
//   lengths (B)          each item's positions n - 1 (what a key-padding mask keeps)
// so a loss over a padded batch is the loss over its items' real positions.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/text.h"

namespace reel::data {

inline constexpr int64_t kPadToken = 0;
inline constexpr int64_t kIgnoreIndex = -100;  // cross_entropy's default ignore_index

// The non-empty lines of `text`, each without its newline (a trailing '\r' kept: bytes are bytes).
std::vector<std::string> split_lines(const std::string& text);

struct LineBatch {
  Tensor inputs;                 // (B, L) i64, padded with kPadToken
  Tensor targets;                // (B, L) i64, padded with kIgnoreIndex
  std::vector<int64_t> lengths;  // (B) real positions per item, each in [1, L]
  int64_t positions() const;     // the batch's real positions: the sum of lengths
};

class LineSampler {
 public:
  // The items of `lines` (see above); reel::Error when none has 2 bytes or block_size < 1.
  LineSampler(const std::vector<std::string>& lines, int64_t block_size, uint64_t seed = 0);
  // The next `batch_size` items on `device`, padded to max(pad_to, the longest item's positions);
  // pad_to 0: the longest item's. pad_to above block_size is refused (no item is that long).
  LineBatch next(int64_t batch_size, Device device = Device::cpu(), int64_t pad_to = 0);
  int64_t block_size() const { return block_size_; }
  size_t num_items() const { return items_.size(); }
  // Item i's bytes as kept (cut to block_size + 1).
  const std::string& item(size_t i) const { return items_[i]; }
  uint64_t draws() const { return draws_; }
  // Continues the sequence after `draws` draws, as a sampler that made them would (a resumed run).
  void set_draws(uint64_t draws) { draws_ = draws; }

 private:
  std::vector<std::string> items_;
  int64_t block_size_;
  uint64_t seed_;
  uint64_t draws_ = 0;
};

}  // namespace reel::data
