// Implements StoreServer on asio. Thread-safety: every member of Impl except the atomics
// and the thread handle is touched only by the event-loop thread.
#include "cohort/store/store_server.h"

#include <fcntl.h>
#include <sys/resource.h>

#include <algorithm>
#include <asio.hpp>
#include <atomic>
#include <deque>
#include <mutex>
#include <queue>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "cohort/base/log.h"
#include "cohort/base/strings.h"
#include "cohort/base/worker_env.h"
#include "cohort/net/codec.h"
#include "cohort/store/asio_listen.h"
#include "cohort/store/kv_state.h"
#include "cohort/store/memory_store.h"

namespace cohort::store {

using asio::ip::tcp;
using protocol::Op;

void RaiseFileLimit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
}

namespace {

struct Connection;

struct Waiter {
  Waiter(std::weak_ptr<Connection> c, uint64_t request_id, Op request_op,
         std::vector<std::string> wanted)
      : conn(std::move(c)), id(request_id), op(request_op), keys(std::move(wanted)) {}
  std::weak_ptr<Connection> conn;
  uint64_t id;
  Op op;
  std::vector<std::string> keys;
  std::vector<std::string> parked_on;  // the keys it was missing when parked
  std::vector<std::optional<std::string>> peeked;  // BEAT: the values read when it came
  std::vector<int64_t> peeked_age_ms;  // BEAT: how long ago each was last beaten (-1: never)
  bool done = false;
};

// The waiters parked on one key. Finished waiters stay until they are the majority, then
// the list is compacted: finishing a waiter costs O(1) amortized however many wait on the
// key (ten thousand watchers of one round's `next` time out every heartbeat).
struct WaitList {
  std::vector<std::shared_ptr<Waiter>> waiters;
  size_t finished = 0;
};

// When a parked request times out. Expiries are kept in a heap and served by one timer,
// rounded up to kExpiryTick so that the many that fall close together fire as one.
struct Expiry {
  SteadyClock::time_point at;
  std::weak_ptr<Waiter> waiter;
  bool operator>(const Expiry& o) const { return at > o.at; }
};
constexpr auto kExpiryTick = std::chrono::milliseconds(2);

// Reads land in the connection's buffer this many bytes at a time (more when a frame
// being read is larger); a buffer left larger than kMaxIdleBuffer is freed once empty.
constexpr size_t kReadChunk = 1024;
constexpr size_t kMaxIdleBuffer = 64 * 1024;

struct Connection {
  explicit Connection(tcp::socket s)
      : socket(std::move(s)), handshake_timer(socket.get_executor()) {}
  tcp::socket socket;
  asio::steady_timer handshake_timer;  // closes a client that does not authenticate
  std::string peer;
  bool authenticated = false;
  bool closed = false;
  bool close_after_write = false;
  std::string in;    // bytes read, not yet handled (a partial frame at most)
  size_t need = 0;   // bytes the partial frame in `in` still lacks
  std::deque<std::string> out;
  size_t out_bytes = 0;  // queued in `out`
  bool writing = false;
  std::vector<std::shared_ptr<Waiter>> waiters;
  std::vector<std::string> wills;  // keys of the wills this connection holds
  std::string end_cause;           // why it ended, for its wills
};

// A client's will (WILL): `key` is set when its owner's connection ends and no connection
// takes the will up again within `grace`. While pending, `timer` runs.
struct Will {
  const Connection* owner = nullptr;  // null while pending
  Duration grace{};
  std::shared_ptr<asio::steady_timer> timer;
};


net::Writer OkResponse(uint64_t id) {
  net::Writer w;
  w.U64(id).U8(0);
  return w;
}

std::string ErrorResponse(uint64_t id, const Status& status) {
  net::Writer w;
  w.U64(id).U8(static_cast<uint8_t>(status.code())).Str(status.message());
  return std::move(w.Finish());
}

}  // namespace

class StoreServer::Impl {
 public:
  explicit Impl(StoreServerOptions options)
      : options_(std::move(options)) {}

