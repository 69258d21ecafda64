// KubernetesStatusFromJson (see kubernetes_backend.h): the state of a job and of each array
// element from what `kubectl get -o json` prints of its objects and pods. Thread-safety:
// pure functions.
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cohort/base/strings.h"
#include "cohort/launch/kubernetes_backend.h"

namespace cohort::launch {
namespace {

using Json = nlohmann::ordered_json;

// "0-2,5" -> {0, 1, 2, 5}
std::set<int> ParseIndexes(const std::string& text) {
  std::set<int> out;
  for (const auto& part : Split(text, ',')) {
    auto range = Split(part, '-');
    auto lo = range.empty() ? std::nullopt : ParseInt64(range[0]);
    auto hi = range.size() == 2 ? ParseInt64(range[1]) : lo;
    if (!lo || !hi) continue;
    for (int64_t i = *lo; i <= *hi && i < *lo + 10000000; ++i) out.insert(static_cast<int>(i));
  }
  return out;
}

// The value at `path` (object keys), or nullptr when a step is missing or not an object.
const Json* At(const Json& j, std::initializer_list<const char*> path) {
  const Json* cur = &j;
  for (const char* key : path) {
    if (!cur->is_object()) return nullptr;
    auto it = cur->find(key);
    if (it == cur->end()) return nullptr;
    cur = &*it;
  }
  return cur;
}

std::string Str(const Json& j, std::initializer_list<const char*> path) {
  const Json* v = At(j, path);
  return v && v->is_string() ? v->get<std::string>() : std::string();
}

int64_t Int(const Json& j, std::initializer_list<const char*> path) {
  const Json* v = At(j, path);
  return v && v->is_number_integer() ? v->get<int64_t>() : 0;
}

// The elements of the array at `path` (empty when there is none).
std::vector<const Json*> List(const Json& j, std::initializer_list<const char*> path) {
  std::vector<const Json*> out;
  const Json* v = At(j, path);
  if (v && v->is_array()) {
    for (const Json& e : *v) out.push_back(&e);
  }
  return out;
}

struct ObjectState {
  JobState state = JobState::kPending;
  std::string detail;
};

// The last condition of `type` whose status is "True", or nullptr.
const Json* TrueCondition(const Json& object, const char* type) {
  const Json* found = nullptr;
  for (const Json* c : List(object, {"status", "conditions"})) {
    if (Str(*c, {"type"}) == type && Str(*c, {"status"}) == "True") found = c;
  }
  return found;
}

std::string ConditionDetail(const Json& c) {
  std::string reason = Str(c, {"reason"}), message = Str(c, {"message"});
  if (reason.empty()) return message;
  return message.empty() ? reason : reason + ": " + message;
}

// Kubeflow conditions: Created, Running, Restarting, Succeeded, Failed, Suspended.
ObjectState PyTorchJobState(const Json& object) {
  constexpr std::pair<const char*, JobState> kConditions[] = {
      {"Succeeded", JobState::kSucceeded}, {"Failed", JobState::kFailed},
      {"Restarting", JobState::kRunning},  {"Running", JobState::kRunning},
      {"Suspended", JobState::kPending}};
  for (const auto& [type, state] : kConditions) {
    if (const Json* c = TrueCondition(object, type)) return {state, ConditionDetail(*c)};
  }
  return {JobState::kPending, "created, waiting for its pods"};
}

// Volcano phases: Pending, Running, Restarting, Completing, Completed, Aborting, Aborted,
// Terminating, Terminated, Failed.
ObjectState VolcanoJobState(const Json& object) {
  const std::string phase = Str(object, {"status", "state", "phase"});
  std::string detail = Str(object, {"status", "state", "message"});
  if (detail.empty()) detail = Str(object, {"status", "state", "reason"});
  if (phase == "Completed") return {JobState::kSucceeded, detail};
  if (phase == "Failed" || phase == "Terminated" || phase == "Aborted") {
    return {JobState::kFailed, detail.empty() ? "volcano job " + phase : detail};
  }
  if (phase == "Running" || phase == "Restarting" || phase == "Completing" ||
      phase == "Terminating" || phase == "Aborting") {
    return {JobState::kRunning, phase == "Running" ? detail : phase};
  }
  return {JobState::kPending, phase.empty() ? "created, waiting for the scheduler" : phase};
}

// batch/v1 conditions: Complete, Failed (and SuccessCriteriaMet, FailureTarget before them).
ObjectState BatchJobState(const Json& object) {
  for (const char* t : {"Complete", "SuccessCriteriaMet"}) {
    if (const Json* c = TrueCondition(object, t)) {
      return {JobState::kSucceeded, ConditionDetail(*c)};
    }
  }
  for (const char* t : {"Failed", "FailureTarget"}) {
    if (const Json* c = TrueCondition(object, t)) return {JobState::kFailed, ConditionDetail(*c)};
  }
  if (const Json* c = TrueCondition(object, "Suspended")) {
    return {JobState::kPending, ConditionDetail(*c)};
  }
  if (Int(object, {"status", "active"}) > 0 || Int(object, {"status", "succeeded"}) > 0 ||
      Int(object, {"status", "failed"}) > 0) {
    return {JobState::kRunning, ""};
  }
  return {JobState::kPending, "created, waiting for its pods"};
}

ObjectState StateOf(const std::string& resource, const Json& object) {
  if (resource == kPyTorchResource) return PyTorchJobState(object);
  if (resource == kVolcanoResource) return VolcanoJobState(object);
  return BatchJobState(object);
}

// The element a pod belongs to: its Indexed Job completion index, or our array label.
std::string PodIndex(const Json& pod) {
  std::string a = Str(pod, {"metadata", "annotations", "batch.kubernetes.io/job-completion-index"});
  if (!a.empty()) return a;
  return Str(pod, {"metadata", "labels", "cohort.dev/array-index"});
}

// Exit code of the first worker container that ended non-zero among the pods of `index`
// (-1: every pod).
std::optional<int> FailedExitCode(const Json& pods, int index) {
  for (const Json* pod : List(pods, {"items"})) {
    if (index >= 0 && PodIndex(*pod) != std::to_string(index)) continue;
    for (const Json* cs : List(*pod, {"status", "containerStatuses"})) {
      for (const char* which : {"state", "lastState"}) {
        const Json* code = At(*cs, {which, "terminated", "exitCode"});
        if (code && code->is_number_integer() && code->get<int>() != 0) return code->get<int>();
      }
    }
  }
  return std::nullopt;
}

Result<Json> ParseList(const std::string& text, const char* what) {
  if (Trim(text).empty()) return Json{{"items", Json::array()}};
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Internal("kubectl printed {} that is not JSON: {}", what, text.substr(0, 200));
  }
  return j;
}

}  // namespace

