// safetensors read, write, save and load (the format and the checks are documented in safetensors.h).
// The header is JSON, parsed and written with nlohmann::json; everything about the bytes around it
// (the length, the ranges, the tiling of the data section) is checked here.
#include "nn/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>
#include <set>
#include <vector>

#include "autograd/grad_mode.h"
#include "nn/state_dict.h"
#include "tensor/file_io.h"

namespace reel::nn {

static_assert(std::endian::native == std::endian::little, "safetensors: the format is little-endian");

namespace {

// ordered_json keeps the header's key order: the order read_safetensors returns the tensors in.
using Json = nlohmann::ordered_json;

// The reference reader's limit too: a larger "length" is a corrupt file or not a safetensors file,
// and refusing it early keeps a bad file from asking for gigabytes.
constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;
constexpr const char* kMetadataKey = "__metadata__";
// A problem list in an error stops after this many names, then says how many more.
constexpr size_t kListedKeys = 16;

struct DTypeCode {
  const char* name;
  DType dtype;
};
constexpr DTypeCode kDTypes[] = {
    {"F32", DType::f32}, {"F64", DType::f64}, {"F16", DType::f16}, {"BF16", DType::bf16}, {"I64", DType::i64}};
// The format's other dtypes: named apart from unknown strings, so that a file of, say, int32 ids is
// reported as a dtype reel lacks rather than as a corrupt file.
constexpr const char* kOtherDTypes[] = {"BOOL", "U8",      "I8",      "I16",     "U16", "I32",     "U32",    "U64",
                                        "F8_E5M2", "F8_E4M3", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64"};

const char* dtype_string(DType t) {
  for (const auto& d : kDTypes)
    if (d.dtype == t) return d.name;
  throw InternalError("safetensors: no format name for a reel dtype");
}

// One tensor of a checked header; its bytes are [begin, end) of the data section.
struct Entry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

struct Header {
  std::vector<Entry> entries;  // the header's order
  std::map<std::string, std::string> metadata;
  size_t data_start = 0;  // 8 + the header length
};

// A JSON value in an error message, cut short: a header can be 100 MiB.
std::string brief(const Json& v) {
  std::string s = v.dump();
  return s.size() <= 60 ? s : s.substr(0, 57) + "...";
}

std::string join(const std::vector<std::string>& items) {
  std::string s;
  for (size_t i = 0; i < items.size() && i < kListedKeys; ++i) s += (i ? ", " : "") + items[i];
  if (items.size() > kListedKeys) s += detail::cat(" and ", items.size() - kListedKeys, " more");
  return s;
}

uint64_t header_length(const std::string& bytes, const std::string& where) {
  REEL_CHECK(bytes.size() >= 8, where, " is truncated: ", bytes.size(),
             " bytes, fewer than the 8 of the header length");
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  REEL_CHECK(n <= kMaxHeaderBytes, where, " has a header length of ", n, " bytes, above the limit of ",
             kMaxHeaderBytes, " (100 MiB): a corrupt file, or not a safetensors file");
  REEL_CHECK(n <= bytes.size() - 8, where, " has a header length of ", n, " bytes, past the end of the file (",
             bytes.size() - 8, " bytes follow the length): the file is truncated or not a safetensors file");
  return n;
}

// The header as JSON. nlohmann keeps the last of two equal keys silently; the format allows one
// entry per name, so the parse events are watched for a key seen twice in one object.
Json parse_json(const char* p, size_t n, const std::string& where) {
  std::vector<std::set<std::string>> open;  // the keys of each object being parsed, innermost last
  std::string twice;
  auto watch = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) open.emplace_back();
    else if (event == Json::parse_event_t::object_end) open.pop_back();
    else if (event == Json::parse_event_t::key && !open.empty() && !open.back().insert(parsed.get<std::string>()).second &&
             twice.empty())
      twice = parsed.get<std::string>();
    return true;
  };
  Json j;
  try {
    j = Json::parse(p, p + n, watch);
  } catch (const nlohmann::json::exception& e) {
    throw Error(detail::cat(where, " has a header that is not valid JSON (", n, " bytes): ", e.what()));
  }
  REEL_CHECK(twice.empty(), where, " has the key '", twice, "' twice in one object of its header");
  REEL_CHECK(j.is_object(), where, " has a header that is not a JSON object: ", brief(j));
  return j;
}

std::map<std::string, std::string> read_metadata(const Json& v, const std::string& where) {
  REEL_CHECK(v.is_object(), where, ": \"__metadata__\" must be an object of strings, got ", brief(v));
  std::map<std::string, std::string> m;
  for (const auto& [key, value] : v.items()) {
    REEL_CHECK(value.is_string(), where, ": \"__metadata__\" key '", key, "' must hold a string, got ", brief(value));
    m[key] = value.get<std::string>();
  }
  return m;
}

// A non-negative integer of the header (a JSON integer: not 2.0, not -1).
uint64_t read_uint(const Json& v, const std::string& at, const char* field) {
  REEL_CHECK(!(v.is_number_integer() && !v.is_number_unsigned()), at, " has a negative number in its ", field, ": ",
             brief(v));
  REEL_CHECK(v.is_number_unsigned(), at, " has a ", field, " entry that is not a non-negative integer: ", brief(v));
  return v.get<uint64_t>();
}

DType read_dtype(const Json& v, const std::string& at) {
  REEL_CHECK(v.is_string(), at, " has a dtype that is not a string: ", brief(v));
  const std::string& s = v.get_ref<const std::string&>();
  for (const auto& d : kDTypes)
    if (s == d.name) return d.dtype;
  const bool known = std::any_of(std::begin(kOtherDTypes), std::end(kOtherDTypes), [&](const char* o) { return s == o; });
  REEL_CHECK(!known, at, " has dtype \"", s,
             "\", which reel does not hold (it reads F32, F64, F16, BF16 and I64: convert the tensor first)");
  throw Error(detail::cat(at, " has unknown dtype \"", s, "\" (safetensors dtypes reel reads: F32, F64, F16, BF16, I64)"));
}

Entry read_entry(const std::string& name, const Json& v, const std::string& where) {
  const std::string at = detail::cat(where, " key '", name, "'");
  REEL_CHECK(v.is_object(), at, " is not an object of dtype, shape and data_offsets: ", brief(v));
  for (const char* field : {"dtype", "shape", "data_offsets"})
    REEL_CHECK(v.contains(field), at, " lacks \"", field, "\"");
  Entry e;
  e.name = name;
  e.dtype = read_dtype(v["dtype"], at);
  const Json& shape = v["shape"];
  REEL_CHECK(shape.is_array(), at, " has a shape that is not a list of integers: ", brief(shape));
  for (const Json& s : shape) {
    const uint64_t size = read_uint(s, at, "shape");
    REEL_CHECK(size <= uint64_t(std::numeric_limits<int64_t>::max()), at, " has a size of ", size, " in its shape");
    e.shape.push_back(int64_t(size));
  }
  const Json& offsets = v["data_offsets"];
  REEL_CHECK(offsets.is_array() && offsets.size() == 2, at, " has data_offsets that are not [begin, end]: ",
             brief(offsets));
  e.begin = read_uint(offsets[0], at, "data_offsets");
  e.end = read_uint(offsets[1], at, "data_offsets");
  REEL_CHECK(e.begin <= e.end, at, " has data_offsets [", e.begin, ", ", e.end, "] that end before they begin");
  // The bytes the shape needs, without wrapping: a product that overflows is an error of its own.
  uint64_t need = dtype_size(e.dtype);
  for (int64_t s : e.shape)
    REEL_CHECK(!__builtin_mul_overflow(need, uint64_t(s), &need), at, " has shape ", shape_str(e.shape),
               ", more bytes than a file can hold");
  REEL_CHECK(need == e.end - e.begin, at, " is ", dtype_string(e.dtype), " of shape ", shape_str(e.shape), ", which needs ",
             need, " bytes, but its data_offsets [", e.begin, ", ", e.end, "] span ", e.end - e.begin);
  return e;
}

// The ranges must lie inside the data section and tile it exactly.
void check_layout(const std::vector<Entry>& entries, uint64_t data_size, const std::string& where) {
  // Bounds first: a truncated file is reported as such rather than as a gap or an overlap.
  for (const Entry& e : entries)
    REEL_CHECK(e.end <= data_size, where, " key '", e.name, "' has data_offsets [", e.begin, ", ", e.end,
               "] past the end of the data section (", data_size, " bytes): the file is truncated or its offsets are wrong");
  std::vector<const Entry*> order;
  for (const Entry& e : entries) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry* e : order) {
    REEL_CHECK(e->begin >= pos, where, " key '", e->name, "' (data_offsets [", e->begin, ", ", e->end,
               "]) overlaps key '", prev->name, "' ([", prev->begin, ", ", prev->end, "])");
    REEL_CHECK(e->begin == pos, where, " has a gap: bytes [", pos, ", ", e->begin,
               ") of the data section belong to no tensor (the next is key '", e->name, "')");
    pos = e->end;
    prev = e;
  }
  REEL_CHECK(pos == data_size, where, " has a gap: the data section holds ", data_size, " bytes, its tensors cover ",
             pos, " (", data_size - pos, " bytes after the last one)");
}