  Status Open() {
    RaiseFileLimit();
    COHORT_RETURN_IF_ERROR(server_.Start(
        options_.host.empty() ? "0.0.0.0" : options_.host, options_.port, "store server",
        "store-server", [this](tcp::socket socket) { Accept(std::move(socket)); }));
    COHORT_LOG_DEBUG("store", "store server listening on {}:{}", options_.host, port());
    return Status::Ok();
  }

  void Stop() {
    server_.Stop([this] {
      stopping_ = true;
      for (auto& [key, will] : wills_) {
        if (will.timer) will.timer->cancel();
      }
      wills_.clear();
      auto conns = connections_;
      for (auto& c : conns) Close(c, "");
    });
  }

  int port() const { return server_.port(); }
  StoreServerStats stats() const {
    StoreServerStats s;
    s.connections_accepted = accepted_;
    s.connections_rejected = rejected_;
    s.connections_open = open_;
    s.connections_unauthenticated = unauthenticated_;
    s.requests = requests_;
    s.beats = beats_;
    s.wills_fired = wills_fired_;
    return s;
  }

 private:
  // A new connection (io thread): refused at once while strangers hold every slot, else
  // given the handshake deadline and read.
  void Accept(tcp::socket socket) {
    if (unauthenticated_ >= options_.max_unauthenticated && !unauthenticated_list_.empty()) {
      // Every slot is held by a connection that has not authenticated: shed one of them,
      // chosen at random, and take the new one (as sshd's MaxStartups drops at random). A
      // stranger holding every slot is shed slot by slot while a client of the job, which
      // sends its HELLO at once, authenticates: the slots never lock everyone out.
      if (!warned_full_) {
        COHORT_LOG_WARN("store", "{} connections have not authenticated; shedding them at "
                        "random as new ones arrive", unauthenticated_.load());
        warned_full_ = true;
      }
      std::uniform_int_distribution<size_t> pick(0, unauthenticated_list_.size() - 1);
      auto victim = unauthenticated_list_[pick(shed_random_)];
      ++rejected_;
      Close(victim, "");  // not logged: a flood would flood the log
    }
    auto conn = std::make_shared<Connection>(std::move(socket));
    asio::error_code ignored;
    auto remote = conn->socket.remote_endpoint(ignored);
    conn->peer = fmt::format("{}:{}", remote.address().to_string(), remote.port());
    connections_.insert(conn);
    ++accepted_;
    ++open_;
    ++unauthenticated_;
    unauthenticated_list_.push_back(conn);
    conn->handshake_timer.expires_after(options_.handshake_timeout);
    conn->handshake_timer.async_wait([this, weak = std::weak_ptr<Connection>(conn)](
                                         asio::error_code ec) {
      auto c = weak.lock();
      if (ec || !c || c->closed || c->authenticated) return;
      Reject(c, fmt::format("no HELLO within {:.0f} s",
                            std::chrono::duration<double>(options_.handshake_timeout).count()));
    });
    Read(conn);
  }

  // Reads what the client sent (into the connection's buffer) and handles every complete
  // frame in it: one read per batch of requests, not one per header and body.
  void Read(const std::shared_ptr<Connection>& conn) {
    const size_t old = conn->in.size();
    conn->in.resize(old + std::max(kReadChunk, conn->need));
    conn->socket.async_read_some(
        asio::buffer(conn->in.data() + old, conn->in.size() - old),
        [this, conn, old](asio::error_code ec, size_t n) {
          if (conn->closed) return;
          conn->in.resize(old + (ec ? 0 : n));
          if (ec) {
            conn->end_cause = ec == asio::error::eof ? "its store connection closed"
                              : ec == asio::error::connection_reset
                                  ? "its store connection was reset"
                                  : "its store connection failed: " + ec.message();
            Close(conn, "");
            return;
          }
          if (HandleFrames(conn)) Read(conn);
        });
  }

