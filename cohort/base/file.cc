// ReadFileToString and ReplaceFile (see file.h). Thread-safety: pure functions.
#include "cohort/base/file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "cohort/base/settings.h"

namespace cohort {

Result<std::string> ReadFileToString(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound("cannot read {}: {}", path, std::strerror(errno));
  // Sized from fstat and read in large pieces (a checkpoint is gigabytes); a file that
  // grows meanwhile (or a /proc file, size 0) is read to its end all the same.
  struct stat st {};
  const size_t expected =
      ::fstat(fd, &st) == 0 && st.st_size > 0 ? static_cast<size_t>(st.st_size) : 0;
  std::string text(expected + (size_t{1} << 12), '\0');  // room to see the end at once
  size_t size = 0;
  for (;;) {
    if (size == text.size()) text.resize(2 * text.size());
    const ssize_t n = ::read(fd, text.data() + size, text.size() - size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return DataLoss("cannot read {}: {}", path, std::strerror(err));
    }
    if (n == 0) break;
    size += static_cast<size_t>(n);
  }
  ::close(fd);
  text.resize(size);
  return text;
}

Status ReplaceFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return Internal("cannot create {}: {}", tmp, std::strerror(errno));
    out << text;
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      return Internal("cannot write {}", tmp);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return Internal("cannot rename {} to {}: {}", tmp, path, std::strerror(err));
  }
  return Status::Ok();
}

namespace {
std::string TempRoot(const std::string& parent) {
  if (!parent.empty()) return parent;
  return SystemEnv("TMPDIR").value_or("/tmp");
}
}  // namespace

Status CheckPrivateDir(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) return NotFound("{} does not exist", path);
    return PermissionDenied("cannot inspect {}: {}", path, std::strerror(err));
  }
  if (S_ISLNK(st.st_mode)) {
    return PermissionDenied("{} is a symbolic link, not a directory of this user's; remove it "
                            "or choose another directory", path);
  }
  if (!S_ISDIR(st.st_mode)) {
    return PermissionDenied("{} is not a directory; remove it or choose another directory",
                            path);
  }
  if (st.st_uid != ::geteuid()) {
    return PermissionDenied("{} belongs to uid {}, not to this user (uid {}): another user "
                            "made it, so it is not used; remove it or choose another directory",
                            path, st.st_uid, ::geteuid());
  }
  if ((st.st_mode & 077) != 0) {
    return PermissionDenied("{} has mode {:o}: other users can reach it, so it is not used; "
                            "run 'chmod 700 {}' or choose another directory",
                            path, st.st_mode & 07777, path);
  }
  return Status::Ok();
}

Result<std::string> MakePrivateDir(const std::string& parent, const std::string& prefix) {
  std::string pattern = TempRoot(parent) + "/" + prefix + "XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    return Internal("cannot create a private directory {}: {}", pattern, std::strerror(errno));
  }
  std::string path(buf.data());
  COHORT_RETURN_IF_ERROR(CheckPrivateDir(path));
  return path;
}

Result<std::string> UserPrivateDir(const std::string& parent, const std::string& name) {
  const std::string path = fmt::format("{}/{}-{}", TempRoot(parent), name, ::geteuid());
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    return Internal("cannot create {}: {}", path, std::strerror(errno));
  }
  COHORT_RETURN_IF_ERROR(CheckPrivateDir(path));
  return path;
}

}  // namespace cohort
