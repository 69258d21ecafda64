// The slurm backend's pure part (see slurm_backend.h, namespace slurm): what Slurm's
// commands print (scontrol records, sinfo partitions, job states and exit codes), the files
// a job leaves, and the spec checks that need no cluster. Thread-safety: pure functions.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <set>

#include "cohort/base/exit_codes.h"
#include "cohort/base/file.h"
#include "cohort/base/strings.h"
#include "cohort/base/worker_env.h"
#include "cohort/launch/slurm_backend.h"
#include "cohort/launch/spec_walker.h"

namespace cohort::launch::slurm {
namespace {

// "2+" (sinfo's "at least") and "4096" -> the number in front.
int64_t LeadingNumber(std::string_view text) {
  int64_t n = 0;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) break;
    n = n * 10 + (c - '0');
    if (n > (int64_t{1} << 40)) break;
  }
  return n;
}

}  // namespace

int CpusPerTask(const JobSpec& spec) {
  return spec.resources.cpu > 0 ? static_cast<int>(std::ceil(spec.resources.cpu - 1e-9)) : 0;
}

int64_t MemoryMib(const JobSpec& spec) {
  const int64_t mib = 1024 * 1024;
  return spec.resources.memory_bytes > 0 ? (spec.resources.memory_bytes + mib - 1) / mib : 0;
}

// "2026-11-29T14:56:12" (the controller's local time) -> unix seconds; 0 for Unknown/None.
double ParseSlurmTime(const std::string& text) {
  std::tm tm{};
  const char* end = ::strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (end == nullptr || *end != '\0') return 0;
  tm.tm_isdst = -1;
  std::time_t t = std::mktime(&tm);
  return t < 0 ? 0 : static_cast<double>(t);
}

std::string Field(const Record& r, const std::string& key) {
  auto it = r.find(key);
  return it == r.end() ? std::string() : it->second;
}

// An element (or job) from its scontrol record.
ElementRecord ElementFromRecord(const Record& r) {
  ElementRecord e;
  const std::string slurm_state = Field(r, "JobState");
  e.state = MapJobState(slurm_state);
  const std::string id = Field(r, "JobId");
  const std::string reason = Field(r, "Reason");
  const bool has_reason = !reason.empty() && reason != "None" && reason != "(null)";
  if (e.state != JobState::kPending) e.started_at = ParseSlurmTime(Field(r, "StartTime"));
  if (IsFinalState(e.state)) {
    e.ended_at = ParseSlurmTime(Field(r, "EndTime"));
    e.exit_code = ParseExitCode(Field(r, "ExitCode"));
  }
  if (e.state == JobState::kPending) {
    e.detail =
        fmt::format("Slurm job {} pending{}", id, has_reason ? fmt::format(" ({})", reason) : "");
  } else if (e.state == JobState::kRunning) {
    e.detail = fmt::format("Slurm job {} {} on {}", id, slurm_state, Field(r, "NodeList"));
  } else if (e.state == JobState::kFailed || e.state == JobState::kCancelled) {
    const std::string code = Field(r, "ExitCode");
    std::string how;
    if (auto parts = Split(code, ':', false); parts.size() == 2 && parts[1] != "0") {
      how = fmt::format(", killed by signal {}", parts[1]);
    } else if (e.exit_code && *e.exit_code != 0) {
      how = fmt::format(", exit code {}", *e.exit_code);
    }
    e.detail = fmt::format("Slurm job {} {}{}{}", id, slurm_state,
                           has_reason ? fmt::format(" ({})", reason) : "", how);
  }
  return e;
}

std::vector<Record> ParseScontrolRecords(std::string_view text) {
  std::vector<Record> records;
  for (const std::string& line : Split(text, '\n')) {
    if (Trim(line).empty()) continue;
    Record r;
    std::string last_key;
    for (const std::string& token : Split(line, ' ')) {
      size_t eq = token.find('=');
      bool is_key =
          eq != std::string::npos && eq > 0 && std::isalpha(static_cast<unsigned char>(token[0]));
      for (size_t i = 0; is_key && i < eq; ++i) {
        char c = token[i];
        is_key = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '/' || c == ':';
      }
      if (!is_key) {
        if (!last_key.empty()) r[last_key] += " " + token;  // a value with blanks
        continue;
      }
      std::string key = token.substr(0, eq);
      if (r.count(key)) {  // first occurrence wins; later ones are inside some value
        if (!last_key.empty()) r[last_key] += " " + token;
        continue;
      }
      r[key] = token.substr(eq + 1);
      last_key = key;
    }
    if (!r.empty()) records.push_back(std::move(r));
  }
  return records;
}

