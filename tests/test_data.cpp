// The data layer: idx readers (values, shapes, normalisation, every corruption), the real
// Fashion-MNIST files when installed, byte-level text windows and the fortunes corpus, and the
// DataLoader's shuffling and batching. Small files are written with zlib into a fresh /tmp directory.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>

#include "data/data.h"
#include "tensor/cuda.h"
#include "test_util.h"

using namespace reel;
using namespace reel::data;
using reel::testing_util::expect_error;
namespace fs = std::filesystem;

namespace {

// A fresh directory under /tmp, removed with its files when the test ends.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/reel_data_test_XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void put_u32(std::string& s, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) s += char((v >> shift) & 0xff);
}

// An idx file's bytes: magic, sizes, then `data`.
std::string idx_bytes(uint32_t magic, const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data) {
  std::string s;
  put_u32(s, magic);
  for (uint32_t d : dims) put_u32(s, d);
  s.append(data.begin(), data.end());
  return s;
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), unsigned(bytes.size())), int(bytes.size()));
  gzclose(f);
}

void write_plain(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// n images of h x w with pixel (i, k) = (7 i + 3 k) mod 256, labels i mod 10.
std::vector<uint8_t> pixels(int n, int h, int w) {
  std::vector<uint8_t> p(size_t(n * h * w));
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < h * w; ++k) p[size_t(i * h * w + k)] = uint8_t((7 * i + 3 * k) % 256);
  return p;
}
std::vector<uint8_t> labels(int n) {
  std::vector<uint8_t> l(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) l[size_t(i)] = uint8_t(i % 10);
  return l;
}

// Writes a Fashion-MNIST-style split (gzipped) of n 28x28 images into dir.
void write_split(const TempDir& dir, const std::string& split, int n) {
  write_gz(dir.file(split + "-images-idx3-ubyte.gz"), idx_bytes(2051, {uint32_t(n), 28, 28}, pixels(n, 28, 28)));
  write_gz(dir.file(split + "-labels-idx1-ubyte.gz"), idx_bytes(2049, {uint32_t(n)}, labels(n)));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// idx files

TEST(DataIdx, ReadsValuesShapesAndNormalisation) {
  TempDir dir;
  const int n = 5, h = 3, w = 4;
  write_gz(dir.file("img.gz"), idx_bytes(2051, {n, h, w}, pixels(n, h, w)));
  write_gz(dir.file("lab.gz"), idx_bytes(2049, {n}, labels(n)));
  ImageDataset ds = load_idx_dataset(dir.file("img.gz"), dir.file("lab.gz"));
  EXPECT_EQ(ds.images.shape(), (Shape{n, 1, h, w}));
  EXPECT_EQ(ds.images.dtype(), DType::f32);
  EXPECT_EQ(ds.labels.shape(), (Shape{n}));
  EXPECT_EQ(ds.labels.dtype(), DType::i64);
  EXPECT_EQ(ds.size(), n);
  std::vector<float> got = ds.images.to_vector<float>();
  std::vector<uint8_t> px = pixels(n, h, w);
  for (size_t i = 0; i < px.size(); ++i) {
    double expect = (px[i] / 255.0 - 0.2860) / 0.3530;
    ASSERT_NEAR(got[i], expect, 1e-6) << "pixel " << i;
  }
  EXPECT_EQ(ds.labels.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  // Other statistics: mean 0, std 1 leaves byte / 255.
  ImageDataset raw = load_idx_dataset(dir.file("img.gz"), dir.file("lab.gz"), -1, 0.0, 1.0);
  EXPECT_NEAR(raw.images.to_vector<float>()[1], px[1] / 255.0, 1e-7);
}

TEST(DataIdx, FashionMnistLayoutLimitAndPlainFiles) {
  TempDir dir;
  write_split(dir, "train", 7);
  write_split(dir, "t10k", 3);
  ImageDataset train = load_fashion_mnist(dir.path(), true);
  EXPECT_EQ(train.images.shape(), (Shape{7, 1, 28, 28}));
  ImageDataset test = load_fashion_mnist(dir.path(), false);
  EXPECT_EQ(test.images.shape(), (Shape{3, 1, 28, 28}));
  ImageDataset first = load_fashion_mnist(dir.path(), true, 4);
  EXPECT_EQ(first.images.shape(), (Shape{4, 1, 28, 28}));
  EXPECT_EQ(first.labels.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3}));
  std::vector<float> all = train.images.to_vector<float>(), some = first.images.to_vector<float>();
  EXPECT_TRUE(std::equal(some.begin(), some.end(), all.begin()));
  // Uncompressed files are read too (gzread passes plain data through).
  TempDir plain;
  write_plain(plain.file("t10k-images-idx3-ubyte"), idx_bytes(2051, {2, 28, 28}, pixels(2, 28, 28)));
  write_plain(plain.file("t10k-labels-idx1-ubyte"), idx_bytes(2049, {2}, labels(2)));
  ImageDataset p = load_fashion_mnist(plain.path(), false);
  EXPECT_EQ(p.images.to_vector<float>(), std::vector<float>(all.begin(), all.begin() + 2 * 784));
}

