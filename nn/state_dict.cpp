// state_dict save/load (the file format is documented in state_dict.h).
#include "nn/state_dict.h"

#include <bit>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>

#include "autograd/grad_mode.h"
#include "tensor/file_io.h"

namespace reel::nn {

static_assert(std::endian::native == std::endian::little, "state_dict: the format is little-endian");

namespace {

constexpr char kMagic[8] = {'R', 'E', 'E', 'L', 'S', 'D', '0', '1'};

uint8_t dtype_code(DType t) { return uint8_t(t); }  // enum order f32 f64 f16 bf16 i64 is the file's

template <typename T>
void put(std::string& buf, T v) {
  buf.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// One parsed entry, pointing into the file's bytes.
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  const char* data;
  uint64_t nbytes;
};

// Bounds-checked reader over the file's bytes; running past the end means the file is truncated.
class Reader {
 public:
  Reader(const std::string& bytes, size_t end, const std::string& path) : b_(bytes), end_(end), path_(path) {}
  template <typename T>
  T get(const char* what) {
    T v;
    std::memcpy(&v, take(sizeof(T), what), sizeof(T));
    return v;
  }
  const char* take(uint64_t n, const char* what) {
    REEL_CHECK(n <= end_ - pos_, "load_state_dict: '", path_, "' is truncated (reading ", what, " at byte ", pos_,
               " needs ", n, " bytes, ", end_ - pos_, " left)");
    const char* p = b_.data() + pos_;
    pos_ += n;
    return p;
  }
  size_t pos() const { return pos_; }

 private:
  const std::string& b_;
  size_t end_, pos_ = 0;
  const std::string& path_;
};

Entry read_entry(Reader& r, const std::string& path) {
  Entry e;
  uint32_t name_len = r.get<uint32_t>("a name length");
  e.name.assign(r.take(name_len, "a name"), name_len);
  uint8_t code = r.get<uint8_t>("a dtype");
  REEL_CHECK(code <= uint8_t(DType::i64), "load_state_dict: '", path, "' entry '", e.name, "' has unknown dtype code ",
             int(code));
  e.dtype = DType(code);
  uint32_t ndim = r.get<uint32_t>("a rank");
  REEL_CHECK(ndim <= 16, "load_state_dict: '", path, "' entry '", e.name, "' has implausible rank ", ndim);
  for (uint32_t d = 0; d < ndim; ++d) {
    e.shape.push_back(r.get<int64_t>("a shape"));
    REEL_CHECK(e.shape.back() >= 0, "load_state_dict: '", path, "' entry '", e.name, "' has a negative size");
  }
  e.nbytes = r.get<uint64_t>("a byte length");
  // The size the shape needs, checked here so that a shape whose product overflows is reported with
  // the file and entry (numel_of would say only "more than 2^63 - 1 elements").
  int64_t need = int64_t(dtype_size(e.dtype));
  for (int64_t d : e.shape)
    REEL_CHECK(!__builtin_mul_overflow(need, d, &need), "load_state_dict: '", path, "' entry '", e.name, "' has shape ",
               shape_str(e.shape), ", more bytes than a file can hold");
  REEL_CHECK(e.nbytes == uint64_t(need), "load_state_dict: '", path, "' entry '", e.name, "' holds ", e.nbytes,
             " bytes, but ", dtype_name(e.dtype), " ", shape_str(e.shape), " needs ", need);
  e.data = r.take(e.nbytes, "tensor data");
  return e;
}

// Magic, structure, checksum: everything that can be checked without the module.
std::vector<Entry> parse(const std::string& bytes, const std::string& path) {
  REEL_CHECK(bytes.size() >= 8 && std::memcmp(bytes.data(), kMagic, 8) == 0, "load_state_dict: '", path,
             "' is not a reel state_dict file (bad magic; expected \"REELSD01\")");
  REEL_CHECK(bytes.size() >= 24, "load_state_dict: '", path, "' is truncated (", bytes.size(), " bytes)");
  size_t body = bytes.size() - 8;  // the checksum's position, if the file is whole
  Reader r(bytes, body, path);
  r.take(8, "the magic");
  uint64_t count = r.get<uint64_t>("the entry count");
  std::vector<Entry> entries;
  for (uint64_t i = 0; i < count; ++i) entries.push_back(read_entry(r, path));
  REEL_CHECK(r.pos() == body, "load_state_dict: '", path, "' has ", body - r.pos(),
             " unexpected bytes after its last entry");
  uint64_t stored;
  std::memcpy(&stored, bytes.data() + body, 8);
  REEL_CHECK(stored == fnv1a64(bytes.data(), body), "load_state_dict: '", path,
             "' failed its checksum (the file is corrupt)");
  return entries;
}

// Every key, dtype and shape against the module; throws before anything is modified.
void check_against(const NamedTensors& state, const std::map<std::string, const Entry*>& by_name,
                   const std::string& path) {
  std::string missing;
  for (const auto& [name, t] : state) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      missing += (missing.empty() ? "" : ", ") + name;
      continue;
    }
    const Entry& e = *it->second;
    REEL_CHECK(e.shape == t.shape(), "load_state_dict: '", path, "' key '", name, "' has shape ", shape_str(e.shape),
               ", the module expects ", shape_str(t.shape()));
    REEL_CHECK(e.dtype == t.dtype(), "load_state_dict: '", path, "' key '", name, "' has dtype ",
               dtype_name(e.dtype), ", the module expects ", dtype_name(t.dtype()));
  }
  REEL_CHECK(missing.empty(), "load_state_dict: '", path, "' lacks keys the module has: ", missing);
  if (by_name.size() == state.size()) return;
  std::map<std::string, bool> known;
  for (const auto& [name, t] : state) known[name] = true;
  std::string extra;
  for (const auto& [name, e] : by_name)
    if (!known.count(name)) extra += (extra.empty() ? "" : ", ") + name;
  REEL_CHECK(false, "load_state_dict: '", path, "' has keys the module lacks: ", extra);
}

}  // namespace

