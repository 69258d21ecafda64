// Implements the one way to reach a job's store (job_store_access.h). Pure functions.
#include "cohort/store/job_store_access.h"

namespace cohort::store {
namespace {

// New connections of one client type (TcpStore, EtcdStore) with fixed options.
template <typename Client, typename Options>
StoreConnector ConnectorOf(Options options) {
  return [options](Deadline d) -> Result<std::shared_ptr<Store>> {
    COHORT_ASSIGN_OR_RETURN(auto s, Client::Connect(options, d));
    return std::shared_ptr<Store>(std::move(s));
  };
}

}  // namespace

JobStoreAccess TcpAccess(const TcpStoreOptions& options) {
  JobStoreAccess a;
  a.kind = JobStoreAccess::Kind::kTcp;
  a.addr = options.host;
  a.port = options.port;
  a.token = options.token;
  return a;
}

namespace {

// The fields an access and the etcd options share, one list for both directions: `f(a, o)`
// for each pair (the request timeout, in different units, is converted by the callers).
template <typename Access, typename Options, typename F>
void ForEachEtcdField(Access& a, Options& o, F f) {
  f(a.etcd_endpoints, o.endpoints);
  f(a.etcd_prefix, o.prefix);
  f(a.etcd_ca_file, o.ca_file);
  f(a.etcd_cert_file, o.cert_file);
  f(a.etcd_key_file, o.key_file);
  f(a.etcd_user, o.user);
  f(a.etcd_password, o.password);  // never written to a worker's environment
}

}  // namespace

JobStoreAccess EtcdAccess(const EtcdStoreOptions& options) {
  JobStoreAccess a;
  a.kind = JobStoreAccess::Kind::kEtcd;
  ForEachEtcdField(a, options, [](auto& to, const auto& from) { to = from; });
  a.etcd_request_timeout_s = std::chrono::duration<double>(options.request_timeout).count();
  return a;
}

EtcdStoreOptions EtcdOptionsOf(const JobStoreAccess& access) {
  EtcdStoreOptions o;
  ForEachEtcdField(access, o, [](const auto& from, auto& to) { to = from; });
  if (access.etcd_request_timeout_s > 0) {
    o.request_timeout = std::chrono::duration_cast<Duration>(
        std::chrono::duration<double>(access.etcd_request_timeout_s));
  }
  return o;
}

StoreConnector ConnectorFor(const JobStoreAccess& access) {
  switch (access.kind) {
    case JobStoreAccess::Kind::kTcp:
      return ConnectorOf<TcpStore>(
          TcpStoreOptions{.host = access.addr, .port = access.port, .token = access.token});
    case JobStoreAccess::Kind::kEtcd:
      // Each connection is its own EtcdStore; Connect gives up after the request timeout
      // when no member answers.
      return ConnectorOf<EtcdStore>(EtcdOptionsOf(access));
    case JobStoreAccess::Kind::kNone:
      break;
  }
  return [](Deadline) -> Result<std::shared_ptr<Store>> {
    return FailedPrecondition("the worker environment names no job store");
  };
}

Result<std::shared_ptr<Store>> ConnectJobStore(const JobStoreAccess& access, Deadline deadline) {
  return ConnectorFor(access)(deadline);
}

}  // namespace cohort::store