TEST(DataIdx, DirectoryFromEnvironment) {
  const char* old = std::getenv("REEL_FASHION_MNIST");
  std::string saved = old ? old : "";
  ::setenv("REEL_FASHION_MNIST", "/some/where", 1);
  EXPECT_EQ(fashion_mnist_dir(), "/some/where");
  ::unsetenv("REEL_FASHION_MNIST");
  EXPECT_EQ(fashion_mnist_dir(), "/usr/share/datasets/fashion-mnist");
  if (old) ::setenv("REEL_FASHION_MNIST", saved.c_str(), 1);
  EXPECT_EQ(fashion_mnist_classes().size(), 10u);
  EXPECT_EQ(fashion_mnist_classes()[9], "Ankle boot");
}

TEST(DataIdx, MissingFileNamesPathAndPackage) {
  TempDir dir;
  expect_error([&] { load_fashion_mnist(dir.path(), true); },
               {"load_fashion_mnist", dir.file("train-images-idx3-ubyte.gz"), "not found", "dataset-fashion-mnist",
                "REEL_FASHION_MNIST"});
  write_split(dir, "train", 2);
  fs::remove(dir.file("train-labels-idx1-ubyte.gz"));
  expect_error([&] { load_fashion_mnist(dir.path(), true); },
               {dir.file("train-labels-idx1-ubyte.gz"), "dataset-fashion-mnist"});
  expect_error([&] { read_idx(dir.file("nothing.gz"), 2051); }, {"read_idx", dir.file("nothing.gz"), "does not exist"});
}

TEST(DataIdx, BadMagic) {
  TempDir dir;
  write_gz(dir.file("img.gz"), idx_bytes(2049, {2}, labels(2)));  // a labels file where images belong
  write_gz(dir.file("lab.gz"), idx_bytes(2049, {2}, labels(2)));
  expect_error([&] { load_idx_dataset(dir.file("img.gz"), dir.file("lab.gz")); },
               {dir.file("img.gz"), "magic number 2049", "expected 2051", "images"});
  write_gz(dir.file("junk.gz"), "hello world, not an idx file");
  expect_error([&] { read_idx(dir.file("junk.gz"), 2049); }, {dir.file("junk.gz"), "magic number", "expected 2049"});
}

