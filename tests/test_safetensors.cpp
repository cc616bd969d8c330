// safetensors files (nn/safetensors.h): round trips of every dtype reel holds, 0-dim and empty
// tensors included; files laid out by hand as the reference writer lays them out (bytes for bytes,
// both ways); modules with BatchNorm's i64 counter and a GPT saved and loaded to the same bits; the
// strictness of loading (every problem listed, the module untouched); `reel weights`. The BadInput
// cases feed broken files (truncated, ranges past the end, overlapping or with gaps, unknown dtypes,
// header lengths past the file or absurd, headers that are not JSON, sizes that disagree with the
// shape): each a reel::Error naming the problem, from reading and loading alike, with the module
// untouched.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "autograd/grad_mode.h"
#include "cli_run.h"
#include "test_util.h"

using namespace reel;
using namespace reel::nn;
using reel::testing_util::expect_error;

namespace {

std::string tmp_path(const std::string& name) { return ::testing::TempDir() + "reel_safetensors_" + name; }

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

std::string u64le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = char((v >> (8 * i)) & 0xff);
  return s;
}

// A safetensors file from a header (padded here as the format allows, not by the code under test).
std::string file_of(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  return u64le(header.size()) + header + data;
}

std::string bytes_of(const Tensor& t) {
  Tensor h = t.detach().cpu().contiguous();
  return std::string(static_cast<const char*>(h.data_ptr()), h.nbytes());
}

void expect_same_bits(const NamedTensors& a, const NamedTensors& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].second.dtype(), b[i].second.dtype()) << a[i].first;
    EXPECT_EQ(a[i].second.shape(), b[i].second.shape()) << a[i].first;
    EXPECT_EQ(bytes_of(a[i].second), bytes_of(b[i].second)) << a[i].first;
  }
}

// Every tensor of a module (name, dtype, shape, bytes), to show a failed load changed nothing.
struct Snapshot {
  explicit Snapshot(const Module& m) : module(m) {
    for (const auto& [name, t] : m.named_state()) state.emplace_back(name, t.detach().cpu().clone());
  }
  void expect_unchanged() const { expect_same_bits(module.named_state(), state); }
  const Module& module;
  NamedTensors state;
};

// No temporary of `path` left in its folder (write_file_atomically names them path + ".tmp...").
void expect_no_temporaries(const std::string& path) {
  const std::filesystem::path p(path);
  const std::string stem = p.filename().string() + ".tmp";
  for (const auto& entry : std::filesystem::directory_iterator(p.parent_path()))
    EXPECT_NE(entry.path().filename().string().rfind(stem, 0), 0u) << "left behind: " << entry.path();
}

std::shared_ptr<Sequential> conv_bn(uint64_t seed) {
  Generator g(seed);
  return std::make_shared<Sequential>(std::initializer_list<ModulePtr>{
      std::make_shared<Conv2d>(2, 3, 3, 1, 1, false, &g), std::make_shared<BatchNorm2d>(3),
      std::make_shared<GlobalAvgPool2d>(), std::make_shared<Linear>(3, 2, true, &g)});
}

}  // namespace

