// How the command lines reach a job's store, shared by `cohort run` and `cohort top`: the
// etcd client settings of --rdzv-conf, and connectors (a new connection per call, within a
// deadline) to a cohort store or etcd.
// Thread-safety: pure functions (SplitEtcdConf reads the environment and the file system);
// a connector may be called from any thread, each call making its own connection.
#pragma once

#include <string>

#include "cohort/agent/job_directory.h"
#include "cohort/base/status.h"
#include "cohort/store/etcd_store.h"
#include "cohort/store/tcp_store.h"

namespace cohort::cli {

// Takes the etcd client keys out of --rdzv-conf text (the rest goes to `rest`):
// protocol=http|https, cacert, cert, key (PEM paths), user, request_timeout (seconds).
// The user may also come from COHORT_ETCD_USER; the password comes from
// COHORT_ETCD_PASSWORD only, never from the command line. A named file that does not exist
// is NotFound; a bad value InvalidArgument.
Status SplitEtcdConf(const std::string& text, store::EtcdStoreOptions& o, std::string* rest,
                     bool* https);

agent::StoreConnector TcpConnector(store::TcpStoreOptions options);
agent::StoreConnector EtcdConnector(store::EtcdStoreOptions options);

}  // namespace cohort::cli
