// Implements how `cohort run` reaches its job's store (run_store.h). Single-threaded.
#include "cohort/cli/run_store.h"

#include <arpa/inet.h>

#include "cohort/base/exit_codes.h"
#include "cohort/base/log.h"
#include "cohort/base/strings.h"
#include "cohort/base/worker_env.h"
#include "cohort/cli/job_store.h"
#include "cohort/net/socket.h"
#include "cohort/store/job_store_access.h"
#include "cohort/store/tcp_store.h"

namespace cohort::cli {
namespace {

constexpr int kDefaultStorePort = 29400;

// The address the store this node serves listens on: only what the endpoint names, never
// more. A generated port (single node) and localhost stay on loopback; an IPv4 address is
// bound as given (0.0.0.0 only when the user wrote it); a host name is bound at the
// address it resolves to, except that a name this machine maps to loopback (Debian's
// 127.0.1.1 line for its own hostname) must still be reachable by the other nodes, so it
// binds every interface.
std::string StoreBindAddress(const StorePlan& plan) {
  if (plan.port == 0 || plan.host == "localhost") return "127.0.0.1";
  in_addr literal{};
  if (::inet_pton(AF_INET, plan.host.c_str(), &literal) == 1) return plan.host;
  auto resolved = net::ResolveIpv4(plan.host);
  if (!resolved.ok() || StartsWith(*resolved, "127.")) return "0.0.0.0";
  return *resolved;
}

}  // namespace

int RunFailed(int code, const std::string& message) {
  fmt::print(stderr, "cohort run: {}\n", message);
  return code;
}

int RunFailed(const Status& s) {
  return RunFailed(ExitCodeFor(s, ExitContext::kLauncher), s.message());
}

Status ServeOrJoinStore(StorePlan& plan, const rendezvous::RendezvousConfig& rdzv, bool single,
                        std::unique_ptr<store::StoreServer>* server,
                        std::string* local_store_addr) {
  const std::string bind_addr = StoreBindAddress(plan);
  *local_store_addr = bind_addr == "0.0.0.0" ? "127.0.0.1" : bind_addr;
  const Deadline give_up = Deadline::After(rdzv.join_timeout);
  for (;;) {
    auto started = store::StoreServer::Start(
        {.host = bind_addr, .port = plan.port, .token = plan.token});
    if (started.ok()) {
      *server = std::move(started).value();
      plan.port = (*server)->port();
      break;
    }
    if (started.status().code() != StatusCode::kAlreadyExists) {
      return Unavailable("{}", started.status().message());
    }
    auto probe = store::TcpStore::Probe(
        {.host = *local_store_addr, .port = plan.port, .token = plan.token},
        Deadline::AfterMs(2000).Earlier(give_up));
    if (probe.peer == store::StorePeer::kCohortStore) {
      COHORT_LOG_INFO("cli", "port {} is served by another agent; joining it", plan.port);
      break;
    }
    const Status& why = probe.status;
    if (probe.peer == store::StorePeer::kWrongToken) {
      return PermissionDenied("the store on port {} refused this job's token; set the same "
                              "COHORT_TOKEN on every node",
                              plan.port);
    }
    if (probe.peer == store::StorePeer::kOtherProgram || single) {
      return AlreadyExists("cannot serve the rendezvous store on port {}: another program "
                           "holds the port; choose another --rdzv-endpoint port",
                           plan.port);
    }
    if (give_up.expired()) {
      return Unavailable("could neither serve nor reach the store on port {}: {}", plan.port,
                         why.message());
    }
  }
  return Status::Ok();
}

void WireJobStore(const StorePlan& plan, const std::string& store_addr, bool use_etcd,
                  bool serving, const store::EtcdStoreOptions& etcd, Duration join_timeout,
                  agent::AgentOptions& o, agent::StoreConnector* connect_within) {
  const JobStoreAccess tcp = store::TcpAccess({.host = store_addr, .port = plan.port,
                                               .token = plan.token});
  // The job's keys in etcd: "/cohort/<run id>/" (etcd.prefix is the run id).
  const JobStoreAccess on_etcd = use_etcd ? store::EtcdAccess(etcd) : JobStoreAccess{};
  o.spec.store_access = use_etcd && !serving ? on_etcd : tcp;
  // The agent's connections (its own and the watcher's): etcd whenever the job meets there.
  *connect_within = store::ConnectorFor(use_etcd ? on_etcd : tcp);
  const Deadline connect_deadline = Deadline::After(join_timeout);
  o.connect_store = [connect = *connect_within, connect_deadline] {
    return connect(connect_deadline.expired() ? Deadline::AfterMs(5000) : connect_deadline);
  };
}

Status PlanStore(const StoreFlags& f, bool use_etcd, bool single, std::optional<bool> is_host,
              StorePlan* plan) {
  const std::optional<std::string> env_token = worker_env::Inherited(worker_env::kToken);
  if (use_etcd) {
    // The agents meet in etcd, which has its own auth: no rendezvous store is served and
    // COHORT_TOKEN is not needed. On a single node the workers' communicator still gets a
    // loopback cohort store from this agent; across nodes it uses etcd too (docs/etcd.md).
    *plan = {"127.0.0.1", 0, single, env_token ? *env_token : RandomHex(16)};
  } else if (f.standalone || (single && f.rdzv_endpoint.empty())) {
    *plan = {"127.0.0.1", 0, true, env_token ? *env_token : RandomHex(16)};
  } else {
    auto hp = ParseHostPort(f.rdzv_endpoint.empty() ? "127.0.0.1" : f.rdzv_endpoint,
                            kDefaultStorePort);
    if (!hp) {
      return InvalidArgument("--rdzv-endpoint '{}' is not host[:port]", f.rdzv_endpoint);
    }
    plan->host = hp->first;
    plan->port = hp->second;
    plan->serve = is_host.value_or(net::IsLocalHost(plan->host));
    if (env_token) {
      plan->token = *env_token;
    } else if (single) {
      plan->token = RandomHex(16);
    } else {
      return InvalidArgument(
          "a multi-node job needs a shared secret: set COHORT_TOKEN to the same value on every "
          "node (for example: export COHORT_TOKEN=$(head -c16 /dev/urandom | od -An -tx1 | tr "
          "-d ' \\n'))");
    }
  }
  return Status::Ok();
}

Status PlanEtcd(const StoreFlags& f, store::EtcdStoreOptions* etcd, std::string* rdzv_conf) {
  if (f.rdzv_endpoint.empty()) {
    return InvalidArgument("--rdzv-backend etcd needs --rdzv-endpoint host:port[,host:port...] "
                           "of the etcd members");
  }
  bool https = false;
  // A named file that does not exist is kNotFound (exit 127), a bad value kInvalidArgument.
  COHORT_RETURN_IF_ERROR(SplitEtcdConf(f.rdzv_conf, *etcd, rdzv_conf, &https));
  auto endpoints = store::ParseEtcdEndpoints(f.rdzv_endpoint, https || !etcd->ca_file.empty());
  if (!endpoints.ok()) return InvalidArgument("{}", endpoints.status().message());
  etcd->endpoints = *endpoints;
  return Status::Ok();
}

void RemoveEtcdKeys(const store::EtcdStoreOptions& etcd) {
  auto s = store::EtcdStore::Connect(etcd, Deadline::After(etcd.request_timeout));
  auto deleted = s.ok() ? (*s)->DeleteAll(Deadline::After(etcd.request_timeout))
                        : Result<int64_t>(s.status());
  if (!deleted.ok()) {
    COHORT_LOG_WARN("cli", "could not remove this job's keys from etcd: {}",
                    deleted.status().message());
  }
}

}  // namespace cohort::cli