  // Handles the complete frames in conn->in; false when the connection was closed.
  bool HandleFrames(const std::shared_ptr<Connection>& conn) {
    std::string& in = conn->in;
    size_t at = 0;
    conn->need = 0;
    for (;;) {
      const size_t avail = in.size() - at;
      if (avail < 4) {
        conn->need = 4 - avail;
        break;
      }
      const uint32_t n = net::DecodeFrameLength(in.data() + at);
      // A stranger gets no more than a HELLO's worth of memory.
      const uint32_t limit = conn->authenticated ? options_.max_frame : protocol::kMaxHelloFrame;
      if (n > limit) {
        Reject(conn, fmt::format("frame of {} bytes exceeds the limit of {}{}", n, limit,
                                 conn->authenticated ? "" : " before HELLO"));
        return false;
      }
      if (avail - 4 < n) {
        conn->need = n + 4 - avail;
        break;
      }
      ++requests_;
      Handle(conn, std::string_view(in).substr(at + 4, n));
      // A refused HELLO ends the connection once its answer is written: nothing it sent
      // after it (another HELLO, pipelined) is looked at.
      if (conn->closed || conn->close_after_write) return false;
      at += 4 + n;
    }
    in.erase(0, at);
    if (in.empty() && in.capacity() > kMaxIdleBuffer) std::string().swap(in);
    return true;
  }

  void Reject(const std::shared_ptr<Connection>& conn, const std::string& reason) {
    ++rejected_;
    Close(conn, reason);
  }

  void Close(const std::shared_ptr<Connection>& conn, const std::string& reason) {
    if (conn->closed) return;
    if (!reason.empty()) {
      COHORT_LOG_WARN("store", "closing connection from {}: {}", conn->peer, reason);
    }
    conn->closed = true;
    if (!conn->authenticated) Authenticated(conn);
    if (unauthenticated_ < options_.max_unauthenticated) warned_full_ = false;
    conn->handshake_timer.cancel();
    for (auto& w : conn->waiters) Finish(w);
    conn->waiters.clear();
    LeaveWills(*conn, !reason.empty()            ? "the store closed its connection: " + reason
                      : !conn->end_cause.empty() ? conn->end_cause
                                                 : std::string("its store connection ended"));
    asio::error_code ignored;
    conn->socket.shutdown(tcp::socket::shutdown_both, ignored);
    conn->socket.close(ignored);
    connections_.erase(conn);
    --open_;
  }

  void Send(const std::shared_ptr<Connection>& conn, std::string frame) {
    if (conn->closed) return;
    if (conn->out_bytes + frame.size() > options_.max_output_bytes) {
      Reject(conn, fmt::format("the client does not read its responses ({} bytes queued)",
                               conn->out_bytes + frame.size()));
      return;
    }
    conn->out_bytes += frame.size();
    conn->out.push_back(std::move(frame));
    if (!conn->writing) Flush(conn);
  }

  void Flush(const std::shared_ptr<Connection>& conn) {
    if (conn->out.empty()) {
      conn->writing = false;
      if (conn->close_after_write) Close(conn, "");
      return;
    }
    conn->writing = true;
    asio::async_write(conn->socket, asio::buffer(conn->out.front()),
                      [this, conn](asio::error_code ec, size_t) {
                        if (conn->closed) return;
                        if (ec) {
                          conn->end_cause = "its store connection failed: " + ec.message();
                          Close(conn, "");
                          return;
                        }
                        conn->out_bytes -= conn->out.front().size();
                        conn->out.pop_front();
                        Flush(conn);
                      });
  }

