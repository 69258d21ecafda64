// Arrays over several targets (see targets.h). Thread-safety: as documented there.
#include "cohort/launch/targets.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <set>

#include "cohort/base/strings.h"
#include "cohort/launch/job_db.h"
#include "cohort/launch/job_env.h"
#include "cohort/launch/local_backend.h"
#include "cohort/launch/submit.h"

namespace cohort::launch {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxElementProblems = 5;

std::string TargetNames(const std::vector<Target>& targets) {
  std::string out;
  for (const Target& t : targets) out += (out.empty() ? "" : ", ") + t.name;
  return out;
}

// The job as `target` runs it: its partition, its variables, its concurrency, no targets.
// On Kubernetes its objects are named <job>-<target>, so that targets sharing a cluster and
// namespace do not collide.
JobSpec SpecForTarget(const JobSpec& spec, const Target& target) {
  std::vector<Problem> ignored;  // SplitByTarget's caller validated every backend's spec
  JobSpec out = SpecForBackend(spec, target.backend, &ignored);
  if (target.backend == "kubernetes") out.name = spec.name + "-" + target.name;
  out.targets.clear();
  out.array.target_by.clear();
  if (target.concurrency > 0) out.array.concurrency = target.concurrency;
  if (!target.partition.empty()) out.queue = target.partition;
  for (const auto& [k, v] : target.env) out.env[k] = v;
  return out;
}

// "east (local)", "eu (kubernetes, context eu-1)".
std::string Describe(const Target& t) {
  std::string where = t.backend;
  if (!t.context.empty()) where += ", context " + t.context;
  if (!t.kube_namespace.empty()) where += ", namespace " + t.kube_namespace;
  if (!t.cluster.empty()) where += ", cluster " + t.cluster;
  if (!t.partition.empty()) where += ", partition " + t.partition;
  return fmt::format("{} ({})", t.name, where);
}

class TargetsBackend final : public Backend {
 public:
  explicit TargetsBackend(BackendOptions options) : options_(std::move(options)) {}

  std::string name() const override { return kTargetsBackend; }

  void Validate(const JobSpec& spec, const std::vector<ArrayElement>& elements,
                std::vector<Problem>* problems) override {
    for (TargetShare& share : SplitByTarget(spec, elements, problems)) {
      auto backend = MakeBackend(share.target.backend, TargetOptions(options_, share.target));
      if (!backend.ok()) {
        problems->push_back({"targets: " + share.target.name, backend.status().message()});
        continue;
      }
      std::vector<Problem> own;
      (*backend)->Validate(share.spec, share.elements, &own);
      for (Problem& p : own) {
        p.where = fmt::format("target {}{}{}", share.target.name, p.where.empty() ? "" : ": ",
                              p.where);
        problems->push_back(std::move(p));
      }
      backends_[share.target.name] = std::move(*backend);  // Render uses what Validate saw
    }
  }

  Result<std::string> Render(const JobSpec& spec,
                             const std::vector<ArrayElement>& elements) override {
    std::vector<Problem> problems;
    auto shares = SplitByTarget(spec, elements, &problems);
    if (!problems.empty()) return InvalidArgument("{}", FormatProblems(problems));
    std::string out;
    for (const TargetShare& share : shares) {
      COHORT_ASSIGN_OR_RETURN(Backend * backend, BackendOf(share.target));
      COHORT_ASSIGN_OR_RETURN(std::string text, backend->Render(share.spec, share.elements));
      out += fmt::format("# ---- target {}: {} element(s), array indices {}{}\n",
                         Describe(share.target), share.indices.size(),
                         fmt::join(share.indices, ","),
                         share.spec.array.concurrency > 0
                             ? fmt::format(", at most {} at once", share.spec.array.concurrency)
                             : "");
      out += text;
      if (!out.empty() && out.back() != '\n') out += '\n';
    }
    return out;
  }