TEST(DataIdx, TruncatedDataHeaderAndGzipStream) {
  TempDir dir;
  std::string full = idx_bytes(2051, {5, 3, 4}, pixels(5, 3, 4));  // 16 + 60 bytes
  write_gz(dir.file("short.gz"), full.substr(0, 16 + 36));
  expect_error([&] { read_idx(dir.file("short.gz"), 2051); },
               {dir.file("short.gz"), "truncated", "(5, 3, 4)", "expected 60 bytes", "found 36"});
  write_gz(dir.file("header.gz"), full.substr(0, 10));
  expect_error([&] { read_idx(dir.file("header.gz"), 2051); },
               {dir.file("header.gz"), "truncated", "12-byte size header", "found 6"});
  write_gz(dir.file("tiny.gz"), full.substr(0, 2));
  expect_error([&] { read_idx(dir.file("tiny.gz"), 2051); }, {dir.file("tiny.gz"), "truncated", "found 2"});
  // A .gz cut in the middle of its compressed stream.
  std::string big = idx_bytes(2051, {50, 28, 28}, pixels(50, 28, 28));
  write_gz(dir.file("whole.gz"), big);
  std::ifstream in(dir.file("whole.gz"), std::ios::binary);
  std::string gz((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  write_plain(dir.file("cut.gz"), gz.substr(0, gz.size() / 2));
  expect_error([&] { read_idx(dir.file("cut.gz"), 2051); }, {dir.file("cut.gz"), "truncated", "expected 39200 bytes"});
  // Extra bytes after the declared data are refused too.
  write_gz(dir.file("long.gz"), full + "xyz");
  expect_error([&] { read_idx(dir.file("long.gz"), 2051); },
               {dir.file("long.gz"), "longer than its header", "expected 60 bytes", "found 3 more"});
  // With a limit, only the requested prefix has to be there.
  EXPECT_EQ(read_idx(dir.file("short.gz"), 2051, 3).dims, (std::vector<int64_t>{3, 3, 4}));
}

TEST(DataIdx, CountMismatchAndBadLabels) {
  TempDir dir;
  write_gz(dir.file("img.gz"), idx_bytes(2051, {5, 2, 2}, pixels(5, 2, 2)));
  write_gz(dir.file("lab.gz"), idx_bytes(2049, {4}, labels(4)));
  expect_error([&] { load_idx_dataset(dir.file("img.gz"), dir.file("lab.gz")); },
               {"holds 5 images", "holds 4 labels", "must match"});
  std::vector<uint8_t> bad = labels(5);
  bad[3] = 10;
  write_gz(dir.file("bad.gz"), idx_bytes(2049, {5}, bad));
  expect_error([&] { load_idx_dataset(dir.file("img.gz"), dir.file("bad.gz")); },
               {dir.file("bad.gz"), "item 3", "label 10", "[0, 10)"});
  // The Fashion-MNIST loader insists on 28x28.
  write_gz(dir.file("train-images-idx3-ubyte.gz"), idx_bytes(2051, {5, 2, 2}, pixels(5, 2, 2)));
  write_gz(dir.file("train-labels-idx1-ubyte.gz"), idx_bytes(2049, {5}, labels(5)));
  expect_error([&] { load_fashion_mnist(dir.path(), true); }, {"2x2 images", "expected 28x28"});
}

TEST(DataIdx, RealFashionMnist) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir + "/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << dir << " is absent (Debian package dataset-fashion-mnist not installed)";
  auto t0 = std::chrono::steady_clock::now();
  ImageDataset train = load_fashion_mnist(dir, true);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("  loaded 60000 training images in %.2f s\n", secs);
  ImageDataset test = load_fashion_mnist(dir, false);
  EXPECT_EQ(train.images.shape(), (Shape{60000, 1, 28, 28}));
  EXPECT_EQ(test.images.shape(), (Shape{10000, 1, 28, 28}));
  for (auto [ds, per_class] : {std::pair{&train, 6000}, std::pair{&test, 1000}}) {
    std::vector<int64_t> hist(10, 0);
    for (int64_t l : ds->labels.to_vector<int64_t>()) {
      ASSERT_TRUE(l >= 0 && l < 10) << l;
      ++hist[size_t(l)];
    }
    for (int c = 0; c < 10; ++c) EXPECT_EQ(hist[size_t(c)], per_class) << "class " << c;
  }
  // The normalisation constants are the training set's own statistics: mean ~0, std ~1 afterwards.
  const float* p = train.images.data<float>();
  double s = 0, ss = 0;
  const int64_t total = train.images.numel();
  for (int64_t i = 0; i < total; ++i) s += p[i], ss += double(p[i]) * p[i];
  double mean = s / double(total), var = ss / double(total) - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(var), 1.0, 0.01);
}

// ---------------------------------------------------------------------------------------------
// text

