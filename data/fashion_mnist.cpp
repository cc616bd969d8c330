// The idx reader and the Fashion-MNIST loader (see fashion_mnist.h for the format and conventions).
//
// Files are read through zlib's gzFile, which inflates gzip files and passes plain files through, so
// one reader serves both. A file is checked in the order a human would: can it be opened, is the
// header complete, is the magic right, are the sizes sane, is the data complete, is there nothing
// after it. A corrupt gzip stream (a cut .gz) surfaces as zlib's own message with the file name.
#include "data/fashion_mnist.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sys/stat.h>

#include "tensor/error.h"

namespace reel::data {
namespace {

constexpr uint32_t kImagesMagic = 2051;  // 0x00000803: unsigned bytes, 3 dims
constexpr uint32_t kLabelsMagic = 2049;  // 0x00000801: unsigned bytes, 1 dim

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Owns a gzFile; reads exactly or reports how much was there.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    file_ = gzopen(path.c_str(), "rb");
    REEL_CHECK(file_ != nullptr, "read_idx: cannot open ", path, " (", std::strerror(errno), ")");
    gzbuffer(file_, 1 << 18);
  }
  ~GzReader() {
    if (file_) gzclose(file_);
  }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Reads up to n bytes into dst; returns how many were read (fewer only at the end of the data).
  size_t read(void* dst, size_t n) {
    size_t done = 0;
    while (done < n) {
      unsigned chunk = unsigned(std::min<size_t>(n - done, 1u << 30));
      int got = gzread(file_, static_cast<char*>(dst) + done, chunk);
      check_stream();
      if (got <= 0) break;
      done += size_t(got);
    }
    return done;
  }

  // "" or zlib's word on why the data ended early.
  const std::string& note() const { return note_; }

  // The number of bytes left after the current position (reads them; for the over-long check).
  size_t drain() {
    char buf[4096];
    size_t extra = 0;
    for (size_t got; (got = read(buf, sizeof buf)) > 0;) extra += got;
    return extra;
  }

 private:
  // A cut gzip stream (Z_BUF_ERROR) reads as a short read, which the caller reports with the byte
  // counts; any other zlib error (bad CRC, bad deflate data) is corruption.
  void check_stream() {
    int err = Z_OK;
    std::string msg = gzerror(file_, &err);
    if (msg.rfind(path_ + ": ", 0) == 0) msg.erase(0, path_.size() + 2);  // zlib prefixes the path
    if (err == Z_BUF_ERROR) {
      note_ = " (zlib: " + msg + ")";
      return;
    }
    REEL_CHECK(err == Z_OK || err == Z_STREAM_END, "read_idx: ", path_, " is corrupt (zlib: ", msg, ")");
  }
  std::string note_;
  std::string path_;
  gzFile file_ = nullptr;
};

uint32_t big_endian_u32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

std::string dims_str(const std::vector<int64_t>& dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + (dims.size() == 1 ? ",)" : ")");
}

}  // namespace

IdxArray read_idx(const std::string& path, uint32_t expected_magic, int64_t limit) {
  REEL_CHECK(file_exists(path), "read_idx: ", path, " does not exist");
  GzReader in(path);
  uint8_t magic_bytes[4];
  size_t got = in.read(magic_bytes, 4);
  REEL_CHECK(got == 4, "read_idx: ", path, " is truncated: expected a 4-byte idx magic number, found ", got,
             " bytes", in.note());
  uint32_t magic = big_endian_u32(magic_bytes);
  REEL_CHECK(magic == expected_magic, "read_idx: ", path, " has magic number ", magic, ", expected ",
             expected_magic, expected_magic == kImagesMagic   ? " (an images idx3-ubyte file)"
                             : expected_magic == kLabelsMagic ? " (a labels idx1-ubyte file)"
                                                              : "");
  size_t ndims = magic & 0xff;
  REEL_CHECK(ndims >= 1, "read_idx: ", path, " has magic number ", magic, ", which declares no dimensions");
  std::vector<uint8_t> header(4 * ndims);
  got = in.read(header.data(), header.size());
  REEL_CHECK(got == header.size(), "read_idx: ", path, " is truncated: expected a ", header.size(),
             "-byte size header after the magic, found ", got, " bytes", in.note());
  IdxArray out;
  int64_t item_bytes = 1;
  for (size_t d = 0; d < ndims; ++d) {
    int64_t n = big_endian_u32(&header[4 * d]);
    out.dims.push_back(n);
    if (d > 0) {
      REEL_CHECK(n > 0, "read_idx: ", path, " declares sizes ", dims_str(out.dims), "; item sizes must be positive");
      REEL_CHECK(!__builtin_mul_overflow(item_bytes, n, &item_bytes), "read_idx: ", path, " declares sizes ",
                 dims_str(out.dims), ": an item of more bytes than a file can hold");
    }
  }
  int64_t items = out.dims[0];
  if (limit >= 0 && limit < items) items = limit;
  int64_t want_bytes = 0;
  REEL_CHECK(!__builtin_mul_overflow(items, item_bytes, &want_bytes), "read_idx: ", path, " declares sizes ",
             dims_str(out.dims), ": more bytes than a file can hold");
  const size_t want = size_t(want_bytes);
  // Read in chunks as the data comes: a header that declares more than the file holds is reported
  // as truncated after reading what is there, without first allocating what it declared.
  constexpr size_t kChunk = size_t(1) << 24;
  got = 0;
  while (got < want) {
    const size_t n = std::min(kChunk, want - got);
    out.bytes.resize(got + n);
    const size_t read = in.read(out.bytes.data() + got, n);
    got += read;
    if (read < n) break;
  }
  out.bytes.resize(got);
  REEL_CHECK(got == want, "read_idx: ", path, " is truncated: its header declares sizes ", dims_str(out.dims),
             ", so expected ", want, " bytes of data after the ", 4 + header.size(), "-byte header, found ", got, in.note());
  if (items == out.dims[0]) {
    size_t extra = in.drain();
    REEL_CHECK(extra == 0, "read_idx: ", path, " is longer than its header declares: expected ", want,
               " bytes of data for sizes ", dims_str(out.dims), ", found ", extra, " more");
    // All the data came, but a gzip stream cut inside its 8-byte trailer was never checked against
    // its CRC: the bytes read may be corrupt.
    REEL_CHECK(in.note().empty(), "read_idx: ", path, " is truncated: its gzip stream ends before the trailer that "
               "checks its data", in.note());
  }
  out.dims[0] = items;
  return out;
}