JobState MapJobState(std::string_view slurm_state) {
  std::string s(Trim(slurm_state));
  s = s.substr(0, s.find_first_of(" +"));
  static const std::set<std::string> kPending = {"PENDING",      "CONFIGURING", "REQUEUED",
                                                 "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD",
                                                 "SPECIAL_EXIT"};
  static const std::set<std::string> kFailed = {
      "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"};
  if (kPending.count(s)) return JobState::kPending;
  if (s == "COMPLETED") return JobState::kSucceeded;
  if (kFailed.count(s)) return JobState::kFailed;
  if (s == "CANCELLED" || s == "REVOKED") return JobState::kCancelled;
  // RUNNING, COMPLETING, SUSPENDED, STOPPED, SIGNALING, STAGE_OUT, RESIZING and anything
  // newer: not final.
  return JobState::kRunning;
}

std::optional<int> ParseExitCode(std::string_view text) {
  auto parts = Split(Trim(text), ':', false);
  if (parts.size() != 2) return std::nullopt;
  auto code = ParseInt64(parts[0]);
  auto sig = ParseInt64(parts[1]);
  if (!code || !sig || *code < 0 || *sig < 0) return std::nullopt;
  return *sig != 0 ? ExitCodeForSignal(static_cast<int>(*sig)) : static_cast<int>(*code);
}

std::vector<int> ParseTaskIds(std::string_view text) {
  std::string_view ids = Trim(text);
  ids = ids.substr(0, ids.find('%'));  // "%2": the throttle, not an index
  std::vector<int> out;
  constexpr int64_t kMaxIds = 10'000'000;
  for (const std::string& item : Split(ids, ',')) {
    auto step_parts = Split(item, ':', false);
    if (step_parts.empty() || step_parts.size() > 2) return {};
    int64_t step = 1;
    if (step_parts.size() == 2) {
      auto st = ParseInt64(step_parts[1]);
      if (!st || *st < 1) return {};
      step = *st;
    }
    auto range = Split(step_parts[0], '-', false);
    if (range.empty() || range.size() > 2) return {};
    auto lo = ParseInt64(range[0]);
    auto hi = range.size() == 2 ? ParseInt64(range[1]) : lo;
    if (!lo || !hi || *lo < 0 || *hi < *lo || (*hi - *lo) / step > kMaxIds) return {};
    for (int64_t i = *lo; i <= *hi; i += step) out.push_back(static_cast<int>(i));
  }
  return out;
}

JobStatus StatusFromRecords(const std::vector<Record>& records, int array_size) {
  JobStatus s;
  if (array_size <= 0) {
    if (records.empty()) return s;
    ElementRecord e = ElementFromRecord(records.front());
    s.state = e.state;
    s.exit_code = e.exit_code;
    s.detail = e.detail;
    return s;
  }
  s.elements.resize(static_cast<size_t>(array_size));
  for (int i = 0; i < array_size; ++i) {
    s.elements[static_cast<size_t>(i)].index = i;
    s.elements[static_cast<size_t>(i)].state = JobState::kUnknown;
  }
  for (const Record& r : records) {
    ElementRecord e = ElementFromRecord(r);
    for (int index : ParseTaskIds(Field(r, "ArrayTaskId"))) {
      if (index < 0 || index >= array_size) continue;
      ElementRecord& slot = s.elements[static_cast<size_t>(index)];
      slot = e;
      slot.index = index;
    }
  }
  AggregateElements(&s);
  return s;
}

void AggregateElements(JobStatus* status) {
  std::vector<int> failed;
  const ElementRecord* first_failed = nullptr;
  bool any_open = false, any_known = false, all_pending = true, any_cancelled = false,
       any_lost = false;
  for (const ElementRecord& e : status->elements) {
    if (e.state == JobState::kUnknown) continue;
    any_known = true;
    all_pending = all_pending && e.state == JobState::kPending;
    any_cancelled = any_cancelled || e.state == JobState::kCancelled;
    any_lost = any_lost || e.state == JobState::kLost;
    if (!IsFinalState(e.state)) any_open = true;
    if (e.state == JobState::kFailed) {
      failed.push_back(e.index);
      if (first_failed == nullptr) first_failed = &e;
    }
  }
  if (!any_known) return;
  const std::string summary = CountElementStates(status->elements);
  status->exit_code.reset();
  if (any_open) {
    status->state = all_pending ? JobState::kPending : JobState::kRunning;
    status->detail = summary;
  } else if (first_failed != nullptr) {
    status->state = JobState::kFailed;
    status->exit_code = first_failed->exit_code;
    status->detail = fmt::format("element{} {} failed; {}", failed.size() > 1 ? "s" : "",
                                 fmt::join(failed, ", "), summary);
  } else if (any_cancelled) {
    status->state = JobState::kCancelled;
    status->detail = summary;
  } else if (any_lost) {
    status->state = JobState::kLost;
    status->detail = summary;
  } else {
    status->state = JobState::kSucceeded;
    status->exit_code = 0;
    status->detail.clear();
  }
}

