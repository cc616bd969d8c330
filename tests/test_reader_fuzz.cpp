// Seeded fuzzing of the three file readers (idx, text, state_dict): a small valid file is cut, has
// bytes flipped, bytes inserted and header fields set to extreme values, and every mutant must read
// either as a reel::Error that names the reader and the file, or as a result consistent with the
// bytes on disk. Nothing else is acceptable: another exception type, a crash, a result that
// disagrees with the file, or (for checkpoints) a failed load that changed the module. The seed is
// fixed, so a failure names a mutant that the same build reproduces every time.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

#include "data/fashion_mnist.h"
#include "data/text.h"
#include "nn/nn.h"
#include "nn/state_dict.h"
#include "tensor/file_io.h"
#include "test_util.h"

using namespace reel;
using namespace std::string_literals;
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kSeed = 0x5EED'F00D'2024ull;

// A fresh directory, removed with its files when the test ends.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/reel_reader_fuzz_XXXXXX";
    const char* made = ::mkdtemp(tmpl);
    path_ = made ? made : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Mutants are plain writes: the valid originals go through the library's writers, and an fsync per
// mutant would only slow the test down. The old file is removed first: a file truncated and
// rewritten in place is flushed to disk on close by some file systems (ext4's auto_da_alloc).
void write_plain(const std::string& path, const std::string& bytes) {
  std::error_code ec;
  fs::remove(path, ec);
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string hex(uint64_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

// A fixed-width integer of a file's header, so that it can be set to extreme values.
struct Field {
  std::string name;
  size_t offset;
  int width;  // 1, 4 or 8 bytes
  bool big_endian;
};

uint64_t get_field(const std::string& b, const Field& f) {
  uint64_t v = 0;
  for (int i = 0; i < f.width; ++i) {
    const uint64_t byte = uint8_t(b[f.offset + size_t(i)]);
    v |= byte << (8 * (f.big_endian ? f.width - 1 - i : i));
  }
  return v;
}

void set_field(std::string& b, const Field& f, uint64_t v) {
  for (int i = 0; i < f.width; ++i) b[f.offset + size_t(i)] = char((v >> (8 * (f.big_endian ? f.width - 1 - i : i))) & 0xff);
}

struct Mutant {
  std::string bytes;
  std::string what;  // how it was made, for failure messages
  bool truncated = false;
};

// Mutants of one valid file, drawn from a seeded generator in a fixed rotation of kinds, so every
// kind (and every class of truncation length) is represented whatever the count.
class Mutator {
 public:
  Mutator(std::string valid, size_t header_end, std::vector<Field> fields, uint64_t seed)
      : valid_(std::move(valid)), header_end_(header_end), fields_(std::move(fields)), rng_(seed) {}

  // Every header field set to every extreme value: the header space is small enough to cover
  // whole, where random picks would leave most combinations untried.
  std::vector<Mutant> all_field_extremes() const {
    std::vector<Mutant> out;
    for (const Field& f : fields_)
      for (uint64_t v : extremes(f))
        if (v != get_field(valid_, f)) out.push_back(with_field(f, v));
    return out;
  }

  // Every length short of the whole file: which cut a reader misses depends on the format (a gzip
  // member cut inside its trailer, say), so none is left to chance.
  std::vector<Mutant> all_truncations() const {
    std::vector<Mutant> out;
    for (size_t len = 0; len < valid_.size(); ++len) out.push_back(cut(len));
    return out;
  }

  Mutant make(int i) {
    switch (i % 6) {
      case 0: return truncate(i / 6);
      case 1: return flip(1);
      case 2: return flip(2 + int(below(7)));
      case 3: return fields_.empty() ? flip(1) : extreme_field();
      case 4: return insert();
      default: return append();
    }
  }

 private:
  uint64_t below(uint64_t n) { return n ? rng_() % n : 0; }
  size_t between(size_t lo, size_t hi) { return lo + size_t(below(hi - lo + 1)); }  // [lo, hi]

  Mutant cut(size_t len) const {
    const size_t n = valid_.size();
    const char* where = len == 0 ? "empty" : len < header_end_ ? "inside the header" : len + 1 < n ? "inside the data" : "one byte short";
    return {valid_.substr(0, len), "truncated to " + std::to_string(len) + " of " + std::to_string(n) + " bytes (" + where + ")",
            true};
  }

  // One of the four classes of length in turn: empty, inside the header, inside the data, one short.
  Mutant truncate(int round) {
    const size_t n = valid_.size();
    switch (round % 4) {
      case 0: return cut(0);
      case 1: return cut(between(1, header_end_ - 1));
      case 2: return cut(between(header_end_, n - 2));
      default: return cut(n - 1);
    }
  }

  Mutant flip(int count) {
    Mutant m{valid_, "flipped", false};
    for (int k = 0; k < count; ++k) {
      const size_t at = size_t(below(valid_.size()));
      const uint8_t mask = uint8_t(1 + below(255));
      m.bytes[at] = char(uint8_t(m.bytes[at]) ^ mask);
      m.what += " byte " + std::to_string(at) + " ^= " + hex(mask) + (at < header_end_ ? " (header)" : " (data)") + ";";
    }
    return m;
  }

  // 0, 1, all ones, the largest and smallest signed values, off by one either way, and sizes that
  // are huge without overflowing a product of two.
  std::vector<uint64_t> extremes(const Field& f) const {
    const uint64_t orig = get_field(valid_, f);
    const uint64_t all = f.width == 8 ? ~uint64_t(0) : (uint64_t(1) << (8 * f.width)) - 1;
    return {0, 1, all, all >> 1, (all >> 1) + 1, all >> 8, (orig + 1) & all, (orig - 1) & all, uint64_t(1) << (4 * f.width)};
  }

  Mutant with_field(const Field& f, uint64_t v) const {
    Mutant m{valid_, "", false};
    set_field(m.bytes, f, v);
    m.what = "set " + f.name + " (" + std::to_string(f.width) + " bytes " + (f.big_endian ? "BE" : "LE") + " at " +
             std::to_string(f.offset) + ") from " + hex(get_field(valid_, f)) + " to " + hex(v);
    return m;
  }

  Mutant extreme_field() {
    const Field& f = fields_[size_t(below(fields_.size()))];
    std::vector<uint64_t> values = extremes(f);
    std::erase(values, get_field(valid_, f));  // a mutant must differ from the original
    return with_field(f, values[size_t(below(values.size()))]);
  }

  Mutant insert() {
    static const std::vector<std::string> pieces = {std::string(1, '\0'), "\xff", "%\n", "\n%", "%", "\r\n",
                                                    std::string(4, '\xff'), std::string(8, '\0')};
    const std::string& p = pieces[size_t(below(pieces.size()))];
    const size_t at = size_t(below(valid_.size() + 1));
    Mutant m{valid_, "", false};
    m.bytes.insert(at, p);
    m.what = "inserted " + std::to_string(p.size()) + " bytes (first " + hex(uint8_t(p[0])) + ") at " + std::to_string(at);
    return m;
  }

  Mutant append() {
    const size_t n = 1 + size_t(below(16));
    Mutant m{valid_, "", false};
    for (size_t k = 0; k < n; ++k) m.bytes += char(below(256));
    m.what = "appended " + std::to_string(n) + " random bytes";
    return m;
  }

  std::string valid_;
  size_t header_end_;
  std::vector<Field> fields_;
  std::mt19937_64 rng_;
};

struct Outcomes {
  int errors = 0;
  int valid = 0;
};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Runs one read of a mutant. A reel::Error must name the reader and `names_file` (a file or folder);
// on_error then checks what the failure must not have changed, on_valid the result (outside the
// try, so that nothing the check itself throws passes for the reader's error).
template <typename Read, typename OnValid, typename OnError>
void try_mutant(const Mutant& m, const std::string& reader, const std::string& names_file, Outcomes& out, Read&& read,
                OnValid&& on_valid, OnError&& on_error) {
  std::optional<decltype(read())> result;
  try {
    result.emplace(read());
  } catch (const InternalError& e) {
    ADD_FAILURE() << reader << ": internal error (a bug in reel) for mutant [" << m.what << "]: " << e.what();
  } catch (const Error& e) {
    ++out.errors;
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, reader) && contains(msg, names_file))
        << "the error does not name " << reader << " and " << names_file << " for mutant [" << m.what << "]: " << msg;
    on_error();
  } catch (const std::exception& e) {
    ADD_FAILURE() << reader << ": threw a " << typeid(e).name() << " instead of reel::Error for mutant [" << m.what
                  << "]: " << e.what();
  } catch (...) {
    ADD_FAILURE() << reader << ": threw a non-std exception for mutant [" << m.what << "]";
  }
  if (result) {
    ++out.valid;
    on_valid(*result);
  }
}

