// Elastic rendezvous over any Store: nodes (agents) agree on numbered rounds, each with a
// closed member list, within --nnodes MIN:MAX.
//
// Keys under "rdzv/<run_id>/" (see docs/rendezvous.md for the full protocol):
//   round            the current round number (advanced by CompareSet only)
//   r<R>/slot        join counter of round R; Store::Join hands out slots 1, 2, ...
//   r<R>/node<S>     NodeInfo of slot S (JSON), written with the slot (Store::Join, as
//                    Append; read with ReadAppended: on etcd it is kept with the ticket)
//   r<R>/hb<S>       slot S's heartbeat counter (absent until its first beat); on a store
//                    with leases, "alive" on slot S's lease (deleted when it expires)
//   r<R>/gone<S>     set by the store (a will) when slot S's watcher connection ended for
//                    good: why ("its store connection closed")
//   r<R>/layout      the closed round's member count and local world sizes, run-length
//                    encoded ("N:8x9999,4x1"), then a newline and node 1's record;
//                    written once by slot 1, read by every node. A carried round's
//                    (written by the node that ended R-1) adds a line naming the round
//                    whose records its nodes are and the slots of it left out
//                    ("carried:<Q>:<s>,<s>..."), and a line per node appended to it
//                    ("appended:<token> <record>": it arrived at a running round)
//   r<R>/publisher   the slot that publishes the layout in place of a silent slot 1
//   r<R>/closed      member count N of round R, set once by CompareSet (first writer wins)
//   r<R>/pace        a quiet round's pace: its beat period and dead timeout times it
//                    (absent: the start pace), "K by slot S", set by a few of its nodes
//                    as the store answers their beats (Rendezvous::FollowPace)
//   r<R>/expect      how many nodes round R expects (set when R-1 ended): its last call ends
//                    once they joined
//   r<R>/ended_by    the claim of round R's end: the node that writes `next` (a claim
//                    whose `next` did not come within the layout grace is taken over)
//   r<R>/next        why round R ends (RoundEnd::Encode), first writer wins
//   r<R>/master_port the round's MASTER_PORT, published by node 0's agent (MasterPortKey)
//   r<R>/failure     JSON summary of the failure that ended round R
//   r<R>/finished<S> slot S finished successfully (not a dead node)
//   restarts         job-wide count of rounds ended by a failure, and the last round
//                    whose end counted one ("N@R")
//   standby          how many warm spares (--standby) have waited for a place
//   r<R>/spares      claims of the places round R-1's lost nodes left (warm spares)
//   done             the job is over ("succeeded" or "failed: ...")
// A large round that ends for a lost node, or for a node arriving, may be carried
// (carry_start_nodes): its nodes form the next round without joining it (one read each), in
// their old order, the arriving node appended.
// A join is two store round trips on etcd and three on the embedded store for every node but
// slot 1, whatever the node count, and reads O(1) bytes per node (the layout is one run when
// all nodes run as many workers); only slot 1 reads the N node records. Liveness is a ring:
// each node watches one peer (its successor), so a heartbeat period costs the store O(N)
// requests in all; on a store that keeps wills the connection carries liveness and the beats
// slow down; on a store with leases (etcd) a beat renews the node's lease on its key (no
// write) and a dead node's key is deleted by the store; a large round on etcd is quiet (one
// txn per beat, no watch, no lease; beats bounded by quiet_beats_per_s) (docs/scale.md).
//
// Thread-safety: a Rendezvous is used by one thread (the agent's); Watch runs on the
// watcher's own Rendezvous object over its own store connection.
#pragma once

#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cohort/base/status.h"
#include "cohort/base/time.h"
#include "cohort/rendezvous/round_tell.h"
#include "cohort/store/store.h"

namespace cohort::rendezvous {

struct NodeInfo {
  std::string host;            // hostname, for messages
  std::string addr;            // address other nodes reach this node at
  int local_world_size = 1;
  std::string boot_id;         // same host + boot id = shared memory possible
  int tell_port = 0;           // UDP port its watcher is told a round's end at (0: none)

