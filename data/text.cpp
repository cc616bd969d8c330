// Byte-level text data: file reading, the fortunes corpus, the positional split and the window sampler
// (see text.h for the conventions).
#include "data/text.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>

#include "autograd/ops.h"
#include "tensor/error.h"
#include "tensor/rng.h"

namespace reel::data {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string read_file(const std::string& api, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REEL_CHECK(in.good(), api, ": cannot open ", path, " (", std::strerror(errno), ")");
  std::ostringstream os;
  os << in.rdbuf();
  REEL_CHECK(!in.bad(), api, ": error while reading ", path);
  return os.str();
}

// A fortune file with each "%" separator line turned into an empty line.
std::string strip_fortune_separators(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    size_t end = nl == std::string::npos ? text.size() : nl + 1;
    std::string_view line(text.data() + pos, end - pos);
    if (line == "%\n" || line == "%") {
      out += '\n';
    } else {
      out.append(line);
    }
    pos = end;
  }
  return out;
}

}  // namespace

Tensor bytes_to_tensor(const std::string& text) {
  Tensor t = Tensor::empty({int64_t(text.size())}, DType::i64);  // (N)
  int64_t* p = t.data<int64_t>();
  for (size_t i = 0; i < text.size(); ++i) p[i] = static_cast<unsigned char>(text[i]);
  return t;
}

std::string tensor_to_bytes(const Tensor& tokens) {
  std::vector<int64_t> v = tokens.to_vector<int64_t>();
  std::string s(v.size(), '\0');
  for (size_t i = 0; i < v.size(); ++i) s[i] = char(uint8_t(v[i] & 0xff));
  return s;
}

Tensor load_text_bytes(const std::string& path) {
  std::string text = read_file("load_text_bytes", path);
  REEL_CHECK(!text.empty(), "load_text_bytes: ", path, " is empty; a text data set needs at least one byte");
  return bytes_to_tensor(text);
}

std::string fortunes_dir() {
  const char* env = std::getenv("REEL_FORTUNES");
  return (env && *env) ? std::string(env) : std::string(kFortunesDefaultDir);
}

std::vector<std::string> fortune_files(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  REEL_CHECK(d != nullptr, "load_fortunes: cannot open the directory ", dir, " (", std::strerror(errno),
             "). Install Debian's fortunes package (apt-get install fortunes), set REEL_FORTUNES to a "
             "directory of fortune files, or pass any text file to load_text_bytes");
  std::vector<std::string> files;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.empty() || name[0] == '.' || ends_with(name, ".dat") || ends_with(name, ".u8")) continue;
    std::string path = dir + "/" + name;
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;  // links and subfolders
    files.push_back(path);
  }
  ::closedir(d);
  std::sort(files.begin(), files.end());
  REEL_CHECK(!files.empty(), "load_fortunes: ", dir, " holds no fortune files (plain files other than *.dat and *.u8)");
  return files;
}

std::string read_fortunes(const std::string& dir) {
  std::string all;
  for (const std::string& path : fortune_files(dir)) {
    std::string text = strip_fortune_separators(read_file("load_fortunes", path));
    if (!all.empty() && all.back() != '\n') all += '\n';
    all += text;
  }
  REEL_CHECK(!all.empty(), "load_fortunes: the fortune files in ", dir, " are all empty");
  return all;
}

Tensor load_fortunes(const std::string& dir) { return bytes_to_tensor(read_fortunes(dir)); }

TextSplit split_text(const Tensor& tokens, double val_fraction) {
  REEL_CHECK(tokens.defined() && tokens.dim() == 1, "split_text: expected a (N) token tensor, got ",
             tokens.defined() ? tokens.dim() : 0, " dims");
  REEL_CHECK(val_fraction >= 0 && val_fraction < 1, "split_text: val_fraction must be in [0, 1), got ", val_fraction);
  int64_t n = tokens.size(0);
  int64_t n_train = n - int64_t(double(n) * val_fraction);
  return {tokens.slice(0, 0, n_train), tokens.slice(0, n_train, n)};
}

TextSampler::TextSampler(Tensor tokens, int64_t block_size, uint64_t seed) : block_size_(block_size), seed_(seed) {
  REEL_CHECK(tokens.defined() && tokens.dim() == 1 && tokens.dtype() == DType::i64,
             "TextSampler: expected a (N) i64 token tensor");
  REEL_CHECK(block_size > 0, "TextSampler: block_size must be positive, got ", block_size);
  REEL_CHECK(tokens.size(0) >= block_size + 1, "TextSampler: a window of ", block_size,
             " tokens needs a text of at least ", block_size + 1, " tokens (inputs plus the shifted target), got ",
             tokens.size(0));
  tokens_ = tokens.cpu().contiguous();
}

TextBatch TextSampler::gather(const std::vector<int64_t>& starts, Device device) const {
  const int64_t b = int64_t(starts.size()), t = block_size_;
  Tensor inputs = Tensor::empty({b, t}, DType::i64);   // (B, T)
  Tensor targets = Tensor::empty({b, t}, DType::i64);  // (B, T)
  const int64_t* src = tokens_.data<int64_t>();
  int64_t* x = inputs.data<int64_t>();
  int64_t* y = targets.data<int64_t>();
  for (int64_t i = 0; i < b; ++i) {
    std::memcpy(x + i * t, src + starts[size_t(i)], size_t(t) * sizeof(int64_t));
    std::memcpy(y + i * t, src + starts[size_t(i)] + 1, size_t(t) * sizeof(int64_t));
  }
  if (device.is_cpu()) return {inputs, targets};
  return {inputs.to(device), targets.to(device)};
}

TextBatch TextSampler::next(int64_t batch_size, Device device) {
  REEL_CHECK(batch_size > 0, "TextSampler::next: batch_size must be positive, got ", batch_size);
  // The batch's inputs and targets are two (B, T) i64 tensors: their size is checked before any allocation.
  int64_t bytes = 0;
  REEL_CHECK(!__builtin_mul_overflow(batch_size, block_size_, &bytes) && !__builtin_mul_overflow(bytes, int64_t(16), &bytes),
             "TextSampler::next: a batch of ", batch_size, " windows of ", block_size_,
             " tokens needs more than 2^63 bytes");
  std::vector<int64_t> starts(static_cast<size_t>(batch_size));
  const uint64_t range = uint64_t(num_starts());
  for (auto& s : starts) {
    Philox4 r = philox4x32_10(seed_, draws_++);
    uint64_t u = (uint64_t(r.w[0]) << 32) | r.w[1];
    s = int64_t(u % range);  // modulo bias below 2^-40 for any text that fits in memory
  }
  return gather(starts, device);
}

TextBatch TextSampler::window(int64_t start, Device device) const {
  REEL_CHECK(start >= 0 && start < num_starts(), "TextSampler::window: start ", start, " is outside [0, ",
             num_starts(), ") for a text of ", text_size(), " tokens and block_size ", block_size_);
  return gather({start}, device);
}

}  // namespace reel::data