  // Handles one request body. Protocol steps are in docs/store-protocol.md.
  void Handle(const std::shared_ptr<Connection>& conn, std::string_view body) {
    net::Reader r(body);
    uint8_t raw_op;
    uint64_t id;
    if (!r.U8(&raw_op) || !r.U64(&id)) {
      Reject(conn, "malformed frame: missing opcode or request id");
      return;
    }
    Op op = static_cast<Op>(raw_op);
    if (!conn->authenticated) {
      HandleHello(conn, r, op, id);
      return;
    }
    auto malformed = [&] {
      Reject(conn, fmt::format("malformed {} request", protocol::OpName(op)));
    };
    std::string key, value, expected;
    int64_t number;
    std::vector<std::string> keys, values;
    switch (op) {
      case Op::kSet:
        if (!r.Str(&key) || !r.Str(&value) || !r.AtEnd()) return malformed();
        state_.Set(key, value);
        Send(conn, std::move(OkResponse(id).Finish()));
        Notify(key);
        return;
      case Op::kGet:
      case Op::kWait:
      case Op::kMultiGet:
        if (!HandleWait(conn, r, op, id)) return malformed();
        return;
      case Op::kAdd: {
        if (!r.Str(&key) || !r.I64(&number) || !r.AtEnd()) return malformed();
        auto result = state_.Add(key, number);
        if (!result.ok()) {
          Send(conn, ErrorResponse(id, result.status()));
          return;
        }
        Send(conn, std::move(OkResponse(id).I64(*result).Finish()));
        Notify(key);
        return;
      }
      case Op::kAppend:
        if (!HandleAppend(conn, r, id)) return malformed();
        return;
      case Op::kCompareSet: {
        if (!r.Str(&key) || !r.Str(&expected) || !r.Str(&value) || !r.AtEnd()) {
          return malformed();
        }
        std::string after = state_.CompareSet(key, expected, value);
        Send(conn, std::move(OkResponse(id).Str(after).Finish()));
        Notify(key);
        return;
      }
      case Op::kCheck:
        if (!r.StrList(&keys, protocol::kMaxKeysPerRequest) || !r.AtEnd()) return malformed();
        Send(conn, std::move(OkResponse(id).U8(state_.ContainsAll(keys) ? 1 : 0).Finish()));
        return;
      case Op::kDelete:
        if (!r.Str(&key) || !r.AtEnd()) return malformed();
        Send(conn, std::move(OkResponse(id).U8(state_.Delete(key) ? 1 : 0).Finish()));
        return;
      case Op::kNumKeys:
        if (!r.AtEnd()) return malformed();
        Send(conn, std::move(OkResponse(id).I64(state_.size()).Finish()));
        return;
      case Op::kMultiSet:
        if (!r.StrList(&keys, protocol::kMaxKeysPerRequest) ||
            !r.StrList(&values, protocol::kMaxKeysPerRequest) || !r.AtEnd() ||
            keys.size() != values.size()) {
          return malformed();
        }
        for (size_t i = 0; i < keys.size(); ++i) state_.Set(keys[i], values[i]);
        Send(conn, std::move(OkResponse(id).Finish()));
        for (const auto& k : keys) Notify(k);
        return;
      case Op::kCreateAll:
        if (!HandleCreateAll(conn, r, id)) return malformed();
        return;
      case Op::kPing:
        Send(conn, std::move(OkResponse(id).Finish()));
        return;
      case Op::kPeek: {
        if (!r.StrList(&keys, protocol::kMaxKeysPerRequest) || !r.AtEnd()) return malformed();
        Send(conn, PeekResponse(id, keys));
        return;
      }
      case Op::kBeat:
        ++beats_;
        if (!HandleBeat(conn, r, id)) return malformed();
        return;
      case Op::kWill:
        if (!HandleWill(conn, r, id)) return malformed();
        return;
      case Op::kHello:
        return Reject(conn, "second HELLO on an open connection");
    }
    Reject(conn, fmt::format("unknown opcode {}", raw_op));
  }

  // GET, WAIT and MULTI_GET: answered now when every key exists, else parked until they
  // do or the request's timeout. False when the request is malformed.
  bool HandleWait(const std::shared_ptr<Connection>& conn, net::Reader& r, Op op, uint64_t id) {
    std::vector<std::string> keys;
    if (op == Op::kGet) {
      std::string key;
      if (!r.Str(&key)) return false;
      keys.push_back(std::move(key));
    } else if (!r.StrList(&keys, protocol::kMaxKeysPerRequest)) {
      return false;
    }
    int64_t timeout_ms;
    if (!r.I64(&timeout_ms) || !r.AtEnd() || timeout_ms < -1) return false;
    auto waiter = std::make_shared<Waiter>(conn, id, op, std::move(keys));
    AnswerOrPark(conn, waiter, timeout_ms);
    return true;
  }