  std::string ToJson() const;
  static Result<NodeInfo> FromJson(std::string_view text);
};

struct RendezvousConfig {
  std::string run_id = "none";
  int min_nodes = 1;
  int max_nodes = 1;
  Duration join_timeout = std::chrono::seconds(600);
  Duration last_call = std::chrono::seconds(1);
  Duration heartbeat_interval = std::chrono::seconds(1);
  Duration dead_timeout = std::chrono::seconds(10);
  int64_t max_restarts = 0;  // Next() refuses to start a round once `restarts` exceeds it
  // How long nodes wait for slot 1 to publish a closed round's layout before one of them
  // does (slot 1 died between joining and publishing); after a quiet round, its beat
  // period longer (the nodes learned its end up to a period apart).
  Duration layout_grace = std::chrono::seconds(30);
  // Rounds of at least this many nodes: a watcher's first step (before its first beat)
  // asks the store nothing where waiting is a request (Store::Idle; etcd), so a round that
  // ends within its first beat period is learned up to a period late.
  int quiet_start_nodes = 500;
  // A quiet round beats at most this often in all (its beat period is at least N / this,
  // and the dead timeout at least four periods; a warning says so): a store that pays for
  // each request (etcd) is not asked more than it can answer. 0: no bound.
  int quiet_beats_per_s = 500;
  // A quiet round of at most this many nodes that is not told its end by datagram
  // (tell_start_nodes) rests between its beats on a wait for the round's end that the store
  // holds for each node (Store::Await; etcd: one watch per node for the round), so its
  // nodes learn the end as it is written. Larger rounds (and 0: every round) rest asking
  // nothing (Store::Idle) and learn it at their next beat, up to a beat period later,
  // sparing the store a held watch per node: at 5,000 nodes on three etcd members the
  // watches cut a loss's handling by a third for 0.8 GB of the members' memory, and at
  // 10,000 nodes, on members sharing two cores with the nodes, etcd stopped answering in
  // round 0 with them. A told round holds none: at 5,000 nodes told ends alone handled a
  // loss in 2.4 s against 9.3 s with the watches too, with 0.7 GB less (docs/scale.md).
  int quiet_watch_max_nodes = 5000;
  // Rounds of at least this many nodes that end for a lost node are carried: the node
  // that ends the round also closes the next one with the survivors, leaving out the lost
  // node and every other whose beats the store dates as older than two beat periods
  // (Store::Silent), and each survivor takes it with one read instead of a join (at
  // 10,000 nodes on etcd, 10,000 joins at once are what the round after a loss cost and
  // what made etcd lose its leader; docs/scale.md). Not when a node has finished, a warm
  // spare waits, or fewer than MIN would be left; a node left out that is alive joins
  // as a late node (a re-rendezvous). 0: never.
  int carry_start_nodes = 500;
  // Quiet rounds of at least this many nodes are told their end by datagram (RoundTell):
  // the node that ends the round reads the round's records and sends the end to every
  // node, whose watcher rests on its datagram socket between its beats (and in its first
  // step) instead of asking the store nothing: the end is learned as it is written, not at
  // the next beat (a beat period, 20 s at 10,000 nodes on etcd, later), without a watch
  // per node on the store. Only nodes given a RoundTell (UseTell; `cohort run` does) take
  // part. 0: never.
  int tell_start_nodes = 500;
  // A warm spare (`cohort run --standby`): Next() joins no running round and asks for no
  // re-rendezvous; it waits for a round that loses a node and takes the place in the next
  // one (behind the survivors, never in place of one). Rounds after that as any node.
  bool standby = false;
};

// How a closed round's global ranks fall on its nodes: the local world sizes of group
// ranks 0..N-1 as runs of equal sizes. On the wire (r<R>/layout): "N:LxC,LxC,...".
struct RoundLayout {
  struct Run {
    int local_world_size = 0;
    int count = 0;
  };
  int members = 0;
  std::vector<Run> runs;