// ---- idx ----

void put_u32_be(std::string& s, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) s += char((v >> shift) & 0xff);
}

std::string idx_bytes(uint32_t magic, const std::vector<uint32_t>& dims, std::mt19937_64& rng) {
  std::string s;
  put_u32_be(s, magic);
  size_t n = 1;
  for (uint32_t d : dims) put_u32_be(s, d), n *= d;
  for (size_t k = 0; k < n; ++k) s += char(rng() & 0xff);
  return s;
}

std::vector<Field> idx_fields(size_t ndims) {
  std::vector<Field> f = {{"magic", 0, 4, true}, {"type byte", 2, 1, true}, {"ndims byte", 3, 1, true}};
  for (size_t d = 0; d < ndims; ++d) f.push_back({"dims[" + std::to_string(d) + "]", 4 + 4 * d, 4, true});
  return f;
}

// What a successful read_idx of the plain file `b` must return: the header's sizes (dim 0 cut to
// `limit`), the data right after the header, and with no limit exactly as many bytes as declared.
void check_idx_result(const data::IdxArray& a, const std::string& b, uint32_t magic, int64_t limit, const Mutant& m) {
  SCOPED_TRACE("mutant [" + m.what + "], limit " + std::to_string(limit));
  ASSERT_GE(b.size(), 4u) << "read a file without a whole magic";
  const Field magic_field{"magic", 0, 4, true};
  ASSERT_EQ(get_field(b, magic_field), magic) << "accepted a wrong magic";
  const size_t ndims = magic & 0xff, header = 4 + 4 * ndims;
  ASSERT_GE(b.size(), header) << "accepted a cut header";
  ASSERT_EQ(a.dims.size(), ndims);
  uint64_t item = 1;
  for (size_t d = 0; d < ndims; ++d) {
    const int64_t declared = int64_t(get_field(b, {"", 4 + 4 * d, 4, true}));
    if (d == 0) {
      EXPECT_EQ(a.dims[0], limit >= 0 ? std::min(declared, limit) : declared);
    } else {
      EXPECT_EQ(a.dims[d], declared);
      item *= uint64_t(declared);
    }
  }
  const uint64_t want = uint64_t(a.dims[0]) * item;
  ASSERT_EQ(a.bytes.size(), want) << "the data does not match the sizes returned";
  if (limit < 0) {
    EXPECT_EQ(b.size(), header + want) << "accepted a file whose size disagrees with its header";
  }
  ASSERT_GE(b.size(), header + want);
  EXPECT_EQ(0, std::memcmp(a.bytes.data(), b.data() + header, want)) << "the data is not the file's";
}

