// The job's directory of monitoring endpoints (see job_directory.h).
// Thread-safety: as documented in the header.
#include "cohort/agent/job_directory.h"

#include <fmt/format.h>

#include <algorithm>

#include "cohort/base/json_bounded.h"

namespace cohort::agent {
namespace {

std::string Key(const std::string& run_id, std::string_view what) {
  return fmt::format("metrics/{}/{}", run_id, what);
}

std::optional<nlohmann::json> ParseObject(const std::optional<std::string>& text) {
  if (!text) return std::nullopt;
  // Another agent's record: bounded like every answer from another node.
  nlohmann::json j = ParseJsonBounded(*text, 1u << 20);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  return j;
}

}  // namespace

Result<int> PublishEndpoint(store::Store& store, const std::string& run_id,
                            const nlohmann::json& record, Deadline deadline) {
  if (!record.is_object() || !record.contains("url")) {
    return InvalidArgument("an endpoint record needs a url: {}", record.dump());
  }
  COHORT_ASSIGN_OR_RETURN(int64_t index, store.TakeTicket(Key(run_id, "node"), deadline));
  COHORT_RETURN_IF_ERROR(
      store.Set(Key(run_id, fmt::format("node{}", index)), record.dump(), deadline));
  return static_cast<int>(index);
}

Status PublishEnd(store::Store& store, const std::string& run_id, int index,
                  const nlohmann::json& end, Deadline deadline) {
  return store.Set(Key(run_id, fmt::format("node{}/end", index)), end.dump(), deadline);
}

Result<std::vector<DirectoryEntry>> ReadDirectory(store::Store& store, const std::string& run_id,
                                                  Deadline deadline, int max_entries) {
  COHORT_ASSIGN_OR_RETURN(int64_t count, store.CountTickets(Key(run_id, "node"), deadline));
  const int64_t first = std::max<int64_t>(1, count - max_entries + 1);
  std::vector<std::string> keys;
  for (int64_t i = first; i <= count; ++i) {
    keys.push_back(Key(run_id, fmt::format("node{}", i)));
    keys.push_back(Key(run_id, fmt::format("node{}/end", i)));
  }
  std::vector<DirectoryEntry> out;
  if (keys.empty()) return out;
  COHORT_ASSIGN_OR_RETURN(auto values, store.Peek(keys, deadline));
  for (int64_t i = first; i <= count; ++i) {
    const size_t at = static_cast<size_t>(2 * (i - first));
    std::optional<nlohmann::json> record = ParseObject(values[at]);
    if (!record || !record->contains("url")) continue;
    out.push_back({static_cast<int>(i), std::move(*record), ParseObject(values[at + 1])});
  }
  return out;
}

std::function<Result<std::vector<DirectoryEntry>>()> DirectoryReader(
    StoreConnector connect, std::string run_id, Duration timeout,
    std::shared_ptr<store::Store> first) {
  return [connect = std::move(connect), run_id = std::move(run_id), timeout,
          store = std::move(first)]() mutable
         -> Result<std::vector<DirectoryEntry>> {
    const Deadline deadline = Deadline::After(timeout);
    if (!store) {
      COHORT_ASSIGN_OR_RETURN(store, connect(deadline));
    }
    auto entries = ReadDirectory(*store, run_id, deadline);
    if (!entries.ok()) store.reset();
    return entries;
  };
}

}  // namespace cohort::agent