  // One child job per share, submitted in target order. A target that refuses its share
  // leaves a failed child (the others still run); only when none accepted is it an error.
  Result<std::string> Submit(const JobRecord& job, const JobSpec& spec,
                             const std::vector<ArrayElement>& elements) override {
    std::vector<Problem> problems;
    auto shares = SplitByTarget(spec, elements, &problems);
    if (!problems.empty()) return InvalidArgument("{}", FormatProblems(problems));
    COHORT_ASSIGN_OR_RETURN(JobDb * db, Db());
    std::vector<std::string> children, refusals;  // "job 12 (east)", reasons
    for (const TargetShare& share : shares) {
      COHORT_ASSIGN_OR_RETURN(Backend * backend, BackendOf(share.target));
      ChildOf parent{job.id, TargetRecord(share.target, share.indices)};
      auto child = SubmitJob(*db, *backend, share.spec, share.elements, options_.home, &parent);
      if (child.ok()) {
        children.push_back(fmt::format("job {} ({})", child->id, share.target.name));
      } else {
        refusals.push_back(child.status().message());
      }
    }
    if (children.empty()) {
      return FailedPrecondition("no target accepted its elements: {}", fmt::join(refusals, "; "));
    }
    return fmt::format("{}", fmt::join(children, ", "));
  }

  Result<JobStatus> Poll(const JobRecord& job) override {
    COHORT_ASSIGN_OR_RETURN(JobDb * db, Db());
    COHORT_ASSIGN_OR_RETURN(std::vector<JobRecord> children, db->Children(job.id));
    JobStatus s;
    s.elements.resize(static_cast<size_t>(job.array_size));
    for (int i = 0; i < job.array_size; ++i) {
      s.elements[static_cast<size_t>(i)].index = i;
      s.elements[static_cast<size_t>(i)].detail = "no target took this element";
      s.elements[static_cast<size_t>(i)].state = JobState::kFailed;
    }
    int active = 0, pending = 0, succeeded = 0, cancelled = 0, failed = 0;
    std::optional<int> exit_code;
    std::vector<std::string> details;
    for (JobRecord& child : children) {
      COHORT_ASSIGN_OR_RETURN(TargetRecordValue where, ParseTargetRecord(child.target));
      JobStatus cs;
      auto backend = MakeBackendForJob(child, options_);
      auto polled = backend.ok() ? RefreshJob(*db, **backend, child)
                                 : Result<JobStatus>(backend.status());
      if (polled.ok()) {
        cs = *polled;
      } else {  // keep what was recorded; say why it is not fresh
        cs.state = child.state;
        cs.exit_code = child.exit_code;
        cs.detail = fmt::format("cannot read its state now: {}", polled.status().message());
        auto recorded = db->Elements(child.id);
        if (recorded.ok()) cs.elements = *recorded;
      }
      for (const ElementRecord& e : cs.elements) {
        if (e.index < 0 || e.index >= static_cast<int>(where.indices.size())) continue;
        const int global = where.indices[static_cast<size_t>(e.index)];
        if (global < 0 || global >= job.array_size) continue;
        ElementRecord& out = s.elements[static_cast<size_t>(global)];
        out = e;
        out.index = global;
        out.target = where.target.name;
      }
      if (cs.state == JobState::kSucceeded) {
        ++succeeded;
      } else if (cs.state == JobState::kCancelled) {
        ++cancelled;
      } else if (IsFinalState(cs.state)) {
        ++failed;
        if (!exit_code) exit_code = cs.exit_code;
      } else if (cs.state == JobState::kPending) {
        ++pending;
      } else {
        ++active;
      }
      if (!cs.detail.empty() && cs.state != JobState::kSucceeded) {
        details.push_back(fmt::format("target {} (job {}): {}", where.target.name, child.id,
                                      cs.detail));
      }
    }
    const int total = static_cast<int>(children.size());
    if (total == 0) {
      s.state = job.state;  // not submitted yet, or refused (the record says why)
      s.detail = job.detail;
      return s;
    }
    if (active > 0 || (pending > 0 && pending < total)) {
      s.state = JobState::kRunning;
    } else if (pending == total) {
      s.state = JobState::kPending;
    } else if (succeeded == total) {
      s.state = JobState::kSucceeded;
      s.exit_code = 0;
    } else if (failed > 0) {
      s.state = JobState::kFailed;
      s.exit_code = exit_code;
    } else {
      s.state = JobState::kCancelled;
    }
    s.detail = fmt::format("{}", fmt::join(details, "; "));
    return s;
  }