// A plain idx file and its mutants, each read whole and with a limit of one item.
Outcomes fuzz_plain_idx(const TempDir& dir, const std::string& name, uint32_t magic, const std::vector<uint32_t>& dims,
                        int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::string valid = idx_bytes(magic, dims, rng);
  const std::string path = dir.file(name);
  write_file_atomically(path, valid, "test");
  EXPECT_EQ(data::read_idx(path, magic).bytes.size(), valid.size() - 4 - 4 * dims.size()) << "the original must read";
  Mutator mutator(valid, 4 + 4 * dims.size(), idx_fields(dims.size()), seed + 1);
  std::vector<Mutant> mutants = mutator.all_field_extremes(), cuts = mutator.all_truncations();
  mutants.insert(mutants.end(), cuts.begin(), cuts.end());
  for (int i = 0; i < count; ++i) mutants.push_back(mutator.make(i));
  Outcomes out;
  for (const Mutant& m : mutants) {
    write_plain(path, m.bytes);
    for (int64_t limit : {int64_t(-1), int64_t(1)}) {
      try_mutant(
          m, "read_idx", path, out, [&] { return data::read_idx(path, magic, limit); },
          [&](const data::IdxArray& a) { check_idx_result(a, m.bytes, magic, limit, m); }, [] {});
    }
  }
  return out;
}

