// Tests of the kubernetes backend's view of running jobs without a cluster: the status
// mapping of captured `kubectl get -o json` output (PyTorchJob conditions, Volcano phases,
// Indexed Job arrays, one object per element), and Submit/Poll/Cancel/CancelElement/LogPath
// through a stand-in kubectl, through a missing one and through the real one with no
// cluster; a target's context and namespace reach every kubectl call.
#include "cohort/launch/kubernetes_backend.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <map>

#include "cohort/base/strings.h"
#include "cohort/base/subprocess.h"
#include "cohort/base/temp_dir.h"
#include "cohort/launch/kubernetes_test_util.h"

namespace cohort::launch::kubernetes_test {
namespace {

// ---------------------------------------------------------------------------------------
// Status from `kubectl get -o json`

std::string List(const std::vector<std::string>& items) {
  std::string s = "{\"apiVersion\": \"v1\", \"kind\": \"List\", \"items\": [";
  for (size_t i = 0; i < items.size(); ++i) s += (i ? "," : "") + items[i];
  return s + "]}";
}

TEST(KubernetesStatusTest, PyTorchJobConditions) {
  auto obj = [](const std::string& conditions) {
    return List({R"({"metadata": {"name": "fmnist", "labels": {"cohort.dev/job": "fmnist"}},
                    "status": {"conditions": [)" +
                 conditions + "]}}"});
  };
  const std::string created = R"({"type": "Created", "status": "True"})";
  const std::string running = R"({"type": "Running", "status": "True"})";
  const std::string done = R"({"type": "Running", "status": "False"},
      {"type": "Succeeded", "status": "True", "reason": "PyTorchJobSucceeded",
       "message": "PyTorchJob fmnist successfully completed."})";
  const std::string failed = R"({"type": "Failed", "status": "True", "reason": "PyTorchJobFailed",
       "message": "PyTorchJob fmnist is failed because 1 Worker replica(s) failed."})";
  auto st = KubernetesStatusFromJson("pytorchjobs.kubeflow.org", obj(created), "", 0);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->state, JobState::kPending);
  EXPECT_EQ(
      KubernetesStatusFromJson("pytorchjobs.kubeflow.org", obj(created + "," + running), "", 0)
          ->state,
      JobState::kRunning);
  st = KubernetesStatusFromJson("pytorchjobs.kubeflow.org", obj(created + "," + done), "", 0);
  EXPECT_EQ(st->state, JobState::kSucceeded);
  EXPECT_EQ(st->exit_code, 0);
  const std::string pods = List({R"({"metadata": {"name": "fmnist-worker-1"},
      "status": {"phase": "Failed", "containerStatuses": [{"name": "pytorch",
        "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}})"});
  st = KubernetesStatusFromJson("pytorchjobs.kubeflow.org", obj(created + "," + failed), pods, 0);
  EXPECT_EQ(st->state, JobState::kFailed);
  EXPECT_EQ(st->exit_code, 1);
  EXPECT_TRUE(Contains(st->detail, "1 Worker replica(s) failed")) << st->detail;
}

TEST(KubernetesStatusTest, VolcanoPhases) {
  auto obj = [](const std::string& phase) {
    return List({R"({"metadata": {"name": "fmnist"}, "status": {"state": {"phase": ")" + phase +
                 R"("}}})"});
  };
  const std::map<std::string, JobState> expected = {
      {"Pending", JobState::kPending},     {"Running", JobState::kRunning},
      {"Restarting", JobState::kRunning},  {"Completed", JobState::kSucceeded},
      {"Failed", JobState::kFailed},       {"Terminated", JobState::kFailed},
      {"Aborted", JobState::kFailed},      {"Completing", JobState::kRunning}};
  for (const auto& [phase, state] : expected) {
    auto st = KubernetesStatusFromJson("jobs.batch.volcano.sh", obj(phase), "", 0);
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->state, state) << phase;
  }
}