TEST(Safetensors, RoundTripOfEveryDtype) {
  NamedTensors tensors{
      {"f32", Tensor::from_vector<float>({1.5f, -2.25f, 3e-38f, 1e38f, 0.0f, -0.0f}, {2, 3})},
      {"f16", Tensor::from_vector<Half>({Half(1.0f), Half(-0.5f), Half(65504.0f)}, {3})},  // 6 bytes: misaligns what follows
      {"f64", Tensor::from_vector<double>({0.1, -1e300, 5e-324}, {3, 1})},
      {"bf16", Tensor::from_vector<BFloat16>({BFloat16(3.0f), BFloat16(-1e30f)}, {1, 2})},
      {"i64", Tensor::from_vector<int64_t>({-1, int64_t(1) << 62, 7}, {3})},
      {"scalar", Tensor::from_vector<float>({42.0f}, {})},
      {"counter", Tensor::from_vector<int64_t>({9}, {})},
      {"empty", Tensor::empty({0, 3}, DType::f32)},
      {"empty_bf16", Tensor::empty({4, 0}, DType::bf16)},
  };
  const std::map<std::string, std::string> metadata{{"format", "pt"}, {"note", "unicode \xc3\xa9"}};
  const std::string path = tmp_path("every_dtype.safetensors");
  write_safetensors(path, tensors, metadata);
  expect_no_temporaries(path);
  SafetensorsFile f = read_safetensors(path);
  expect_same_bits(f.tensors, tensors);  // the caller's order comes back
  EXPECT_EQ(f.metadata, metadata);

  // The layout: the header padded to 8 bytes, each tensor at a multiple of its element size.
  const std::string bytes = read_bytes(path);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["f16"]["dtype"], "F16");
  EXPECT_EQ(header["bf16"]["dtype"], "BF16");
  EXPECT_EQ(header["counter"]["shape"], nlohmann::json::array());
  EXPECT_EQ(header["empty"]["shape"], nlohmann::json::array({0, 3}));
  for (const auto& [name, t] : tensors) {
    const uint64_t begin = header[name]["data_offsets"][0];
    EXPECT_EQ(begin % t.element_size(), 0u) << name << " starts at " << begin;
  }
  // On the GPU too: what is written is the tensors' values, wherever they live.
  if (cuda::is_available()) {
    NamedTensors on_gpu;
    for (const auto& [name, t] : tensors) on_gpu.emplace_back(name, t.to(Device::cuda(0)));
    write_safetensors(path, on_gpu, metadata);
    expect_same_bits(read_safetensors(path).tensors, tensors);
  }
  std::remove(path.c_str());
}

// Files laid out as the reference writer (huggingface/safetensors) lays them out: compact JSON,
// "__metadata__" first, the data sorted by dtype (largest alignment first) then name, the header
// padded with spaces. They read back right, and writing the same tensors gives the same bytes.
TEST(Safetensors, FilesLaidOutByHandReadBackAndAreWrittenBytesForBytes) {
  const std::string path = tmp_path("by_hand.safetensors");
  // One F32 (1, 1, 2, 3) holding 0..5: a 65-byte header, 7 spaces, 24 bytes of data.
  std::string data;
  for (float v : {0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f}) data.append(reinterpret_cast<const char*>(&v), 4);
  const std::string one = u64le(72) + R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})" +
                          std::string(7, ' ') + data;
  write_bytes(path, one);
  SafetensorsFile f = read_safetensors(path);
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_EQ(f.tensors[0].first, "attn0");
  EXPECT_EQ(f.tensors[0].second.shape(), (Shape{1, 1, 2, 3}));
  EXPECT_EQ(f.tensors[0].second.to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_TRUE(f.metadata.empty());
  write_safetensors(path, f.tensors);
  EXPECT_EQ(read_bytes(path), one);

  // A BatchNorm-like state with metadata: I64, then F32, then BF16, as the reference orders them.
  const std::string header = R"({"__metadata__":{"format":"pt"},)"
                             R"("num_batches_tracked":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
                             R"("running_mean":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                             R"("weight":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]}})";
  ASSERT_EQ(header.size(), 228u);
  const std::string two = u64le(232) + header + std::string(4, ' ') +
                          std::string("\x07\0\0\0\0\0\0\0", 8) +             // 7
                          std::string("\0\0\0\x3f\0\0\0\xc0", 8) +           // 0.5, -2
                          std::string("\x80\x3f\0\xc0\x80\x7f", 6);          // bf16 1, -2, inf
  write_bytes(path, two);
  f = read_safetensors(path);
  ASSERT_EQ(f.tensors.size(), 3u);
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_EQ(f.tensors[0].first, "num_batches_tracked");
  EXPECT_EQ(f.tensors[0].second.dtype(), DType::i64);
  EXPECT_EQ(f.tensors[0].second.dim(), 0);
  EXPECT_EQ(f.tensors[0].second.item(), 7.0);
  EXPECT_EQ(f.tensors[1].second.to_vector<float>(), (std::vector<float>{0.5f, -2.0f}));
  EXPECT_EQ(f.tensors[2].second.dtype(), DType::bf16);
  EXPECT_EQ(f.tensors[2].second.to_vector<float>(), (std::vector<float>{1.0f, -2.0f, INFINITY}));
  write_safetensors(path, f.tensors, f.metadata);
  EXPECT_EQ(read_bytes(path), two);

  // No tensors: "{}" and six spaces; with metadata, 35 bytes of JSON and five spaces.
  write_safetensors(path, {});
  EXPECT_EQ(read_bytes(path), u64le(8) + "{}      ");
  write_safetensors(path, {}, {{"framework", "pt"}});
  EXPECT_EQ(read_bytes(path), u64le(40) + R"({"__metadata__":{"framework":"pt"}})" + "     ");
  EXPECT_TRUE(read_safetensors(path).tensors.empty());
  std::remove(path.c_str());
}

