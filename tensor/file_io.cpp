// Whole files, read and written safely (see file_io.h). POSIX calls, so that the data and the
// rename can be fsynced.
#include "tensor/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "tensor/error.h"

namespace reel {
namespace {

std::string folder_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string unique_temporary(const std::string& path) {
  static std::atomic<unsigned> counter{0};
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
}

std::string reason() { return std::strerror(errno); }

// Writes all of `bytes` to fd; false on an error (errno says which).
bool write_all(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += size_t(n);
  }
  return true;
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& bytes, const char* what) {
  const std::string tmp = unique_temporary(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  REEL_CHECK(fd >= 0, what, ": cannot create '", tmp, "': ", reason());
  const bool written = write_all(fd, bytes) && ::fsync(fd) == 0;
  const std::string why = written ? "" : reason();
  const bool closed = ::close(fd) == 0;
  if (!written || !closed || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = !written ? why : reason();
    ::unlink(tmp.c_str());
    throw Error(detail::cat(what, ": cannot write '", path, "': ", err));
  }
  // The rename is durable once the folder's entry is on disk too.
  const int dir = ::open(folder_of(path).c_str(), O_RDONLY | O_DIRECTORY);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

std::string read_file(const std::string& path, const char* what) {
  struct stat st;
  REEL_CHECK(::stat(path.c_str(), &st) == 0, what, ": cannot open '", path, "': ", reason());
  REEL_CHECK(S_ISREG(st.st_mode), what, ": '", path, "' is not a file");
  const int fd = ::open(path.c_str(), O_RDONLY);
  REEL_CHECK(fd >= 0, what, ": cannot open '", path, "': ", reason());
  std::string bytes;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string err = reason();
      ::close(fd);
      throw Error(detail::cat(what, ": error reading '", path, "': ", err));
    }
    if (n == 0) break;
    bytes.append(buf, size_t(n));
  }
  ::close(fd);
  return bytes;
}

void check_writable(const std::string& path, const char* what) {
  struct stat st;
  REEL_CHECK(!(::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)), what, ": '", path,
             "' is a folder, not a file name");
  const std::string folder = folder_of(path);
  REEL_CHECK(::stat(folder.c_str(), &st) == 0 && S_ISDIR(st.st_mode), what, ": the folder '", folder, "' of '", path,
             "' does not exist");
  REEL_CHECK(::access(folder.c_str(), W_OK) == 0, what, ": the folder '", folder, "' of '", path,
             "' cannot be written: ", reason());
}

}  // namespace reel