std::string gzip_bytes(const std::string& path, const std::string& plain) {
  gzFile f = gzopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr);
  if (!f) return "";
  EXPECT_EQ(gzwrite(f, plain.data(), unsigned(plain.size())), int(plain.size()));
  gzclose(f);
  return read_whole(path);
}

// ---- state_dict ----

// Where each field of a state_dict file lies (see nn/state_dict.h for the format), parsed here
// independently of the library; nullopt for a file that is not well formed.
struct EntryLayout {
  std::string name;
  uint8_t dtype;
  std::vector<int64_t> shape;
  size_t name_len_at, dtype_at, ndim_at, shape_at, nbytes_at, data_at;
  uint64_t nbytes;
};

std::optional<std::vector<EntryLayout>> state_dict_layout(const std::string& b) {
  if (b.size() < 24 || b.compare(0, 8, "REELSD01") != 0) return std::nullopt;
  const size_t end = b.size() - 8;
  size_t pos = 8;
  auto get = [&](int width, uint64_t& v) {
    if (end - pos < size_t(width)) return false;
    v = get_field(b, {"", pos, width, false});
    pos += size_t(width);
    return true;
  };
  uint64_t count = 0;
  if (!get(8, count)) return std::nullopt;
  std::vector<EntryLayout> entries;
  for (uint64_t i = 0; i < count; ++i) {
    EntryLayout e{};
    uint64_t v = 0;
    e.name_len_at = pos;
    if (!get(4, v) || end - pos < v) return std::nullopt;
    e.name = b.substr(pos, size_t(v));
    pos += size_t(v);
    e.dtype_at = pos;
    if (!get(1, v)) return std::nullopt;
    e.dtype = uint8_t(v);
    e.ndim_at = pos;
    if (!get(4, v) || v > 16) return std::nullopt;
    e.shape_at = pos;
    for (uint64_t d = 0, ndim = v; d < ndim; ++d) {
      if (!get(8, v)) return std::nullopt;
      e.shape.push_back(int64_t(v));
    }
    e.nbytes_at = pos;
    if (!get(8, e.nbytes) || end - pos < e.nbytes) return std::nullopt;
    e.data_at = pos;
    pos += size_t(e.nbytes);
    entries.push_back(e);
  }
  if (pos != end) return std::nullopt;
  return entries;
}

std::vector<Field> state_dict_fields(const std::vector<EntryLayout>& entries, size_t checksum_at) {
  std::vector<Field> f = {{"magic", 0, 8, false}, {"count", 8, 8, false}, {"checksum", checksum_at, 8, false}};
  for (const auto& e : entries) {
    f.push_back({e.name + ".name_len", e.name_len_at, 4, false});
    f.push_back({e.name + ".dtype", e.dtype_at, 1, false});
    f.push_back({e.name + ".ndim", e.ndim_at, 4, false});
    for (size_t d = 0; d < e.shape.size(); ++d) f.push_back({e.name + ".shape[" + std::to_string(d) + "]", e.shape_at + 8 * d, 8, false});
    f.push_back({e.name + ".nbytes", e.nbytes_at, 8, false});
  }
  return f;
}

// Every state tensor's name, dtype, shape and bytes: compared to the bit.
struct StateImage {
  std::string name;
  DType dtype;
  Shape shape;
  std::string bits;
  bool operator==(const StateImage&) const = default;
};

std::vector<StateImage> state_image(const nn::Module& m) {
  std::vector<StateImage> out;
  for (const auto& [name, t] : m.named_state()) {
    const Tensor c = t.contiguous();
    out.push_back({name, c.dtype(), c.shape(), std::string(static_cast<const char*>(c.data_ptr()), c.nbytes())});
  }
  return out;
}