ImageDataset load_idx_dataset(const std::string& images_path, const std::string& labels_path, int64_t limit,
                              double mean, double std, int64_t num_classes) {
  REEL_CHECK(std > 0, "load_idx_dataset: std must be positive, got ", std);
  IdxArray imgs = read_idx(images_path, kImagesMagic, limit);
  IdxArray labs = read_idx(labels_path, kLabelsMagic, limit);
  REEL_CHECK(imgs.dims.size() == 3, "load_idx_dataset: ", images_path, " has sizes ", dims_str(imgs.dims),
             ", expected (N, H, W)");
  REEL_CHECK(labs.dims.size() == 1, "load_idx_dataset: ", labels_path, " has sizes ", dims_str(labs.dims),
             ", expected (N,)");
  REEL_CHECK(imgs.dims[0] == labs.dims[0], "load_idx_dataset: ", images_path, " holds ", imgs.dims[0],
             " images but ", labels_path, " holds ", labs.dims[0], " labels; the counts must match");
  const int64_t n = imgs.dims[0], h = imgs.dims[1], w = imgs.dims[2];
  ImageDataset ds;
  ds.num_classes = num_classes;
  ds.images = Tensor::empty({n, 1, h, w}, DType::f32);  // (N, 1, H, W)
  ds.labels = Tensor::empty({n}, DType::i64);           // (N)
  // x' = (byte / 255 - mean) / std, as one table lookup per byte value.
  float table[256];
  for (int v = 0; v < 256; ++v) table[v] = float((v / 255.0 - mean) / std);
  float* px = ds.images.data<float>();
  const uint8_t* src = imgs.bytes.data();
  const int64_t total = n * h * w;
#pragma omp parallel for schedule(static) if (total > (1 << 20))
  for (int64_t i = 0; i < total; ++i) px[i] = table[src[i]];
  int64_t* lab = ds.labels.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    lab[i] = labs.bytes[size_t(i)];
    REEL_CHECK(lab[i] < num_classes, "load_idx_dataset: ", labels_path, " item ", i, " has label ", lab[i],
               ", expected a class in [0, ", num_classes, ")");
  }
  return ds;
}

std::string fashion_mnist_dir() {
  const char* env = std::getenv("REEL_FASHION_MNIST");
  return (env && *env) ? std::string(env) : std::string(kFashionMnistDefaultDir);
}

namespace {
// <dir>/<name>.gz if present, else <dir>/<name> if present, else an error naming what is missing.
std::string find_idx_file(const std::string& dir, const std::string& name) {
  std::string gz = dir + "/" + name + ".gz", plain = dir + "/" + name;
  if (file_exists(gz)) return gz;
  if (file_exists(plain)) return plain;
  throw Error("load_fashion_mnist: " + gz + " not found (nor " + plain +
              "). Install Debian's dataset-fashion-mnist package (apt-get install dataset-fashion-mnist), "
              "or set REEL_FASHION_MNIST to a directory holding the idx files");
}
}  // namespace

ImageDataset load_fashion_mnist(const std::string& dir, bool train, int64_t limit) {
  const std::string split = train ? "train" : "t10k";
  std::string images = find_idx_file(dir, split + "-images-idx3-ubyte");
  std::string labels = find_idx_file(dir, split + "-labels-idx1-ubyte");
  ImageDataset ds = load_idx_dataset(images, labels, limit);
  REEL_CHECK(ds.images.size(2) == 28 && ds.images.size(3) == 28, "load_fashion_mnist: ", images, " holds ",
             ds.images.size(2), "x", ds.images.size(3), " images, expected 28x28");
  return ds;
}

const std::vector<std::string>& fashion_mnist_classes() {
  static const std::vector<std::string> names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                 "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return names;
}

}  // namespace reel::data