TEST(KubernetesStatusTest, IndexedArrayElements) {
  const std::string job = List({R"({"metadata": {"name": "sweep"},
      "status": {"active": 1, "completedIndexes": "0-1,3", "failedIndexes": "2"}})"});
  const std::string pods = List({
      R"({"metadata": {"annotations": {"batch.kubernetes.io/job-completion-index": "2"}},
          "status": {"phase": "Failed", "containerStatuses": [{"name": "worker",
            "state": {"terminated": {"exitCode": 3}}}]}})",
      R"({"metadata": {"annotations": {"batch.kubernetes.io/job-completion-index": "4"}},
          "status": {"phase": "Running"}})"});
  auto st = KubernetesStatusFromJson("jobs.batch", job, pods, 6);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->state, JobState::kRunning);
  ASSERT_EQ(st->elements.size(), 6u);
  const std::vector<JobState> states = {JobState::kSucceeded, JobState::kSucceeded,
                                        JobState::kFailed,    JobState::kSucceeded,
                                        JobState::kRunning,   JobState::kPending};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(st->elements[i].state, states[i]) << i;
  EXPECT_EQ(st->elements[2].exit_code, 3);
  // The Job ends Failed: what never finished is reported as cancelled.
  const std::string failed = List({R"({"metadata": {"name": "sweep"},
      "status": {"completedIndexes": "0-1,3", "failedIndexes": "2",
        "conditions": [{"type": "Failed", "status": "True", "reason": "FailedIndexes",
                        "message": "Job has failed indexes"}]}})"});
  st = KubernetesStatusFromJson("jobs.batch", failed, pods, 6);
  EXPECT_EQ(st->state, JobState::kFailed);
  EXPECT_EQ(st->elements[5].state, JobState::kCancelled);
  EXPECT_TRUE(Contains(st->detail, "FailedIndexes"));
}

TEST(KubernetesStatusTest, OneObjectPerElement) {
  auto element = [](int i, const std::string& conditions) {
    return fmt::format(R"({{"metadata": {{"name": "msweep-{0}",
        "labels": {{"cohort.dev/job": "msweep", "cohort.dev/array-index": "{0}"}}}},
        "status": {{"conditions": [{1}]}}}})",
                       i, conditions);
  };
  const std::string ok = R"({"type": "Complete", "status": "True"})";
  const std::string bad =
      R"({"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"})";
  auto st = KubernetesStatusFromJson("jobs.batch", List({element(0, ok), element(1, "")}), "", 2);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->state, JobState::kRunning);
  EXPECT_EQ(st->elements[0].state, JobState::kSucceeded);
  EXPECT_EQ(st->elements[1].state, JobState::kPending);
  st = KubernetesStatusFromJson("jobs.batch", List({element(0, ok), element(1, bad)}), "", 2);
  EXPECT_EQ(st->state, JobState::kFailed);
  EXPECT_EQ(st->detail, "1 of 2 elements failed");
  st = KubernetesStatusFromJson("jobs.batch", List({element(0, ok), element(1, ok)}), "", 2);
  EXPECT_EQ(st->state, JobState::kSucceeded);
  // Element 1's object deleted (cohort cancel --element): cancelled, not failed; the job
  // waits for the others, then succeeds with them.
  st = KubernetesStatusFromJson("jobs.batch", List({element(0, ""), element(2, ok)}), "", 3);
  EXPECT_EQ(st->elements[1].state, JobState::kCancelled);
  EXPECT_EQ(st->state, JobState::kRunning);
  st = KubernetesStatusFromJson("jobs.batch", List({element(0, ok), element(2, ok)}), "", 3);
  EXPECT_EQ(st->state, JobState::kSucceeded);
}

TEST(KubernetesStatusTest, MissingAndMalformed) {
  auto st = KubernetesStatusFromJson("jobs.batch", List({}), "", 0);
  EXPECT_EQ(st.status().code(), StatusCode::kNotFound);
  st = KubernetesStatusFromJson("jobs.batch", "error: not json", "", 0);
  EXPECT_EQ(st.status().code(), StatusCode::kInternal);
}

// ---------------------------------------------------------------------------------------
// Submit / Poll / Cancel / LogPath

// A stand-in kubectl: records its arguments and stdin, answers `get` from files.
std::string FakeKubectl(const TempDir& dir) {
  return dir.File("kubectl", R"(#!/bin/sh
d=$(dirname "$0")
echo "$*" >> "$d/calls"
case "$1" in
  apply) cat > "$d/applied.yaml"; echo "pytorchjob.kubeflow.org/fmnist created";;
  get)
    if [ "$3" = pods ] || [ "$2" = pods ]; then cat "$d/pods.json" 2>/dev/null; exit 0; fi
    for a in "$@"; do
      if [ "$a" = name ]; then cat "$d/existing" 2>/dev/null; exit 0; fi
    done
    cat "$d/objects.json";;
  delete) echo "deleted";;
  *) echo "unexpected: $*" >&2; exit 1;;
esac
)",
                  true);
}