// Everything that can be checked without a module; `where` opens every error ("read_safetensors: 'f'").
Header parse(const std::string& bytes, const std::string& where) {
  const uint64_t n = header_length(bytes, where);
  const Json j = parse_json(bytes.data() + 8, n, where);
  Header h;
  h.data_start = size_t(8 + n);
  for (const auto& [key, value] : j.items()) {
    if (key == kMetadataKey) h.metadata = read_metadata(value, where);
    else h.entries.push_back(read_entry(key, value, where));
  }
  check_layout(h.entries, bytes.size() - h.data_start, where);
  return h;
}

Tensor host_tensor(const Entry& e, const std::string& bytes, size_t data_start) {
  Tensor t = Tensor::empty(e.shape, e.dtype);
  if (e.end > e.begin) std::memcpy(t.data_ptr(), bytes.data() + data_start + e.begin, e.end - e.begin);
  return t;
}

// The header's JSON: metadata first (when any), then the tensors in the caller's order.
std::string header_json(const NamedTensors& tensors, const std::vector<Tensor>& host,
                        const std::vector<uint64_t>& begin, const std::map<std::string, std::string>& metadata,
                        const char* what) {
  Json j = Json::object();
  if (!metadata.empty()) {
    Json m = Json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    j[kMetadataKey] = std::move(m);
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    Json e = Json::object();
    e["dtype"] = dtype_string(host[i].dtype());
    e["shape"] = Json::array();
    for (int64_t s : host[i].shape()) e["shape"].push_back(s);
    e["data_offsets"] = Json::array({begin[i], begin[i] + host[i].nbytes()});
    j[tensors[i].first] = std::move(e);
  }
  try {
    return j.dump();
  } catch (const nlohmann::json::exception& e) {
    throw Error(detail::cat(what, ": tensor names and metadata must be valid UTF-8 (", e.what(), ")"));
  }
}

