// Implements TcpStore. Thread-safety: mu_ serializes calls (a Call holds it for one request)
// and guards socket_, next_id_ and reached_peer_; Abort() touches only atomics and
// shutdown(2), which is safe against a concurrent poll on the same descriptor.
#include "cohort/store/tcp_store.h"

#include <sys/socket.h>

#include <algorithm>
#include <functional>

#include "cohort/base/log.h"
#include "cohort/net/codec.h"

namespace cohort::store {

using protocol::Op;

namespace {

// The wait a blocking request (GET, WAIT, MULTI_GET) asks the server for: a little less
// than the caller's time, so that the server's "timed out" answer arrives before the
// caller's deadline. A call that gives up with its request still in flight must drop the
// connection (its answer could arrive mid-frame later); without the margin a watcher that
// waits one heartbeat at a time reconnected after about every third wait.
// How long the rest of an answer may take once its first bytes arrived.
constexpr auto kFrameGrace = std::chrono::seconds(5);

int64_t TimeoutMs(Deadline deadline) {
  if (deadline.infinite()) return -1;
  const int64_t ms = deadline.RemainingMs();
  return std::max<int64_t>(0, ms - std::clamp<int64_t>(ms / 20, 5, 100));
}

// A WILL request's fields: the key and the grace in milliseconds.
void WriteWill(net::Writer& w, std::string_view key, Duration grace) {
  w.Str(key).I64(std::chrono::duration_cast<std::chrono::milliseconds>(grace).count());
}

// Splits a response body into (code, payload reader); error responses become a Status.
Status ParseResponseHead(net::Reader& r, uint64_t* id) {
  uint8_t code;
  if (!r.U64(id) || !r.U8(&code)) return DataLoss("malformed response from store server");
  if (code == 0) return Status::Ok();
  std::string message;
  if (!r.Str(&message)) return DataLoss("malformed error response from store server");
  return Status(static_cast<StatusCode>(code), message);
}

}  // namespace

// One request: builds the frame, runs the round trip and hands back a payload reader. It
// holds store->mu_ from construction to destruction, so the analysis treats it as a lock.
class COHORT_SCOPED_CAPABILITY TcpStore::Call {
 public:
  Call(TcpStore* store, Op op) COHORT_ACQUIRE(store->mu_) : store_(store), lock_(&store->mu_) {
    id_ = store->next_id_++;
    writer_.U8(static_cast<uint8_t>(op)).U64(id_);
  }
  ~Call() COHORT_RELEASE() {}  // lock_ unlocks
  net::Writer& writer() { return writer_; }
  Status Run(Deadline deadline) { return Run(deadline, /*blocking=*/false); }
  // For GET, WAIT, MULTI_GET and BEAT: appends the server-side wait (their last field) once
  // connected, so that time spent reconnecting is not added to the server's wait.
  Status RunBlocking(Deadline deadline) { return Run(deadline, /*blocking=*/true); }
  Status Run(Deadline deadline, bool blocking) {
    // Held by lock_ since the constructor; the analysis cannot tie store_->mu_ to this object.
    store_->mu_.AssertHeld();
    if (store_->aborted_) return Cancelled("store client aborted");
    COHORT_RETURN_IF_ERROR(store_->EnsureConnected(deadline));
    if (blocking) writer_.I64(TimeoutMs(deadline));
    Status st = store_->RoundTrip(writer_.Finish(), id_, &body_, deadline);
    if (!st.ok()) return st;
    reader_.emplace(body_);
    uint64_t id;
    COHORT_RETURN_IF_ERROR(ParseResponseHead(*reader_, &id));
    return Status::Ok();
  }
  net::Reader& reader() { return *reader_; }
  // Runs the request and reads its one-byte yes/no answer (CHECK, DELETE).
  Result<bool> RunForFlag(Deadline deadline, const char* op_name) {
    COHORT_RETURN_IF_ERROR(Run(deadline));
    uint8_t flag;
    if (!reader_->U8(&flag)) return DataLoss("malformed {} response", op_name);
    return flag != 0;
  }

