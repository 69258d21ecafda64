// The membership channel: how an agent and its workers talk about live reconfiguration
// (docs/multinode.md, "Live reconfiguration"). Files in one directory per worker group,
// which the agent names in COHORT_MEMBERSHIP_DIR; per local rank L:
//
//   ready.L    the worker re-forms in place when the membership changes (worker, once)
//   notice.L   the newest membership the agent announces to it (agent; JSON)
//   formed.L   the round the worker last formed its group in (worker)
//   lost.L     a collective of the worker failed because a peer went away (worker; JSON)
//
// Every file is replaced whole (write beside, rename), so a reader sees one version or the
// next; each has exactly one writer. A directory watched with inotify (IN_MOVED_TO) sees
// every change. Absence of ready.L means the worker cannot re-form: it is restarted.
//
// Who can talk on it: the directory is private (mkdtemp, mode 0700, this user's; every
// reader and the worker's first write check that with CheckPrivateDir, so a directory
// another user prepared is refused), and the messages that steer (notice, lost) carry the
// agent's channel secret (COHORT_MEMBERSHIP_SECRET, which only the agent's workers
// inherit): a message without it is refused, never acted on.
//
// Thread-safety: free functions over files; no state.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cohort/base/status.h"

namespace cohort {

// One worker's place in a newly formed round.
struct MembershipNotice {
  int64_t round = 0;
  int rank = 0;
  int world_size = 1;
  int group_rank = 0;
  int group_world_size = 1;
  std::string store_prefix;  // the round's key prefix in the job's store (JobStoreAccess)
  int64_t restart_count = 0;
  std::string master_addr;   // the round's MASTER_ADDR/PORT (torch's store, served by node 0)
  int master_port = 0;

  std::string ToJson() const;
  static Result<MembershipNotice> FromJson(std::string_view text);
};

// A worker's report that a peer went away during a collective of `round`.
struct LostPeerReport {
  int64_t round = 0;
  int rank = 0;
  std::string reason;  // the collective's error
  int peer = -1;       // the global rank of the peer that went away (-1: not known)

  std::string ToJson() const;
  static Result<LostPeerReport> FromJson(std::string_view text);
};

// The peer a transport error names as "rank <N> (at <address>)" (the TCP mesh's errors for
// a peer that closed its connection or could not be reached), -1 when it names none.
int LostPeerIn(std::string_view reason);
// The address a transport error names as "[<ip>]:<port>" (gloo's TCP pairs: "Read error
// [10.0.0.3]:41234: Connection reset by peer"), without brackets or port; empty when none.
std::string LostPeerAddressIn(std::string_view reason);

namespace membership_channel {

enum class File { kReady, kNotice, kFormed, kLost };

// <dir>/<name>.<local_rank>; the name alone ("notice") for inotify events: FileOf parses it.
std::string PathOf(const std::string& dir, File file, int local_rank);
// Which file an entry name ("lost.3") is, and its local rank; nullopt for anything else
// (temporary files included).
std::optional<std::pair<File, int>> FileOf(std::string_view name);

// A channel directory watched with inotify, for the agent's monitor and a worker's watcher
// thread: fd() becomes readable when a file is replaced; Changed() reads what is pending
// and says which files those were. One owner thread.
class ChannelWatch {
 public:
  static Result<std::unique_ptr<ChannelWatch>> Open(const std::string& dir);
  ~ChannelWatch();
  ChannelWatch(const ChannelWatch&) = delete;
  ChannelWatch& operator=(const ChannelWatch&) = delete;
  int fd() const { return fd_; }
  std::vector<std::pair<File, int>> Changed();

 private:
  explicit ChannelWatch(int fd) : fd_(fd) {}
  const int fd_;
};

// `secret`: the agent's channel secret, which the notice and report files carry and their
// readers require (kPermissionDenied otherwise, as for a directory that is not private).
Status WriteNotice(const std::string& dir, int local_rank, const MembershipNotice& notice,
                   const std::string& secret);
// kNotFound when the agent announced nothing yet.
Result<MembershipNotice> ReadNotice(const std::string& dir, int local_rank,
                                    const std::string& secret);

// The worker's first word on the channel: refused (kPermissionDenied) unless the directory
// is private to this user.
Status MarkReady(const std::string& dir, int local_rank);
bool IsReady(const std::string& dir, int local_rank);

Status WriteFormed(const std::string& dir, int local_rank, int64_t round);
// The round the worker formed last, nullopt before its first re-form.
std::optional<int64_t> ReadFormed(const std::string& dir, int local_rank);

Status WriteLost(const std::string& dir, int local_rank, const LostPeerReport& report,
                 const std::string& secret);
Result<LostPeerReport> ReadLost(const std::string& dir, int local_rank,
                                const std::string& secret);

}  // namespace membership_channel
}  // namespace cohort