uint64_t fnv1a64(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

void save_state_dict(const Module& module, const std::string& path) {
  NamedTensors state = module.named_state();
  std::string buf(kMagic, 8);
  put<uint64_t>(buf, state.size());
  for (const auto& [name, t] : state) {
    Tensor host = t.detach().cpu().contiguous();
    put<uint32_t>(buf, uint32_t(name.size()));
    buf += name;
    put<uint8_t>(buf, dtype_code(host.dtype()));
    put<uint32_t>(buf, uint32_t(host.dim()));
    for (int64_t s : host.shape()) put<int64_t>(buf, s);
    put<uint64_t>(buf, host.nbytes());
    buf.append(static_cast<const char*>(host.data_ptr()), host.nbytes());
  }
  put<uint64_t>(buf, fnv1a64(buf.data(), buf.size()));

  write_file_atomically(path, buf, "save_state_dict");
}

void load_state_dict(Module& module, const std::string& path) {
  std::string bytes = read_file(path, "load_state_dict");
  std::vector<Entry> entries = parse(bytes, path);
  std::map<std::string, const Entry*> by_name;
  for (const auto& e : entries) {
    REEL_CHECK(by_name.emplace(e.name, &e).second, "load_state_dict: '", path, "' has key '", e.name, "' twice");
  }
  NamedTensors state = module.named_state();
  check_against(state, by_name, path);

  NoGradGuard guard;
  for (const auto& [name, t] : state) {
    const Entry& e = *by_name.at(name);
    Tensor host = Tensor::empty(e.shape, e.dtype);
    if (e.nbytes) std::memcpy(host.data_ptr(), e.data, e.nbytes);
    copy_(t, t.device().is_cpu() ? host : host.to(t.device()));
  }
}

}  // namespace reel::nn