  Status Cancel(const JobRecord& job) override {
    COHORT_ASSIGN_OR_RETURN(JobDb * db, Db());
    COHORT_ASSIGN_OR_RETURN(std::vector<JobRecord> children, db->Children(job.id));
    std::vector<std::string> errors;
    for (JobRecord& child : children) {
      auto backend = MakeBackendForJob(child, options_);
      if (!backend.ok()) {
        errors.push_back(backend.status().message());
        continue;
      }
      auto now = RefreshJob(*db, **backend, child);
      if (now.ok() && IsFinalState(now->state)) continue;
      if (Status st = (*backend)->Cancel(child); !st.ok()) {
        errors.push_back(fmt::format("job {}: {}", child.id, st.message()));
      }
    }
    if (!errors.empty()) return Unavailable("{}", fmt::join(errors, "; "));
    return Status::Ok();
  }

  // The element's child job, asked to stop its element there.
  Status CancelElement(const JobRecord& job, int element) override {
    COHORT_ASSIGN_OR_RETURN(ElementPlace place, PlaceOf(job, element));
    if (NeverSubmitted(place.child)) {
      return FailedPrecondition("element {} was never submitted to target {} ({})", element,
                                place.target, place.child.detail);
    }
    COHORT_ASSIGN_OR_RETURN(JobDb * db, Db());
    COHORT_ASSIGN_OR_RETURN(auto backend, MakeBackendForJob(place.child, options_));
    (void)RefreshJob(*db, *backend, place.child);
    return backend->CancelElement(place.child, place.index);
  }

  Result<std::string> LogPath(const JobRecord& job, int element, int rank) override {
    if (element < 0 || element >= job.array_size) {
      return InvalidArgument("job {} is an array of {} elements over targets: choose one with "
                             "--element 0..{}",
                             job.id, job.array_size, job.array_size - 1);
    }
    COHORT_ASSIGN_OR_RETURN(ElementPlace place, PlaceOf(job, element));
    if (NeverSubmitted(place.child)) {
      return NotFound("element {} of job {} has no logs: it was never submitted to target {} "
                      "({})",
                      element, job.id, place.target, place.child.detail);
    }
    COHORT_ASSIGN_OR_RETURN(auto backend, MakeBackendForJob(place.child, options_));
    return backend->LogPath(place.child, place.index, rank);
  }

 private:
  // Where element `element` of the parent job runs: its target's child job and its index
  // there.
  struct ElementPlace {
    JobRecord child;
    std::string target;
    int index = 0;
  };
  Result<ElementPlace> PlaceOf(const JobRecord& job, int element) {
    COHORT_ASSIGN_OR_RETURN(JobDb * db, Db());
    COHORT_ASSIGN_OR_RETURN(std::vector<JobRecord> children, db->Children(job.id));
    for (JobRecord& child : children) {
      COHORT_ASSIGN_OR_RETURN(TargetRecordValue where, ParseTargetRecord(child.target));
      for (size_t i = 0; i < where.indices.size(); ++i) {
        if (where.indices[i] == element) {
          return ElementPlace{std::move(child), where.target.name, static_cast<int>(i)};
        }
      }
    }
    return NotFound("element {} of job {} was not submitted to any target (see `cohort status "
                    "{}`)",
                    element, job.id, job.id);
  }

  Result<JobDb*> Db() {
    if (!db_) {
      COHORT_ASSIGN_OR_RETURN(db_, JobDb::Open(JobDbPath(options_.home)));
    }
    return db_.get();
  }

  Result<Backend*> BackendOf(const Target& target) {
    auto it = backends_.find(target.name);
    if (it == backends_.end()) {
      COHORT_ASSIGN_OR_RETURN(auto made, MakeBackend(target.backend, TargetOptions(options_, target)));
      it = backends_.emplace(target.name, std::move(made)).first;
    }
    return it->second.get();
  }

  BackendOptions options_;
  std::unique_ptr<JobDb> db_;
  std::map<std::string, std::unique_ptr<Backend>> backends_;  // by target name
};

}  // namespace