  // PEEK: each key's value if it exists, without waiting.
  std::string PeekResponse(uint64_t id, const std::vector<std::string>& keys) {
    auto response = OkResponse(id);
    WritePeeked(response, Values(keys));
    return std::move(response.Finish());
  }

  std::vector<std::optional<std::string>> Values(const std::vector<std::string>& keys) {
    std::vector<std::optional<std::string>> values;
    values.reserve(keys.size());
    for (const auto& k : keys) {
      const std::string* v = state_.Find(k);
      values.push_back(v ? std::optional<std::string>(*v) : std::nullopt);
    }
    return values;
  }

  static void WritePeeked(net::Writer& w, const std::vector<std::optional<std::string>>& values) {
    w.U32(static_cast<uint32_t>(values.size()));
    for (const auto& v : values) {
      w.U8(v ? 1 : 0);
      if (v) w.Str(*v);
    }
  }

  // BEAT: ADD 1 to the beat key (unless empty), read the peek keys now, then answer once
  // any of the wait keys exists (or at the timeout, which is an ordinary answer: "none").
  bool HandleBeat(const std::shared_ptr<Connection>& conn, net::Reader& r, uint64_t id) {
    std::string beat_key;
    std::vector<std::string> peek_keys, wait_keys;
    int64_t timeout_ms;
    if (!r.Str(&beat_key) || !r.StrList(&peek_keys, protocol::kMaxKeysPerRequest) ||
        !r.StrList(&wait_keys, protocol::kMaxKeysPerRequest) || wait_keys.empty() ||
        !r.I64(&timeout_ms) || !r.AtEnd() || timeout_ms < -1) {
      return false;
    }
    const auto now = SteadyClock::now();
    if (!beat_key.empty()) {
      auto added = state_.Add(beat_key, 1);
      if (!added.ok()) {
        Send(conn, ErrorResponse(id, added.status()));
        return true;
      }
      Notify(beat_key);
      beaten_at_[beat_key] = now;
    }
    auto waiter = std::make_shared<Waiter>(conn, id, Op::kBeat, std::move(wait_keys));
    waiter->peeked = Values(peek_keys);
    // The store's clock says when each peeked counter last moved: a watcher then knows a
    // silent peer's deadline exactly, not one of its own steps late.
    for (const auto& k : peek_keys) {
      auto at = beaten_at_.find(k);
      waiter->peeked_age_ms.push_back(
          at == beaten_at_.end()
              ? -1
              : std::chrono::duration_cast<std::chrono::milliseconds>(now - at->second).count());
    }
    AnswerOrPark(conn, waiter, timeout_ms);
    return true;
  }

  // APPEND: ADD 1 to the ticket key, then SET record prefix + ticket (Store::Append).
  bool HandleAppend(const std::shared_ptr<Connection>& conn, net::Reader& r, uint64_t id) {
    std::string key, prefix, value;
    if (!r.Str(&key) || !r.Str(&prefix) || !r.Str(&value) || !r.AtEnd()) return false;
    auto ticket = state_.Add(key, 1);
    if (!ticket.ok()) {
      Send(conn, ErrorResponse(id, ticket.status()));
      return true;
    }
    std::string record = prefix + std::to_string(*ticket);
    state_.Set(record, value);
    Send(conn, std::move(OkResponse(id).I64(*ticket).Finish()));
    Notify(key);
    Notify(record);
    return true;
  }

