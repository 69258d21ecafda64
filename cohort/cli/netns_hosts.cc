// NetnsHosts (see netns_hosts.h). Thread-safety: as documented there.
#include "cohort/cli/netns_hosts.h"

#include <unistd.h>

#include <filesystem>

#include "cohort/base/subprocess.h"

namespace cohort::cli {
namespace {

Status Ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"ip"};
  argv.insert(argv.end(), args.begin(), args.end());
  COHORT_ASSIGN_OR_RETURN(CapturedOutput out, RunAndCapture(argv, {}, "", Deadline::AfterMs(30000)));
  if (!out.status.success()) {
    std::string cmd;
    for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
    return Internal("`{}` failed: {}", cmd, out.err.empty() ? out.status.Describe() : out.err);
  }
  return Status::Ok();
}

// Removes the namespaces named `tag`br and `tag`h<i>, and the cables `tag`v<i> still in
// this namespace, that a killed earlier process of this pid left.
void RemoveLeftovers(const std::string& tag) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/run/netns", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(tag, 0) != 0) continue;
    const std::string rest = name.substr(tag.size());
    const bool ours = rest == "br" || (rest.size() > 1 && rest[0] == 'h' &&
                                       rest.find_first_not_of("0123456789", 1) == rest.npos);
    if (ours) (void)Ip({"netns", "del", name});
  }
  for (const auto& e : std::filesystem::directory_iterator("/sys/class/net", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(tag + "v", 0) == 0) (void)Ip({"link", "del", name});
  }
}

}  // namespace

Result<std::unique_ptr<NetnsHosts>> NetnsHosts::Create(int hosts) {
  if (::geteuid() != 0) {
    return FailedPrecondition("network-namespace hosts need root (ip netns); run as root, or "
                              "inside a Slurm allocation with --hosts slurm");
  }
  std::unique_ptr<NetnsHosts> h(new NetnsHosts());
  // Named after this process (interface names stay within 15 characters: "cs" + at most 7
  // digits + "v" + the host's index). Namespaces of that name can only be left by a dead
  // process that had this pid and was killed before its destructor ran: removed first.
  h->tag_ = fmt::format("cs{}", ::getpid());
  h->subnet_ = 1 + ::getpid() % 250;
  RemoveLeftovers(h->tag_);
  const std::string bridge = h->tag_ + "br";
  COHORT_RETURN_IF_ERROR(Ip({"netns", "add", bridge}));
  h->namespaces_.push_back(bridge);
  COHORT_RETURN_IF_ERROR(Ip({"-n", bridge, "link", "add", "br0", "type", "bridge"}));
  COHORT_RETURN_IF_ERROR(Ip({"-n", bridge, "link", "set", "br0", "up"}));
  for (int i = 0; i < hosts; ++i) {
    const std::string ns = fmt::format("{}h{}", h->tag_, i);
    const std::string host_end = fmt::format("{}v{}", h->tag_, i);
    const std::string bridge_end = fmt::format("{}p{}", h->tag_, i);
    COHORT_RETURN_IF_ERROR(Ip({"netns", "add", ns}));
    h->namespaces_.push_back(ns);
    h->hosts_.push_back(ns);
    COHORT_RETURN_IF_ERROR(Ip({"link", "add", host_end, "type", "veth", "peer", "name", bridge_end}));
    h->cables_.push_back(host_end);  // removed by the destructor if still here
    COHORT_RETURN_IF_ERROR(Ip({"link", "set", host_end, "netns", ns}));
    COHORT_RETURN_IF_ERROR(Ip({"link", "set", bridge_end, "netns", bridge}));
    COHORT_RETURN_IF_ERROR(Ip({"-n", ns, "link", "set", host_end, "name", "eth0"}));
    COHORT_RETURN_IF_ERROR(Ip({"-n", ns, "addr", "add", h->addr(i) + "/24", "dev", "eth0"}));
    COHORT_RETURN_IF_ERROR(Ip({"-n", ns, "link", "set", "eth0", "up"}));
    COHORT_RETURN_IF_ERROR(Ip({"-n", ns, "link", "set", "lo", "up"}));
    COHORT_RETURN_IF_ERROR(Ip({"-n", bridge, "link", "set", bridge_end, "master", "br0"}));
    COHORT_RETURN_IF_ERROR(Ip({"-n", bridge, "link", "set", bridge_end, "up"}));
  }
  return h;
}

NetnsHosts::~NetnsHosts() {
  for (auto it = namespaces_.rbegin(); it != namespaces_.rend(); ++it) {
    (void)Ip({"netns", "del", *it});
  }
  // A cable made but not yet moved into its namespace (a failed Create) is still in this
  // one; the others went with their namespaces.
  for (const auto& cable : cables_) {
    if (::access(fmt::format("/sys/class/net/{}", cable).c_str(), F_OK) == 0) {
      (void)Ip({"link", "del", cable});
    }
  }
}

std::string NetnsHosts::addr(int i) const { return fmt::format("10.233.{}.{}", subnet_, i + 1); }

std::vector<std::string> NetnsHosts::On(int i, const std::vector<std::string>& argv) const {
  std::vector<std::string> out = {"ip", "netns", "exec", hosts_[i]};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

}  // namespace cohort::cli