TEST(Safetensors, ModuleWithBatchNormLoadsToTheSameBits) {
  auto a = conv_bn(1), b = conv_bn(2);
  a->forward(randn({4, 2, 5, 5}));  // running statistics and the counter move away from their init
  const std::string path = tmp_path("batchnorm.safetensors");
  save_safetensors(*a, path);
  expect_no_temporaries(path);
  load_safetensors(*b, path);
  expect_same_bits(b->named_state(), a->named_state());

  SafetensorsFile f = read_safetensors(path);
  EXPECT_EQ(f.metadata.at("format"), "pt");
  bool counter = false;
  for (const auto& [name, t] : f.tensors)
    if (name == "1.num_batches_tracked") {
      counter = true;
      EXPECT_EQ(t.dtype(), DType::i64);
      EXPECT_EQ(t.dim(), 0);
      EXPECT_EQ(t.item(), 1.0);
    }
  EXPECT_TRUE(counter) << "BatchNorm's num_batches_tracked is saved";
  Tensor x = randn({2, 2, 5, 5});
  a->eval(), b->eval();
  EXPECT_EQ(bytes_of(a->forward(x)), bytes_of(b->forward(x)));
  std::remove(path.c_str());
}

TEST(Safetensors, GptLoadsToTheSameBitsOnEveryDevice) {
  const GptConfig config{/*vocab*/ 32, /*block_size*/ 8, /*dim*/ 16, /*heads*/ 2, /*layers*/ 2};
  Generator g1(1);
  auto a = gpt(config, &g1);
  const std::string path = tmp_path("gpt.safetensors");
  save_safetensors(*a, path);
  for (Device device : testing_util::test_devices()) {
    Generator g2(2);
    auto b = gpt(config, &g2);
    b->to(device);
    load_safetensors(*b, path);
    for (const auto& [name, t] : b->named_state()) EXPECT_EQ(t.device(), device) << name;
    expect_same_bits(b->named_state(), a->named_state());
  }
  std::remove(path.c_str());
}

TEST(Safetensors, LoadIsStrictListsEveryProblemAndChangesNothing) {
  const std::string path = tmp_path("strict.safetensors");
  Generator g(77);
  Linear dst(3, 2, true, &g);
  const Snapshot before(dst);

  Linear nobias(3, 2, false);
  save_safetensors(nobias, path);
  expect_error([&] { load_safetensors(dst, path); }, {"load_safetensors", path, "missing keys", "bias"});
  before.expect_unchanged();

  Linear src(3, 2);
  NamedTensors extra = src.named_state();
  extra.emplace_back("extra.weight", zeros({2}));
  write_safetensors(path, extra);
  expect_error([&] { load_safetensors(dst, path); }, {path, "unexpected keys", "extra.weight"});
  before.expect_unchanged();

  Linear wide(4, 2);
  save_safetensors(wide, path);
  expect_error([&] { load_safetensors(dst, path); }, {path, "weight", "(2, 4)", "(2, 3)"});
  before.expect_unchanged();

  Linear f64(3, 2);
  f64.to(DType::f64);
  save_safetensors(f64, path);
  expect_error([&] { load_safetensors(dst, path); }, {path, "weight", "f64", "f32", "bias"});
  before.expect_unchanged();

  // Several problems at once: all of them in one message.
  write_safetensors(path, {{"weight", zeros({2, 4})}, {"other", zeros({1})}});
  expect_error([&] { load_safetensors(dst, path); },
               {"1 missing keys", "bias", "1 unexpected keys", "other", "weight (the file's f32 (2, 4)"});
  before.expect_unchanged();
  expect_error([&] { load_weights(dst, path); }, {"load_safetensors", "bias"});
  before.expect_unchanged();
  expect_error([&] { load_safetensors(dst, path + ".none"); }, {"load_safetensors", "cannot open", ".none"});
  std::remove(path.c_str());
}

