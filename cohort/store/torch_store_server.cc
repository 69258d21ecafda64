// Implements TorchStoreServer on asio. Wire format of torch 1.13's TCPStore (native byte
// order, as torch writes it): a request is one query byte then its arguments; a string or a
// value is a u64 length and the bytes; a key list is a u64 count and that many strings.
//   SET 0 key value            -> (nothing)
//   COMPARE_SET 1 key exp new  -> value (the new one, the current one, or exp when missing)
//   GET 2 key                  -> value
//   ADD 3 key i64              -> i64
//   CHECK 4 keys               -> u8 (0 ready, 1 not ready)
//   WAIT 5 keys                -> u8 0 once every key exists
//   GETNUMKEYS 6               -> i64
//   DELETE_KEY 8 key           -> i64 (keys deleted)
// Anything else (WATCH_KEY 7, unknown queries, fields over the limits) closes the
// connection.
//
// Thread-safety: every member of Impl except server_ (its Start and Stop) and the stats
// counters (atomics) is touched only by the event-loop thread.
#include "cohort/store/torch_store_server.h"

#include <unistd.h>

#include <asio.hpp>
#include <atomic>
#include <cstring>
#include <deque>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "cohort/base/log.h"
#include "cohort/net/socket.h"
#include "cohort/store/asio_listen.h"
#include "cohort/store/kv_state.h"

namespace cohort::store {

using asio::ip::tcp;

namespace {

enum Query : uint8_t {
  kSet = 0,
  kCompareSet = 1,
  kGet = 2,
  kAdd = 3,
  kCheck = 4,
  kWait = 5,
  kNumKeys = 6,
  kDelete = 8,
};

constexpr uint64_t kMaxKeys = 1u << 16;  // keys in one CHECK or WAIT
constexpr size_t kMaxQueuedOutput = 512u << 20;

// The fields of a query, in order: s = a string, i = an i64, k = a key list.
const char* FieldsOf(uint8_t q) {
  switch (q) {
    case kSet: return "ss";
    case kCompareSet: return "sss";
    case kGet: return "s";
    case kAdd: return "si";
    case kCheck:
    case kWait: return "k";
    case kNumKeys: return "";
    case kDelete: return "s";
    default: return nullptr;
  }
}

// One request being read. Each field is taken from the input once it is whole and never
// looked at again: a request that arrives a byte at a time costs what it would at once.
struct Pending {
  bool started = false;
  uint8_t query = 0;
  size_t field = 0;               // index into FieldsOf(query)
  std::vector<std::string> strs;  // the string fields read ('s')
  int64_t number = 0;             // the 'i' field
  bool have_count = false;        // the 'k' field: its count, then its keys
  uint64_t count = 0;
  std::vector<std::string> keys;
  size_t bytes = 0;
};

struct Conn {
  explicit Conn(tcp::socket s) : socket(std::move(s)) {}
  tcp::socket socket;
  std::string peer;
  std::string in;           // received; bytes before `pos` are parsed
  size_t pos = 0;
  Pending pending;
  std::deque<std::string> out;
  size_t out_bytes = 0;
  bool writing = false;
  bool closed = false;
  int waits = 0;            // WAITs not answered yet (answered in order)
  char chunk[64 * 1024];
};

struct Waiter {
  std::weak_ptr<Conn> conn;
  std::vector<std::string> keys;
};

std::string Value(std::string_view v) {
  std::string out(8 + v.size(), '\0');
  uint64_t n = v.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, v.data(), v.size());
  return out;
}
std::string Int(int64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }
std::string Byte(uint8_t v) { return std::string(1, static_cast<char>(v)); }

}  // namespace

class TorchStoreServer::Impl {
 public:
  explicit Impl(TorchStoreServerOptions o) : o_(std::move(o)) {
    remote_.insert(o_.remote_hosts.begin(), o_.remote_hosts.end());
    for (const auto& [key, value] : o_.initial_keys) {
      const int64_t before = Held(key);
      state_.Set(key, value);
      stored_bytes_ += Held(key) - before;
    }
  }