  // CREATE_ALL: every key written when none exists, in this one step (KvState::CreateAll).
  bool HandleCreateAll(const std::shared_ptr<Connection>& conn, net::Reader& r, uint64_t id) {
    std::vector<std::string> keys, values;
    if (!r.StrList(&keys, protocol::kMaxKeysPerRequest) ||
        !r.StrList(&values, protocol::kMaxKeysPerRequest) || !r.AtEnd() ||
        keys.size() != values.size()) {
      return false;
    }
    const KvState::Created created = state_.CreateAll(keys, values);
    Send(conn, std::move(
                   OkResponse(id).U8(created != KvState::Created::kRefused ? 1 : 0).Finish()));
    if (created == KvState::Created::kWritten) {
      for (const auto& k : keys) Notify(k);
    }
    return true;
  }

  bool HandleWill(const std::shared_ptr<Connection>& conn, net::Reader& r, uint64_t id) {
    std::string key;
    int64_t grace_ms;
    if (!r.Str(&key) || !r.I64(&grace_ms) || !r.AtEnd() || grace_ms < 0) return false;
    TakeWill(conn, key, std::chrono::milliseconds(std::min(grace_ms, protocol::kMaxWaitMs)));
    Send(conn, std::move(OkResponse(id).Finish()));
    return true;
  }

  // WILL: `conn` now holds the will on `key`; a pending one (its last owner's connection
  // ended less than its grace ago: the client reconnected) is taken up, not fired.
  void TakeWill(const std::shared_ptr<Connection>& conn, const std::string& key, Duration grace) {
    Will& will = wills_[key];
    if (will.timer) will.timer->cancel();
    will.timer.reset();
    will.owner = conn.get();
    will.grace = grace;
    if (std::find(conn->wills.begin(), conn->wills.end(), key) == conn->wills.end()) {
      conn->wills.push_back(key);
    }
  }

  // The connection ended: each will it still holds fires after its grace unless taken up.
  void LeaveWills(const Connection& conn, const std::string& cause) {
    if (stopping_) return;
    for (const auto& key : conn.wills) {
      auto it = wills_.find(key);
      if (it == wills_.end() || it->second.owner != &conn) continue;  // taken up elsewhere
      Will& will = it->second;
      will.owner = nullptr;
      will.timer = std::make_shared<asio::steady_timer>(server_.io(), will.grace);
      will.timer->async_wait([this, key, cause, timer = std::weak_ptr(will.timer)](
                                 asio::error_code ec) {
        // A handler already queued when the will was taken up runs with no error; taking
        // it up dropped this timer (or replaced it), so the will is no longer this one's.
        auto it = wills_.find(key);
        const auto mine = timer.lock();
        if (ec || !mine || it == wills_.end() || it->second.timer != mine) return;
        wills_.erase(it);
        ++wills_fired_;
        if (state_.Find(key)) return;  // set already: the first word stays
        state_.Set(key, cause);
        Notify(key);
      });
    }
  }

  // The connection no longer holds a pre-authentication slot (it authenticated or closed).
  void Authenticated(const std::shared_ptr<Connection>& conn) {
    --unauthenticated_;
    auto at = std::find(unauthenticated_list_.begin(), unauthenticated_list_.end(), conn);
    if (at != unauthenticated_list_.end()) {
      *at = std::move(unauthenticated_list_.back());
      unauthenticated_list_.pop_back();
    }
  }

  // Step 1 of every connection: HELLO(magic, version, token). Anything else is refused.
  void HandleHello(const std::shared_ptr<Connection>& conn, net::Reader& r, Op op, uint64_t id) {
    std::string magic, token;
    uint32_t version;
    if (op != Op::kHello || !r.Str(&magic) || !r.U32(&version) || !r.Str(&token) ||
        magic != protocol::kMagic) {
      Reject(conn, "the first frame is not a cohort HELLO");
      return;
    }
    if (version != protocol::kVersion) {
      ++rejected_;
      COHORT_LOG_WARN("store", "refusing {}: protocol version {} (server speaks {})", conn->peer,
                      version, protocol::kVersion);
      conn->close_after_write = true;
      Send(conn, ErrorResponse(id, FailedPrecondition("protocol version {} not supported; "
                                                      "this server speaks version {}",
                                                      version, protocol::kVersion)));
      return;
    }
    if (!ConstantTimeEquals(token, options_.token)) {
      ++rejected_;
      COHORT_LOG_WARN("store", "refusing {}: {} token", conn->peer,
                      token.empty() ? "missing" : "wrong");
      conn->close_after_write = true;
      Send(conn, ErrorResponse(id, PermissionDenied("the store refused the job token; set {} "
                                                    "to the job's token",
                                                    worker_env::kToken)));
      return;
    }
    conn->authenticated = true;
    Authenticated(conn);
    conn->handshake_timer.cancel();
    Send(conn, std::move(OkResponse(id).Finish()));
  }

