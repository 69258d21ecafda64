// etcd_join_floor: what a join of two requests would cost etcd (docs/scale.md, "A join of
// two requests on etcd": designed, not built into cohort). N threads, each a simulated
// node with its own kept-open HTTP connection to one member of an etcd cluster (JSON
// gateway, libcurl), join one round the way that design does, without cohort's
// rendezvous code:
//   1. one txn: if the round is not closed (`closed` absent) and this call's marker is
//      absent, put the ticket key with the node's record as its value (its previous
//      version + 1 is the slot) and the marker; else read both (a resent txn whose first
//      send was applied finds its marker and reads the ticket key's version then);
//   2. slot 1 watches the ticket key's puts from its creation (slot 1's own txn): they
//      count the joins and carry the N records in slot order; at the N-th it puts the
//      layout (here just N) and `closed`; every other node watches the layout key from
//      its txn's revision (no read) and takes N from it.
// It checks every node saw the same N and prints the slots taken. Requests and CPU are
// measured by its caller (bench/rdzv_scale.py --jobs floor) from etcd's side.
//
//   etcd_join_floor --etcd HOST:PORT,... --nodes N [--first I --count K] --prefix P
//                   [--timeout-s S]
//       runs nodes I..I+K-1 of a round of N (all by default; a process holds a few
//       thousand: each node takes three descriptors), connects them, prints
//       {"ready": K}, waits for "go" on stdin, joins, prints {"go": t, "last": t,
//       "slots": [...], "errors": [...], "nodes_cpu_s": s} (CLOCK_MONOTONIC seconds; its
//       caller checks the slots of all processes are 1..N once each).
//
// Thread-safety: each node thread owns its Node (its CURL handle and its results, read by
// the main thread after joining the thread); the start gate is guarded by one mutex.
#include <curl/curl.h>
#include <fmt/format.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cohort/base/mutex.h"
#include "cohort/base/strings.h"
#include "cohort/base/time.h"
#include "cohort/store/etcd_store.h"
#include "cohort/store/store_server.h"

using json = nlohmann::json;
using namespace cohort;
using namespace std::chrono_literals;

namespace {

std::string B64(std::string_view in) {
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(in.data()),
                          static_cast<int>(in.size()));
  out.resize(n);
  return out;
}

std::string UnB64(std::string_view in) {
  std::string out(3 * (in.size() / 4) + 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(in.data()),
                          static_cast<int>(in.size()));
  if (n < 0) return "";
  size_t pad = 0;
  for (size_t i = in.size(); i > 0 && in[i - 1] == '='; --i) ++pad;
  out.resize(n - pad);
  return out;
}

int64_t Int(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end()) return 0;
  if (it->is_string()) return ParseInt64(it->get<std::string>()).value_or(0);
  return it->is_number_integer() ? it->get<int64_t>() : 0;
}

struct Options {
  std::vector<std::string> endpoints;
  int nodes = 0;             // in the round
  int first = 0, count = 0;  // the nodes this process runs (count 0: all)
  std::string prefix = "floor";
  double timeout_s = 300;
};

