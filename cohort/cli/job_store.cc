// The etcd client settings of --rdzv-conf (see job_store.h). Thread-safety: as there.
#include "cohort/cli/job_store.h"

#include <filesystem>

#include "cohort/base/strings.h"
#include "cohort/base/worker_env.h"

namespace cohort::cli {

namespace fs = std::filesystem;

Status SplitEtcdConf(const std::string& text, store::EtcdStoreOptions& o, std::string* rest,
                     bool* https) {
  rest->clear();
  for (const auto& item : Split(text, ',')) {
    auto eq = item.find('=');
    std::string key = eq == std::string::npos ? item : std::string(Trim(item.substr(0, eq)));
    std::string value = eq == std::string::npos ? "" : std::string(Trim(item.substr(eq + 1)));
    if (key == "protocol") {
      if (value != "http" && value != "https") {
        return InvalidArgument("--rdzv-conf protocol={} must be http or https", value);
      }
      *https = value == "https";
    } else if (key == "cacert") {
      o.ca_file = value;
    } else if (key == "cert") {
      o.cert_file = value;
    } else if (key == "key") {
      o.key_file = value;
    } else if (key == "user") {
      o.user = value;
    } else if (key == "request_timeout") {
      auto seconds = ParseDouble(value);
      if (!seconds || *seconds <= 0) {
        return InvalidArgument("--rdzv-conf request_timeout={} is not a number of seconds",
                               value);
      }
      o.request_timeout =
          std::chrono::duration_cast<Duration>(std::chrono::duration<double>(*seconds));
    } else {
      *rest += (rest->empty() ? "" : ",") + item;
    }
  }
  for (const std::string* file : {&o.ca_file, &o.cert_file, &o.key_file}) {
    if (!file->empty() && !fs::is_regular_file(*file)) {
      return NotFound("--rdzv-conf: the file '{}' does not exist", *file);
    }
  }
  if (o.user.empty()) o.user = worker_env::Inherited(worker_env::kEtcdUser).value_or("");
  o.password = worker_env::Inherited(worker_env::kEtcdPassword).value_or("");
  return Status::Ok();
}

}  // namespace cohort::cli
