// NetnsHosts: several "hosts" on this machine for `cohort bench scaling --nodes` (root):
// a bridge in a network namespace of its own and, per host, a namespace joined to it by a
// veth cable, with an address (10.233.X.i/24) that exists only inside these namespaces.
// Processes run on host i through `ip netns exec`. The destructor removes every namespace
// (the interfaces go with them). Needs root and iproute2.
//
// Thread-safety: one owner; not shared between threads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cohort/base/status.h"

namespace cohort::cli {

class NetnsHosts {
 public:
  static Result<std::unique_ptr<NetnsHosts>> Create(int hosts);
  ~NetnsHosts();
  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;

  int size() const { return static_cast<int>(hosts_.size()); }
  const std::string& name(int i) const { return hosts_[i]; }
  std::string addr(int i) const;
  // `argv` run on host i: {"ip", "netns", "exec", <host>, argv...}.
  std::vector<std::string> On(int i, const std::vector<std::string>& argv) const;

 private:
  NetnsHosts() = default;
  std::string tag_;
  int subnet_ = 0;
  std::vector<std::string> namespaces_;  // every namespace made, the bridge's first
  std::vector<std::string> hosts_;
  std::vector<std::string> cables_;  // the host ends of the veth pairs made
};

}  // namespace cohort::cli
