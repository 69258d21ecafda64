// The one way to reach a job's store, for every part of cohort that needs it: the agent and
// its round watcher (`cohort run`), libcohort in the workers, `cohort top`, and the job's
// directory of monitoring endpoints. What names the store is a JobStoreAccess (the worker
// contract's record, base/worker_env.h: a cohort store over TCP with the job's token, or
// etcd with the job's prefix, TLS and user); a StoreConnector makes a new connection to it
// per call, within the call's deadline.
//
// Thread-safety: pure functions; a connector may be called from any thread, each call
// making its own connection.
#pragma once

#include <functional>
#include <memory>

#include "cohort/base/status.h"
#include "cohort/base/time.h"
#include "cohort/base/worker_env.h"
#include "cohort/store/etcd_store.h"
#include "cohort/store/store.h"
#include "cohort/store/tcp_store.h"

namespace cohort::store {

using StoreConnector = std::function<Result<std::shared_ptr<Store>>(Deadline)>;

// The access to a cohort store, and to etcd (keys under "/cohort/<options.prefix>/").
JobStoreAccess TcpAccess(const TcpStoreOptions& options);
JobStoreAccess EtcdAccess(const EtcdStoreOptions& options);
// The etcd client options an access names (kEtcd).
EtcdStoreOptions EtcdOptionsOf(const JobStoreAccess& access);

// New connections to the store `access` names; a connector of an access that names no store
// fails with kFailedPrecondition.
StoreConnector ConnectorFor(const JobStoreAccess& access);
// One new connection, not narrowed to a round (wrap it in a PrefixStore for that).
Result<std::shared_ptr<Store>> ConnectJobStore(const JobStoreAccess& access, Deadline deadline);

}  // namespace cohort::store
