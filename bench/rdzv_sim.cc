// rdzv_sim: the simulated nodes of the rendezvous scale harness (bench/rdzv_scale.py,
// docs/scale.md). Each simulated node is a thread running the agent's real rendezvous code
// (rendezvous::Rendezvous: Next, then WatchStep until the round ends, then Next again) over
// its own store connection; one process holds many of them. A driver (rdzv_scale.py) speaks
// to it on stdin/stdout, one JSON line per reply. Times are CLOCK_MONOTONIC seconds, the
// clock every process on the machine shares.
//
//   rdzv_sim serve [--token T]
//       An embedded StoreServer on 127.0.0.1 (kernel-chosen port); prints {"port": P}.
//       stdin "stats" -> {"requests": .., "beats": .., "connections_open": ..,
//       "connections_accepted": ..}; "quit" or EOF: exit.
//   rdzv_sim agents --first I --count K --nodes MIN:MAX
//                   (--store HOST:PORT --token T | --etcd HOST:PORT,... --prefix P)
//                   [--run-id R] [--local-world-size L] [--heartbeat-ms H] [--dead-ms D]
//                   [--last-call-ms C] [--join-timeout-s S] [--quiet-start-nodes Q]
//                   [--carry-start-nodes C] [--quiet-watch-max-nodes W]
//                   [--tell-start-nodes T]
//       Agents I..I+K-1 connect (each its own connection and datagram socket for told
//       ends, as an agent of `cohort run`) and start their threads, which
//       wait for `go`; then it prints {"ready": K}.
//       stdin commands, each answered by one line:
//         go                every agent starts its loop
//         wait R C SEC      once C live agents here hold round >= R (or SEC passed):
//                           {"round": R, "done": n, "first": t, "last": t, "errors": [...]}
//                           (first/last: when the first/last of them got round R)
//         ranks R           {"round": R, "ranks": [[group_rank, rank_offset, world_size,
//                           group_world_size], ...]} for the agents here that got round R
//         stepped R         {"round": R, "stepped": n}: how many live agents here took a
//                           watch step in round R (past it: beating, their dead timeout set)
//         hang I [I ...]    those agents take no more watch steps (no more heartbeats) but
//                           keep their connection, as a hung agent: {"hung": [...],
//                           "last_beat": [t, ...], "dead_s": [s, ...]}
//         kill I [I ...]    those agents stop (no more heartbeats) and close their store
//                           connection: {"killed": [...], "last_beat": [t, ...],
//                           "closed": [t, ...], "dead_s": [s, ...]} (closed: when each
//                           connection was shut down; dead_s: the dead timeout of each
//                           one's round, longer than --dead-ms in a quiet round)
//         quit              every agent stops; the process exits
//
// Thread-safety: each agent thread owns its Rendezvous and store; the shared records are
// guarded by one mutex (mu); the main thread reads commands and answers them.
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cohort/base/log.h"
#include "cohort/base/mutex.h"
#include "cohort/base/strings.h"
#include "cohort/rendezvous/rendezvous.h"
#include "cohort/store/etcd_store.h"
#include "cohort/store/store_server.h"
#include "cohort/store/tcp_store.h"

using namespace cohort;

namespace {

double Now() { return std::chrono::duration<double>(SteadyClock::now().time_since_epoch()).count(); }

struct Options {
  int first = 0, count = 1, min_nodes = 1, max_nodes = 1, local_world_size = 8;
  std::string store, token, etcd, prefix = "rdzvsim", run_id = "sim";
  int heartbeat_ms = 1000, dead_ms = 10000, last_call_ms = 1000;
  double join_timeout_s = 600;
  int quiet_start_nodes = -1;  // -1: the rendezvous default
  int carry_start_nodes = -1;  // -1: the rendezvous default
  int quiet_watch_max_nodes = -1;  // -1: the rendezvous default
  int tell_start_nodes = -1;  // -1: the rendezvous default; 0: no told ends (no sockets)
};

// What one agent got for one round.
struct RoundRecord {
  double at = 0;  // when Next() returned it
  int group_rank = 0, rank_offset = 0, world_size = 0, group_world_size = 0;
};

struct Agent {
  int index = 0;
  std::shared_ptr<store::Store> store;
  std::shared_ptr<rendezvous::RoundTell> tell;  // null: told no ends
  std::atomic<bool> stop{false};
  bool hung = false;  // guarded by Sim::mu_: takes no more steps, keeps its connection
  pthread_t thread{};
  bool started = false;
};

class Sim {
 public:
  explicit Sim(Options o) : o_(std::move(o)) {}