ElementRecord StatusFromFiles(const std::string& log_dir, const std::string& tag) {
  ElementRecord e;
  const std::string exit_path = fmt::format("{}/slurm-{}.exit", log_dir, tag);
  const std::string out_path = fmt::format("{}/slurm-{}.out", log_dir, tag);
  if (auto exit_text = ReadFileToString(exit_path); exit_text.ok()) {
    if (auto code = ParseInt64(*exit_text); code) {
      e.exit_code = static_cast<int>(*code);
      e.state = *code == 0 ? JobState::kSucceeded : JobState::kFailed;
      e.detail = *code == 0 ? ""
                            : fmt::format(
                                  "exit code {} (from {}; Slurm no longer knows "
                                  "job {})",
                                  *code, exit_path, tag);
      return e;
    }
  }
  auto out = ReadFileToString(out_path);
  if (!out.ok()) {
    e.state = JobState::kLost;
    e.detail =
        fmt::format("Slurm no longer knows job {} and it left no output at {}", tag, out_path);
    return e;
  }
  const std::string& text = *out;
  // slurmstepd's notices: "*** JOB 8 ON n1 CANCELLED AT ... ***", "... DUE TO TIME LIMIT ***".
  if (text.find("DUE TO TIME LIMIT") != std::string::npos) {
    e.state = JobState::kFailed;
    e.detail = fmt::format("Slurm job {} hit its time limit (from {})", tag, out_path);
  } else if (text.find("DUE TO NODE FAILURE") != std::string::npos) {
    e.state = JobState::kFailed;
    e.detail = fmt::format("Slurm job {} lost a node (from {})", tag, out_path);
  } else if (text.find("DUE TO PREEMPTION") != std::string::npos) {
    e.state = JobState::kFailed;
    e.detail = fmt::format("Slurm job {} was preempted (from {})", tag, out_path);
  } else if (text.find("CANCELLED AT") != std::string::npos) {
    e.state = JobState::kCancelled;
    e.detail = fmt::format("Slurm job {} was cancelled (from {})", tag, out_path);
  } else {
    e.state = JobState::kLost;
    e.detail =
        fmt::format("Slurm no longer knows job {} and {} does not say how it ended", tag, out_path);
  }
  return e;
}

std::vector<Partition> ParseSinfo(std::string_view text) {
  std::vector<Partition> out;
  for (const std::string& line : Split(text, '\n')) {
    auto cols = Split(line, ' ');
    if (cols.size() < 4) continue;
    std::string name = cols[0];
    bool is_default = EndsWith(name, "*");
    if (is_default) name.pop_back();
    auto it =
        std::find_if(out.begin(), out.end(), [&](const Partition& p) { return p.name == name; });
    if (it == out.end()) {
      out.emplace_back();
      out.back().name = name;
      it = out.end() - 1;
    }
    it->is_default = it->is_default || is_default;
    it->nodes += static_cast<int>(LeadingNumber(cols[1]));
    it->max_cpus = std::max(it->max_cpus, static_cast<int>(LeadingNumber(cols[2])));
    it->max_memory_mib = std::max(it->max_memory_mib, LeadingNumber(cols[3]));
    // Gres: "(null)", "gpu:2", "gpu:a100:4(S:0-1),mps:100".
    std::string gres = cols.size() > 4 ? cols[4] : "";
    std::string plain;
    int depth = 0;
    for (char c : gres) {
      if (c == '(') ++depth;
      if (depth == 0) plain += c;
      if (c == ')' && depth > 0) --depth;
    }
    for (const std::string& item : Split(plain, ',')) {
      auto parts = Split(item, ':', false);
      if (parts.empty() || parts[0].empty() || parts[0] == "(null)") continue;
      int n = parts.size() == 1 ? 1 : static_cast<int>(LeadingNumber(parts.back()));
      int& most = it->max_gres[parts[0]];
      most = std::max(most, n);
      if (parts[0] == "gpu") it->max_gpus = std::max(it->max_gpus, n);
    }
  }
  return out;
}