std::string encode(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata, const char* what) {
  std::vector<Tensor> host;
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    REEL_CHECK(t.defined(), what, ": tensor '", name, "' is undefined");
    REEL_CHECK(name != kMetadataKey, what, ": a tensor cannot be named \"__metadata__\" (the format's metadata key)");
    REEL_CHECK(names.insert(name).second, what, ": the tensor name '", name, "' appears twice");
    host.push_back(t.detach().cpu().contiguous());
  }
  // Data by element size, largest first: every tensor then starts aligned to its element size.
  std::vector<size_t> order(host.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return host[a].element_size() > host[b].element_size(); });
  std::vector<uint64_t> begin(host.size());
  uint64_t data_bytes = 0;
  for (size_t i : order) {
    begin[i] = data_bytes;
    data_bytes += host[i].nbytes();
  }
  std::string header = header_json(tensors, host, begin, metadata, what);
  header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t n = header.size();
  std::string out;
  out.reserve(8 + header.size() + data_bytes);
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += header;
  for (size_t i : order) out.append(static_cast<const char*>(host[i].data_ptr()), host[i].nbytes());
  return out;
}

// Every key, dtype and shape against the module, all problems in one error; throws before any copy.
void check_against(const NamedTensors& state, const std::vector<Entry>& entries,
                   const std::map<std::string, const Entry*>& by_name, const std::string& where) {
  std::vector<std::string> missing, unexpected, mismatched;
  std::set<std::string> known;
  for (const auto& [name, t] : state) {
    known.insert(name);
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      missing.push_back(name);
      continue;
    }
    const Entry& e = *it->second;
    if (e.shape != t.shape() || e.dtype != t.dtype())
      mismatched.push_back(detail::cat(name, " (the file's ", dtype_name(e.dtype), " ", shape_str(e.shape),
                                       ", the module's ", dtype_name(t.dtype()), " ", shape_str(t.shape()), ")"));
  }
  for (const Entry& e : entries)  // in the file's order
    if (!known.count(e.name)) unexpected.push_back(e.name);
  if (missing.empty() && unexpected.empty() && mismatched.empty()) return;
  std::string msg = where + " does not match the module (nothing was loaded):";
  if (!missing.empty()) msg += detail::cat(" ", missing.size(), " missing keys (the module has them, the file does not): ", join(missing), ";");
  if (!unexpected.empty()) msg += detail::cat(" ", unexpected.size(), " unexpected keys (the file has them, the module does not): ", join(unexpected), ";");
  if (!mismatched.empty()) msg += detail::cat(" ", mismatched.size(), " keys of another dtype or shape: ", join(mismatched), ";");
  msg.pop_back();
  throw Error(msg);
}

}  // namespace

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_file_atomically(path, encode(tensors, metadata, "write_safetensors"), "write_safetensors");
}