JobRecord Record(const std::string& backend_id) {
  JobRecord job;
  job.id = 7;
  job.name = "fmnist";
  job.backend = "kubernetes";
  job.backend_id = backend_id;
  return job;
}

TEST(KubernetesBackendTest, SubmitPollCancelWithStandInKubectl) {
  TempDir dir;
  BackendOptions options;
  options.kubectl = FakeKubectl(dir);
  options.cohort_bin = "/opt/cohort/bin/cohort";
  auto backend = MakeKubernetesBackend(options);
  EXPECT_EQ(backend->name(), "kubernetes");

  auto id = backend->Submit(Record(""), ElasticSpec(), {});
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(*id, "pytorchjobs.kubeflow.org/fmnist");
  const std::string applied = dir.Read("applied.yaml");
  EXPECT_TRUE(Contains(applied, "kind: PyTorchJob")) << applied;
  EXPECT_TRUE(Contains(applied, "kind: Secret")) << applied;
  EXPECT_TRUE(Contains(applied, "- /opt/cohort/bin/cohort\n")) << applied;
  std::string calls = dir.Read("calls");
  EXPECT_TRUE(Contains(calls, "get pytorchjobs.kubeflow.org -l cohort.dev/job=fmnist -o name"))
      << calls;
  EXPECT_TRUE(Contains(calls, "apply --field-manager=cohort -f -")) << calls;

  // A job of that name still in the cluster.
  dir.File("existing", "pytorchjob.kubeflow.org/fmnist\n");
  auto again = backend->Submit(Record(""), ElasticSpec(), {});
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(Contains(again.status().message(), "cohort cancel fmnist"))
      << again.status().message();

  dir.File("objects.json", List({R"({"metadata": {"name": "fmnist"},
      "status": {"conditions": [{"type": "Running", "status": "True"}]}})"}));
  auto st = backend->Poll(Record(*id));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->state, JobState::kRunning);
  calls = dir.Read("calls");
  EXPECT_TRUE(Contains(calls, "get pytorchjobs.kubeflow.org -l cohort.dev/job=fmnist -o json"));
  EXPECT_TRUE(
      Contains(calls, "get pods -l cohort.dev/job=fmnist,cohort.dev/component=worker -o json"));

  Status cancelled = backend->Cancel(Record(*id));
  EXPECT_TRUE(cancelled.ok()) << cancelled.ToString();
  EXPECT_TRUE(Contains(dir.Read("calls"),
                       "delete pytorchjobs.kubeflow.org,services,configmaps,secrets,"
                       "deployments.apps -l cohort.dev/job=fmnist --ignore-not-found"));

  // Invalid specs never reach kubectl.
  JobSpec no_image = ElasticSpec();
  no_image.image.clear();
  auto refused = backend->Submit(Record(""), no_image, {});
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
}

TEST(KubernetesBackendTest, LogPathSaysWhereLogsAre) {
  auto backend = MakeKubernetesBackend(BackendOptions{});
  auto path = backend->LogPath(Record("pytorchjobs.kubeflow.org/fmnist"), -1, -1);
  ASSERT_FALSE(path.ok());
  EXPECT_EQ(path.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(path.status().message(), "kubectl logs -l cohort.dev/job=fmnist"))
      << path.status().message();
  JobRecord element = Record("pytorchjobs.kubeflow.org/fmnist");
  element.array_size = 3;
  path = backend->LogPath(element, 2, -1);
  EXPECT_TRUE(Contains(path.status().message(), "cohort.dev/job=fmnist,cohort.dev/array-index=2"))
      << path.status().message();
}

// A single-node array is one Indexed Job: the hint selects pods by labels the rendered pods
// carry (not batch.kubernetes.io/job-completion-index, a label only from Kubernetes 1.28)
// and picks element I's pod by its name, <job>-<I>-<suffix>.
TEST(KubernetesBackendTest, LogHintOfAnIndexedJobElementUsesRenderedLabelsAndThePodName) {
  JobSpec spec = NodesSpec("sweep", 1, 1);
  spec.image = "registry.example.com/train:1";
  const std::vector<ArrayElement> elements = {{0, {}}, {1, {}}, {2, {}}};
  auto manifests = RenderKubernetes(spec, elements, "indexed", "cohort");
  ASSERT_TRUE(manifests.ok()) << manifests.status().ToString();
  auto backend = MakeKubernetesBackend(BackendOptions{});
  JobRecord job = Record("jobs.batch/sweep");
  job.spec_yaml = JobSpecToYaml(spec);
  job.array_size = 3;
  auto path = backend->LogPath(job, 2, -1);
  const std::string hint = path.status().message();
  EXPECT_TRUE(Contains(hint, "kubectl logs -l cohort.dev/job=sweep,cohort.dev/component=worker "
                             "--prefix --tail=-1 | grep '^\\[pod/sweep-2-'"))
      << hint;
  EXPECT_FALSE(Contains(hint, "job-completion-index")) << hint;
  // Every label of the selector is on the rendered pod template.
  EXPECT_TRUE(Contains(*manifests, "cohort.dev/job: sweep")) << *manifests;
  EXPECT_TRUE(Contains(*manifests, "cohort.dev/component: worker")) << *manifests;
}

