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
// Anything else (WATCH_KEY 7, unknown queries, oversized fields) closes the connection.
//
// Thread-safety: every member of Impl except server_ (its Start and Stop) is touched only by
// the event-loop thread.
#include "cohort/store/torch_store_server.h"

#include <fcntl.h>

#include <asio.hpp>
#include <cstring>
#include <deque>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "cohort/base/log.h"
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

constexpr uint64_t kMaxField = 256u << 20;  // one key or value
constexpr uint64_t kMaxKeys = 1u << 16;     // keys in one CHECK or WAIT
constexpr size_t kMaxQueuedOutput = 512u << 20;

struct Conn {
  explicit Conn(tcp::socket s) : socket(std::move(s)) {}
  tcp::socket socket;
  std::string in;           // received, not yet parsed
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

// Parses one request from the front of `in`; nullopt when more bytes are needed.
class Parser {
 public:
  explicit Parser(std::string_view in) : in_(in) {}
  bool U8(uint8_t* v) { return Raw(v, 1); }
  bool I64(int64_t* v) { return Raw(v, 8); }
  bool Str(std::string* s) {
    uint64_t n;
    if (!Raw(&n, 8)) return false;
    if (n > kMaxField) return Bad();
    if (in_.size() - pos_ < n) return false;
    s->assign(in_.substr(pos_, n));
    pos_ += n;
    return true;
  }
  bool Keys(std::vector<std::string>* keys) {
    uint64_t n;
    if (!Raw(&n, 8)) return false;
    if (n > kMaxKeys) return Bad();
    keys->resize(n);
    for (auto& k : *keys) {
      if (!Str(&k)) return false;
    }
    return true;
  }
  size_t consumed() const { return pos_; }
  bool bad() const { return bad_; }

 private:
  bool Raw(void* out, size_t n) {
    if (in_.size() - pos_ < n) return false;
    std::memcpy(out, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool Bad() {
    bad_ = true;
    return false;
  }
  std::string_view in_;
  size_t pos_ = 0;
  bool bad_ = false;
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
  Status Open(const TorchStoreServerOptions& o) {
    return server_.Start(o.host, o.port, "torch store", "torch-store", [this](tcp::socket s) {
      auto c = std::make_shared<Conn>(std::move(s));
      conns_.insert(c);
      Read(c);
    });
  }

  void Stop() {
    server_.Stop([this] {
      auto conns = conns_;
      for (auto& c : conns) Close(c);
    });
  }

  int port() const { return server_.port(); }

 private:
  void Read(const std::shared_ptr<Conn>& c) {
    c->socket.async_read_some(asio::buffer(c->chunk), [this, c](asio::error_code ec, size_t n) {
      if (c->closed) return;
      if (ec) return Close(c);
      c->in.append(c->chunk, n);
      size_t used = 0;
      for (;;) {
        Parser p(std::string_view(c->in).substr(used));
        if (!HandleOne(c, p)) {
          if (p.bad()) return Close(c);
          break;
        }
        used += p.consumed();
        if (c->closed) return;
      }
      c->in.erase(0, used);
      Read(c);
    });
  }

  // Handles the request at the parser's front; false when it is incomplete or malformed
  // (p.bad()). Protocol: see the top of this file.
  bool HandleOne(const std::shared_ptr<Conn>& c, Parser& p) {
    uint8_t q;
    if (!p.U8(&q)) return false;
    std::string key, a, b;
    int64_t n;
    std::vector<std::string> keys;
    switch (q) {
      case kSet:
        if (!p.Str(&key) || !p.Str(&a)) return false;
        state_.Set(key, a);
        Notify();
        return true;
      case kCompareSet: {
        if (!p.Str(&key) || !p.Str(&a) || !p.Str(&b)) return false;
        const bool missing = state_.Find(key) == nullptr;
        if (missing && !a.empty()) {
          Send(c, Value(a));  // as torch: a missing key answers with the expected value
          return true;
        }
        Send(c, Value(state_.CompareSet(key, a, b)));
        if (missing) Notify();
        return true;
      }
      case kGet: {
        if (!p.Str(&key)) return false;
        const std::string* v = state_.Find(key);
        Send(c, Value(v ? *v : std::string()));
        return true;
      }
      case kAdd: {
        if (!p.Str(&key) || !p.I64(&n)) return false;
        auto r = state_.Add(key, n);
        if (!r.ok()) {
          COHORT_LOG_WARN("store", "torch store: add to '{}': {}", key, r.status().message());
          Close(c);
          return true;
        }
        Send(c, Int(*r));
        Notify();
        return true;
      }
      case kCheck:
        if (!p.Keys(&keys)) return false;
        Send(c, Byte(state_.ContainsAll(keys) ? 0 : 1));
        return true;
      case kWait:
        if (!p.Keys(&keys)) return false;
        if (state_.ContainsAll(keys) && c->waits == 0) {
          Send(c, Byte(0));
        } else {
          ++c->waits;
          auto w = std::make_shared<Waiter>(Waiter{c, std::move(keys)});
          waiters_.push_back(w);
          if (state_.ContainsAll(w->keys)) Notify();
        }
        return true;
      case kNumKeys:
        Send(c, Int(state_.size()));
        return true;
      case kDelete:
        if (!p.Str(&key)) return false;
        Send(c, Int(state_.Delete(key) ? 1 : 0));
        return true;
      default:
        COHORT_LOG_WARN("store", "torch store: query {} is not supported; closing the "
                        "connection", static_cast<int>(q));
        Close(c);
        return true;
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
    if (c->out_bytes + bytes.size() > kMaxQueuedOutput) return Close(c);
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

  void Close(const std::shared_ptr<Conn>& c) {
    if (c->closed) return;
    c->closed = true;
    asio::error_code ignored;
    c->socket.shutdown(tcp::socket::shutdown_both, ignored);
    c->socket.close(ignored);
    conns_.erase(c);
  }

  AsioServer server_;  // first in, last out: the connections below use its io_context
  std::unordered_set<std::shared_ptr<Conn>> conns_;
  std::vector<std::shared_ptr<Waiter>> waiters_;
  KvState state_;
};

Result<std::unique_ptr<TorchStoreServer>> TorchStoreServer::Start(
    const TorchStoreServerOptions& options) {
  auto impl = std::make_unique<Impl>();
  COHORT_RETURN_IF_ERROR(impl->Open(options));
  return std::unique_ptr<TorchStoreServer>(new TorchStoreServer(std::move(impl)));
}

TorchStoreServer::TorchStoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TorchStoreServer::~TorchStoreServer() { Stop(); }
int TorchStoreServer::port() const { return impl_->port(); }
void TorchStoreServer::Stop() { impl_->Stop(); }

}  // namespace cohort::store