TEST(Safetensors, LoadWeightsTakesEitherFormat) {
  auto a = conv_bn(3);
  a->forward(randn({2, 2, 4, 4}));
  const std::string reelsd = tmp_path("either.reelsd"), st = tmp_path("either.safetensors");
  save_state_dict(*a, reelsd);
  save_safetensors(*a, st);
  for (const std::string& path : {reelsd, st}) {
    auto b = conv_bn(4);
    load_weights(*b, path);
    expect_same_bits(b->named_state(), a->named_state());
  }
  // A REELSD01 file is not a safetensors file: its first 8 bytes make an absurd header length.
  expect_error([&] { read_safetensors(reelsd); }, {"read_safetensors", reelsd, "header length"});
  std::remove(reelsd.c_str());
  std::remove(st.c_str());
}

TEST(Safetensors, WritingRefusesWhatTheFormatCannotHold) {
  const std::string path = tmp_path("refused.safetensors");
  expect_error([&] { write_safetensors(path, {{"a", zeros({1})}, {"a", zeros({2})}}); }, {"write_safetensors", "'a'", "twice"});
  expect_error([&] { write_safetensors(path, {{"__metadata__", zeros({1})}}); }, {"write_safetensors", "__metadata__"});
  expect_error([&] { write_safetensors(path, {{"bad\xff", zeros({1})}}); }, {"write_safetensors", "UTF-8"});
  EXPECT_FALSE(std::filesystem::exists(path));
  expect_no_temporaries(path);
  expect_error([&] { save_safetensors(Linear(2, 2), "/nonexistent-dir/x.safetensors"); },
               {"save_safetensors", "/nonexistent-dir/x.safetensors"});
}

// ---------------------------------------------------------------------------------------------
// Broken files: each an error naming the problem, from read_safetensors, load_safetensors and
// load_weights alike, with the module untouched.

namespace {

void expect_bad_file(const std::string& name, const std::string& bytes, const std::vector<std::string>& parts) {
  const std::string path = tmp_path(name);
  write_bytes(path, bytes);
  std::vector<std::string> read_parts = parts, load_parts = parts;
  read_parts.insert(read_parts.end(), {"read_safetensors", path});
  load_parts.insert(load_parts.end(), {"load_safetensors", path});
  expect_error([&] { read_safetensors(path); }, read_parts);
  Generator g(5);
  Linear m(3, 2, true, &g);
  const Snapshot before(m);
  expect_error([&] { load_safetensors(m, path); }, load_parts);
  before.expect_unchanged();
  expect_error([&] { load_weights(m, path); }, load_parts);
  before.expect_unchanged();
  std::remove(path.c_str());
}

// Two F32 tensors 'a' and 'b' of `numel` elements with the given ranges, over `data_bytes` bytes.
std::string two_tensors(int a_numel, uint64_t a0, uint64_t a1, int b_numel, uint64_t b0, uint64_t b1, size_t data_bytes) {
  return file_of(detail::cat(R"({"a":{"dtype":"F32","shape":[)", a_numel, R"(],"data_offsets":[)", a0, ",", a1,
                             R"(]},"b":{"dtype":"F32","shape":[)", b_numel, R"(],"data_offsets":[)", b0, ",", b1, "]}}"),
                 std::string(data_bytes, '\x01'));
}

std::string one_entry(const std::string& entry, size_t data_bytes) {
  return file_of(R"({"w":)" + entry + "}", std::string(data_bytes, '\0'));
}

}  // namespace

TEST(BadInput, SafetensorsTruncated) {
  Linear src(3, 2);
  const std::string path = tmp_path("whole.safetensors");
  save_safetensors(src, path);
  const std::string good = read_bytes(path);
  std::remove(path.c_str());
  expect_bad_file("cut_data.safetensors", good.substr(0, good.size() - 4),
                  {"'bias'", "past the end of the data section", "truncated"});
  expect_bad_file("cut_header.safetensors", good.substr(0, 40), {"header length", "past the end of the file", "truncated"});
  expect_bad_file("cut_length.safetensors", good.substr(0, 5), {"truncated: 5 bytes"});
  expect_bad_file("empty.safetensors", "", {"truncated: 0 bytes"});
}