// One node's HTTP connection: unary POSTs and one streaming watch at a time.
class Conn {
 public:
  explicit Conn(std::string url) : url_(std::move(url)), curl_(curl_easy_init()) {
    curl_easy_setopt(curl_, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl_, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(curl_, CURLOPT_POST, 1L);
    curl_easy_setopt(curl_, CURLOPT_WRITEFUNCTION, &Conn::Write);
    curl_easy_setopt(curl_, CURLOPT_WRITEDATA, this);
  }
  ~Conn() { curl_easy_cleanup(curl_); }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  // A unary request; the answer, or an {"error": ...} object.
  json Post(const std::string& path, const json& request, Duration timeout) {
    on_line_ = nullptr;
    return Perform(path, request, timeout) ? json::parse(body_, nullptr, false)
                                           : json{{"error", error_}};
  }

  // A watch (each message to `on_message` until it returns false); "" or what failed.
  std::string Watch(const json& request, Duration timeout,
                    const std::function<bool(const json&)>& on_message) {
    bool ended_here = false;
    on_line_ = [&](std::string_view line) {
      json msg = json::parse(line, nullptr, false);
      if (msg.is_discarded()) return true;
      ended_here = !on_message(msg.contains("result") ? msg["result"] : msg);
      return !ended_here;
    };
    Perform("/v3/watch", request, timeout);
    on_line_ = nullptr;  // (libcurl closes a connection whose transfer was cut)
    return ended_here ? std::string() : "watch ended: " + error_;
  }

 private:
  bool Perform(const std::string& path, const json& request, Duration timeout) {
    body_.clear();
    pending_.clear();
    const std::string text = request.dump();
    curl_easy_setopt(curl_, CURLOPT_URL, (url_ + path).c_str());
    curl_easy_setopt(curl_, CURLOPT_POSTFIELDS, text.c_str());
    curl_easy_setopt(curl_, CURLOPT_POSTFIELDSIZE, static_cast<long>(text.size()));
    curl_easy_setopt(curl_, CURLOPT_TIMEOUT_MS,
                     static_cast<long>(std::chrono::ceil<std::chrono::milliseconds>(timeout)
                                           .count()));
    CURLcode rc = curl_easy_perform(curl_);
    error_ = curl_easy_strerror(rc);
    return rc == CURLE_OK;
  }
  static size_t Write(char* data, size_t size, size_t n, void* self_ptr) {
    auto* self = static_cast<Conn*>(self_ptr);
    if (!self->on_line_) {
      self->body_.append(data, size * n);
      return size * n;
    }
    self->pending_.append(data, size * n);
    size_t start = 0;
    for (size_t nl; (nl = self->pending_.find('\n', start)) != std::string::npos;
         start = nl + 1) {
      if (!self->on_line_(std::string_view(self->pending_).substr(start, nl - start))) return 0;
    }
    self->pending_.erase(0, start);
    return size * n;
  }

  std::string url_;
  CURL* curl_;
  std::string body_, pending_, error_;
  std::function<bool(std::string_view)> on_line_;
};

struct Node {
  int index = 0;
  std::unique_ptr<Conn> conn;
  int64_t slot = 0, members = 0;
  double done_at = 0;
  std::string error;
};

class Floor {
 public:
  explicit Floor(Options o) : o_(std::move(o)), root_("/cohort/" + o_.prefix + "/") {}

  // Every node's connection opens (one read) before the clock starts.
  std::string Connect() {
    for (int i = o_.first; i < o_.first + o_.count; ++i) {
      auto node = std::make_unique<Node>();
      node->index = i;
      node->conn = std::make_unique<Conn>(o_.endpoints[i % o_.endpoints.size()]);
      json r = node->conn->Post("/v3/kv/range", {{"key", B64(root_)}}, std::chrono::seconds(60));
      if (r.is_discarded() || r.contains("error")) {
        return fmt::format("node {} cannot connect: {}", i, r.dump().substr(0, 200));
      }
      nodes_.push_back(std::move(node));
    }
    return "";
  }

  json Run() {
    std::vector<pthread_t> threads(nodes_.size());
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (size_t i = 0; i < nodes_.size(); ++i) {
      auto* arg = new std::pair<Floor*, Node*>(this, nodes_[i].get());
      pthread_create(&threads[i], &attr, &Floor::Trampoline, arg);
    }
    pthread_attr_destroy(&attr);
    const double t0 = Now();
    {
      MutexLock lock(&mu_);
      go_ = true;
      cv_.SignalAll();
    }
    for (auto& t : threads) pthread_join(t, nullptr);
    double last = t0;
    json errors = json::array(), slots = json::array();
    for (const auto& n : nodes_) {
      last = std::max(last, n->done_at);
      if (!n->error.empty()) {
        // The first of each kind (the text after the node), then ten more.
        const bool new_kind = std::none_of(errors.begin(), errors.end(), [&](const json& e) {
          return e.get<std::string>().find(n->error) != std::string::npos;
        });
        if (new_kind || errors.size() < 10) {
          errors.push_back(fmt::format("node {} (slot {}): {}", n->index, n->slot, n->error));
        }
        continue;
      }
      if (n->members != o_.nodes) {
        errors.push_back(fmt::format("node {}: round of {} nodes", n->index, n->members));
      }
      slots.push_back(n->slot);
    }
    return {{"go", t0}, {"last", last}, {"slots", slots}, {"errors", errors}};
  }

