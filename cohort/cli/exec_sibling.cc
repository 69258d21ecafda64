// Implements ExecSibling with execv. Thread-safety: main thread only.
#include "cohort/cli/exec_sibling.h"
#include "cohort/base/exit_codes.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>


namespace cohort::cli {

std::string SiblingPath(const std::string& program) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto self = fs::read_symlink("/proc/self/exe", ec);
  const fs::path dir = ec ? fs::path(".") : self.parent_path();
  // COHORT_LIBEXEC_FROM_BIN / COHORT_BIN_FROM_LIBEXEC: the install layout's relative paths
  // (cohort/cli/CMakeLists.txt computes them from GNUInstallDirs).
  for (const fs::path& candidate :
       {dir / program, dir / COHORT_LIBEXEC_FROM_BIN / program,
        dir / COHORT_BIN_FROM_LIBEXEC / program}) {
    if (fs::exists(candidate, ec)) return candidate.lexically_normal().string();
  }
  return (dir / program).string();
}

int ExecSibling(const std::string& program, const std::vector<std::string>& args) {
  const std::string path = SiblingPath(program);
  std::vector<char*> argv;
  std::string name = "cohort " + program.substr(program.find('-') + 1);
  argv.push_back(name.data());
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // The launcher blocked some signals for its agent; the companion gets the default mask.
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execv(path.c_str(), argv.data());
  const int err = errno;
  if (err == ENOENT) {
    // A build of only some targets (the quickstart builds cohort and cohort-train).
    fmt::print(stderr,
               "cohort: this command needs the program {}, which is not installed or built "
               "beside cohort ({} does not exist). Build every target (tools/build.sh "
               "release, or cmake --build <build dir> --target {}), or install the cohort "
               "package.\n",
               program, path, program);
    return kExitNotFound;
  }
  fmt::print(stderr, "cohort: cannot run {}: {}\n", path, std::strerror(err));
  return kExitInternal;
}

}  // namespace cohort::cli