TEST(DataText, FileBytesSplitAndWindows) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 200; ++i) text += char(i);  // distinct bytes, so a window's first byte is its start
  write_plain(dir.file("t.txt"), text);
  Tensor tokens = load_text_bytes(dir.file("t.txt"));
  EXPECT_EQ(tokens.shape(), (Shape{200}));
  EXPECT_EQ(tokens.dtype(), DType::i64);
  EXPECT_EQ(tensor_to_bytes(tokens), text);
  TextSplit split = split_text(tokens, 0.1);
  EXPECT_EQ(split.train.size(0), 180);
  EXPECT_EQ(split.val.size(0), 20);
  EXPECT_EQ(split.val.to_vector<int64_t>()[0], 180);

  const int64_t T = 16, B = 8;
  TextSampler sampler(tokens, T, 42);
  std::set<int64_t> starts;
  for (int step = 0; step < 60; ++step) {
    TextBatch b = sampler.next(B);
    ASSERT_EQ(b.inputs.shape(), (Shape{B, T}));
    ASSERT_EQ(b.targets.shape(), (Shape{B, T}));
    std::vector<int64_t> x = b.inputs.to_vector<int64_t>(), y = b.targets.to_vector<int64_t>();
    for (int64_t r = 0; r < B; ++r) {
      int64_t s = x[size_t(r * T)];
      ASSERT_TRUE(s >= 0 && s + T < 200) << s;
      starts.insert(s);
      for (int64_t j = 0; j < T; ++j) {
        ASSERT_EQ(x[size_t(r * T + j)], s + j);
        ASSERT_EQ(y[size_t(r * T + j)], s + j + 1);  // target = input shifted by one
      }
    }
  }
  EXPECT_EQ(sampler.draws(), 480u);
  // 480 draws over 184 starts reach nearly all of them, both ends included.
  EXPECT_GT(starts.size(), 160u);
  EXPECT_TRUE(starts.count(0) || starts.count(1));
  EXPECT_LE(*starts.rbegin(), 183);
  TextBatch w = sampler.window(183);
  EXPECT_EQ(w.targets.to_vector<int64_t>().back(), 199);
}

TEST(DataText, SeededReproducibility) {
  std::vector<int64_t> idx(2000);
  for (int i = 0; i < 2000; ++i) idx[size_t(i)] = i % 256;
  Tensor text = tensor_i64(idx, {2000});
  TextSampler a(text, 32, 7), b(text, 32, 7), c(text, 32, 8);
  for (int i = 0; i < 3; ++i) {
    std::vector<int64_t> xa = a.next(4).inputs.to_vector<int64_t>();
    EXPECT_EQ(xa, b.next(4).inputs.to_vector<int64_t>());
    EXPECT_NE(xa, c.next(4).inputs.to_vector<int64_t>());
  }
}

TEST(DataText, Errors) {
  TempDir dir;
  expect_error([&] { load_text_bytes(dir.file("none.txt")); }, {"load_text_bytes", dir.file("none.txt"), "cannot open"});
  write_plain(dir.file("empty.txt"), "");
  expect_error([&] { load_text_bytes(dir.file("empty.txt")); }, {"empty"});
  Tensor t = bytes_to_tensor("abcdef");
  expect_error([&] { TextSampler(t, 6); }, {"TextSampler", "at least 7 tokens", "got 6"});
  expect_error([&] { TextSampler(t, 0); }, {"block_size must be positive"});
  TextSampler s(t, 3);
  expect_error([&] { s.window(3); }, {"start 3", "[0, 3)"});
  expect_error([&] { split_text(t, 1.0); }, {"val_fraction", "[0, 1)"});
  expect_error([&] { fortune_files(dir.file("nope")); }, {"fortunes", dir.file("nope"), "apt-get install fortunes"});
}

TEST(DataText, FortuneFilesSkipIndexesAndSeparators) {
  TempDir dir;
  write_plain(dir.file("b"), "two\n%\nthree\n%\n");
  write_plain(dir.file("a"), "one\n%\n");
  write_plain(dir.file("a.dat"), std::string("\x00\x00\x00\x02\x01", 5));
  fs::create_symlink(dir.file("a"), dir.file("a.u8"));
  fs::create_symlink(dir.file("b"), dir.file("c"));  // links are skipped (Debian's .u8 are links)
  fs::create_directory(dir.file("off"));
  EXPECT_EQ(fortune_files(dir.path()), (std::vector<std::string>{dir.file("a"), dir.file("b")}));
  EXPECT_EQ(read_fortunes(dir.path()), "one\n\ntwo\n\nthree\n\n");
  EXPECT_EQ(load_fortunes(dir.path()).size(0), 17);
}