  Status Connect() {
    for (int i = 0; i < o_.count; ++i) {
      auto agent = std::make_unique<Agent>();
      agent->index = o_.first + i;
      COHORT_ASSIGN_OR_RETURN(agent->store, OpenStore(agent->index));
      if (o_.tell_start_nodes != 0) {
        COHORT_ASSIGN_OR_RETURN(agent->tell, rendezvous::RoundTell::Open());
      }
      agents_.push_back(std::move(agent));
    }
    return Status::Ok();
  }

  // Starts every agent thread with a small stack (tens of thousands fit in memory); they
  // wait for Go(), so that starting threads is not part of what is measured.
  Status Start() {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (auto& a : agents_) {
      auto* arg = new std::pair<Sim*, Agent*>(this, a.get());
      int rc = pthread_create(&a->thread, &attr, &Sim::Trampoline, arg);
      if (rc != 0) {
        delete arg;
        pthread_attr_destroy(&attr);
        return Internal("pthread_create: {}", strerror(rc));
      }
      a->started = true;
    }
    pthread_attr_destroy(&attr);
    return Status::Ok();
  }

  void Go() {
    MutexLock lock(&mu_);
    go_ = true;
    cv_.SignalAll();
  }

  std::string Wait(int64_t round, int wanted, double seconds) {
    const Deadline deadline = Deadline::After(std::chrono::duration_cast<Duration>(
        std::chrono::duration<double>(seconds)));
    MutexLock lock(&mu_);
    auto reached = [&]() COHORT_REQUIRES(mu_) {
      int n = 0;
      for (auto it = at_round_.lower_bound(round); it != at_round_.end(); ++it) n += it->second;
      return n;
    };
    while (reached() < wanted && errors_.size() < 10 && !deadline.expired()) {
      cv_.WaitUntil(&mu_, deadline);
    }
    double first = 0, last = 0;
    int done = 0;
    for (auto& [index, rounds] : records_) {
      auto it = rounds.find(round);
      if (it == rounds.end()) continue;
      first = done == 0 ? it->second.at : std::min(first, it->second.at);
      last = std::max(last, it->second.at);
      ++done;
    }
    std::string errors;
    for (size_t i = 0; i < errors_.size(); ++i) {
      errors += fmt::format("{}{}", i ? ", " : "", nlohmann::json(errors_[i]).dump());
    }
    return fmt::format(
        "{{\"round\": {}, \"done\": {}, \"reached\": {}, \"first\": {:.6f}, \"last\": {:.6f}, "
        "\"errors\": [{}]}}",
        round, done, reached(), first, last, errors);
  }

  std::string Stepped(int64_t round) {
    MutexLock lock(&mu_);
    int n = 0;
    for (auto& [index, rounds] : records_) {
      auto it = last_step_.find(index);
      if (it != last_step_.end() && it->second.round >= round) ++n;
    }
    return fmt::format("{{\"round\": {}, \"stepped\": {}}}", round, n);
  }

  std::string Ranks(int64_t round) {
    MutexLock lock(&mu_);
    std::string out;
    for (auto& [index, rounds] : records_) {
      auto it = rounds.find(round);
      if (it == rounds.end()) continue;
      const RoundRecord& r = it->second;
      out += fmt::format("{}[{}, {}, {}, {}]", out.empty() ? "" : ", ", r.group_rank,
                         r.rank_offset, r.world_size, r.group_world_size);
    }
    return fmt::format("{{\"round\": {}, \"ranks\": [{}]}}", round, out);
  }

  std::string Kill(const std::vector<int>& indices) {
    std::string killed, beats, closed, dead;
    for (int index : indices) {
      Agent* a = Find(index);
      if (a == nullptr || a->stop) continue;
      closed += fmt::format("{}{:.6f}", closed.empty() ? "" : ", ", Now());
      Stop(*a);
      double beat = 0, dead_s = 0;
      {
        MutexLock lock(&mu_);
        beat = last_beat_[index];
        dead_s = DeadSeconds(index);
        ForgetLive(index);
      }
      killed += fmt::format("{}{}", killed.empty() ? "" : ", ", index);
      beats += fmt::format("{}{:.6f}", beats.empty() ? "" : ", ", beat);
      dead += fmt::format("{}{:.3f}", dead.empty() ? "" : ", ", dead_s);
    }
    return fmt::format(
        "{{\"killed\": [{}], \"last_beat\": [{}], \"closed\": [{}], \"dead_s\": [{}]}}",
        killed, beats, closed, dead);
  }