Result<JobStatus> KubernetesStatusFromJson(const std::string& resource,
                                           const std::string& objects_json,
                                           const std::string& pods_json, int array_size) {
  COHORT_ASSIGN_OR_RETURN(Json objects, ParseList(objects_json, "the job objects"));
  COHORT_ASSIGN_OR_RETURN(Json pods, ParseList(pods_json, "the pods"));
  const std::vector<const Json*> items = List(objects, {"items"});
  if (items.empty()) {
    return NotFound(
        "no {} of this job is in the cluster (deleted, or applied in another "
        "namespace or cluster?)",
        resource);
  }
  JobStatus status;

  // One object for the whole job: a plain job, or a single-node array (one Indexed Job).
  if (items.size() == 1 &&
      Str(*items[0], {"metadata", "labels", "cohort.dev/array-index"}).empty()) {
    const Json& object = *items[0];
    ObjectState s = StateOf(resource, object);
    status.state = s.state;
    status.detail = s.detail;
    if (s.state == JobState::kSucceeded) status.exit_code = 0;
    if (s.state == JobState::kFailed) status.exit_code = FailedExitCode(pods, -1);
    if (array_size <= 0) return status;
    const std::set<int> done = ParseIndexes(Str(object, {"status", "completedIndexes"}));
    const std::set<int> failed = ParseIndexes(Str(object, {"status", "failedIndexes"}));
    std::set<int> running;
    for (const Json* pod : List(pods, {"items"})) {
      auto index = ParseInt64(PodIndex(*pod));
      if (index && Str(*pod, {"status", "phase"}) == "Running") {
        running.insert(static_cast<int>(*index));
      }
    }
    for (int i = 0; i < array_size; ++i) {
      ElementRecord e;
      e.index = i;
      if (done.count(i)) {
        e.state = JobState::kSucceeded;
        e.exit_code = 0;
      } else if (failed.count(i)) {
        e.state = JobState::kFailed;
        e.exit_code = FailedExitCode(pods, i);
      } else if (s.state == JobState::kFailed || s.state == JobState::kSucceeded) {
        e.state = JobState::kCancelled;
        e.detail = "the job ended before this element finished";
      } else {
        e.state = running.count(i) ? JobState::kRunning : JobState::kPending;
      }
      status.elements.push_back(e);
    }
    return status;
  }

  // One object per element (multi-node arrays).
  std::map<int, ObjectState> states;
  for (const Json* object : items) {
    auto index = ParseInt64(Str(*object, {"metadata", "labels", "cohort.dev/array-index"}));
    if (index) states[static_cast<int>(*index)] = StateOf(resource, *object);
  }
  const int n = std::max(array_size, states.empty() ? 0 : states.rbegin()->first + 1);
  int failed = 0;
  for (int i = 0; i < n; ++i) {
    ElementRecord e;
    e.index = i;
    auto it = states.find(i);
    if (it == states.end()) {  // deleted: `cohort cancel --element`, or by hand
      e.state = JobState::kCancelled;
      e.detail = "its object is no longer in the cluster (deleted)";
    } else {
      e.state = it->second.state;
      e.detail = it->second.detail;
    }
    if (e.state == JobState::kSucceeded) e.exit_code = 0;
    if (e.state == JobState::kFailed) {
      e.exit_code = FailedExitCode(pods, i);
      ++failed;
    }
    status.elements.push_back(e);
  }
  status.state = AggregateElementStates(status.elements);
  if (failed > 0) status.detail = fmt::format("{} of {} elements failed", failed, n);
  if (status.state == JobState::kSucceeded) status.exit_code = 0;
  return status;
}

}  // namespace cohort::launch
