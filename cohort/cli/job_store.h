// The etcd client settings of --rdzv-conf, shared by `cohort run` and `cohort top` (both then
// reach the job's store through store/job_store_access.h).
// Thread-safety: pure functions (SplitEtcdConf reads the environment and the file system);
// nothing shared.
#pragma once

#include <string>

#include "cohort/base/status.h"
#include "cohort/store/etcd_store.h"

namespace cohort::cli {

// Takes the etcd client keys out of --rdzv-conf text (the rest goes to `rest`):
// protocol=http|https, cacert, cert, key (PEM paths), user, request_timeout (seconds).
// The user may also come from COHORT_ETCD_USER; the password comes from
// COHORT_ETCD_PASSWORD only, never from the command line. A named file that does not exist
// is NotFound; a bad value InvalidArgument.
Status SplitEtcdConf(const std::string& text, store::EtcdStoreOptions& o, std::string* rest,
                     bool* https);

}  // namespace cohort::cli