  // Hung agents: their step in progress ends, and no other begins (see RunAgent).
  std::string Hang(const std::vector<int>& indices) {
    std::string hung, beats, dead;
    MutexLock lock(&mu_);
    for (int index : indices) {
      Agent* a = Find(index);
      if (a == nullptr || a->stop || a->hung) continue;
      a->hung = true;
      const double dead_s = DeadSeconds(index);
      ForgetLive(index);
      hung += fmt::format("{}{}", hung.empty() ? "" : ", ", index);
      beats += fmt::format("{}{:.6f}", beats.empty() ? "" : ", ", last_beat_[index]);
      dead += fmt::format("{}{:.3f}", dead.empty() ? "" : ", ", dead_s);
    }
    return fmt::format("{{\"hung\": [{}], \"last_beat\": [{}], \"dead_s\": [{}]}}", hung,
                       beats, dead);
  }

  void StopAll() {
    for (auto& a : agents_) a->stop = true;
    Go();  // agents still at the gate see `stop`
    for (auto& a : agents_) {
      if (a->store) a->store->Abort();  // a killed agent's is gone
      if (a->tell) a->tell->Cancel();
    }
    for (auto& a : agents_) Stop(*a);
  }

 private:
  Result<std::shared_ptr<store::Store>> OpenStore(int index) {
    const Deadline deadline = Deadline::AfterMs(60000);
    if (!o_.etcd.empty()) {
      COHORT_ASSIGN_OR_RETURN(auto endpoints, store::ParseEtcdEndpoints(o_.etcd));
      // Nodes spread over the members, as etcd's own clients balance over endpoints.
      std::rotate(endpoints.begin(), endpoints.begin() + index % endpoints.size(),
                  endpoints.end());
      store::EtcdStoreOptions options;
      options.endpoints = std::move(endpoints);
      options.prefix = o_.prefix;
      options.request_timeout = std::chrono::seconds(30);
      options.peers = o_.max_nodes;
      COHORT_ASSIGN_OR_RETURN(auto s, store::EtcdStore::Connect(options, deadline));
      return std::shared_ptr<store::Store>(std::move(s));
    }
    const size_t colon = o_.store.rfind(':');
    store::TcpStoreOptions options{.host = o_.store.substr(0, colon),
                                   .port = std::atoi(o_.store.c_str() + colon + 1),
                                   .token = o_.token};
    COHORT_ASSIGN_OR_RETURN(auto s, store::TcpStore::Connect(options, deadline));
    return std::shared_ptr<store::Store>(std::move(s));
  }

  static void* Trampoline(void* arg) {
    auto* p = static_cast<std::pair<Sim*, Agent*>*>(arg);
    Sim* sim = p->first;
    Agent* agent = p->second;
    delete p;
    sim->RunAgent(*agent);
    return nullptr;
  }

  // The agent's rendezvous loop: join a round, watch it until it ends, join the next.
  void RunAgent(Agent& a) {
    rendezvous::RendezvousConfig c;
    c.run_id = o_.run_id;
    c.min_nodes = o_.min_nodes;
    c.max_nodes = o_.max_nodes;
    c.join_timeout = std::chrono::duration_cast<Duration>(
        std::chrono::duration<double>(o_.join_timeout_s));
    c.last_call = std::chrono::milliseconds(o_.last_call_ms);
    c.heartbeat_interval = std::chrono::milliseconds(o_.heartbeat_ms);
    c.dead_timeout = std::chrono::milliseconds(o_.dead_ms);
    c.max_restarts = 1000;
    if (o_.quiet_start_nodes >= 0) c.quiet_start_nodes = o_.quiet_start_nodes;
    if (o_.carry_start_nodes >= 0) c.carry_start_nodes = o_.carry_start_nodes;
    if (o_.quiet_watch_max_nodes >= 0) c.quiet_watch_max_nodes = o_.quiet_watch_max_nodes;
    if (o_.tell_start_nodes >= 0) c.tell_start_nodes = o_.tell_start_nodes;
    rendezvous::NodeInfo self{fmt::format("node{}", a.index), "127.0.0.1", o_.local_world_size,
                              ""};
    rendezvous::Rendezvous r(a.store, c, self);
    r.UseTell(a.tell);
    {
      MutexLock lock(&mu_);
      while (!go_) cv_.Wait(&mu_);
    }
    while (!a.stop) {
      {
        MutexLock lock(&mu_);
        while (a.hung && !a.stop) cv_.Wait(&mu_);  // a hung agent joins no other round
        if (a.stop) return;
      }
      auto info = r.Next();
      if (!info.ok()) return Fail(a, info.status());
      Record(a.index, *info);
      for (;;) {
        if (a.stop) return;
        {
          MutexLock lock(&mu_);
          while (a.hung && !a.stop) cv_.Wait(&mu_);  // parked until killed or quit
          if (a.stop) return;
          last_beat_[a.index] = Now();  // the beat is the step's first call
        }
        auto step = r.WatchStep(*info);
        if (!step.ok()) return Fail(a, step.status());
        {
          MutexLock lock(&mu_);
          last_step_[a.index] = {info->round,
                                 std::chrono::duration<double>(r.DeadTimeout(*info)).count()};
        }
        if (*step) {
          r.Told(info->round, **step);  // as an agent does: a carried end names the next round
          break;
        }
      }
    }
  }

