// RoundTell: a round's end told node to node by datagram (RendezvousConfig::tell_start_nodes).
// In a large quiet round on etcd the nodes rest between their beats without a watch (a held
// watch per node overloads etcd at 10,000 nodes), so they learn the round's end at their
// next beat, up to a beat period (20 s at 10,000 nodes) after it was written. With a
// RoundTell the node that wrote the end sends it (r<R>/next's value) to every node of the
// round as one UDP datagram each, and a resting node wakes on it. A datagram lost costs
// that node nothing but the wait it had without: it still learns the end at its next beat.
//
// A datagram is "cohort-end 1\n<run id>\n<round>\n<key>\n<end>", where <key> is the round's
// tell key (random, published with the round's layout: only the round's nodes and readers
// of its store know it). A node takes only its own job's, round's and key's; everything
// else is dropped unread further.
//
// The socket is IPv4 (the address each node publishes, NodeInfo::addr), bound to a free port
// on every interface; its port is in the node's record (NodeInfo::tell_port).
//
// Thread-safety: Await by one thread at a time (the round's watcher); Cancel and Send from
// any thread; Uncancel only while no Await runs. The object outlives its users (shared_ptr).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/base/event_fd.h"
#include "cohort/base/status.h"
#include "cohort/base/time.h"

namespace cohort::rendezvous {

class RoundTell {
 public:
  // A datagram at most this long is sent (an end whose text is longer, a carried layout
  // with many appended nodes, is learned at the beats as before).
  static constexpr size_t kMaxDatagram = 60000;

  // Binds a UDP socket to a free port on every interface.
  static Result<std::shared_ptr<RoundTell>> Open();
  ~RoundTell();
  RoundTell(const RoundTell&) = delete;
  RoundTell& operator=(const RoundTell&) = delete;

  int port() const { return port_; }

  // Waits until `deadline` for the end of `round` of job `run_id` told with `key`: the
  // end's text (what r<R>/next says), nullopt at the deadline, kCancelled once Cancel() was
  // called (before or during, until Uncancel).
  Result<std::optional<std::string>> Await(std::string_view run_id, int64_t round,
                                           std::string_view key, Deadline deadline);
  void Cancel() { cancel_.Notify(); }
  void Uncancel() { cancel_.Drain(); }

  struct Peer {
    std::string addr;  // IPv4 address or host name
    int port = 0;
  };
  // Sends the end of `round` to each peer, best effort (a peer that cannot be resolved, or
  // whose datagram the kernel refuses, is skipped). Returns how many datagrams were sent.
  int Send(std::string_view run_id, int64_t round, std::string_view key, std::string_view end,
           const std::vector<Peer>& to);

 private:
  RoundTell(int fd, int port) : fd_(fd), port_(port) {}
  int fd_;
  int port_;
  EventFd cancel_;
};

// The datagram's text, and its parse (nullopt: not an end of that job, round and key).
std::string EncodeToldEnd(std::string_view run_id, int64_t round, std::string_view key,
                          std::string_view end);
std::optional<std::string> DecodeToldEnd(std::string_view datagram, std::string_view run_id,
                                         int64_t round, std::string_view key);

}  // namespace cohort::rendezvous