  // Answers at once when the waiter's keys all exist, else parks it until they do or its
  // timeout (capped at kMaxWaitMs; -1: none).
  void AnswerOrPark(const std::shared_ptr<Connection>& conn,
                    const std::shared_ptr<Waiter>& waiter, int64_t timeout_ms) {
    if (Ready(*waiter)) {
      Answer(*waiter, conn);
    } else {
      Park(conn, waiter, std::min(timeout_ms, protocol::kMaxWaitMs));
    }
  }

  void Park(const std::shared_ptr<Connection>& conn, const std::shared_ptr<Waiter>& waiter,
            int64_t timeout_ms) {
    for (const auto& k : waiter->keys) {
      if (!state_.Find(k)) {
        waiting_[k].waiters.push_back(waiter);
        waiter->parked_on.push_back(k);
      }
    }
    conn->waiters.push_back(waiter);
    if (timeout_ms >= 0) {
      const auto since = (SteadyClock::now() + std::chrono::milliseconds(timeout_ms))
                             .time_since_epoch();
      const auto ticks = (since + kExpiryTick - Duration(1)) / kExpiryTick;  // rounded up
      expiries_.push(Expiry{SteadyClock::time_point(ticks * kExpiryTick), waiter});
      ArmExpiryTimer();
    }
  }

  // Keeps the one expiry timer set for the earliest pending expiry.
  void ArmExpiryTimer() {
    if (expiries_.empty() || expiries_.top().at >= armed_for_) return;
    armed_for_ = expiries_.top().at;
    expiry_timer_.expires_at(armed_for_);
    expiry_timer_.async_wait([this](asio::error_code ec) {
      if (ec) return;  // re-armed earlier, or stopping
      armed_for_ = SteadyClock::time_point::max();
      ExpireWaiters();
    });
  }

  // Answers every parked request whose time is up with a timeout.
  void ExpireWaiters() {
    const auto now = SteadyClock::now();
    while (!expiries_.empty() && expiries_.top().at <= now) {
      auto waiter = expiries_.top().waiter.lock();
      expiries_.pop();
      if (!waiter || waiter->done) continue;
      auto c = waiter->conn.lock();
      Finish(waiter);
      if (c) {
        if (waiter->op == Op::kBeat) {
          Send(c, BeatAnswer(*waiter, /*timed_out=*/true));  // an ordinary answer
        } else {
          Send(c, ErrorResponse(waiter->id, WaitTimeout(waiter->keys)));
        }
        ForgetWaiter(*c, waiter);
      }
    }
    ArmExpiryTimer();
  }

  // A BEAT's answer: the values read when it came and their ages, then the first wait key
  // that exists (its index and value; none: the wait timed out).
  std::string BeatAnswer(const Waiter& waiter, bool timed_out) {
    net::Writer w = OkResponse(waiter.id);
    WritePeeked(w, waiter.peeked);
    for (int64_t age : waiter.peeked_age_ms) w.I64(age);
    for (size_t i = 0; !timed_out && i < waiter.keys.size(); ++i) {
      if (const std::string* v = state_.Find(waiter.keys[i])) {
        w.U8(1).U32(static_cast<uint32_t>(i)).Str(*v);
        return std::move(w.Finish());
      }
    }
    w.U8(0);
    return std::move(w.Finish());
  }