  // The dead timeout of the agent's round (--dead-ms before its first watch step).
  double DeadSeconds(int index) COHORT_REQUIRES(mu_) {
    auto it = last_step_.find(index);
    return it == last_step_.end() ? o_.dead_ms / 1000.0 : it->second.dead_s;
  }

  // A killed or hung node no longer counts among the live ones (Wait, Ranks).
  void ForgetLive(int index) COHORT_REQUIRES(mu_) {
    auto& rounds = records_[index];
    if (!rounds.empty()) --at_round_[rounds.rbegin()->first];
    records_.erase(index);
  }

  void Record(int index, const rendezvous::RendezvousInfo& info) {
    MutexLock lock(&mu_);
    auto& rounds = records_[index];
    if (!rounds.empty()) --at_round_[rounds.rbegin()->first];
    ++at_round_[info.round];
    rounds[info.round] = RoundRecord{Now(), info.group_rank, info.RankOffset(), info.WorldSize(),
                                     info.group_world_size};
    cv_.SignalAll();
  }

  void Fail(Agent& a, const Status& s) {
    if (a.stop) return;  // killed: its calls are cancelled on purpose
    MutexLock lock(&mu_);
    errors_.push_back(fmt::format("node {}: {}", a.index, s.ToString()));
    cv_.SignalAll();
  }

  Agent* Find(int index) {
    const int i = index - o_.first;
    return i >= 0 && i < static_cast<int>(agents_.size()) ? agents_[i].get() : nullptr;
  }

  // Stops one agent: its pending call is cancelled, its thread ends, its connection closes.
  // (Once: a killed agent has no store left.)
  void Stop(Agent& a) {
    if (!a.store) return;
    {
      MutexLock lock(&mu_);
      a.stop = true;
      cv_.SignalAll();  // a hung agent is parked on it
    }
    a.store->Abort();
    if (a.tell) a.tell->Cancel();
    if (a.started) {
      pthread_join(a.thread, nullptr);
      a.started = false;
    }
    a.store.reset();
    a.tell.reset();  // its socket closes, as a dead process's
  }

  Options o_;
  std::vector<std::unique_ptr<Agent>> agents_;  // main thread
  Mutex mu_;
  CondVar cv_;
  std::map<int, std::map<int64_t, RoundRecord>> records_ COHORT_GUARDED_BY(mu_);
  std::map<int64_t, int> at_round_ COHORT_GUARDED_BY(mu_);  // live agents by latest round
  std::map<int, double> last_beat_ COHORT_GUARDED_BY(mu_);
  // Each agent's last watch step: its round, and the dead timeout its round's watchers apply
  // (longer than --dead-ms in a quiet round).
  struct LastStep {
    int64_t round = 0;
    double dead_s = 0;
  };
  std::map<int, LastStep> last_step_ COHORT_GUARDED_BY(mu_);
  std::vector<std::string> errors_ COHORT_GUARDED_BY(mu_);
  bool go_ COHORT_GUARDED_BY(mu_) = false;
};

int Serve(const std::string& token) {
  auto server = store::StoreServer::Start({.host = "127.0.0.1", .port = 0, .token = token});
  if (!server.ok()) {
    fmt::print(stderr, "rdzv_sim: {}\n", server.status().ToString());
    return 1;
  }
  fmt::print("{{\"port\": {}}}\n", (*server)->port());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line) && line != "quit") {
    if (line == "stats") {
      auto s = (*server)->stats();
      fmt::print("{{\"requests\": {}, \"beats\": {}, \"connections_open\": {}, "
                 "\"connections_accepted\": {}}}\n",
                 s.requests, s.beats, s.connections_open, s.connections_accepted);
      std::fflush(stdout);
    }
  }
  return 0;
}