void CheckAgainstPartitions(const JobSpec& spec, const std::vector<Partition>& partitions,
                            std::vector<Problem>* problems) {
  if (partitions.empty()) {
    problems->push_back({"queue", "Slurm reports no partition this user can submit to"});
    return;
  }
  const Partition* p = nullptr;
  for (const Partition& candidate : partitions) {
    if (spec.queue.empty() ? candidate.is_default : candidate.name == spec.queue) {
      p = &candidate;
    }
  }
  std::vector<std::string> names;
  for (const Partition& candidate : partitions) names.push_back(candidate.name);
  if (p == nullptr) {
    problems->push_back(
        {"queue", spec.queue.empty() ? fmt::format("Slurm has no default partition; name one of {}",
                                                   fmt::join(names, ", "))
                                     : fmt::format("Slurm has no partition '{}' (partitions: {})",
                                                   spec.queue, fmt::join(names, ", "))});
    return;
  }
  if (spec.max_nodes > p->nodes) {
    problems->push_back(
        {"nnodes", fmt::format("'{}' asks for up to {} nodes; partition '{}' has {}",
                               spec.NnodesText(), spec.max_nodes, p->name, p->nodes)});
  }
  if (int cpus = CpusPerTask(spec); cpus > p->max_cpus) {
    problems->push_back(
        {"resources.cpu", fmt::format("{} cores per node requested; the largest node of "
                                      "partition '{}' has {}",
                                      spec.resources.cpu, p->name, p->max_cpus)});
  }
  if (int64_t mib = MemoryMib(spec); mib > p->max_memory_mib) {
    problems->push_back(
        {"resources.memory",
         fmt::format("{} per node requested; the largest node of partition '{}' has {} MiB",
                     spec.resources.memory_text.empty() ? fmt::format("{} MiB", mib)
                                                        : spec.resources.memory_text,
                     p->name, p->max_memory_mib)});
  }
  if (spec.resources.gpu > 0 && p->max_gpus == 0) {
    problems->push_back(
        {"resources.gpu", fmt::format("{} GPU(s) per node requested; no node of partition '{}' "
                                      "has GPUs (no gpu gres)",
                                      spec.resources.gpu, p->name)});
  } else if (spec.resources.gpu > p->max_gpus) {
    problems->push_back(
        {"resources.gpu", fmt::format("{} GPUs per node requested; nodes of partition '{}' "
                                      "have at most {}",
                                      spec.resources.gpu, p->name, p->max_gpus)});
  }
  for (const auto& [resource, count] : spec.resources.extended) {
    const std::string gres = GresName(resource);
    auto it = p->max_gres.find(gres);
    const int most = it == p->max_gres.end() ? 0 : it->second;
    if (count > most) {
      problems->push_back(
          {"resources.extended." + resource,
           most == 0 ? fmt::format("{} per node requested as gres '{}'; no node of partition "
                                   "'{}' has that gres (docs/slurm.md: the mapping)",
                                   count, gres, p->name)
                     : fmt::format("{} per node requested as gres '{}'; nodes of partition "
                                   "'{}' have at most {}",
                                   count, gres, p->name, most)});
    }
  }
}

std::string GresName(const std::string& extended_resource) {
  if (extended_resource == "nvidia.com/gpu") return "gpu";
  return extended_resource.substr(extended_resource.find('/') + 1);
}

void CheckSpec(const JobSpec& spec, std::vector<Problem>* problems) {
  CheckUnsupportedFields(spec, "slurm", problems);
  if (!spec.priority.empty() && !ParseInt64(spec.priority)) {
    problems->push_back(
        {"priority", fmt::format("Slurm takes a number here (its --nice: higher runs later); "
                                 "'{}' is a priority class name for kubernetes",
                                 spec.priority)});
  }
  for (const auto& [k, v] : spec.env) {
    if (!IsEnvName(k)) {
      problems->push_back(
          {"env." + k, "not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"});
    }
  }
  CheckHostPathVolumes(spec, "Slurm", problems);
  if (spec.rdzv.backend == "etcd" && spec.max_nodes > 1 && spec.rdzv.endpoint.empty()) {
    problems->push_back({"rdzv.endpoint",
                         "the etcd rendezvous needs the etcd endpoints "
                         "(host:port[,host:port])"});
  }
  if (spec.rdzv.port < 1 || spec.rdzv.port > 65535) {
    problems->push_back({"rdzv.port", fmt::format("{} is not a TCP port", spec.rdzv.port)});
  }
}

std::string OutputPath(const std::string& log_dir, const std::string& slurm_id, int element) {
  return element < 0 ? fmt::format("{}/slurm-{}.out", log_dir, slurm_id)
                     : fmt::format("{}/slurm-{}_{}.out", log_dir, slurm_id, element);
}

}  // namespace cohort::launch::slurm
