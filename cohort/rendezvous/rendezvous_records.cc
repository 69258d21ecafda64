// The rendezvous records' wire forms (rendezvous.h): NodeInfo and FailureRecord as JSON,
// RoundLayout ("N:LxC,..."), RoundEnd (r<R>/next) and the layout slot 1 publishes
// (Rendezvous::Published: the layout, a newline, node 1's record, and a carried round's
// line); RendezvousInfo::RecordSlot; FailureRecord::Describe.
// Thread-safety: value types and pure functions; this file keeps no global state.
#include <string.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "cohort/base/exit_codes.h"
#include "cohort/base/json_bounded.h"
#include "cohort/base/strings.h"
#include "cohort/rendezvous/rendezvous.h"

namespace cohort::rendezvous {

using nlohmann::json;

namespace {

std::string SignalName(int sig) {
  const char* name = sigabbrev_np(sig);
  return name ? fmt::format("SIG{}", name) : fmt::format("signal {}", sig);
}

}  // namespace

// The records' JSON: every field by its name; a missing field keeps its default.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(NodeInfo, host, addr, local_world_size, boot_id,
                                                tell_port)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(FailureRecord, rank, host, exit_code, signal,
                                                message)

namespace {

template <typename Record>
Result<Record> ParseRecord(std::string_view text, const char* what) {
  json j = ParseJsonBounded(text, 1u << 20);  // another node's record
  if (j.is_discarded() || !j.is_object()) return DataLoss("malformed {}", what);
  try {
    return j.get<Record>();
  } catch (const json::exception&) {  // a field of the wrong type
    return DataLoss("malformed {}", what);
  }
}

}  // namespace

std::string NodeInfo::ToJson() const { return json(*this).dump(); }

Result<NodeInfo> NodeInfo::FromJson(std::string_view text) {
  return ParseRecord<NodeInfo>(text, "node record");
}

std::string FailureRecord::ToJson() const { return json(*this).dump(); }

Result<FailureRecord> FailureRecord::FromJson(std::string_view text) {
  return ParseRecord<FailureRecord>(text, "failure record");
}

std::string FailureRecord::Describe() const {
  if (signal == 0 && exit_code == 0 && !message.empty()) {
    // Not a process's exit: a node that went silent, a group that did not re-form.
    return rank >= 0 ? fmt::format("rank {} (host {}): {}", rank, host, message) : message;
  }
  std::string how = signal != 0 ? fmt::format("was killed by {}", SignalName(signal))
                                : fmt::format("exited with code {}", exit_code);
  if (signal == 0 && exit_code == kExitCannotJoinJob) how += " (it could not join its job)";
  std::string text = fmt::format("rank {} (host {}) {}", rank, host, how);
  if (!message.empty()) text += fmt::format(": {}", message);
  return text;
}

void RoundLayout::Append(int local_world_size) {
  if (runs.empty() || runs.back().local_world_size != local_world_size) {
    runs.push_back({local_world_size, 0});
  }
  ++runs.back().count;
  ++members;
}

RoundLayout RoundLayout::FromNodes(const std::vector<NodeInfo>& nodes) {
  RoundLayout layout;
  for (const auto& n : nodes) layout.Append(n.local_world_size);
  return layout;
}

RoundLayout RoundLayout::Without(const std::vector<int>& group_ranks) const {
  std::vector<bool> drop(members, false);
  for (int g : group_ranks) {
    if (g >= 0 && g < members) drop[g] = true;
  }
  RoundLayout out;
  int g = 0;
  for (const auto& run : runs) {
    for (int i = 0; i < run.count; ++i, ++g) {
      if (!drop[g]) out.Append(run.local_world_size);
    }
  }
  return out;
}

int RendezvousInfo::RecordSlot(int slot) const {
  // The slot-th of records_round's slots that are not left out (left_out is ascending).
  int record = slot;
  for (int out : carried.left_out) {
    if (out <= record) ++record;
  }
  return record;
}

std::string RoundLayout::Encode() const {
  std::string text = fmt::format("{}:", members);
  for (size_t i = 0; i < runs.size(); ++i) {
    text += fmt::format("{}{}x{}", i ? "," : "", runs[i].local_world_size, runs[i].count);
  }
  return text;
}

