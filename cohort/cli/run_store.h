// How `cohort run` reaches its job's store: where the store is and whether this node serves
// it (PlanStore, PlanEtcd), serving it or joining the agent that does (ServeOrJoinStore), and
// the one place that wires the agent's connections and the workers' store access to it
// (WireJobStore). Internal to cli/run_command.cc. Errors are Statuses whose codes give the
// exit code (ExitCodeFor, ExitContext::kLauncher: kInvalidArgument 3, kNotFound 127,
// kAlreadyExists 5 for a port another program holds, kUnavailable/kPermissionDenied 4).
// Thread-safety: single-threaded (called before the agent starts); the StoreServer it
// starts runs on its own thread.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "cohort/agent/agent.h"
#include "cohort/agent/job_directory.h"
#include "cohort/rendezvous/rendezvous.h"
#include "cohort/store/etcd_store.h"
#include "cohort/store/store_server.h"

namespace cohort::cli {

// Prints "cohort run: <message>" on stderr and returns `code` (the command's exit code).
int RunFailed(int code, const std::string& message);
// The same for a failed step: the exit code its status gives (ExitCodeFor, launcher).
int RunFailed(const Status& s);

// Where this node's agent finds the store, and whether it serves it.
struct StorePlan {
  std::string host;
  int port = 0;
  bool serve = false;
  std::string token;
};

// The flags of `cohort run` that say where the store is.
struct StoreFlags {
  bool standalone = false;
  std::string rdzv_endpoint;
  std::string rdzv_conf;
};

// Where the store is: embedded on a free loopback port for one node without an endpoint,
// else the endpoint, served by this node when its host is local (or --rdzv-conf is_host
// says so); the job's token.
Status PlanStore(const StoreFlags& f, bool use_etcd, bool single, std::optional<bool> is_host,
              StorePlan* plan);

// The etcd rendezvous: its members (--rdzv-endpoint) and the TLS and auth options of
// --rdzv-conf, which leaves the rendezvous' own options in `rdzv_conf`.
Status PlanEtcd(const StoreFlags& f, store::EtcdStoreOptions* etcd, std::string* rdzv_conf);

// Serves the rendezvous store on plan.port, or joins the agent that does: two agents may
// race for the port; the loser finds a cohort store there and becomes a client; if the
// winner then vanishes, the port is free again and the next try serves it. Another program
// on the port is a port-in-use error (kAlreadyExists).
Status ServeOrJoinStore(StorePlan& plan, const rendezvous::RendezvousConfig& rdzv, bool single,
                        std::unique_ptr<store::StoreServer>* server,
                        std::string* local_store_addr);

// Where the job's store is, for the agent (connect_store: the rendezvous' store, a cohort
// store or etcd) and for libcohort in the workers (store_access): the cohort store this node
// serves or joins; on an etcd job etcd itself (the run id's keys), except on a single node,
// where this agent serves a loopback store for its own workers.
void WireJobStore(const StorePlan& plan, const std::string& store_addr, bool use_etcd,
                  bool serving, const store::EtcdStoreOptions& etcd, Duration join_timeout,
                  agent::AgentOptions& o, agent::StoreConnector* connect_within);

// Removes the job's keys from etcd (best effort, warned on failure).
void RemoveEtcdKeys(const store::EtcdStoreOptions& etcd);

}  // namespace cohort::cli
