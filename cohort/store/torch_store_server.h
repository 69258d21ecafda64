// TorchStoreServer: a server of PyTorch's TCPStore wire protocol (as torch 1.13 speaks it:
// set, compare_set, get, add, check, wait, num_keys, delete_key), so that the agent can host
// the store that torch's env:// rendezvous uses. With TORCHELASTIC_USE_AGENT_STORE=True in
// the workers' environment every rank connects as a client to a server that is already
// listening: no rank races to start it, and no client sleeps a second before retrying.
// Keys live in memory for the server's lifetime (the agent starts one per round).
//
// Thread-safety: Start/Stop/port may be called from any thread; all state is owned by the
// server's event-loop thread ("torch-store").
#pragma once

#include <memory>
#include <string>

#include "cohort/base/status.h"

namespace cohort::store {

struct TorchStoreServerOptions {
  std::string host = "0.0.0.0";
  int port = 0;  // 0: a free port; SO_REUSEADDR, so a port held by net::ReservePort works
};

class TorchStoreServer {
 public:
  static Result<std::unique_ptr<TorchStoreServer>> Start(const TorchStoreServerOptions& options);
  ~TorchStoreServer();
  TorchStoreServer(const TorchStoreServer&) = delete;
  TorchStoreServer& operator=(const TorchStoreServer&) = delete;

  int port() const;
  void Stop();

 private:
  class Impl;
  explicit TorchStoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cohort::store