Result<RoundLayout> RoundLayout::Decode(std::string_view text) {
  auto bad = [&] { return DataLoss("malformed round layout '{}'", text.substr(0, 64)); };
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos) return bad();
  RoundLayout layout;
  auto members = ParseInt64(text.substr(0, colon));
  if (!members || *members < 1) return bad();
  layout.members = static_cast<int>(*members);
  int64_t counted = 0;
  for (std::string_view rest = text.substr(colon + 1); !rest.empty();) {
    const size_t comma = rest.find(',');
    std::string_view run = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const size_t x = run.find('x');
    if (x == std::string_view::npos) return bad();
    auto size = ParseInt64(run.substr(0, x));
    auto count = ParseInt64(run.substr(x + 1));
    if (!size || !count || *size < 1 || *count < 1) return bad();
    layout.runs.push_back({static_cast<int>(*size), static_cast<int>(*count)});
    counted += *count;
  }
  if (counted != layout.members) return bad();
  return layout;
}

int RoundLayout::RankOffset(int group_rank) const {
  int offset = 0, before = group_rank;
  for (const auto& run : runs) {
    const int n = std::min(before, run.count);
    offset += n * run.local_world_size;
    before -= n;
    if (before == 0) break;
  }
  return offset;
}

int RoundLayout::WorldSize() const { return RankOffset(members); }

int RoundLayout::GroupRankOf(int global_rank) const {
  int group_rank = 0, offset = 0;
  for (const auto& run : runs) {
    const int64_t span = int64_t{run.count} * run.local_world_size;
    if (global_rank >= offset && global_rank < offset + span) {
      return group_rank + (global_rank - offset) / run.local_world_size;
    }
    offset += static_cast<int>(span);
    group_rank += run.count;
  }
  return -1;
}

std::string RoundEnd::Encode() const {
  std::string text;
  if (carried) {
    text = fmt::format("carried:{}:{}:{}", carried->restarts, carried->layout.size(),
                       carried->layout);
  }
  switch (kind) {
    case Kind::kJoin: return text + "join:" + detail;
    case Kind::kDeadNode: return text + "dead:" + detail;
    case Kind::kJobDone: return text + "done";
    case Kind::kFailure: break;
  }
  return text + "failure:" + detail;
}

namespace {
// "carried:<restarts>:<bytes>:<layout>" at the start of `text`: the next round, and the
// rest of the text after it (nullopt: none, or malformed).
std::optional<RoundEnd::Carried> TakeCarried(std::string_view* text) {
  constexpr std::string_view kPrefix = "carried:";
  if (!StartsWith(*text, kPrefix)) return std::nullopt;
  std::string_view rest = text->substr(kPrefix.size());
  const size_t colon1 = rest.find(':');
  const size_t colon2 = colon1 == std::string_view::npos ? colon1 : rest.find(':', colon1 + 1);
  if (colon2 == std::string_view::npos) return std::nullopt;
  auto restarts = ParseInt64(rest.substr(0, colon1));
  auto bytes = ParseInt64(rest.substr(colon1 + 1, colon2 - colon1 - 1));
  if (!restarts || *restarts < 0 || !bytes || *bytes < 0 ||
      static_cast<uint64_t>(*bytes) > rest.size() - colon2 - 1) {
    return std::nullopt;
  }
  RoundEnd::Carried carried{*restarts, std::string(rest.substr(colon2 + 1, *bytes))};
  *text = rest.substr(colon2 + 1 + *bytes);
  return carried;
}

// The reason after a carried round, if any: "join:<host>", "dead:...", "done", or a failure.
RoundEnd ReasonOf(std::string_view text) {
  using Kind = RoundEnd::Kind;
  auto after = [&](std::string_view prefix) { return std::string(text.substr(prefix.size())); };
  if (text == "done") return {Kind::kJobDone, ""};
  if (StartsWith(text, "join:")) return {Kind::kJoin, after("join:")};
  if (StartsWith(text, "dead:")) return {Kind::kDeadNode, after("dead:")};
  if (StartsWith(text, "failure:")) return {Kind::kFailure, after("failure:")};
  return {Kind::kFailure, std::string(text)};
}
}  // namespace

RoundEnd RoundEnd::Decode(std::string_view text) {
  std::optional<Carried> carried = TakeCarried(&text);
  RoundEnd end = ReasonOf(text);
  end.carried = std::move(carried);
  return end;
}