  Status Open() {
    return server_.Start(o_.host, o_.port, "torch store", "torch-store",
                         [this](tcp::socket s) { Accept(std::move(s)); });
  }

  void Stop() {
    server_.Stop([this] {
      auto conns = conns_;
      for (auto& c : conns) Close(c);
    });
  }

  int port() const { return server_.port(); }
  TorchStoreServerStats stats() const {
    return {admitted_, refused_, closed_for_limits_, open_, stored_bytes_};
  }

 private:
  // Admission (see the header): why the peer may not use the store, or "" when it may.
  std::string Refusal(tcp::socket& s, const std::string& peer_addr) {
    auto uid = net::LocalPeerUid(s.native_handle());
    if (!uid.ok()) {
      // No socket diagnostics (a kernel without inet_diag, a sandbox): only an open store
      // admits then.
      return o_.any_remote_host ? ""
                                : "cannot tell who connects (" + uid.status().message() +
                                      "; COHORT_TORCH_STORE_ANY_HOST=1 admits everyone)";
    }
    if (uid->has_value()) {
      return **uid == ::geteuid()
                 ? ""
                 : fmt::format("a process of this host run by uid {}, not by this job's user "
                               "(uid {})", **uid, ::geteuid());
    }
    if (o_.any_remote_host || remote_.count(peer_addr)) return "";
    return fmt::format("{} is not the address of a node of this job's round (set "
                       "COHORT_TORCH_STORE_ANY_HOST=1 if a node of the job reaches MASTER_ADDR "
                       "from another address)", peer_addr);
  }

  void Accept(tcp::socket s) {
    asio::error_code ec;
    const auto remote = s.remote_endpoint(ec);
    const std::string addr = ec ? "?" : remote.address().to_string();
    std::string why = open_ >= o_.max_connections
                          ? fmt::format("its limit of {} connections is reached",
                                        o_.max_connections)
                          : Refusal(s, addr);
    if (!why.empty()) {
      ++refused_;
      // Once per address and reason: a flood from one stranger is one line.
      if (warned_.size() < 1024 && warned_.insert(addr + "|" + why).second) {
        COHORT_LOG_WARN("store", "torch store: refused a connection from {}: {}", addr, why);
      }
      s.close(ec);
      return;
    }
    ++admitted_;
    ++open_;
    auto c = std::make_shared<Conn>(std::move(s));
    c->peer = fmt::format("{}:{}", addr, ec ? 0 : remote.port());
    conns_.insert(c);
    Read(c);
  }

  void Read(const std::shared_ptr<Conn>& c) {
    c->socket.async_read_some(asio::buffer(c->chunk), [this, c](asio::error_code ec, size_t n) {
      if (c->closed) return;
      if (ec) return Close(c);
      c->in.append(c->chunk, n);
      for (;;) {
        std::string problem;
        if (!Parse(*c, &problem)) {
          if (!problem.empty()) return CloseFor(c, problem);
          break;
        }
        Handle(c);
        c->pending = Pending();
        if (c->closed) return;
      }
      c->in.erase(0, c->pos);
      c->pos = 0;
      Read(c);
    });
  }

