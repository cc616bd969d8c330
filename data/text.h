// Byte-level text data for language models (vocab 256: one token per byte, no tokenizer).
//
// A text is a (N) i64 tensor of byte values in [0, 256). Training draws windows at random start
// positions s: inputs = text[s .. s+T), targets = text[s+1 .. s+T+1) (the next byte at every position),
// batched to (B, T). Start positions come from a seeded counter-based generator (Philox, tensor/rng.h):
// draw k of a sampler with seed S uses Philox(S, k), so a sampler's windows are a pure function of
// (seed, draw number) and two samplers with the same seed yield the same batches.
//
// The default text is the fortune cookie files of Debian's `fortunes` package
// (/usr/share/games/fortunes, overridable with $REEL_FORTUNES): every plain-text fortune file, in
// sorted name order, skipping the strfile indexes (*.dat), the *.u8 links (the same files again) and
// anything that is not a regular file. Fortunes in a file are separated by lines holding only "%";
// each such line becomes an empty line, so fortunes stay apart as blank-line separated paragraphs and
// the model never sees the "%" markup.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/device.h"
#include "tensor/tensor.h"

namespace reel::data {

inline constexpr int64_t kByteVocab = 256;
inline constexpr const char* kFortunesDefaultDir = "/usr/share/games/fortunes";

// The bytes of any file as a (N) i64 tensor. Errors: missing/unreadable file, empty file.
Tensor load_text_bytes(const std::string& path);
// Bytes of a string as a (N) i64 tensor, and back (values are taken modulo 256 on the way back).
Tensor bytes_to_tensor(const std::string& text);
std::string tensor_to_bytes(const Tensor& tokens);

// $REEL_FORTUNES when set and non-empty, else /usr/share/games/fortunes.
std::string fortunes_dir();
// The fortune files of `dir` that load_fortunes reads, in order (full paths).
std::vector<std::string> fortune_files(const std::string& dir);
// The concatenated fortunes (see above) as one string / as a (N) i64 tensor.
std::string read_fortunes(const std::string& dir = fortunes_dir());
Tensor load_fortunes(const std::string& dir = fortunes_dir());

// A split by position: train = the first (1 - val_fraction) of the text, val = the rest (views).
struct TextSplit {
  Tensor train;  // (N_train) i64
  Tensor val;    // (N_val) i64
};
TextSplit split_text(const Tensor& tokens, double val_fraction = 0.1);

struct TextBatch {
  Tensor inputs;   // (B, T) i64
  Tensor targets;  // (B, T) i64, inputs shifted left by one
};

// Draws random (B, T) windows from one text. The text must hold at least T + 1 bytes.
class TextSampler {
 public:
  TextSampler(Tensor tokens, int64_t block_size, uint64_t seed = 0);
  // The next batch of `batch_size` windows, on `device`.
  TextBatch next(int64_t batch_size, Device device = Device::cpu());
  // The window starting at `start` (deterministic, e.g. for evaluation sweeps), as (1, T).
  TextBatch window(int64_t start, Device device = Device::cpu()) const;
  int64_t block_size() const { return block_size_; }
  int64_t text_size() const { return tokens_.size(0); }
  int64_t num_starts() const { return tokens_.size(0) - block_size_; }  // valid starts: [0, num_starts)
  uint64_t draws() const { return draws_; }
  // Continues the sequence after `draws` draws, as a sampler that made them would (a resumed run).
  void set_draws(uint64_t draws) { draws_ = draws; }

 private:
  TextBatch gather(const std::vector<int64_t>& starts, Device device) const;
  Tensor tokens_;  // (N) i64, contiguous, CPU
  int64_t block_size_;
  uint64_t seed_;
  uint64_t draws_ = 0;  // windows drawn so far (the Philox counter)
};

}  // namespace reel::data