TEST(BadInput, SafetensorsOffsetsPastTheEnd) {
  expect_bad_file("past_end.safetensors", two_tensors(2, 0, 8, 2, 8, 16, 8),
                  {"key 'b'", "[8, 16]", "past the end of the data section (8 bytes)"});
  expect_bad_file("past_u64.safetensors", two_tensors(2, 0, 8, 0, 18446744073709551615ull, 18446744073709551615ull, 8),
                  {"key 'b'", "18446744073709551615", "past the end"});
}

TEST(BadInput, SafetensorsOverlappingRanges) {
  expect_bad_file("overlap.safetensors", two_tensors(2, 0, 8, 2, 4, 12, 12), {"key 'b'", "[4, 12]", "overlaps key 'a'", "[0, 8]"});
  expect_bad_file("same_range.safetensors", two_tensors(2, 0, 8, 2, 0, 8, 8), {"overlaps"});
}

TEST(BadInput, SafetensorsGap) {
  expect_bad_file("gap.safetensors", two_tensors(2, 0, 8, 2, 12, 20, 20), {"gap", "bytes [8, 12)", "key 'b'"});
  expect_bad_file("gap_first.safetensors", two_tensors(2, 4, 12, 2, 12, 20, 20), {"gap", "bytes [0, 4)", "key 'a'"});
  expect_bad_file("gap_after.safetensors", two_tensors(2, 0, 8, 2, 8, 16, 20), {"gap", "holds 20 bytes", "cover 16",
                                                                              "4 bytes after the last"});
}

TEST(BadInput, SafetensorsWrongDtype) {
  expect_bad_file("dtype_unknown.safetensors", one_entry(R"({"dtype":"F33","shape":[1],"data_offsets":[0,4]})", 4),
                  {"key 'w'", "unknown dtype \"F33\""});
  expect_bad_file("dtype_i32.safetensors", one_entry(R"({"dtype":"I32","shape":[1],"data_offsets":[0,4]})", 4),
                  {"key 'w'", "dtype \"I32\"", "does not hold"});
  expect_bad_file("dtype_lower.safetensors", one_entry(R"({"dtype":"float32","shape":[1],"data_offsets":[0,4]})", 4),
                  {"unknown dtype \"float32\""});
  expect_bad_file("dtype_number.safetensors", one_entry(R"({"dtype":3,"shape":[1],"data_offsets":[0,4]})", 4),
                  {"dtype that is not a string"});
}

TEST(BadInput, SafetensorsHeaderLengthPastTheFile) {
  expect_bad_file("length_past.safetensors", u64le(1000) + "{}      ",
                  {"header length of 1000 bytes", "past the end of the file (8 bytes follow"});
}

TEST(BadInput, SafetensorsHugeHeaderLength) {
  expect_bad_file("length_huge.safetensors", u64le(uint64_t(1) << 60) + "{}      ",
                  {"header length of 1152921504606846976 bytes", "limit", "100 MiB"});
  expect_bad_file("length_max.safetensors", u64le(~uint64_t(0)) + "{}      ", {"18446744073709551615", "limit"});
}

TEST(BadInput, SafetensorsHeaderNotJson) {
  expect_bad_file("not_json.safetensors", file_of("{not json}", ""), {"not valid JSON", "parse error"});
  expect_bad_file("not_object.safetensors", file_of("[1, 2]", ""), {"not a JSON object", "[1,2]"});
  expect_bad_file("json_cut.safetensors", file_of(R"({"w":{"dtype":"F32",)", ""), {"not valid JSON"});
  expect_bad_file("bad_utf8.safetensors", file_of("{\"w\xff\":{}}", ""), {"not valid JSON"});
  expect_bad_file("nul.safetensors", u64le(8) + std::string(8, '\0'), {"not valid JSON"});
  expect_bad_file("twice.safetensors",
                  file_of(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                          std::string(8, '\0')),
                  {"key 'w' twice"});
  expect_bad_file("metadata_number.safetensors", file_of(R"({"__metadata__":{"epoch":3}})", ""),
                  {"__metadata__", "'epoch'", "must hold a string"});
}