  static RoundLayout FromNodes(const std::vector<NodeInfo>& nodes);
  // This layout without the nodes of the given group ranks (a carried round's).
  RoundLayout Without(const std::vector<int>& group_ranks) const;
  void Append(int local_world_size);  // one more node, after the others
  std::string Encode() const;
  static Result<RoundLayout> Decode(std::string_view text);
  int RankOffset(int group_rank) const;  // sum of lower nodes' local world sizes
  int GroupRankOf(int global_rank) const;  // the node a global rank runs on (-1: none)
  int WorldSize() const;
};

// Who a carried round's nodes are (RendezvousConfig::carry_start_nodes), in group-rank
// order: the nodes of the round whose join records describe them (records_round) but its
// slots `left_out`, then the `appended` nodes, which joined a running round that was carried
// with them (their records are here: they never joined records_round).
struct CarriedMembers {
  struct Appended {
    std::string token;  // the node's own random name (it finds itself by it)
    NodeInfo node;
  };
  int64_t records_round = -1;  // -1: not carried (the round's own join records)
  std::vector<int> left_out;   // ascending
  std::vector<Appended> appended;
};

struct RendezvousInfo {
  int64_t round = 0;
  int group_rank = 0;        // this node's rank among the round's nodes
  int group_world_size = 0;  // nodes in the round
  NodeInfo master;           // the node of group rank 0 (it serves MASTER_ADDR:PORT)
  int rank_offset = 0;       // global rank of this node's local rank 0
  int world_size = 0;        // workers in the job (all nodes)
  int64_t restart_count = 0;  // job-wide rounds ended by a failure so far
  std::string store_prefix;   // per-round namespace for workers ("rdzv/<id>/r<R>/w")
  int slot = 0;               // join slot (1-based) in this round
  // The store's mark of a moment after this node joined and before the round could end
  // (Store::GetSince): the layout's write, or the join's (0 in a carried round).
  int64_t joined_at = 0;
  // How the group ranks fall on the nodes (rank_offset and world_size come from it).
  RoundLayout layout;
  // A carried round's members (else records_round -1: this round's join records).
  CarriedMembers carried;
  // The key a datagram telling this round's end must carry (RoundTell; empty: none).
  std::string tell_key;
  // A quiet round's pace to start at (Rendezvous::FollowPace; its slot 1 chose it from how
  // fast the round formed, or the round it was carried from had it).
  int64_t pace = 1;
  int64_t RecordsRound() const {
    return carried.records_round >= 0 ? carried.records_round : round;
  }
  // How many of the nodes (the first ones) have their records in RecordsRound().
  int RecordedMembers() const {
    return group_world_size - static_cast<int>(carried.appended.size());
  }
  // The slot in RecordsRound() of this round's slot `slot` <= RecordedMembers() (the same
  // when none was left out).
  int RecordSlot(int slot) const;

  int RankOffset() const { return rank_offset; }
  int WorldSize() const { return world_size; }
};

struct FailureRecord {
  int rank = -1;
  std::string host;
  int exit_code = 0;       // valid when signal == 0
  int signal = 0;
  std::string message;     // from the worker's error file, may be empty
  std::string ToJson() const;
  static Result<FailureRecord> FromJson(std::string_view text);
  std::string Describe() const;
};

// Why a round ended. On the wire (r<R>/next) it is "failure:<detail>", "join:<host>",
// "dead:<detail>" or "done", after "carried:<restarts>:<bytes>:<layout>" when the round's
// nodes were carried into the next one; only Encode and Decode know that form.
struct RoundEnd {
  enum class Kind {
    kFailure,   // a worker failed (detail: which rank)
    kJoin,      // a node joined a running job: re-form with it
    kDeadNode,  // a node stopped sending heartbeats, or its connection ended for good
    kJobDone,   // the job is over
  };
  RoundEnd() = default;
  RoundEnd(Kind k, std::string d) : kind(k), detail(std::move(d)) {}

  Kind kind = Kind::kFailure;
  std::string detail;
  // The next round, when the node that ended this one carried its nodes into it
  // (carry_start_nodes): its layout record (r<R+1>/layout's text) and the job's restart
  // count after this end. A node told the end takes that round from here, without a read
  // (Rendezvous::Told): on a held wait, thousands of survivors learn the end at once, and
  // their reads of the layout at once were most of a carried loss's handling at 5,000 nodes.
  struct Carried {
    int64_t restarts = 0;
    std::string layout;
  };
  std::optional<Carried> carried;

