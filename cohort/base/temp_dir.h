// TempDir: a private directory (mode 0700) under the system temp dir, removed with everything in it when
// the object goes away; File() writes a file (creating parent directories), Read() reads
// one back. For tests. Thread-safety: one owner.
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cohort/base/strings.h"

namespace cohort {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "cohort-test-")
      : path_(std::filesystem::temp_directory_path() / (prefix + RandomHex(6))) {
    std::filesystem::create_directories(path_);
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::replace);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // Writes `text` to <dir>/<name>; `exec` makes it executable. Returns the full path.
  std::string File(const std::string& name, const std::string& text, bool exec = false) const {
    std::filesystem::path p = path_ / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
    if (exec) {
      std::filesystem::permissions(p, std::filesystem::perms::owner_all,
                                   std::filesystem::perm_options::add);
    }
    return p.string();
  }
  std::string Read(const std::string& name) const {
    std::ifstream in(path_ / name);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace cohort