 private:
  TcpStore* store_;
  MutexLock lock_;
  uint64_t id_;
  net::Writer writer_;
  std::string body_;
  std::optional<net::Reader> reader_;
};

Result<std::unique_ptr<TcpStore>> TcpStore::Connect(const TcpStoreOptions& options,
                                                    Deadline deadline) {
  std::unique_ptr<TcpStore> store(new TcpStore(options));
  {
    MutexLock lock(&store->mu_);
    COHORT_RETURN_IF_ERROR(store->EnsureConnected(deadline));
  }
  return store;
}

TcpStore::ProbeResult TcpStore::Probe(const TcpStoreOptions& options, Deadline deadline) {
  std::unique_ptr<TcpStore> store(new TcpStore(options));
  MutexLock lock(&store->mu_);
  Status st = store->EnsureConnected(deadline);
  if (st.ok()) return {StorePeer::kCohortStore, st};
  if (st.code() == StatusCode::kPermissionDenied) return {StorePeer::kWrongToken, st};
  return {store->reached_peer_ ? StorePeer::kOtherProgram : StorePeer::kNothing, st};
}

TcpStore::~TcpStore() = default;

std::string TcpStore::endpoint() const {
  return fmt::format("{}:{}", options_.host, options_.port);
}

Status TcpStore::EnsureConnected(Deadline deadline) {
  if (socket_.valid()) return Status::Ok();
  reached_peer_ = false;
  auto sock = net::Connect(options_.host, options_.port, deadline);
  if (!sock.ok()) {
    return sock.status().WithContext(fmt::format("store at {}", endpoint()));
  }
  socket_ = std::move(sock).value();
  received_.clear();
  live_fd_ = socket_.fd();
  reached_peer_ = true;
  if (aborted_) {
    ::shutdown(socket_.fd(), SHUT_RDWR);
    return Cancelled("store client aborted");
  }
  // Handshake: HELLO(magic, version, token) -> OK or PERMISSION_DENIED.
  Status st = SetupCall(Op::kHello, deadline, [&](net::Writer& w) {
    w.Str(protocol::kMagic).U32(protocol::kVersion).Str(options_.token);
  });
  if (!st.ok()) {
    if (st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kDataLoss) {
      return Unavailable(
          "store at {} did not complete the cohort handshake ({}); is it a cohort store?",
          endpoint(), st.message());
    }
    return st.WithContext(fmt::format("store at {}", endpoint()));
  }
  // A reconnection: leave the wills again, within their grace (the server then does not
  // take the old connection's end for this client's).
  for (const auto& will : wills_) {
    st = SetupCall(Op::kWill, deadline,
                   [&](net::Writer& w) { WriteWill(w, will.first, will.second); });
    if (!st.ok()) {
      return st.WithContext(fmt::format("leaving a will at the store at {}", endpoint()));
    }
  }
  return Status::Ok();
}

// One request of the connection's setup (HELLO, WILL) without an answer payload; the
// connection is closed when it fails.
Status TcpStore::SetupCall(Op op, Deadline deadline,
                           const std::function<void(net::Writer&)>& fields) {
  const uint64_t id = next_id_++;
  net::Writer frame;
  frame.U8(static_cast<uint8_t>(op)).U64(id);
  fields(frame);
  std::string body;
  Status st = RoundTrip(frame.Finish(), id, &body, deadline);
  if (st.ok()) {
    net::Reader r(body);
    uint64_t got;
    st = ParseResponseHead(r, &got);
  }
  if (!st.ok()) {
    socket_.Close();
    live_fd_ = -1;
  }
  return st;
}

Status TcpStore::RoundTrip(std::string& frame, uint64_t id, std::string* body,
                           Deadline deadline) {
  Status st = socket_.SendAll(frame.data(), frame.size(), deadline);
  while (st.ok()) {
    // Until the answer begins, giving up leaves the stream whole: the connection stays and
    // the late answer is skipped by its id on a later call (a reconnection per late answer
    // turned a loaded store's slowness into a storm of reconnections). Once it begins, the
    // rest of the frame gets a few seconds more if needed: a partial frame cannot be left.
    // (Bytes already read past a skipped late answer may hold this one: no waiting then.)
    auto ready = received_.empty() ? socket_.WaitReadable(deadline) : Result<bool>(true);
    if (!ready.ok()) {
      st = ready.status();
      break;
    }
    if (!*ready) {
      if (aborted_) break;  // closed below
      return DeadlineExceeded("no answer from the store at {} before the deadline", endpoint());
    }
    const Deadline rest = deadline.remaining() > kFrameGrace ? deadline
                                                             : Deadline::After(kFrameGrace);
    st = ReadAnswer(body, rest);
    if (!st.ok()) break;
    net::Reader r(*body);
    uint64_t got = 0;
    if (!r.U64(&got)) {
      st = DataLoss("malformed response from store server");
      break;
    }
    if (got == id) return Status::Ok();
    // A late answer to a call that already gave up: drop it and keep reading.
  }
  if (aborted_) {
    socket_.Close();
    live_fd_ = -1;
    return Cancelled("store client aborted");
  }
  // The stream may hold part of a frame: drop the connection and reconnect on the next call
  // (the server forgets requests of a closed connection).
  socket_.Close();
  live_fd_ = -1;
  if (st.code() == StatusCode::kUnavailable) {
    return Unavailable("lost the store at {}: {}", endpoint(), st.message());
  }
  return st;
}

// Reads one answer frame: whatever the socket holds is read at once (one recv for a whole
// small answer, not one for its header and one for its body); bytes beyond the frame stay
// in received_ for the next.
Status TcpStore::ReadAnswer(std::string* body, Deadline deadline) {
  for (;;) {
    if (received_.size() >= 4) {
      const uint32_t n = net::DecodeFrameLength(received_.data());
      if (n > options_.max_frame) {
        return DataLoss("frame of {} bytes exceeds the limit of {}", n, options_.max_frame);
      }
      if (received_.size() >= 4 + size_t{n}) {
        body->assign(received_, 4, n);
        received_.erase(0, 4 + size_t{n});
        return Status::Ok();
      }
    }
    char chunk[16384];
    const ssize_t got = ::recv(socket_.fd(), chunk, sizeof(chunk), MSG_DONTWAIT);
    if (got > 0) {
      received_.append(chunk, static_cast<size_t>(got));
      continue;
    }
    if (got == 0) return Unavailable("the store closed the connection");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return ErrnoStatus("recv from the store", errno);
    COHORT_ASSIGN_OR_RETURN(bool ready, socket_.WaitReadable(deadline));
    if (!ready) return DeadlineExceeded("receive from the store at {} timed out", endpoint());
  }
}

void TcpStore::Abort() {
  aborted_ = true;
  int fd = live_fd_.load();
  if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
}

Status TcpStore::Set(std::string_view key, std::string_view value, Deadline deadline) {
  Call call(this, Op::kSet);
  call.writer().Str(key).Str(value);
  return call.Run(deadline);
}

Result<std::string> TcpStore::Get(std::string_view key, Deadline deadline) {
  Call call(this, Op::kGet);
  call.writer().Str(key);
  COHORT_RETURN_IF_ERROR(call.RunBlocking(deadline));
  std::string value;
  if (!call.reader().Str(&value)) return DataLoss("malformed GET response");
  return value;
}

Result<int64_t> TcpStore::Add(std::string_view key, int64_t delta, Deadline deadline) {
  Call call(this, Op::kAdd);
  call.writer().Str(key).I64(delta);
  COHORT_RETURN_IF_ERROR(call.Run(deadline));
  int64_t value;
  if (!call.reader().I64(&value)) return DataLoss("malformed ADD response");
  return value;
}

Result<std::string> TcpStore::CompareSet(std::string_view key, std::string_view expected,
                                         std::string_view desired, Deadline deadline) {
  Call call(this, Op::kCompareSet);
  call.writer().Str(key).Str(expected).Str(desired);
  COHORT_RETURN_IF_ERROR(call.Run(deadline));
  std::string value;
  if (!call.reader().Str(&value)) return DataLoss("malformed COMPARE_SET response");
  return value;
}

Status TcpStore::Wait(const std::vector<std::string>& keys, Deadline deadline) {
  Call call(this, Op::kWait);
  call.writer().StrList(keys);
  return call.RunBlocking(deadline);
}

Result<bool> TcpStore::Check(const std::vector<std::string>& keys, Deadline deadline) {
  Call call(this, Op::kCheck);
  call.writer().StrList(keys);
  return call.RunForFlag(deadline, "CHECK");
}

namespace {

// Reads "u32 n, then per key: u8 present, str value if present" (PEEK and BEAT answers).
bool ReadPeeked(net::Reader& r, size_t expected, std::vector<std::optional<std::string>>* out) {
  uint32_t n;
  if (!r.U32(&n) || n != expected) return false;
  out->assign(n, std::nullopt);
  for (auto& slot : *out) {
    uint8_t present;
    if (!r.U8(&present)) return false;
    if (!present) continue;
    std::string v;
    if (!r.Str(&v)) return false;
    slot = std::move(v);
  }
  return true;
}

}  // namespace

Result<std::vector<std::optional<std::string>>> TcpStore::Peek(
    const std::vector<std::string>& keys, Deadline deadline) {
  Call call(this, Op::kPeek);
  call.writer().StrList(keys);
  COHORT_RETURN_IF_ERROR(call.Run(deadline));
  std::vector<std::optional<std::string>> out;
  if (!ReadPeeked(call.reader(), keys.size(), &out)) return DataLoss("malformed PEEK response");
  return out;
}

Result<Store::BeatResult> TcpStore::Beat(std::string_view beat_key,
                                         const std::vector<std::string>& peek_keys,
                                         const std::vector<std::string>& wait_keys,
                                         Deadline deadline) {
  if (wait_keys.empty()) return InvalidArgument("a beat waits for at least one key");
  Call call(this, Op::kBeat);
  call.writer().Str(beat_key).StrList(peek_keys).StrList(wait_keys);
  COHORT_RETURN_IF_ERROR(call.RunBlocking(deadline));
  BeatResult out;
  uint8_t present;
  if (!ReadPeeked(call.reader(), peek_keys.size(), &out.peeked)) {
    return DataLoss("malformed BEAT response");
  }
  out.peeked_age_ms.resize(peek_keys.size());
  for (auto& age : out.peeked_age_ms) {
    if (!call.reader().I64(&age)) return DataLoss("malformed BEAT response");
  }
  if (!call.reader().U8(&present)) return DataLoss("malformed BEAT response");
  if (present) {
    uint32_t index;
    std::string v;
    if (!call.reader().U32(&index) || index >= wait_keys.size() || !call.reader().Str(&v)) {
      return DataLoss("malformed BEAT response");
    }
    out.waited_index = index;
    out.waited = std::move(v);
  }
  return out;
}

Status TcpStore::LeaveWill(std::string_view key, Duration grace, Deadline deadline) {
  Call call(this, Op::kWill);
  // Recorded before it is sent: a call that gives up may still reach the server, and the
  // will must then be left again on any later connection, or it would fire at this one's
  // end while this client lives. Only a refusal forgets it.
  auto known = std::find_if(wills_.begin(), wills_.end(),
                            [&](const auto& w) { return w.first == key; });
  if (known == wills_.end()) {
    wills_.emplace_back(std::string(key), grace);
  } else {
    known->second = grace;
  }
  WriteWill(call.writer(), key, grace);
  Status st = call.Run(deadline);
  const bool refused = !st.ok() && st.code() != StatusCode::kDeadlineExceeded &&
                       st.code() != StatusCode::kUnavailable &&
                       st.code() != StatusCode::kCancelled;
  if (refused) {
    std::erase_if(wills_, [&](const auto& w) { return w.first == key; });
  }
  return st;
}

Result<bool> TcpStore::Delete(std::string_view key, Deadline deadline) {
  Call call(this, Op::kDelete);
  call.writer().Str(key);
  return call.RunForFlag(deadline, "DELETE");  // whether the key existed
}

Result<int64_t> TcpStore::NumKeys(Deadline deadline) {
  Call call(this, Op::kNumKeys);
  COHORT_RETURN_IF_ERROR(call.Run(deadline));
  int64_t n;
  if (!call.reader().I64(&n)) return DataLoss("malformed NUM_KEYS response");
  return n;
}

Result<std::vector<std::string>> TcpStore::MultiGet(const std::vector<std::string>& keys,
                                                    Deadline deadline) {
  Call call(this, Op::kMultiGet);
  call.writer().StrList(keys);
  COHORT_RETURN_IF_ERROR(call.RunBlocking(deadline));
  std::vector<std::string> values;
  if (!call.reader().StrList(&values, protocol::kMaxKeysPerRequest)) {
    return DataLoss("malformed MULTI_GET response");
  }
  return values;
}

Status TcpStore::MultiSet(const std::vector<std::string>& keys,
                          const std::vector<std::string>& values, Deadline deadline) {
  if (keys.size() != values.size()) {
    return InvalidArgument("MultiSet with {} keys and {} values", keys.size(), values.size());
  }
  Call call(this, Op::kMultiSet);
  call.writer().StrList(keys).StrList(values);
  return call.Run(deadline);
}

Result<bool> TcpStore::CreateAll(const std::vector<std::string>& keys,
                                  const std::vector<std::string>& values, Deadline deadline) {
  if (keys.size() != values.size()) {
    return InvalidArgument("{} keys but {} values to create", keys.size(), values.size());
  }
  Call call(this, Op::kCreateAll);
  call.writer().StrList(keys).StrList(values);
  COHORT_RETURN_IF_ERROR(call.Run(deadline));
  uint8_t created;
  if (!call.reader().U8(&created)) return DataLoss("malformed CREATE_ALL response");
  return created != 0;
}

Result<int64_t> TcpStore::Append(std::string_view ticket_key, std::string_view record_prefix,
                                 std::string_view value, Deadline deadline) {
  Call call(this, Op::kAppend);
  call.writer().Str(ticket_key).Str(record_prefix).Str(value);
  COHORT_RETURN_IF_ERROR(call.Run(deadline));
  int64_t ticket;
  if (!call.reader().I64(&ticket)) return DataLoss("malformed APPEND response");
  return ticket;
}

Status TcpStore::Ping(Deadline deadline) {
  Call call(this, Op::kPing);
  return call.Run(deadline);
}

}  // namespace cohort::store