TEST(BadInput, SafetensorsShapeAndOffsetSizesDisagree) {
  expect_bad_file("size.safetensors", one_entry(R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,20]})", 20),
                  {"key 'w'", "F32 of shape (2, 3)", "needs 24 bytes", "[0, 20] span 20"});
  expect_bad_file("size_i64.safetensors", one_entry(R"({"dtype":"I64","shape":[],"data_offsets":[0,4]})", 4),
                  {"I64 of shape ()", "needs 8 bytes"});
  expect_bad_file("reversed.safetensors", one_entry(R"({"dtype":"F32","shape":[0],"data_offsets":[4,0]})", 4),
                  {"[4, 0]", "end before they begin"});
  expect_bad_file("negative.safetensors", one_entry(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})", 4),
                  {"key 'w'", "negative number in its shape", "-1"});
  expect_bad_file("fraction.safetensors", one_entry(R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,4]})", 4),
                  {"shape entry that is not a non-negative integer", "1.5"});
  expect_bad_file("overflow.safetensors",
                  one_entry(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]})", 4),
                  {"(4294967296, 4294967296)", "more bytes than a file can hold"});
  expect_bad_file("no_offsets.safetensors", one_entry(R"({"dtype":"F32","shape":[1]})", 4), {"lacks \"data_offsets\""});
  expect_bad_file("three_offsets.safetensors", one_entry(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4,8]})", 4),
                  {"not [begin, end]"});
  expect_bad_file("entry_string.safetensors", one_entry(R"("F32")", 0), {"key 'w'", "is not an object"});
}

// ---------------------------------------------------------------------------------------------
// `reel weights` (REEL_BIN names the binary; make test sets it)

using reel::testing_util::CliRun;
using reel::testing_util::reel_cli;

TEST(Safetensors, WeightsCommandSavesLoadsAndComparesBits) {
  const std::string a = tmp_path("cli_a.safetensors"), b = tmp_path("cli_b.reelsd");
  std::optional<CliRun> r = reel_cli("weights --model cnn-small --seed 3 --save " + a);
  if (!r) GTEST_SKIP() << "REEL_BIN does not name the reel binary (make test sets it)";
  ASSERT_EQ(r->code, 0) << r->out;
  EXPECT_NE(r->out.find("to " + a), std::string::npos) << r->out;
  // What the file holds is what the library builds from the same seed.
  Generator gen(3);
  auto model = make_benchmark_model("cnn-small", &gen);
  expect_same_bits(read_safetensors(a).tensors, model->named_state());

  r = reel_cli("weights --model cnn-small --init-from " + a + " --save " + b + " --compare " + a);
  EXPECT_EQ(r->code, 0) << r->out;
  const std::string same = detail::cat("same bits: ", model->named_state().size(), " tensors");
  EXPECT_NE(r->out.find(same), std::string::npos) << r->out;
  r = reel_cli("weights --model cnn-small --init-from " + b + " --compare " + a);  // REELSD01 in, safetensors compared
  EXPECT_EQ(r->code, 0) << r->out;
  EXPECT_NE(r->out.find(same), std::string::npos) << r->out;

  r = reel_cli("weights --model cnn-small --seed 4 --compare " + a);
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("reel weights: "), std::string::npos) << r->out;
  EXPECT_NE(r->out.find("tensors differ from " + a + ": 0.weight"), std::string::npos) << r->out;
  r = reel_cli("weights --model gpt-tiny --compare " + a);  // another model's file: a strict load's error
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("missing keys"), std::string::npos) << r->out;
  r = reel_cli("weights --model cnn-small --frobnicate 1");
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("unknown option --frobnicate"), std::string::npos) << r->out;
  r = reel_cli("weights --seed 1");
  EXPECT_EQ(r->code, 1) << r->out;
  EXPECT_NE(r->out.find("--model NAME is needed"), std::string::npos) << r->out;
  std::remove(a.c_str());
  std::remove(b.c_str());
}
