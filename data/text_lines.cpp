// Variable-length text items (see text_lines.h).
#include "data/text_lines.h"

#include <algorithm>

#include "tensor/error.h"
#include "tensor/rng.h"

namespace reel::data {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    if (nl > pos) lines.emplace_back(text, pos, nl - pos);
    pos = nl + 1;
  }
  return lines;
}

int64_t LineBatch::positions() const {
  int64_t n = 0;
  for (int64_t l : lengths) n += l;
  return n;
}

LineSampler::LineSampler(const std::vector<std::string>& lines, int64_t block_size, uint64_t seed)
    : block_size_(block_size), seed_(seed) {
  REEL_CHECK(block_size > 0, "LineSampler: block_size must be positive, got ", block_size);
  for (const std::string& line : lines)
    if (line.size() >= 2) items_.push_back(line.substr(0, size_t(std::min<int64_t>(int64_t(line.size()), block_size + 1))));
  REEL_CHECK(!items_.empty(), "LineSampler: none of the ", lines.size(),
             " lines has the 2 bytes an item needs (one input and its next byte)");
}

LineBatch LineSampler::next(int64_t batch_size, Device device, int64_t pad_to) {
  REEL_CHECK(batch_size > 0, "LineSampler::next: batch_size must be positive, got ", batch_size);
  REEL_CHECK(pad_to >= 0 && pad_to <= block_size_, "LineSampler::next: pad_to ", pad_to, " is outside [0, ",
             block_size_, "] (block_size ", block_size_, ")");
  int64_t bytes = 0;
  REEL_CHECK(!__builtin_mul_overflow(batch_size, block_size_, &bytes) && !__builtin_mul_overflow(bytes, int64_t(16), &bytes),
             "LineSampler::next: a batch of ", batch_size, " items of up to ", block_size_,
             " positions needs more than 2^63 bytes");
  std::vector<size_t> picks(static_cast<size_t>(batch_size));
  LineBatch b;
  int64_t L = pad_to;
  for (size_t& i : picks) {
    Philox4 r = philox4x32_10(seed_, draws_++);
    uint64_t u = (uint64_t(r.w[0]) << 32) | r.w[1];
    i = size_t(u % items_.size());
    b.lengths.push_back(int64_t(items_[i].size()) - 1);
    L = std::max(L, b.lengths.back());
  }
  b.inputs = Tensor::empty({batch_size, L}, DType::i64);   // (B, L)
  b.targets = Tensor::empty({batch_size, L}, DType::i64);  // (B, L)
  int64_t* x = b.inputs.data<int64_t>();
  int64_t* y = b.targets.data<int64_t>();
  for (int64_t row = 0; row < batch_size; ++row) {
    const std::string& s = items_[picks[size_t(row)]];
    const int64_t n = b.lengths[size_t(row)];
    for (int64_t t = 0; t < L; ++t) {
      x[row * L + t] = t < n ? int64_t(static_cast<unsigned char>(s[size_t(t)])) : kPadToken;
      y[row * L + t] = t < n ? int64_t(static_cast<unsigned char>(s[size_t(t) + 1])) : kIgnoreIndex;
    }
  }
  if (!device.is_cpu()) {
    b.inputs = b.inputs.to(device);
    b.targets = b.targets.to(device);
  }
  return b;
}

}  // namespace reel::data