// Writes a new checksum over the mutated bytes, so that the mutant reaches the structure checks
// behind it instead of stopping at the checksum.
void reseal(std::string& b) {
  if (b.size() < 8) return;
  const uint64_t h = nn::fnv1a64(b.data(), b.size() - 8);
  std::memcpy(b.data() + b.size() - 8, &h, 8);
}

// ---- text ----

// The fortune reader's documented transformation: a line holding only "%" becomes an empty line.
std::string without_separator_lines(const std::string& text) {
  std::string out;
  for (size_t pos = 0; pos < text.size();) {
    const size_t nl = text.find('\n', pos);
    const size_t end = nl == std::string::npos ? text.size() : nl + 1;
    const std::string line = text.substr(pos, end - pos);
    out += (line == "%\n" || line == "%") ? std::string("\n") : line;
    pos = end;
  }
  return out;
}

// Separator lines, CRLF, bytes past ASCII, a NUL and no final newline: what a corpus may hold.
const std::string kCorpus =
    "A fortune.\n%\nAnother, with\r\nCRLF and a tab\t.\n%\nbytes past ASCII: \xc3\xa9 \xff\xfe and a NUL \0 inside.\n%\n"
    "no trailing newline"s;

}  // namespace

// ---------------------------------------------------------------------------------------------

TEST(ReaderFuzz, IdxFilesReadWhollyOrFailNamingTheFile) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const Outcomes images = fuzz_plain_idx(dir, "images-idx3-ubyte", 2051, {5, 4, 3}, 200, kSeed);
  const Outcomes labels = fuzz_plain_idx(dir, "labels-idx1-ubyte", 2049, {7}, 100, kSeed + 10);
  std::cout << "[ fuzz     ] idx images: " << images.errors << " errors, " << images.valid << " valid; labels: "
            << labels.errors << " errors, " << labels.valid << " valid\n";
  // Flips inside the pixel data leave a valid file, cuts and size changes do not.
  EXPECT_GT(images.errors, 0);
  EXPECT_GT(images.valid, 0);
  EXPECT_GT(labels.errors, 0);
  EXPECT_GT(labels.valid, 0);
}

// The same reader over gzip: zlib's CRC and length trailer guard the data, so a mutant that reads
// must give exactly the original content, and a cut file (whatever it cut) is an error.
TEST(ReaderFuzz, GzippedIdxFilesReadWhollyOrFailNamingTheFile) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  std::mt19937_64 rng(kSeed + 20);
  const std::string plain = idx_bytes(2051, {6, 5, 4}, rng);
  const std::string path = dir.file("images-idx3-ubyte.gz");
  const std::string gz = gzip_bytes(path, plain);
  ASSERT_GT(gz.size(), 18u);
  ASSERT_EQ(data::read_idx(path, 2051).bytes.size(), plain.size() - 16);
  // The gzip header is 10 bytes; its fields (method, flags, mtime, OS) and the 8-byte trailer
  // (CRC32 and length of the content) are what a header-field mutation can hit.
  const std::vector<Field> fields = {{"gzip method", 2, 1, false},
                                     {"gzip flags", 3, 1, false},
                                     {"gzip mtime", 4, 4, false},
                                     {"gzip OS", 9, 1, false},
                                     {"gzip CRC32", gz.size() - 8, 4, false},
                                     {"gzip ISIZE", gz.size() - 4, 4, false}};
  Mutator mutator(gz, 10, fields, kSeed + 21);
  std::vector<Mutant> mutants = mutator.all_field_extremes(), cuts = mutator.all_truncations();
  mutants.insert(mutants.end(), cuts.begin(), cuts.end());
  for (int i = 0; i < 150; ++i) mutants.push_back(mutator.make(i));
  // Without its trailer nothing checks the compressed data: a flipped bit there must still be
  // caught, as the missing trailer itself must.
  for (int k = 0; k < 8; ++k) {
    const size_t at = 10 + size_t(rng() % (gz.size() - 18));
    Mutant m{gz.substr(0, gz.size() - 8), "trailer removed and byte " + std::to_string(at) + " ^= 0x1", true};
    m.bytes[at] = char(uint8_t(m.bytes[at]) ^ 1);
    mutants.push_back(m);
  }
  Outcomes out;
  for (const Mutant& m : mutants) {
    write_plain(path, m.bytes);
    try_mutant(
        m, "read_idx", path, out, [&] { return data::read_idx(path, 2051); },
        [&](const data::IdxArray& a) {
          EXPECT_FALSE(m.truncated) << "a cut .gz read as valid: mutant [" << m.what << "]";
          EXPECT_EQ(a.dims, (std::vector<int64_t>{6, 5, 4})) << "mutant [" << m.what << "]";
          EXPECT_TRUE(a.bytes.size() == plain.size() - 16 && std::memcmp(a.bytes.data(), plain.data() + 16, a.bytes.size()) == 0)
              << "the data is not the original's: mutant [" << m.what << "]";
        },
        [] {});
  }
  std::cout << "[ fuzz     ] idx gzip: " << out.errors << " errors, " << out.valid << " valid\n";
  EXPECT_GT(out.errors, 0);
}