int Usage() {
  fmt::print(stderr,
             "usage: rdzv_sim serve [--token T]\n"
             "       rdzv_sim agents --first I --count K --nodes MIN:MAX (--store HOST:PORT "
             "--token T | --etcd EP,... --prefix P)\n"
             "                [--run-id R] [--local-world-size L] [--heartbeat-ms H] "
             "[--dead-ms D] [--last-call-ms C] [--join-timeout-s S]\n"
             "                [--quiet-start-nodes Q] [--carry-start-nodes C] "
             "[--quiet-watch-max-nodes W] [--tell-start-nodes T]\n");
  return 2;
}

bool ParseAgentFlags(int argc, char** argv, Options* o) {
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], v = argv[i + 1];
    if (flag == "--first") o->first = std::atoi(v.c_str());
    else if (flag == "--count") o->count = std::atoi(v.c_str());
    else if (flag == "--nodes") {
      const size_t colon = v.find(':');
      o->min_nodes = std::atoi(v.c_str());
      o->max_nodes = colon == std::string::npos ? o->min_nodes : std::atoi(v.c_str() + colon + 1);
    } else if (flag == "--store") o->store = v;
    else if (flag == "--token") o->token = v;
    else if (flag == "--etcd") o->etcd = v;
    else if (flag == "--prefix") o->prefix = v;
    else if (flag == "--run-id") o->run_id = v;
    else if (flag == "--local-world-size") o->local_world_size = std::atoi(v.c_str());
    else if (flag == "--heartbeat-ms") o->heartbeat_ms = std::atoi(v.c_str());
    else if (flag == "--dead-ms") o->dead_ms = std::atoi(v.c_str());
    else if (flag == "--last-call-ms") o->last_call_ms = std::atoi(v.c_str());
    else if (flag == "--join-timeout-s") o->join_timeout_s = std::atof(v.c_str());
    else if (flag == "--quiet-start-nodes") o->quiet_start_nodes = std::atoi(v.c_str());
    else if (flag == "--carry-start-nodes") o->carry_start_nodes = std::atoi(v.c_str());
    else if (flag == "--quiet-watch-max-nodes") o->quiet_watch_max_nodes = std::atoi(v.c_str());
    else if (flag == "--tell-start-nodes") o->tell_start_nodes = std::atoi(v.c_str());
    else return false;
  }
  return o->count >= 1 && o->min_nodes >= 1 && o->max_nodes >= o->min_nodes &&
         (o->store.empty() != o->etcd.empty());
}

int RunAgents(const Options& o) {
  store::RaiseFileLimit();
  Sim sim(o);
  Status ready = sim.Connect();
  if (ready.ok()) ready = sim.Start();
  if (!ready.ok()) {
    fmt::print(stderr, "rdzv_sim: {}\n", ready.ToString());
    sim.StopAll();
    return 1;
  }
  fmt::print("{{\"ready\": {}}}\n", o.count);
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string command;
    in >> command;
    std::string reply;
    if (command == "go") {
      sim.Go();
      reply = "{\"started\": true}";
    } else if (command == "wait") {
      int64_t round = 0;
      int wanted = 0;
      double seconds = 0;
      in >> round >> wanted >> seconds;
      reply = sim.Wait(round, wanted, seconds);
    } else if (command == "ranks") {
      int64_t round = 0;
      in >> round;
      reply = sim.Ranks(round);
    } else if (command == "stepped") {
      int64_t round = 0;
      in >> round;
      reply = sim.Stepped(round);
    } else if (command == "hang") {
      std::vector<int> indices;
      for (int i; in >> i;) indices.push_back(i);
      reply = sim.Hang(indices);
    } else if (command == "kill") {
      std::vector<int> indices;
      for (int i; in >> i;) indices.push_back(i);
      reply = sim.Kill(indices);
    } else if (command == "quit") {
      break;
    } else {
      reply = fmt::format("{{\"error\": \"unknown command '{}'\"}}", command);
    }
    fmt::print("{}\n", reply);
    std::fflush(stdout);
  }
  sim.StopAll();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage();
  const std::string mode = argv[1];
  if (mode == "serve") {
    std::string token;
    if (argc == 4 && std::string(argv[2]) == "--token") token = argv[3];
    else if (argc != 2) return Usage();
    return Serve(token);
  }
  if (mode != "agents") return Usage();
  // Thousands of agents share this process's stderr: their per-node info lines (a node
  // resting on a held watch, each round) would be thousands a round. COHORT_LOG_LEVEL=info
  // shows them.
  if (std::getenv("COHORT_LOG_LEVEL") == nullptr) cohort::log::SetLevel("warn");
  Options o;
  if (!ParseAgentFlags(argc, argv, &o)) return Usage();
  return RunAgents(o);
}