  // Answers a waiter whose keys all exist.
  void Answer(Waiter& waiter, const std::shared_ptr<Connection>& conn) {
    if (waiter.op == Op::kBeat) {
      Send(conn, BeatAnswer(waiter, /*timed_out=*/false));
      return;
    }
    net::Writer w = OkResponse(waiter.id);
    if (waiter.op == Op::kGet) {
      w.Str(*state_.Find(waiter.keys[0]));
    } else if (waiter.op == Op::kMultiGet) {
      w.U32(static_cast<uint32_t>(waiter.keys.size()));
      for (const auto& k : waiter.keys) w.Str(*state_.Find(k));
    }
    Send(conn, std::move(w.Finish()));
  }

  // Whether the waiter can be answered: all its keys exist (any one, for a BEAT).
  bool Ready(const Waiter& waiter) const {
    if (waiter.op != Op::kBeat) return state_.ContainsAll(waiter.keys);
    return std::any_of(waiter.keys.begin(), waiter.keys.end(),
                       [this](const std::string& k) { return state_.Find(k) != nullptr; });
  }

  // Marks a waiter done and takes it off the keys it was parked on.
  void Finish(const std::shared_ptr<Waiter>& waiter) {
    if (waiter->done) return;
    waiter->done = true;
    for (const auto& k : waiter->parked_on) {
      auto it = waiting_.find(k);
      if (it == waiting_.end()) continue;
      WaitList& list = it->second;
      if (2 * ++list.finished < list.waiters.size()) continue;
      std::erase_if(list.waiters, [](const auto& w) { return w->done; });
      list.finished = 0;
      if (list.waiters.empty()) waiting_.erase(it);
    }
  }

  void ForgetWaiter(Connection& conn, const std::shared_ptr<Waiter>& waiter) {
    auto& list = conn.waiters;
    list.erase(std::remove(list.begin(), list.end(), waiter), list.end());
  }

  // Wakes the waiters of `key` whose keys now all exist.
  void Notify(const std::string& key) {
    auto it = waiting_.find(key);
    if (it == waiting_.end()) return;
    std::vector<std::shared_ptr<Waiter>> ready;
    for (const auto& w : it->second.waiters) {
      if (!w->done && Ready(*w)) ready.push_back(w);
    }
    for (const auto& w : ready) {
      Finish(w);
      if (auto c = w->conn.lock(); c && !c->closed) {
        Answer(*w, c);
        ForgetWaiter(*c, w);
      }
    }
  }

  const StoreServerOptions options_;
  AsioServer server_;  // first in, last out: the connections below use its io_context
  // The connections that hold a pre-authentication slot, for shedding one at random.
  std::vector<std::shared_ptr<Connection>> unauthenticated_list_;
  std::minstd_rand shed_random_{std::random_device{}()};
  std::atomic<int64_t> accepted_{0}, rejected_{0}, open_{0}, requests_{0}, unauthenticated_{0},
      beats_{0}, wills_fired_{0};
  bool warned_full_ = false;  // event-loop thread
  // Owned by the event-loop thread:
  KvState state_;
  std::unordered_set<std::shared_ptr<Connection>> connections_;
  std::unordered_map<std::string, WaitList> waiting_;
  std::unordered_map<std::string, Will> wills_;
  // When each BEAT key was last added to (one per node and round, like the counters).
  std::unordered_map<std::string, SteadyClock::time_point> beaten_at_;
  bool stopping_ = false;  // Stop() is closing every connection: no will fires
  std::priority_queue<Expiry, std::vector<Expiry>, std::greater<>> expiries_;
  asio::steady_timer expiry_timer_{server_.io()};
  SteadyClock::time_point armed_for_ = SteadyClock::time_point::max();
};

StoreServer::StoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreServer::~StoreServer() { Stop(); }

Result<std::unique_ptr<StoreServer>> StoreServer::Start(const StoreServerOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  COHORT_RETURN_IF_ERROR(impl->Open());
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(impl)));
}

int StoreServer::port() const { return impl_->port(); }
StoreServerStats StoreServer::stats() const { return impl_->stats(); }
void StoreServer::Stop() { impl_->Stop(); }

}  // namespace cohort::store
