// Whole files, read and written safely: what checkpoints (and any other file reel writes for a user)
// go through.
//   write_file_atomically  the bytes go to a temporary of a unique name beside `path` (so two writers
//                          never share one), are fsynced, renamed over `path` (atomic on POSIX) and
//                          the folder is fsynced, so a crash leaves the old file or the new one, never
//                          half of one; any failure removes the temporary and is a reel::Error
//   read_file              the whole file; a folder, a missing or unreadable file is a reel::Error
//   check_writable         before a long run: the folder of `path` exists and can be written, and
//                          `path` is not a folder
// `what` names the caller in errors ("save_state_dict").
#pragma once
#include <string>

namespace reel {

void write_file_atomically(const std::string& path, const std::string& bytes, const char* what);
std::string read_file(const std::string& path, const char* what);
void check_writable(const std::string& path, const char* what);

}  // namespace reel