TEST(DataText, RealFortunes) {
  const std::string dir = "/usr/share/games/fortunes";
  if (!fs::exists(dir + "/fortunes")) GTEST_SKIP() << dir << " is absent (Debian package fortunes not installed)";
  std::vector<std::string> files = fortune_files(dir);
  for (const auto& f : files) EXPECT_FALSE(f.ends_with(".dat") || f.ends_with(".u8")) << f;
  std::string text = read_fortunes(dir);
  EXPECT_GT(text.size(), 100000u);
  EXPECT_EQ(text.find("\n%\n"), std::string::npos);
  std::printf("  %zu fortune files, %zu bytes\n", files.size(), text.size());
}

// ---------------------------------------------------------------------------------------------
// DataLoader

namespace {
// n items: inputs (n, 2, 3) f32 with item i's values 6i .. 6i+5, targets (n) i64 = i.
DataLoader make_loader(int64_t n, DataLoaderOptions opts) {
  std::vector<double> x(size_t(n * 6));
  for (size_t i = 0; i < x.size(); ++i) x[i] = double(i);
  std::vector<int64_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) y[size_t(i)] = i;
  return DataLoader(tensor(x, {n, 2, 3}), tensor_i64(y, {n}), opts);
}

// Every item of every batch of the current epoch, checking rows against indices.
std::vector<int64_t> visit_epoch(const DataLoader& loader, std::vector<int64_t>* sizes = nullptr) {
  std::vector<int64_t> seen;
  for (const Batch& b : loader) {
    std::vector<int64_t> y = b.targets.to_vector<int64_t>();
    std::vector<float> x = b.inputs.to_vector<float>();
    EXPECT_EQ(y, b.indices);
    EXPECT_EQ(b.inputs.shape(), (Shape{b.size(), 2, 3}));
    for (int64_t r = 0; r < b.size(); ++r)
      for (int k = 0; k < 6; ++k) EXPECT_EQ(x[size_t(r * 6 + k)], float(6 * y[size_t(r)] + k));
    seen.insert(seen.end(), y.begin(), y.end());
    if (sizes) sizes->push_back(b.size());
  }
  return seen;
}
}  // namespace

TEST(DataLoader, EveryItemOncePerEpochWithRemainder) {
  DataLoader loader = make_loader(10, DataLoaderOptions{}.with_batch_size(4).with_seed(3));
  EXPECT_EQ(loader.num_batches(), 3);
  EXPECT_EQ(loader.remainder(), 2);
  EXPECT_EQ(loader.items_per_epoch(), 10);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    loader.set_epoch(epoch);
    std::vector<int64_t> sizes;
    std::vector<int64_t> seen = visit_epoch(loader, &sizes);
    EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 2}));
    EXPECT_EQ(seen, loader.order());
    std::sort(seen.begin(), seen.end());
    for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(seen[size_t(i)], i);
  }
}

TEST(DataLoader, DropLast) {
  DataLoader loader = make_loader(10, DataLoaderOptions{}.with_batch_size(4).with_seed(3).with_drop_last(true));
  EXPECT_EQ(loader.num_batches(), 2);
  EXPECT_EQ(loader.remainder(), 2);
  EXPECT_EQ(loader.items_per_epoch(), 8);
  std::vector<int64_t> sizes;
  std::vector<int64_t> seen = visit_epoch(loader, &sizes);
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(seen, std::vector<int64_t>(loader.order().begin(), loader.order().begin() + 8));
  std::set<int64_t> unique(seen.begin(), seen.end());
  EXPECT_EQ(unique.size(), 8u);
  DataLoader exact = make_loader(8, DataLoaderOptions{}.with_batch_size(4).with_drop_last(true));
  EXPECT_EQ(exact.remainder(), 0);
  EXPECT_EQ(exact.num_batches(), 2);
}

