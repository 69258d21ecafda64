// ReadFileToString (see file.h). Thread-safety: pure function.
#include "cohort/base/file.h"

#include <cerrno>
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

}  // namespace cohort