  // Reads fields of the pending request from c.in; true when it is whole. False with
  // `problem` empty when more bytes are needed, set when the request is refused.
  bool Parse(Conn& c, std::string* problem) {
    Pending& p = c.pending;
    const std::string_view in(c.in);
    auto avail = [&] { return in.size() - c.pos; };
    if (!p.started) {
      if (avail() < 1) return false;
      p.query = static_cast<uint8_t>(in[c.pos++]);
      p.started = true;
      p.bytes = 1;
      if (FieldsOf(p.query) == nullptr) {
        *problem = fmt::format("query {} is not supported", static_cast<int>(p.query));
        return false;
      }
    }
    // One string at c.pos into `out`, when whole.
    auto str = [&](std::string* out) -> int {  // 1 read, 0 more bytes needed, -1 refused
      if (avail() < 8) return 0;
      uint64_t n;
      std::memcpy(&n, in.data() + c.pos, 8);
      if (n > o_.max_value_bytes || p.bytes + 8 + n > o_.max_request_bytes) {
        *problem = fmt::format("a field of {} bytes (limits: {} a field, {} a request)", n,
                               o_.max_value_bytes, o_.max_request_bytes);
        return -1;
      }
      if (avail() < 8 + n) return 0;
      out->assign(in.substr(c.pos + 8, n));
      c.pos += 8 + n;
      p.bytes += 8 + n;
      return 1;
    };
    const std::string_view fields = FieldsOf(p.query);
    for (; p.field < fields.size(); ++p.field) {
      switch (fields[p.field]) {
        case 's': {
          std::string s;
          const int got = str(&s);
          if (got <= 0) return false;
          p.strs.push_back(std::move(s));
          break;
        }
        case 'i':
          if (avail() < 8) return false;
          std::memcpy(&p.number, in.data() + c.pos, 8);
          c.pos += 8;
          p.bytes += 8;
          break;
        case 'k':
          if (!p.have_count) {
            if (avail() < 8) return false;
            std::memcpy(&p.count, in.data() + c.pos, 8);
            if (p.count > kMaxKeys) {
              *problem = fmt::format("{} keys in one request (at most {})", p.count, kMaxKeys);
              return false;
            }
            c.pos += 8;
            p.bytes += 8;
            p.have_count = true;
          }
          while (p.keys.size() < p.count) {
            std::string k;
            const int got = str(&k);
            if (got <= 0) return false;
            p.keys.push_back(std::move(k));
          }
          break;
      }
    }
    return true;
  }

  // The bytes `key` holds (its name and value; 0 when missing): stored_bytes_ is their sum,
  // kept by adding Held(key) after a change minus Held(key) before it.
  int64_t Held(const std::string& key) const {
    const std::string* v = state_.Find(key);
    return v ? static_cast<int64_t>(key.size() + v->size()) : 0;
  }
  // Whether setting `key` to `bytes` bytes keeps the store within its limit.
  bool Fits(const std::string& key, size_t bytes) const {
    return static_cast<size_t>(stored_bytes_ - Held(key)) + key.size() + bytes <=
           o_.max_store_bytes;
  }

  // Handles the whole request in c->pending. Protocol: see the top of this file.
  void Handle(const std::shared_ptr<Conn>& c) {
    Pending& p = c->pending;
    auto full = [&](const std::string& key, size_t bytes) {
      CloseFor(c, fmt::format("the store holds {} bytes; setting '{}' to {} bytes would pass "
                              "its limit of {}", stored_bytes_.load(), key.substr(0, 100),
                              bytes, o_.max_store_bytes));
    };
    switch (p.query) {
      case kSet: {
        const std::string& key = p.strs[0];
        if (!Fits(key, p.strs[1].size())) return full(key, p.strs[1].size());
        const int64_t before = Held(key);
        state_.Set(key, p.strs[1]);
        stored_bytes_ += Held(key) - before;
        Notify();
        return;
      }
      case kCompareSet: {
        const std::string& key = p.strs[0];
        const std::string* old = state_.Find(key);
        if (old == nullptr && !p.strs[1].empty()) {
          Send(c, Value(p.strs[1]));  // as torch: a missing key answers with the expected value
          return;
        }
        if (!Fits(key, p.strs[2].size())) return full(key, p.strs[2].size());
        const bool had = old != nullptr;
        const int64_t before = Held(key);
        Send(c, Value(state_.CompareSet(key, p.strs[1], p.strs[2])));
        stored_bytes_ += Held(key) - before;
        if (!had) Notify();
        return;
      }
      case kGet: {
        const std::string* v = state_.Find(p.strs[0]);
        Send(c, Value(v ? *v : std::string()));
        return;
      }
      case kAdd: {
        const std::string& key = p.strs[0];
        if (!Fits(key, 24)) return full(key, 24);
        const int64_t before = Held(key);
        auto r = state_.Add(key, p.number);
        if (!r.ok()) return CloseFor(c, fmt::format("add to '{}': {}", key.substr(0, 100),
                                                    r.status().message()));
        stored_bytes_ += Held(key) - before;
        Send(c, Int(*r));
        Notify();
        return;
      }
      case kCheck:
        Send(c, Byte(state_.ContainsAll(p.keys) ? 0 : 1));
        return;
      case kWait:
        if (state_.ContainsAll(p.keys) && c->waits == 0) {
          Send(c, Byte(0));
        } else {
          ++c->waits;
          auto w = std::make_shared<Waiter>(Waiter{c, std::move(p.keys)});
          waiters_.push_back(w);
          if (state_.ContainsAll(w->keys)) Notify();
        }
        return;
      case kNumKeys:
        Send(c, Int(state_.size()));
        return;
      case kDelete: {
        stored_bytes_ -= Held(p.strs[0]);
        Send(c, Int(state_.Delete(p.strs[0]) ? 1 : 0));
        return;
      }
    }
  }