TEST(ReaderFuzz, TextFilesReadAsTheirBytesOrFailNamingTheFile) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string path = dir.file("corpus.txt");
  write_file_atomically(path, kCorpus, "test");
  ASSERT_EQ(data::tensor_to_bytes(data::load_text_bytes(path)), kCorpus);
  // No header: the "header" for truncation classes is the first line.
  Mutator mutator(kCorpus, kCorpus.find('\n'), {}, kSeed + 30);
  std::vector<Mutant> mutants = mutator.all_truncations();
  for (int i = 0; i < 200; ++i) mutants.push_back(mutator.make(i));
  Outcomes out;
  for (const Mutant& m : mutants) {
    write_plain(path, m.bytes);
    try_mutant(
        m, "load_text_bytes", path, out, [&] { return data::load_text_bytes(path); },
        [&](const Tensor& t) {
          ASSERT_EQ(t.dtype(), DType::i64) << "mutant [" << m.what << "]";
          ASSERT_EQ(t.shape(), (Shape{int64_t(m.bytes.size())})) << "mutant [" << m.what << "]";
          const std::vector<int64_t> v = t.to_vector<int64_t>();
          for (size_t k = 0; k < v.size(); ++k)
            ASSERT_EQ(v[k], int64_t(uint8_t(m.bytes[k]))) << "byte " << k << " of mutant [" << m.what << "]";
        },
        [&] { EXPECT_TRUE(m.bytes.empty()) << "only an empty file is refused: mutant [" << m.what << "]"; });
  }
  std::cout << "[ fuzz     ] load_text_bytes: " << out.errors << " errors, " << out.valid << " valid\n";
  EXPECT_GT(out.errors, 0);
  EXPECT_GT(out.valid, 0);
}

// The fortunes reader over a folder of one fortune file (and a strfile index it must skip).
TEST(ReaderFuzz, FortuneFilesReadWithSeparatorsRemovedOrFailNamingTheFolder) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string path = dir.file("fortunes");
  write_file_atomically(path, kCorpus, "test");
  write_file_atomically(dir.file("fortunes.dat"), std::string("\0\0\0\2not text", 12), "test");
  ASSERT_EQ(data::read_fortunes(dir.path()), without_separator_lines(kCorpus));
  Mutator mutator(kCorpus, kCorpus.find('\n'), {}, kSeed + 40);
  std::vector<Mutant> mutants = mutator.all_truncations();
  for (int i = 0; i < 100; ++i) mutants.push_back(mutator.make(i));
  Outcomes out;
  for (const Mutant& m : mutants) {
    write_plain(path, m.bytes);
    try_mutant(
        m, "load_fortunes", dir.path(), out, [&] { return data::read_fortunes(dir.path()); },
        [&](const std::string& text) {
          EXPECT_EQ(text, without_separator_lines(m.bytes)) << "mutant [" << m.what << "]";
        },
        [&] { EXPECT_TRUE(m.bytes.empty()) << "only an empty file is refused: mutant [" << m.what << "]"; });
  }
  std::cout << "[ fuzz     ] read_fortunes: " << out.errors << " errors, " << out.valid << " valid\n";
  EXPECT_GT(out.errors, 0);
  EXPECT_GT(out.valid, 0);
}