TEST(KubernetesBackendTest, CancelElementDeletesThatElementsObjectsOnly) {
  TempDir dir;
  BackendOptions options;
  options.kubectl = FakeKubectl(dir);
  auto backend = MakeKubernetesBackend(options);
  JobRecord job = Record("jobs.batch/msweep");
  job.array_size = 3;
  job.spec_yaml = JobSpecToYaml(NodesSpec("msweep", 2, 2));
  Status st = backend->CancelElement(job, 1);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(Contains(dir.Read("calls"),
                       "delete jobs.batch,services -l cohort.dev/job=msweep,"
                       "cohort.dev/array-index=1 --ignore-not-found --wait=false"))
      << dir.Read("calls");
  // A single-node array is one Indexed Job: one index cannot be stopped alone.
  JobRecord indexed = Record("jobs.batch/sweep");
  indexed.array_size = 3;
  indexed.spec_yaml = JobSpecToYaml(NodesSpec("sweep", 1, 1));
  st = backend->CancelElement(indexed, 1);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(st.message(), "one Indexed Job")) << st.message();
}

TEST(KubernetesBackendTest, MissingKubectl) {
  BackendOptions options;
  options.kubectl = "/nonexistent/kubectl";
  auto backend = MakeKubernetesBackend(options);
  auto id = backend->Submit(Record(""), ElasticSpec(), {});
  EXPECT_EQ(id.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(id.status().message(), "needs kubectl")) << id.status().message();
}

// The real kubectl with a kubeconfig whose API server does not exist: Submit fails with
// kubectl's own message.
TEST(KubernetesBackendTest, RealKubectlWithoutCluster) {
  if (!FindProgram("kubectl").ok()) GTEST_SKIP() << "kubectl is not installed";
  TempDir dir;
  const std::string config = dir.File("kubeconfig", R"(apiVersion: v1
kind: Config
clusters:
- name: none
  cluster: {server: "https://127.0.0.1:1"}
contexts:
- name: none
  context: {cluster: none, user: nobody}
current-context: none
users:
- name: nobody
  user: {token: not-a-token}
)");
  const char* old = std::getenv("KUBECONFIG");
  std::string saved = old ? old : "";
  ::setenv("KUBECONFIG", config.c_str(), 1);
  auto backend = MakeKubernetesBackend(BackendOptions{});
  auto id = backend->Submit(Record(""), ElasticSpec(), {});
  if (old) {
    ::setenv("KUBECONFIG", saved.c_str(), 1);
  } else {
    ::unsetenv("KUBECONFIG");
  }
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(id.status().message(), "kubectl get pytorchjobs.kubeflow.org"))
      << id.status().message();
  EXPECT_TRUE(Contains(id.status().message(), "127.0.0.1:1")) << id.status().message();
  EXPECT_TRUE(Contains(id.status().message(), "connection refused")) << id.status().message();
}

// A target's kube context and namespace reach every kubectl call.
TEST(KubernetesBackendTest, ContextAndNamespaceReachKubectl) {
  TempDir dir;
  const std::string kubectl = dir.File("kubectl", "#!/bin/sh\necho \"$@\" >> \"$0.calls\"\n"
                                                  "echo 'error: context was not found' >&2\nexit 1\n");
  ::chmod(kubectl.c_str(), 0755);
  BackendOptions options;
  options.kubectl = kubectl;
  options.kube_context = "eu-west";
  options.kube_namespace = "training";
  auto backend = MakeKubernetesBackend(options);
  auto id = backend->Submit(Record(""), ElasticSpec(), {});
  ASSERT_FALSE(id.ok());
  std::ifstream calls(kubectl + ".calls");
  std::string first;
  std::getline(calls, first);
  EXPECT_TRUE(StartsWith(first, "--context eu-west --namespace training get ")) << first;
}

}  // namespace
}  // namespace cohort::launch::kubernetes_test