std::vector<TargetShare> SplitByTarget(const JobSpec& spec,
                                       const std::vector<ArrayElement>& elements,
                                       std::vector<Problem>* problems) {
  std::vector<TargetShare> shares(spec.targets.size());
  std::map<std::string, size_t> by_name;
  for (size_t t = 0; t < spec.targets.size(); ++t) {
    shares[t].target = spec.targets[t];
    shares[t].spec = SpecForTarget(spec, spec.targets[t]);
    by_name[spec.targets[t].name] = t;
  }
  if (spec.targets.empty()) {
    problems->push_back({"targets", "the spec names no targets"});
    return {};
  }
  const std::string& column = spec.array.target_by;
  const bool round_robin = column.empty() || column == "round-robin";
  if (!round_robin && !elements.empty() && elements[0].env.count(column) == 0) {
    std::vector<std::string> columns;
    for (const auto& [k, v] : elements[0].env) {
      if (!StartsWith(k, kEnvArrayPrefix)) columns.push_back(k);
    }
    problems->push_back(
        {"array.target_by",
         fmt::format("'{}' is not a column of the elements (columns: {}); name the column whose "
                     "values are target names, or round-robin",
                     column, fmt::join(columns, ", "))});
    return {};
  }
  size_t bad = 0;
  for (size_t i = 0; i < elements.size(); ++i) {
    size_t t = i % spec.targets.size();
    if (!round_robin) {
      const std::string& value = elements[i].env.at(column);
      auto it = by_name.find(value);
      if (it == by_name.end()) {
        if (++bad <= kMaxElementProblems) {
          problems->push_back(
              {fmt::format("array element {}", elements[i].index),
               fmt::format("{} '{}' names no target (targets: {})", column, value,
                           TargetNames(spec.targets))});
        }
        continue;
      }
      t = it->second;
    }
    ArrayElement e = elements[i];
    e.index = static_cast<int>(shares[t].elements.size());
    e.env[kEnvArrayTarget] = spec.targets[t].name;
    shares[t].elements.push_back(std::move(e));
    shares[t].indices.push_back(elements[i].index);
  }
  if (bad > kMaxElementProblems) {
    problems->push_back({"array", fmt::format("{} more elements name no target",
                                              bad - kMaxElementProblems)});
  }
  std::erase_if(shares, [](const TargetShare& s) { return s.elements.empty(); });
  return shares;
}

std::string BackendOfSpec(const JobSpec& spec, const std::string& named) {
  return spec.targets.empty() ? named : kTargetsBackend;
}

bool SharesSubmitHostFiles(const JobSpec& spec, const std::string& backend) {
  if (backend == kTargetsBackend) {
    return std::none_of(spec.targets.begin(), spec.targets.end(), [](const Target& t) {
      return t.backend == "kubernetes" || t.backend == "k8s";
    });
  }
  return backend.empty() || backend == "local" || backend == "slurm";
}

BackendOptions TargetOptions(const BackendOptions& base, const Target& target) {
  BackendOptions o = base;
  o.kube_context = target.context;
  o.kube_namespace = target.kube_namespace;
  if (!target.flavor.empty()) o.kube_flavor = target.flavor;
  o.slurm_cluster = target.cluster;
  if (target.backend == "kubernetes") o.cohort_bin = base.cohort_in_image;
  return o;
}

std::string TargetRecord(const Target& t, const std::vector<int>& indices) {
  json j = {{"name", t.name},         {"backend", t.backend},
            {"context", t.context},   {"namespace", t.kube_namespace},
            {"flavor", t.flavor},     {"cluster", t.cluster},
            {"partition", t.partition}, {"indices", indices}};
  return j.dump();
}

Result<TargetRecordValue> ParseTargetRecord(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return DataLoss("a child job's target record is damaged: {}", text);
  TargetRecordValue v;
  v.target.name = j.value("name", "");
  v.target.backend = j.value("backend", "");
  v.target.context = j.value("context", "");
  v.target.kube_namespace = j.value("namespace", "");
  v.target.flavor = j.value("flavor", "");
  v.target.cluster = j.value("cluster", "");
  v.target.partition = j.value("partition", "");
  if (j.contains("indices") && j["indices"].is_array()) {
    for (const auto& i : j["indices"]) {
      if (i.is_number_integer()) v.indices.push_back(i.get<int>());
    }
  }
  return v;
}

std::unique_ptr<Backend> MakeTargetsBackend(const BackendOptions& options) {
  return std::make_unique<TargetsBackend>(options);
}

}  // namespace cohort::launch