// Half the mutants get a fresh checksum, so that they get past it to the structure and key checks.
TEST(ReaderFuzz, CheckpointsLoadWhollyOrLeaveTheModuleUntouched) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  Generator gen(kSeed);
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Linear>(3, 4, true, &gen));
  model->push_back(std::make_shared<nn::BatchNorm2d>(4));
  auto extra = std::make_shared<nn::Module>("Extra");  // the other dtypes, and a 0-dim tensor
  extra->register_parameter("scale", Tensor::from_vector<double>({0.5, -2.0}, {2}));
  extra->register_buffer("steps", Tensor::from_vector<int64_t>({7}, {}));
  model->push_back(extra);

  const std::string path = dir.file("model.ckpt");
  nn::save_state_dict(*model, path);
  const std::string valid = read_whole(path);
  const std::optional<std::vector<EntryLayout>> layout = state_dict_layout(valid);
  ASSERT_TRUE(layout.has_value()) << "the test's reading of the format disagrees with the writer's";
  ASSERT_EQ(layout->size(), model->named_state().size());
  const std::vector<StateImage> expected_structure = state_image(*model);
  Mutator mutator(valid, layout->front().data_at, state_dict_fields(*layout, valid.size() - 8), kSeed + 50);
  // Every field extreme both as written and resealed; random mutants resealed on a coin flip.
  std::vector<std::pair<Mutant, bool>> mutants;
  for (const Mutant& m : mutator.all_field_extremes())
    for (bool resealed : {false, true}) mutants.emplace_back(m, resealed);
  for (const Mutant& m : mutator.all_truncations())
    for (bool resealed : {false, true}) mutants.emplace_back(m, resealed);
  std::mt19937_64 coin(kSeed + 51);
  for (int i = 0; i < 200; ++i) mutants.emplace_back(mutator.make(i), bool(coin() & 1));

  Outcomes out;
  int resealed_valid = 0;
  for (auto& [m, resealed] : mutants) {
    if (resealed) {
      reseal(m.bytes);
      m.what += ", checksum resealed";
    }
    write_plain(path, m.bytes);
    const std::vector<StateImage> before = state_image(*model);
    try_mutant(
        m, "load_state_dict", path, out,
        [&] {
          nn::load_state_dict(*model, path);
          return true;
        },
        [&](bool) {
          resealed_valid += resealed;
          EXPECT_TRUE(resealed || m.bytes == valid) << "loaded a file that fails its checksum: mutant [" << m.what << "]";
          const std::vector<StateImage> after = state_image(*model);
          const std::optional<std::vector<EntryLayout>> got = state_dict_layout(m.bytes);
          ASSERT_TRUE(got.has_value()) << "loaded a malformed file: mutant [" << m.what << "]";
          ASSERT_EQ(after.size(), expected_structure.size());
          std::map<std::string, const EntryLayout*> by_name;
          for (const auto& e : *got) by_name[e.name] = &e;
          for (size_t k = 0; k < after.size(); ++k) {
            SCOPED_TRACE(after[k].name + " of mutant [" + m.what + "]");
            EXPECT_EQ(after[k].name, expected_structure[k].name);
            EXPECT_EQ(after[k].dtype, expected_structure[k].dtype);
            EXPECT_EQ(after[k].shape, expected_structure[k].shape);
            ASSERT_TRUE(by_name.count(after[k].name));
            const EntryLayout& e = *by_name[after[k].name];
            EXPECT_EQ(after[k].bits, m.bytes.substr(e.data_at, size_t(e.nbytes))) << "the values are not the file's";
          }
        },
        [&] { EXPECT_TRUE(state_image(*model) == before) << "a failed load changed the module: mutant [" << m.what << "]"; });
  }
  std::cout << "[ fuzz     ] load_state_dict: " << out.errors << " errors, " << out.valid << " valid (" << resealed_valid
            << " of them resealed)\n";
  EXPECT_GT(out.errors, 0);
  EXPECT_GT(resealed_valid, 0) << "no resealed mutant loaded: the structure checks were never passed";
}
