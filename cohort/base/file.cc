// ReadFileToString and ReplaceFile (see file.h). Thread-safety: pure functions.
#include "cohort/base/file.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace cohort {

Result<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read {}: {}", path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return DataLoss("cannot read {}: a read error", path);
  return text.str();
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

}  // namespace cohort