SafetensorsFile read_safetensors(const std::string& path) {
  const std::string bytes = read_file(path, "read_safetensors");
  const Header h = parse(bytes, detail::cat("read_safetensors: '", path, "'"));
  SafetensorsFile f;
  f.metadata = h.metadata;
  for (const Entry& e : h.entries) f.tensors.emplace_back(e.name, host_tensor(e, bytes, h.data_start));
  return f;
}

void save_safetensors(const Module& module, const std::string& path) {
  // "format": "pt" as PyTorch's own writers put it; some readers (transformers) look for it.
  write_file_atomically(path, encode(module.named_state(), {{"format", "pt"}}, "save_safetensors"),
                        "save_safetensors");
}

void load_safetensors(Module& module, const std::string& path) {
  const std::string bytes = read_file(path, "load_safetensors");
  const std::string where = detail::cat("load_safetensors: '", path, "'");
  const Header h = parse(bytes, where);
  std::map<std::string, const Entry*> by_name;
  for (const Entry& e : h.entries) by_name.emplace(e.name, &e);  // names are unique: parse_json checked
  const NamedTensors state = module.named_state();
  check_against(state, h.entries, by_name, where);

  // Every value staged on its tensor's device before the first copy, so that an allocation that
  // fails on the way leaves the module as it was.
  NoGradGuard guard;
  std::vector<Tensor> staged;
  for (const auto& [name, t] : state) {
    Tensor host = host_tensor(*by_name.at(name), bytes, h.data_start);
    staged.push_back(t.device().is_cpu() ? host : host.to(t.device()));
  }
  for (size_t i = 0; i < state.size(); ++i) copy_(state[i].second, staged[i]);
}

void load_weights(Module& module, const std::string& path) {
  // REELSD01: the magic of reel's own state_dict files (nn/state_dict.h).
  char head[8] = {};
  std::ifstream f(path, std::ios::binary);
  if (f.read(head, sizeof head) && std::memcmp(head, "REELSD01", 8) == 0) return load_state_dict(module, path);
  load_safetensors(module, path);
}

}  // namespace reel::nn