  // Answers, in the order they were made, the waits whose keys now all exist. A
  // connection's waits are answered in order (a client has at most one outstanding).
  void Notify() {
    std::vector<std::shared_ptr<Waiter>> keep;
    std::unordered_set<Conn*> blocked;
    for (auto& w : waiters_) {
      auto c = w->conn.lock();
      if (!c || c->closed) continue;
      if (!blocked.count(c.get()) && state_.ContainsAll(w->keys)) {
        --c->waits;
        Send(c, Byte(0));
      } else {
        blocked.insert(c.get());
        keep.push_back(std::move(w));
      }
    }
    waiters_ = std::move(keep);
  }

  void Send(const std::shared_ptr<Conn>& c, std::string bytes) {
    if (c->closed) return;
    if (c->out_bytes + bytes.size() > kMaxQueuedOutput) {
      return CloseFor(c, "the client does not read its answers");
    }
    c->out_bytes += bytes.size();
    c->out.push_back(std::move(bytes));
    if (!c->writing) Flush(c);
  }

  void Flush(const std::shared_ptr<Conn>& c) {
    if (c->out.empty()) {
      c->writing = false;
      return;
    }
    c->writing = true;
    asio::async_write(c->socket, asio::buffer(c->out.front()),
                      [this, c](asio::error_code ec, size_t) {
                        if (c->closed) return;
                        if (ec) return Close(c);
                        c->out_bytes -= c->out.front().size();
                        c->out.pop_front();
                        Flush(c);
                      });
  }

  void CloseFor(const std::shared_ptr<Conn>& c, const std::string& why) {
    ++closed_for_limits_;
    COHORT_LOG_WARN("store", "torch store: closing the connection from {}: {}", c->peer, why);
    Close(c);
  }

  void Close(const std::shared_ptr<Conn>& c) {
    if (c->closed) return;
    c->closed = true;
    asio::error_code ignored;
    c->socket.shutdown(tcp::socket::shutdown_both, ignored);
    c->socket.close(ignored);
    conns_.erase(c);
    --open_;
  }

  const TorchStoreServerOptions o_;
  std::unordered_set<std::string> remote_;
  AsioServer server_;  // first in, last out: the connections below use its io_context
  std::unordered_set<std::shared_ptr<Conn>> conns_;
  std::vector<std::shared_ptr<Waiter>> waiters_;
  std::unordered_set<std::string> warned_;  // (address, reason) refused and logged
  KvState state_;
  std::atomic<int64_t> admitted_{0}, refused_{0}, closed_for_limits_{0}, open_{0},
      stored_bytes_{0};
};

Result<std::unique_ptr<TorchStoreServer>> TorchStoreServer::Start(
    const TorchStoreServerOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  COHORT_RETURN_IF_ERROR(impl->Open());
  return std::unique_ptr<TorchStoreServer>(new TorchStoreServer(std::move(impl)));
}

TorchStoreServer::TorchStoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TorchStoreServer::~TorchStoreServer() { Stop(); }
int TorchStoreServer::port() const { return impl_->port(); }
TorchStoreServerStats TorchStoreServer::stats() const { return impl_->stats(); }
void TorchStoreServer::Stop() { impl_->Stop(); }

}  // namespace cohort::store