std::string RoundEnd::Describe() const {
  switch (kind) {
    case Kind::kJoin: return fmt::format("{} joined", detail);
    case Kind::kDeadNode: return detail;
    case Kind::kJobDone: return "the job is over";
    case Kind::kFailure: break;
  }
  return fmt::format("{} failed", detail);
}

// r<R>/layout: the layout's text, a newline, then node 1's record (JSON: one line); the
// round's tell key, "tell:<key>", when it has one; a carried round's, a line
// "carried:<records round>:<left-out slots, comma-separated>" and a line
// "appended:<token> <record>" per appended node.
std::string Rendezvous::Published::Encode() const {
  std::string text = layout.Encode() + "\n" + master.ToJson();
  if (!tell_key.empty()) text += "\ntell:" + tell_key;
  if (pace > 1) text += fmt::format("\npace:{}", pace);
  if (carried.records_round >= 0) {
    text += fmt::format("\ncarried:{}:{}", carried.records_round, fmt::join(carried.left_out, ","));
    for (const auto& a : carried.appended) {
      text += fmt::format("\nappended:{} {}", a.token, a.node.ToJson());
    }
  }
  return text;
}

namespace {
// "<Q>:<s>,<s>,..." of a carried round's line.
Status DecodeCarried(std::string_view text, CarriedMembers* out) {
  auto bad = [&] { return DataLoss("malformed carried round '{}'", text.substr(0, 64)); };
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos) return bad();
  auto records_round = ParseInt64(text.substr(0, colon));
  if (!records_round || *records_round < 0) return bad();
  out->records_round = *records_round;
  for (std::string_view slots = text.substr(colon + 1); !slots.empty();) {
    const size_t comma = slots.find(',');
    auto slot = ParseInt64(slots.substr(0, comma));
    if (!slot || *slot < 1) return bad();
    out->left_out.push_back(static_cast<int>(*slot));
    slots = comma == std::string_view::npos ? std::string_view() : slots.substr(comma + 1);
  }
  if (!std::is_sorted(out->left_out.begin(), out->left_out.end())) return bad();
  return Status::Ok();
}
}  // namespace

Result<Rendezvous::Published> Rendezvous::Published::Decode(std::string_view text) {
  std::vector<std::string_view> lines;
  for (size_t at = 0;;) {
    const size_t newline = text.find('\n', at);
    lines.push_back(text.substr(at, newline == std::string_view::npos ? newline : newline - at));
    if (newline == std::string_view::npos) break;
    at = newline + 1;
  }
  if (lines.size() < 2) {
    return DataLoss("round layout without its master's record: '{}'", text.substr(0, 64));
  }
  Published published;
  COHORT_ASSIGN_OR_RETURN(published.layout, RoundLayout::Decode(lines[0]));
  COHORT_ASSIGN_OR_RETURN(published.master, NodeInfo::FromJson(lines[1]));
  size_t next = 2;
  if (next < lines.size() && StartsWith(lines[next], "tell:")) {
    published.tell_key = std::string(lines[next].substr(5));
    ++next;
  }
  if (next < lines.size() && StartsWith(lines[next], "pace:")) {
    auto pace = ParseInt64(lines[next].substr(5));
    if (!pace || *pace < 1) return DataLoss("malformed pace '{}'", lines[next].substr(0, 64));
    published.pace = *pace;
    ++next;
  }
  if (lines.size() == next) return published;
  auto bad = [&] { return DataLoss("malformed carried round '{}'", lines[next].substr(0, 64)); };
  if (!StartsWith(lines[next], "carried:")) return bad();
  COHORT_RETURN_IF_ERROR(DecodeCarried(lines[next].substr(8), &published.carried));
  for (size_t i = next + 1; i < lines.size(); ++i) {
    std::string_view line = lines[i];
    const size_t space = line.find(' ');
    if (!StartsWith(line, "appended:") || space == std::string_view::npos) return bad();
    CarriedMembers::Appended a;
    a.token = std::string(line.substr(9, space - 9));
    COHORT_ASSIGN_OR_RETURN(a.node, NodeInfo::FromJson(line.substr(space + 1)));
    published.carried.appended.push_back(std::move(a));
  }
  if (published.carried.appended.size() >= static_cast<size_t>(published.layout.members)) {
    return bad();
  }
  return published;
}

}  // namespace cohort::rendezvous