  // Failures and dead nodes spend the job-wide restart budget; joins do not.
  bool CountsAsFailure() const { return kind == Kind::kFailure || kind == Kind::kDeadNode; }
  std::string Encode() const;
  // Text from the store; anything unknown is a failure described by the whole text.
  static RoundEnd Decode(std::string_view text);
  // "node 1 (host-b) stopped sending heartbeats", "host-c joined", "rank 3 failed", ...
  std::string Describe() const;
};

class Rendezvous {
 public:
  Rendezvous(std::shared_ptr<store::Store> store, RendezvousConfig config, NodeInfo self);

  // Joins the next open round and returns it once closed. Spare nodes (beyond MAX) and
  // late joiners wait here for the next round. Errors: kDeadlineExceeded when MIN nodes do
  // not join within the join timeout; kFailedPrecondition when the job is over or the
  // restart budget is spent (message says which).
  Result<RendezvousInfo> Next();
  // What this node's watcher learned of `round`'s end (WatchStep's RoundEnd), before Next:
  // a carried end's next round is then taken from it, without reading the store.
  void Told(int64_t round, const RoundEnd& why);

  // Ends `round` (first caller wins) for `why`. A failure counts against the job-wide
  // restart budget once, however many nodes report it. Returns whether this call won.
  // `expect_next` (0: unknown) is how many nodes the next round should wait for before
  // closing (r<R+1>/expect): its last call ends once they joined.
  Result<bool> EndRound(int64_t round, const RoundEnd& why, const FailureRecord* failure,
                        int64_t expect_next = 0);
  // The same for `info`'s round, whose nodes the winner then tells the end (tell_start_nodes).
  Result<bool> EndRound(const RendezvousInfo& info, const RoundEnd& why,
                        const FailureRecord* failure, int64_t expect_next);
  // Ends `info`'s round for its lost node of slot `lost_slot` (a watcher's silent peer, or
  // the node of a peer a worker's collective lost): EndRound for a dead node (the next
  // round expects the others), whose winner first carries the others into the next round
  // when the round is one to carry (carry_start_nodes). Returns whether this call won.
  Result<bool> EndRoundForLostNode(const RendezvousInfo& info, int lost_slot,
                                   const RoundEnd& why, const FailureRecord& record);
  Result<FailureRecord> GetFailure(int64_t round);

  // One watcher step: bumps this node's heartbeat (when `beat`), checks the peer it watches
  // (its successor in slot order, skipping finished nodes) for silence, and waits up to
  // one beat period (BeatPeriod; or until that peer's deadline) for the round to end or
  // that peer's will. Returns why it ended, or nullopt while the round is still running.
  Result<std::optional<RoundEnd>> WatchStep(const RendezvousInfo& info, bool beat = true);
  // How long the round's watchers let a peer be silent before ending the round: the
  // configured dead timeout, or longer for a quiet round (known from this node's first
  // WatchStep of the round on: see quiet_start_nodes).
  Duration DeadTimeout(const RendezvousInfo& info) const;
  // Records that this node's workers all succeeded; the last member closes the job.
  Status MarkFinished(const RendezvousInfo& info);
  // For the node serving the store: keeps heartbeating until the job is over, and returns
  // its outcome ("succeeded", "failed: ..."). Gives up one join timeout after the round
  // ended without a new one finishing the job.
  Result<std::string> WaitForJobEnd(const RendezvousInfo& info);
  Status CloseJob(std::string_view outcome);

  // The store key where node 0 publishes round `round`'s MASTER_PORT (the torch store the
  // agent serves); the other nodes wait for it. Keys under a round are this layer's.
  std::string MasterPortKey(int64_t round) const { return RoundKey(round, "master_port"); }
  // The records of the round's nodes, in slot order (node 0, which serves the workers'
  // torch store, admits the others' addresses). One ranged read of the round's records.
  Result<std::vector<NodeInfo>> RoundNodes(const RendezvousInfo& info, Deadline deadline);
  // The group rank of the one node of `info`'s round whose record has address `addr` (a
  // transport error that names a lost peer's address only: gloo), -1 when no node or more
  // than one has it. Reads the round's records (RoundNodes): O(N) bytes, for the few agents
  // whose workers saw the loss, in a round large enough to carry (EndRoundForLostNode).
  Result<int> GroupRankAt(const RendezvousInfo& info, std::string_view addr, Deadline deadline);