TEST(DataLoader, ShuffleReproduciblePerSeedAndEpoch) {
  auto opts = DataLoaderOptions{}.with_batch_size(5).with_seed(11);
  DataLoader a = make_loader(50, opts), b = make_loader(50, opts);
  std::vector<int64_t> a0 = visit_epoch(a);
  EXPECT_EQ(a0, visit_epoch(b));  // same seed, same epoch
  a.set_epoch(1);
  std::vector<int64_t> a1 = visit_epoch(a);
  EXPECT_NE(a0, a1);  // different epoch
  a.set_epoch(0);
  EXPECT_EQ(visit_epoch(a), a0);  // back to epoch 0: the same order again
  EXPECT_EQ(epoch_order(50, 11, 1), a1);
  EXPECT_NE(epoch_order(50, 12, 0), a0);  // different seed
  std::vector<int64_t> identity(50);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(a0, identity);
  DataLoader plain = make_loader(50, DataLoaderOptions{}.with_batch_size(5).with_shuffle(false));
  plain.set_epoch(4);
  EXPECT_EQ(visit_epoch(plain), identity);
}

TEST(DataLoader, ShuffleIsUniformOverPermutations) {
  // 2400 epochs of 4 items: each of the 24 orders should appear ~100 times (binomial sd ~9.8).
  std::map<std::vector<int64_t>, int> counts;
  for (int64_t e = 0; e < 2400; ++e) ++counts[epoch_order(4, 5, e)];
  EXPECT_EQ(counts.size(), 24u);
  for (const auto& [perm, c] : counts) EXPECT_TRUE(c > 55 && c < 145) << c;
}

TEST(DataLoader, Errors) {
  expect_error([] { DataLoader(zeros({4, 2}), zeros({3}), DataLoaderOptions{}); },
               {"DataLoader", "(4, 2)", "(3,)", "different numbers of items"});
  expect_error([] { DataLoader(zeros({4, 2}), zeros({4}), DataLoaderOptions{}.with_batch_size(0)); },
               {"batch_size must be positive"});
  expect_error([] { DataLoader(zeros({4, 2}), zeros({4}), DataLoaderOptions{}.with_batch_size(5).with_drop_last(true)); },
               {"drop_last", "no batch"});
  DataLoader loader = make_loader(4, DataLoaderOptions{}.with_batch_size(2));
  expect_error([&] { loader.batch(2); }, {"batch 2", "[0, 2)"});
}

TEST(DataLoader, FullEpochOfFashionMnistSizedImagesIsFast) {
  const int64_t n = 60000;
  Tensor images = Tensor::empty({n, 1, 28, 28}, DType::f32);
  Tensor labels = Tensor::empty({n}, DType::i64);
  float* p = images.data<float>();
  for (int64_t i = 0; i < images.numel(); ++i) p[i] = float(i % 255);
  int64_t* l = labels.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) l[i] = i;
  DataLoader loader(images, labels, DataLoaderOptions{}.with_batch_size(128).with_seed(1));
  loader.set_epoch(2);
  auto t0 = std::chrono::steady_clock::now();
  int64_t items = 0, checksum = 0;
  for (const Batch& b : loader) {
    items += b.size();
    checksum += b.targets.data<int64_t>()[0];
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("  one epoch of 60000 28x28 images in batches of 128: %.3f s (%lld batches)\n", secs,
              (long long)loader.num_batches());
  EXPECT_EQ(items, n);
  EXPECT_GE(checksum, 0);
  EXPECT_LT(secs, 1.0);
}

TEST(DataLoader, MovesBatchesToTheDevice) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  DataLoader loader = make_loader(10, DataLoaderOptions{}.with_batch_size(4).with_device(Device::cuda()));
  Batch b = loader.batch(0);
  EXPECT_TRUE(b.inputs.device().is_cuda());
  EXPECT_TRUE(b.targets.device().is_cuda());
  EXPECT_EQ(b.targets.to_vector<int64_t>(), b.indices);
  TextSampler s(bytes_to_tensor("hello, world"), 4, 1);
  EXPECT_TRUE(s.next(2, Device::cuda()).inputs.device().is_cuda());
}