 private:
  static double Now() {
    return std::chrono::duration<double>(SteadyClock::now().time_since_epoch()).count();
  }
  static void* Trampoline(void* arg) {
    auto* p = static_cast<std::pair<Floor*, Node*>*>(arg);
    Floor* self = p->first;
    Node* node = p->second;
    delete p;
    {
      MutexLock lock(&self->mu_);
      while (!self->go_) self->cv_.Wait(&self->mu_);
    }
    node->error = self->Join(*node);
    node->done_at = Now();
    return nullptr;
  }

  std::string Key(std::string_view suffix) const { return B64(root_ + std::string(suffix)); }

  // Steps 1 and 2 of the design for one node; "" or what went wrong.
  std::string Join(Node& node) {
    const Duration timeout = std::chrono::duration_cast<Duration>(
        std::chrono::duration<double>(o_.timeout_s));
    const std::string record = json{{"host", fmt::format("node{}", node.index)},
                                    {"addr", "127.0.0.1"}, {"local_world_size", 8}}.dump();
    const std::string marker = Key("t/" + RandomHex(8));
    const json txn = {
        {"compare", {{{"key", Key("closed")}, {"target", "CREATE"}, {"result", "EQUAL"},
                      {"create_revision", "0"}},
                     {{"key", marker}, {"target", "CREATE"}, {"result", "EQUAL"},
                      {"create_revision", "0"}}}},
        {"success", {{{"request_put", {{"key", Key("ticket")}, {"value", B64(record)},
                                        {"prev_kv", true}}}},
                     {{"request_put", {{"key", marker}, {"value", ""}}}}}},
        {"failure", {{{"request_range", {{"key", Key("closed")}}}},
                     {{"request_range", {{"key", marker}}}}}}};
    // Sent again after a backoff when etcd refused it ("too many requests": nothing
    // applied) or did not answer in time (maybe applied: the marker tells), as EtcdStore.
    json r;
    for (auto pause = std::chrono::milliseconds(20);; pause = std::min(2 * pause, 500ms)) {
      r = node.conn->Post("/v3/kv/txn", txn, timeout);
      const std::string text = r.dump();
      if (r.is_discarded() || (text.find("too many requests") == std::string::npos &&
                               text.find("request timed out") == std::string::npos &&
                               text.find("leader changed") == std::string::npos)) {
        break;
      }
      std::this_thread::sleep_for(pause);
    }
    if (r.is_discarded() || r.contains("error")) {
      return "join txn failed: " + r.dump().substr(0, 200);
    }
    int64_t rev = Int(r["header"], "revision");
    if (r.value("succeeded", false)) {
      const json& put = r["responses"][0]["response_put"];
      node.slot = (put.contains("prev_kv") ? Int(put["prev_kv"], "version") : 0) + 1;
    } else {
      // An earlier send was applied (its marker exists): the ticket key's version then.
      const json& kvs = r["responses"][1]["response_range"]["kvs"];
      if (!kvs.is_array() || kvs.empty()) return "the round closed before this node joined";
      rev = Int(kvs[0], "create_revision");
      json at = node.conn->Post(
          "/v3/kv/range", {{"key", Key("ticket")}, {"revision", std::to_string(rev)}}, timeout);
      if (at.is_discarded() || !at.contains("kvs")) return "ticket read failed";
      node.slot = Int(at["kvs"][0], "version");
    }
    return node.slot == 1 ? Coordinate(node, rev, timeout) : AwaitLayout(node, rev, timeout);
  }