  // Whether a round of `members` nodes is large enough to carry (carry_start_nodes).
  bool Carries(int64_t members) const;
  // This node is told its rounds' ends by datagram, and tells them, through `tell` (its
  // port goes into this node's record: call before Next). Shared by the agent's
  // Rendezvous objects (its own and its watcher's).
  void UseTell(std::shared_ptr<RoundTell> tell);

  const RendezvousConfig& config() const { return config_; }
  store::Store& store() { return *store_; }

 private:
  std::string Key(std::string_view suffix) const;
  std::string RoundKey(int64_t round, std::string_view suffix) const;
  Deadline CallDeadline() const;
  struct JobState {
    std::optional<std::string> done;  // the outcome once the job is over
    int64_t restarts = 0;
    int64_t round = 0;
    bool closed_known = false;          // whether `closed` below is that of `round`
    std::optional<std::string> closed;  // the round's member count once it is closed
  };
  // The N node records of `round`, in slot order, read again on a timeout until `deadline`
  // (Next's layout publication and RoundNodes).
  Result<std::vector<NodeInfo>> ReadNodes(int64_t round, int64_t members, Deadline deadline);
  Result<JobState> ReadJobState(Deadline retry_until);
  // (A compare-and-set from absent: made again when it times out, until `retry_until`.)
  Status AdvanceRound(int64_t round, Deadline retry_until);
  Status WaitForNextRound(int64_t round, Deadline join_deadline);
  // The steps of Next (the protocol is written out above it in rendezvous.cc).
  struct Published {  // what slot 1 publishes for a closed round (r<R>/layout)
    RoundLayout layout;
    NodeInfo master;  // node 1's record
    int64_t seen = 0;  // the store's mark of the layout's write (Store::GetSince), 0: none
    CarriedMembers carried;  // a carried round's members (records_round -1: not carried)
    std::string tell_key;    // the round's key for told ends (random, from its slot 1)
    int64_t pace = 1;        // the pace its quiet beats start at (StartPace; "pace:K")
    std::string Encode() const;
    static Result<Published> Decode(std::string_view text);
  };
  Result<std::optional<Published>> ReadPublished(int64_t round, int64_t seen,
                                                 Deadline deadline);
  // How long a node waits for slot 1's layout before it takes over: layout_grace, plus the
  // beat period of the quiet round before (its nodes learned its end up to a period apart,
  // so the next round fills over that period at least).
  Deadline GraceDeadline(Deadline join_deadline) const;
  Result<int64_t> CloseRound(int64_t round, Deadline join_deadline);
  Status WaitOutRound(int64_t round, int64_t members, std::string_view how);
  // A warm spare's wait (RendezvousConfig::standby): the round to join once a node of a
  // running round was lost and this spare claimed its place.
  Result<int64_t> AwaitVacancy();
  // Reads the N node records and writes r<R>/layout (first writer wins); a node other than
  // slot 1 first gives slot 1 the layout grace again, and only the first to claim the
  // round's publisher key publishes in its place.
  Result<Published> PublishLayout(int64_t round, int64_t members, int64_t slot,
                                  Deadline join_deadline);
  // The pace a round of `members` nodes that formed since this node joined it starts at.
  int64_t StartPace(int64_t round, int64_t members) const;
  // The pace of `info`'s round for finding its silent nodes: its watcher's (FollowPace) when
  // this node watches the round, else the store's (one read).
  int64_t PaceNow(const RendezvousInfo& info);
  RendezvousInfo MakeInfo(int64_t round, int64_t slot, Published published,
                          int64_t restarts) const;
  // Carried rounds (rendezvous_carry.cc). A carried round as the end that makes it
  // publishes it: its member count (r<R+1>/closed), its layout record (r<R+1>/layout, and
  // in `next`) and the job's restart count after the end (EndRoundThen fills it in where
  // the end counts one).
  struct Carry {
    int64_t members = 0;
    std::string layout;
    int64_t restarts = 0;
  };
  // The ender of `info`'s round, for its lost peer `dead_slot`: the round of the survivors
  // to carry them into (nullopt when the round is not one to carry). A node that held
  // round - 1: the carried round `round` when it is one and this node is in it (later
  // carried rounds that already ended are passed through; a carried end told by the
  // watcher is taken without a read); nullopt: join as usual.
  Result<std::optional<Carry>> CarryRound(const RendezvousInfo& info, int dead_slot);
  Result<std::optional<RendezvousInfo>> TakeCarriedRound(int64_t round, Deadline deadline);
  // A late node at a large running round `round` of `members` (< MAX): ends it for its
  // join and carries its members into the next round with this node appended (the
  // round's own nodes do not join again); nullopt when another node ended it first or the
  // round is not one to carry (the caller then waits it out and joins).
  Result<std::optional<RendezvousInfo>> JoinCarried(int64_t round, int64_t members,
                                                    int64_t restarts);
  // Whether round `round` may be carried: no node finished, no warm spare, the job on.
  Result<bool> MayCarry(int64_t round);
  // EndRound, with `before_next` run by the winner while its other requests of the end
  // are in flight; the round it returns is written with `next` in one request
  // (Store::CreateAll: r<R+1>/closed, r<R+1>/layout, r<R>/next, none of which may exist),
  // else (another node closed R + 1 first) `next` alone, uncarried.
  using BeforeNext = std::function<std::optional<Carry>()>;
  // The job's restart count one up for the end of `round` (its winner, where the end is a
  // failure), once however often it is called, sent again on a timeout until `until`;
  // returns the count after it.
  Result<int64_t> CountRestart(int64_t round, Deadline until);
  // A loser of `round`'s end (the claim is `owner`'s) waits for `next`, beating for `held`'s
  // slot when it watches that round; past the layout grace without it, takes the stale
  // claim over for `claim`: true when it did (it then ends the round as the winner).
  Result<bool> AwaitEndOrTakeOver(int64_t round, std::string owner, const std::string& claim,
                                  const RendezvousInfo* held);
  // The winner tells the end to the nodes of `tell.info`'s round but group rank `tell.skip`
  // (TellEnd), once `next` is written, before the round counter moves on; null: nobody.
  struct TellTo {
    const RendezvousInfo* info = nullptr;
    int skip = -1;
  };
  // Whether this node won the end (wrote `next`), and whether `next` carried a round.
  struct Ended {
    bool won = false;
    bool carried = false;
  };
  Result<Ended> EndRoundThen(int64_t round, const RoundEnd& why, const FailureRecord* failure,
                             int64_t expect_next, const BeforeNext& before_next, TellTo tell);
  // The winner's times for an end, in seconds: its claim, the carry (before_next), every
  // request and read before `next` (the carry's among them), and the write of `next`.
  struct EndTimes {
    double claim_s, carry_s, requests_s, write_s;
  };
  void LogEndWritten(int64_t round, const EndTimes& times);
  // Told ends (round_tell.h, rendezvous_tell.cc). Whether `info`'s round is told its end
  // (this node has a RoundTell, the round a key and tell_start_nodes nodes, the store rests
  // between beats); the round's records, read on a thread of its own while the winner ends
  // the round (an invalid future where it is not told; the thread reads only store_ and
  // config_); the sending of `end` to every node of the round but group rank `skip`; a quiet
  // watcher's rest until `wake` (on its datagram socket where the round is told, else
  // Store::Idle): the end told, or nullopt at `wake`.
  using Nodes = Result<std::vector<NodeInfo>>;
  bool TellsEnd(const RendezvousInfo& info) const;
  std::future<Nodes> ReadForTell(const RendezvousInfo& info);
  void TellEnd(const RendezvousInfo& info, std::string_view end, int skip,
               std::future<Nodes> nodes);
  Result<std::optional<RoundEnd>> RestIdle(const RendezvousInfo& info, Deadline wake);
  // WatchStep's parts (rendezvous_watch.cc): a round's first step (its will, whether it is
  // quiet), that step on a store without wills, a step with a beat, a silent peer's end.
  void BeginWatchRound(const RendezvousInfo& info);
  Result<std::optional<RoundEnd>> FirstStepWithoutWill(const RendezvousInfo& info,
                                                       Deadline wake, double spread);
  Result<std::optional<RoundEnd>> BeatStep(const RendezvousInfo& info, bool beat, bool watching,
                                           SteadyClock::time_point now, Deadline wake);
  Result<std::optional<RoundEnd>> DeclarePeerDead(const RendezvousInfo& info, int silent,
                                                  const std::optional<std::string>& gone);
  // The watcher's ring (WatchStep): which peer to watch, and whether it went silent.
  bool StartWatching(const RendezvousInfo& info);
  Result<int> JudgeWatchedPeer(const RendezvousInfo& info, const std::optional<std::string>& beat,
                               int64_t age_ms, bool gone, SteadyClock::time_point seen);
  // How often a watcher beats once its will is left, and the will's grace: dead timeout / 3
  // (at least the heartbeat interval).
  Duration LivenessPeriod() const;
  // How often a watcher beats: the liveness period with a will, dead timeout / 3 on a lease
  // (its TTL), else dead timeout / 4 (at least the heartbeat interval).
  Duration BeatPeriod(const RendezvousInfo& info) const;
  // A quiet round's pace (r<R>/pace) as `read` with this node's beat, which the store
  // answered in `took` (Duration::max(): not at all); a pace setter raises or lowers it.
  void FollowPace(const RendezvousInfo& info, const std::optional<std::string>& read,
                  Duration took);
  std::string PeerHost(const RendezvousInfo& info, int slot);
  // The record of the node at `slot` of `info`'s round: its records round's (one read), or
  // the one a carried round keeps for an appended node.
  Result<NodeInfo> NodeOf(const RendezvousInfo& info, int slot);

