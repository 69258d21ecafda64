// Arrays over several targets: one job spec whose array elements run in different places
// (the AWS Batch use: one element per region), each target a backend plus where on it (a
// kube context and namespace, a Slurm cluster and partition, this machine) with its own
// concurrency. Elements pick their target by a column (`array.target_by: region`) or
// round-robin.
//
// Submitting such a spec records a parent job (backend "targets") and one child job per
// target that got elements, each an ordinary job of its backend; the parent's status is
// the children's, element by element, with each element's target. Element variables keep
// the array's view: COHORT_ARRAY_INDEX and COHORT_ARRAY_SIZE count the whole array, and
// COHORT_ARRAY_TARGET names the element's target.
//
// Thread-safety: pure functions; a backend is used by one thread at a time (it opens its
// own JobDb connection).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cohort/base/status.h"
#include "cohort/launch/array.h"
#include "cohort/launch/backend.h"
#include "cohort/launch/job_spec.h"

namespace cohort::launch {

inline constexpr const char* kTargetsBackend = "targets";

// One target's part of an array.
struct TargetShare {
  Target target;
  JobSpec spec;                        // as the target runs it: partition, env, concurrency
  std::vector<ArrayElement> elements;  // numbered 0..k-1, as every backend expects
  std::vector<int> indices;            // the index in the whole array of each element
};

// Assigns every element to a target; problems name the element and the value that names
// no target. Targets without elements are left out.
std::vector<TargetShare> SplitByTarget(const JobSpec& spec,
                                       const std::vector<ArrayElement>& elements,
                                       std::vector<Problem>* problems);

// The backend that runs `spec`: the targets backend when the spec names targets (each
// element goes where its target says), else `named`.
std::string BackendOfSpec(const JobSpec& spec, const std::string& named);

// Whether the nodes of `spec` on `backend` see the submitting machine's files: local and
// Slurm nodes do (Slurm: a shared file system), pods see their image's; an array over
// targets does when none of them is Kubernetes ("" is the local default).
bool SharesSubmitHostFiles(const JobSpec& spec, const std::string& backend);

// `base` with what `target` says about where its backend runs (context, cluster, flavor).
BackendOptions TargetOptions(const BackendOptions& base, const Target& target);

// A child job's JobRecord::target (JSON: the target and the array indices of its elements).
std::string TargetRecord(const Target& target, const std::vector<int>& indices);
struct TargetRecordValue {
  Target target;
  std::vector<int> indices;
};
Result<TargetRecordValue> ParseTargetRecord(const std::string& text);

// The backend of the parent job: validates, renders and submits every share through its
// target's backend, and reads status, logs and cancels through the children.
std::unique_ptr<Backend> MakeTargetsBackend(const BackendOptions& options);

}  // namespace cohort::launch