  // Slot 1: N puts of the ticket key, their values (the records), then the layout.
  std::string Coordinate(Node& node, int64_t rev, Duration timeout) {
    const int64_t n = o_.nodes;
    // The records, in slot order: the key's puts from its creation (slot 1's own), which
    // also counts them: done at the N-th.
    int64_t records = 0;
    std::string err = node.conn->Watch(
        {{"create_request", {{"key", Key("ticket")}, {"start_revision", std::to_string(rev)}}}},
        timeout, [&](const json& res) {
          if (!res.contains("events")) return true;
          for (const auto& ev : res["events"]) {
            if (!UnB64(ev["kv"].value("value", "")).empty()) ++records;
          }
          return records < n;
        });
    if (!err.empty()) return err;
    if (records != n) return fmt::format("read {} records of {}", records, n);
    const std::string layout = fmt::format("{}", n);
    json r = node.conn->Post(
        "/v3/kv/txn",
        {{"success", {{{"request_put", {{"key", Key("layout")}, {"value", B64(layout)}}}},
                      {{"request_put", {{"key", Key("closed")}, {"value", B64(layout)}}}}}}},
        timeout);
    if (r.is_discarded() || r.contains("error")) return "layout put failed";
    node.members = n;
    return "";
  }

  // Every other slot: the layout, watched from the join txn's revision (no read).
  std::string AwaitLayout(Node& node, int64_t rev, Duration timeout) {
    std::string err = node.conn->Watch(
        {{"create_request",
          {{"key", Key("layout")}, {"start_revision", std::to_string(rev + 1)}}}},
        timeout, [&](const json& res) {
          if (!res.contains("events")) return true;
          for (const auto& ev : res["events"]) {
            node.members = ParseInt64(UnB64(ev["kv"].value("value", ""))).value_or(0);
            return false;
          }
          return true;
        });
    return err;
  }

  const Options o_;
  const std::string root_;
  std::vector<std::unique_ptr<Node>> nodes_;
  Mutex mu_;
  CondVar cv_;
  bool go_ COHORT_GUARDED_BY(mu_) = false;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], v = argv[i + 1];
    if (flag == "--etcd") {
      auto eps = store::ParseEtcdEndpoints(v);
      if (!eps.ok()) {
        fmt::print(stderr, "{}\n", eps.status().ToString());
        return 2;
      }
      o.endpoints = *eps;
    } else if (flag == "--nodes") {
      o.nodes = std::atoi(v.c_str());
    } else if (flag == "--first") {
      o.first = std::atoi(v.c_str());
    } else if (flag == "--count") {
      o.count = std::atoi(v.c_str());
    } else if (flag == "--prefix") {
      o.prefix = v;
    } else if (flag == "--timeout-s") {
      o.timeout_s = std::atof(v.c_str());
    } else {
      fmt::print(stderr, "unknown flag {}\n", flag);
      return 2;
    }
  }
  if (o.count == 0) o.count = o.nodes - o.first;
  if (o.endpoints.empty() || o.nodes < 1 || o.first < 0 || o.count < 1) {
    fmt::print(stderr,
               "usage: etcd_join_floor --etcd HOST:PORT,... --nodes N [--first I --count K] "
               "--prefix P [--timeout-s S]\n");
    return 2;
  }
  store::RaiseFileLimit();
  curl_global_init(CURL_GLOBAL_DEFAULT);
  Floor floor(o);
  if (std::string err = floor.Connect(); !err.empty()) {
    fmt::print("{}\n", json{{"error", err}}.dump());
    return 1;
  }
  // Connected: the caller reads its counters, then says go.
  fmt::print("{}\n", json{{"ready", o.count}}.dump());
  std::fflush(stdout);
  std::string line;
  if (!std::getline(std::cin, line) || line != "go") return 1;
  struct rusage before {}, after {};
  getrusage(RUSAGE_SELF, &before);
  json result = floor.Run();
  getrusage(RUSAGE_SELF, &after);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  result["nodes_cpu_s"] = seconds(after.ru_utime) + seconds(after.ru_stime) -
                          seconds(before.ru_utime) - seconds(before.ru_stime);
  fmt::print("{}\n", result.dump());
  return 0;
}