  std::shared_ptr<store::Store> store_;
  RendezvousConfig config_;
  NodeInfo self_;
  std::shared_ptr<RoundTell> tell_;  // told ends (UseTell); null: none
  // Dead-node detection state (watcher thread only): the one peer this node watches.
  int64_t first_step_round_ = -1;  // the round whose first watch step was taken
  bool will_left_ = false;         // this round's will (r<R>/gone<S>) is on the store
  bool leased_ = false;  // else (not quiet) this round's r<R>/hb<S> is on a lease (LeaseKey)
  bool quiet_ = false;  // this round's steps rest between beats (Store::Await, else Idle)
  SteadyClock::time_point last_beat_;  // when this node's last beat was sent (any round)
  int64_t awaited_round_ = -1;  // the last round that rested on a held wait (Store::Await)
  Duration quiet_period_{};        // a quiet round's beat period (0: not quiet); GraceDeadline
  int64_t pace_ = 1;               // this round's pace as read (FollowPace); 1: none
  std::string pace_value_;         // r<R>/pace as read ("" absent)
  SteadyClock::time_point pace_seen_;  // when pace_ last changed, as this node saw it
  int calm_beats_ = 0;             // a pace setter's beats in a row answered quickly
  SteadyClock::time_point joined_time_;  // when this node's last join was answered
  int64_t watched_round_ = -1;
  int watched_slot_ = 0;       // 0: nobody left to watch (every other node finished)
  std::string watched_beat_;   // its counter as last read
  SteadyClock::time_point watched_change_;  // when that counter last moved (store-dated
                                            // where the store says, else as seen here)
  int64_t last_round_ = 0;  // the round seen last: ReadJobState reads its `closed` too
  std::optional<RendezvousInfo> held_;  // the round Next returned last (a carry's base)
  int64_t next_round_ = 0;  // the round after the one Next returned last
  int64_t told_round_ = -1;  // the round whose carried end the watcher told (Told)
  std::optional<RoundEnd::Carried> told_;  // that end's next round
};

}  // namespace cohort::rendezvous
