// The membership channel's files (see membership_channel.h). Thread-safety: stateless.
#include "cohort/base/membership_channel.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "cohort/base/file.h"
#include "cohort/base/json_bounded.h"
#include "cohort/base/strings.h"

namespace cohort {

using nlohmann::json;

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(MembershipNotice, round, rank, world_size,
                                                group_rank, group_world_size, store_prefix,
                                                restart_count, master_addr, master_port)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(LostPeerReport, round, rank, reason, peer)

namespace {
// At most this much of a malformed message goes into an error (a log line), not all of it.
constexpr size_t kQuoted = 200;

std::string Quoted(std::string_view text) {
  return text.size() <= kQuoted ? std::string(text)
                                : fmt::format("{}... ({} bytes)", text.substr(0, kQuoted),
                                              text.size());
}

json ParseObject(std::string_view text) {
  json j = ParseJsonBounded(text, 1u << 20);
  return j.is_object() ? j : json(json::value_t::discarded);
}

template <typename Record>
Result<Record> FromObject(const json& j, std::string_view text, const char* what) {
  if (j.is_discarded()) return DataLoss("malformed {}: {}", what, Quoted(text));
  try {
    return j.get<Record>();
  } catch (const json::exception&) {
    return DataLoss("malformed {}: {}", what, Quoted(text));
  }
}

template <typename Record>
Result<Record> Parse(std::string_view text, const char* what) {
  return FromObject<Record>(ParseObject(text), text, what);
}

// The record as the channel carries it: its JSON with the agent's secret beside it.
template <typename Record>
std::string Sealed(const Record& record, const std::string& secret) {
  json j = record;
  j["auth"] = secret;
  return j.dump();
}

template <typename Record>
Result<Record> Unsealed(const std::string& dir, const std::string& path,
                        const std::string& secret, const char* what) {
  COHORT_RETURN_IF_ERROR(CheckPrivateDir(dir));
  COHORT_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  json j = ParseObject(text);
  const json* auth = j.is_object() ? &j["auth"] : nullptr;
  if (!j.is_discarded() &&
      (secret.empty() || auth == nullptr || !auth->is_string() ||
       !ConstantTimeEquals(auth->get_ref<const std::string&>(), secret))) {
    return PermissionDenied("{} {} does not carry this agent's channel secret: refused", what,
                            path);
  }
  return FromObject<Record>(j, text, what);
}

constexpr const char* kNames[] = {"ready", "notice", "formed", "lost"};
}  // namespace

std::string MembershipNotice::ToJson() const { return json(*this).dump(); }
Result<MembershipNotice> MembershipNotice::FromJson(std::string_view text) {
  return Parse<MembershipNotice>(text, "membership notice");
}
int LostPeerIn(std::string_view reason) {
  for (size_t at = reason.find("rank "); at != std::string_view::npos;
       at = reason.find("rank ", at + 1)) {
    size_t end = at + 5;
    while (end < reason.size() && reason[end] >= '0' && reason[end] <= '9') ++end;
    if (end == at + 5 || reason.substr(end, 5) != " (at ") continue;
    auto rank = ParseInt64(reason.substr(at + 5, end - at - 5));
    if (rank && *rank >= 0 && *rank <= INT32_MAX) return static_cast<int>(*rank);
  }
  return -1;
}

std::string LostPeerAddressIn(std::string_view reason) {
  auto is_ip_char = [](char c) {
    return std::isxdigit(static_cast<unsigned char>(c)) || c == '.' || c == ':';
  };
  for (size_t open = reason.find('['); open != std::string_view::npos;
       open = reason.find('[', open + 1)) {
    const size_t close = reason.find(']', open + 1);
    if (close == std::string_view::npos) break;
    const std::string_view inside = reason.substr(open + 1, close - open - 1);
    // A source location ("[./gloo/transport/tcp/pair.cc:589]") is not an address.
    if (inside.empty() || !std::all_of(inside.begin(), inside.end(), is_ip_char) ||
        inside.find_first_of(".:") == std::string_view::npos) {
      continue;
    }
    const std::string_view after = reason.substr(close + 1);
    if (after.size() >= 2 && after[0] == ':' && after[1] >= '0' && after[1] <= '9') {
      return std::string(inside);
    }
  }
  return "";
}

std::string LostPeerReport::ToJson() const { return json(*this).dump(); }
Result<LostPeerReport> LostPeerReport::FromJson(std::string_view text) {
  return Parse<LostPeerReport>(text, "lost-peer report");
}

namespace membership_channel {

std::string PathOf(const std::string& dir, File file, int local_rank) {
  return fmt::format("{}/{}.{}", dir, kNames[static_cast<int>(file)], local_rank);
}

std::optional<std::pair<File, int>> FileOf(std::string_view name) {
  const size_t dot = name.find('.');
  if (dot == std::string_view::npos) return std::nullopt;
  auto local = ParseInt64(name.substr(dot + 1));
  if (!local || *local < 0) return std::nullopt;  // "notice.3.tmp.77" is no rank
  for (int k = 0; k < 4; ++k) {
    if (name.substr(0, dot) == kNames[k]) {
      return std::make_pair(static_cast<File>(k), static_cast<int>(*local));
    }
  }
  return std::nullopt;
}

Result<std::unique_ptr<ChannelWatch>> ChannelWatch::Open(const std::string& dir) {
  const int fd = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (fd < 0) return Internal("inotify_init1: {}", std::strerror(errno));
  // Every file is replaced by rename: one IN_MOVED_TO per update.
  if (::inotify_add_watch(fd, dir.c_str(), IN_MOVED_TO) < 0) {
    const int err = errno;
    ::close(fd);
    return Internal("cannot watch the membership channel {}: {}", dir, std::strerror(err));
  }
  return std::unique_ptr<ChannelWatch>(new ChannelWatch(fd));
}

ChannelWatch::~ChannelWatch() { ::close(fd_); }

std::vector<std::pair<File, int>> ChannelWatch::Changed() {
  std::vector<std::pair<File, int>> changed;
  alignas(inotify_event) char buf[4096];
  for (ssize_t n; (n = ::read(fd_, buf, sizeof(buf))) > 0;) {
    for (ssize_t off = 0; off < n;) {
      auto* ev = reinterpret_cast<inotify_event*>(buf + off);
      if (auto file = ev->len > 0 ? FileOf(ev->name) : std::nullopt) changed.push_back(*file);
      off += static_cast<ssize_t>(sizeof(inotify_event) + ev->len);
    }
  }
  return changed;
}

Status WriteNotice(const std::string& dir, int local_rank, const MembershipNotice& notice,
                   const std::string& secret) {
  return ReplaceFile(PathOf(dir, File::kNotice, local_rank), Sealed(notice, secret));
}

Result<MembershipNotice> ReadNotice(const std::string& dir, int local_rank,
                                    const std::string& secret) {
  return Unsealed<MembershipNotice>(dir, PathOf(dir, File::kNotice, local_rank), secret,
                                    "membership notice");
}

Status MarkReady(const std::string& dir, int local_rank) {
  COHORT_RETURN_IF_ERROR(CheckPrivateDir(dir));
  return ReplaceFile(PathOf(dir, File::kReady, local_rank), "1\n");
}

bool IsReady(const std::string& dir, int local_rank) {
  return ReadFileToString(PathOf(dir, File::kReady, local_rank)).ok();
}

Status WriteFormed(const std::string& dir, int local_rank, int64_t round) {
  return ReplaceFile(PathOf(dir, File::kFormed, local_rank), std::to_string(round));
}

std::optional<int64_t> ReadFormed(const std::string& dir, int local_rank) {
  auto text = ReadFileToString(PathOf(dir, File::kFormed, local_rank));
  if (!text.ok()) return std::nullopt;
  return ParseInt64(Trim(*text));
}

Status WriteLost(const std::string& dir, int local_rank, const LostPeerReport& report,
                 const std::string& secret) {
  return ReplaceFile(PathOf(dir, File::kLost, local_rank), Sealed(report, secret));
}

Result<LostPeerReport> ReadLost(const std::string& dir, int local_rank,
                                const std::string& secret) {
  return Unsealed<LostPeerReport>(dir, PathOf(dir, File::kLost, local_rank), secret,
                                  "lost-peer report");
}

}  // namespace membership_channel
}  // namespace cohort
