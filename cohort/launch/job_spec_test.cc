// Job spec parsing/validation and array expansion (ranges, CSV, SQLite). PostgreSQL arrays
// and the CLI are covered end to end in tests/e2e/test_jobs.py.
#include "cohort/launch/job_spec.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sqlite3.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "cohort/base/strings.h"
#include "cohort/base/temp_dir.h"
#include "cohort/launch/array.h"
#include "cohort/launch/job_db.h"
#include "cohort/launch/targets.h"

namespace cohort::launch {
namespace {

namespace fs = std::filesystem;

bool HasProblem(const std::vector<Problem>& ps, const std::string& where,
                const std::string& fragment) {
  for (const auto& p : ps) {
    if (p.where == where && p.what.find(fragment) != std::string::npos) return true;
  }
  return false;
}

std::string Dump(const std::vector<Problem>& ps) { return FormatProblems(ps); }

// The elements of `src` (a manifest read from `dir`); any problem fails the test.
std::vector<ArrayElement> ExpandOk(const ArraySource& src, const std::string& dir = "") {
  std::vector<Problem> ps;
  std::vector<ArrayElement> e = ExpandArray(src, dir, &ps);
  EXPECT_TRUE(ps.empty()) << Dump(ps);
  return e;
}

// Each (field, part of its problem's text) of `want` is among the problems `ps`.
void ExpectProblems(const std::vector<Problem>& ps,
                    const std::vector<std::pair<std::string, std::string>>& want) {
  for (const auto& [where, fragment] : want) {
    EXPECT_TRUE(HasProblem(ps, where, fragment)) << where << ": " << fragment << "\n" << Dump(ps);
  }
}

// Every variable of `want` is set in `e`'s environment, to the value given.
void ExpectEnv(const ArrayElement& e, const std::map<std::string, std::string>& want) {
  for (const auto& [name, value] : want) {
    auto it = e.env.find(name);
    EXPECT_EQ(it == e.env.end() ? "(unset)" : it->second, value) << name;
  }
}

// Runs `sql` on the SQLite database at `path` (created when absent), as another program would.
void RunSqlite(const std::string& path, const char* sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, nullptr);
  sqlite3_close(db);
  ASSERT_EQ(rc, SQLITE_OK);
}

// The problems of `src` (a manifest read from `dir`), which must expand to no elements.
std::vector<Problem> ExpandProblems(const ArraySource& src, const std::string& dir = "") {
  std::vector<Problem> ps;
  EXPECT_TRUE(ExpandArray(src, dir, &ps).empty());
  return ps;
}

// The YAML of `spec` (what the job history stores) parses back to the same spec.
void ExpectRoundTrip(const JobSpec& spec) {
  std::vector<Problem> again;
  JobSpec back = ParseJobSpec(JobSpecToYaml(spec), &again);
  ASSERT_TRUE(again.empty()) << Dump(again) << JobSpecToYaml(spec);
  EXPECT_EQ(JobSpecToYaml(back), JobSpecToYaml(spec));
}


TEST(JobSpecTest, FullSpecParses) {
  std::vector<Problem> ps;
  JobSpec s = ParseJobSpec(R"(
name: fmnist-train
image: registry.local/cohort:1
entrypoint: python3
args: [train.py, --epochs, "3"]
nnodes: "1:4"
nproc_per_node: 2
resources: {cpu: 1500m, memory: 8Gi, gpu: 1, network_devices: [eth0, ib0]}
env: {DATA: /data, SEED: "7"}
volumes:
  - {name: data, host_path: /mnt/data}
  - {name: ckpt, nfs: {server: nfs.local, path: /export/ckpt}}
  - {name: scratch, claim: scratch-pvc}
mounts:
  - {volume: data, path: /data, read_only: true}
  - {volume: ckpt, path: /ckpt}
max_restarts: 3
queue: gpu
priority: high
rdzv: {backend: etcd, endpoint: "etcd-0:2379,etcd-1:2379"}
array: {range: "0-9", concurrency: 3}
)",
                           &ps);
  ASSERT_TRUE(ps.empty()) << Dump(ps);
  EXPECT_EQ(s.name, "fmnist-train");
  EXPECT_EQ(s.args, (std::vector<std::string>{"train.py", "--epochs", "3"}));
  EXPECT_EQ(s.min_nodes, 1);
  EXPECT_EQ(s.max_nodes, 4);
  EXPECT_EQ(s.nproc_per_node, 2);
  EXPECT_DOUBLE_EQ(s.resources.cpu, 1.5);
  EXPECT_EQ(s.resources.memory_bytes, 8LL << 30);
  EXPECT_EQ(s.resources.gpu, 1);
  EXPECT_EQ(s.resources.network_devices.size(), 2u);
  EXPECT_EQ(s.env.at("SEED"), "7");
  ASSERT_EQ(s.volumes.size(), 3u);
  EXPECT_EQ(s.volumes[1].nfs_server, "nfs.local");
  EXPECT_EQ(s.volumes[2].claim, "scratch-pvc");
  ASSERT_EQ(s.mounts.size(), 2u);
  EXPECT_TRUE(s.mounts[0].read_only);
  EXPECT_EQ(s.max_restarts, 3);
  EXPECT_EQ(s.rdzv.backend, "etcd");
  EXPECT_EQ(s.array.range, "0-9");
  EXPECT_EQ(s.array.concurrency, 3);

  // The YAML written back parses to the same spec.
  ExpectRoundTrip(s);
}

TEST(JobSpecTest, EveryProblemIsListedWithItsField) {
  std::vector<Problem> ps;
  ParseJobSpec(R"(
name: Bad_Name
nnode: 2
nnodes: "4:2"
nproc_per_node: zero
resources: {cpu: -1, memory: 12XB, gpu: 2}
env: {"1BAD": x}
volumes: [{name: data}]
mounts: [{volume: nope, path: relative}]
rdzv: {backend: zookeeper}
array: {range: "0-9", manifest: x.csv}
)",
               &ps);
  ExpectProblems(ps, {{"name", "lowercase"},
                      {"nnode", "did you mean 'nnodes'"},
                      {"nnodes", "MIN <= MAX"},
                      {"nproc_per_node", "not a whole number"},
                      {"entrypoint", "required"},
                      {"resources.cpu", "positive"},
                      {"resources.memory", "not a memory size"},
                      {"env.1BAD", "environment variable"},
                      {"volumes[0]", "exactly one of"},
                      {"mounts[0].volume", "no volume named 'nope'"},
                      {"mounts[0].path", "absolute"},
                      {"rdzv.backend", "zookeeper"},
                      {"array", "only one of"}});
  EXPECT_GE(ps.size(), 13u);
}

TEST(JobSpecTest, SyntaxErrorsAndEmptySpecsSayWhere) {
  std::vector<Problem> ps;
  ParseJobSpec("name: x\nentrypoint: [unclosed\n", &ps);
  ASSERT_EQ(ps.size(), 1u) << Dump(ps);
  EXPECT_NE(ps[0].where.find("line"), std::string::npos) << Dump(ps);
  EXPECT_NE(ps[0].what.find("YAML syntax error"), std::string::npos);
  ps.clear();
  ParseJobSpec("", &ps);
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_NE(ps[0].what.find("empty"), std::string::npos);
  ps.clear();
  ParseJobSpec("- a\n- b\n", &ps);
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_NE(ps[0].what.find("map"), std::string::npos);
}

TEST(JobSpecTest, MemoryQuantities) {
  EXPECT_EQ(ParseMemoryQuantity("8Gi"), 8LL << 30);
  EXPECT_EQ(ParseMemoryQuantity("512Mi"), 512LL << 20);
  EXPECT_EQ(ParseMemoryQuantity("2G"), 2000000000LL);
  EXPECT_EQ(ParseMemoryQuantity("1.5Gi"), 3LL << 29);
  EXPECT_EQ(ParseMemoryQuantity("1024"), 1024);
  EXPECT_EQ(ParseMemoryQuantity("12XB"), std::nullopt);
  EXPECT_EQ(ParseMemoryQuantity("-1Gi"), std::nullopt);
}

TEST(ArrayTest, RangesWithSteps) {
  std::string err;
  EXPECT_EQ(ParseArrayRange("0-4", &err), (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(ParseArrayRange("2-8:3", &err), (std::vector<int>{2, 5, 8}));
  EXPECT_EQ(ParseArrayRange("7", &err), (std::vector<int>{7}));
  EXPECT_TRUE(err.empty());
  EXPECT_TRUE(ParseArrayRange("5-1", &err).empty());
  EXPECT_NE(err.find("FIRST <= LAST"), std::string::npos);
  auto e = ExpandOk(ArraySource{.range = "10-12"});
  ASSERT_EQ(e.size(), 3u);
  ExpectEnv(e[2], {{"COHORT_ARRAY_INDEX", "2"},
                   {"COHORT_ARRAY_TASK_ID", "12"},
                   {"COHORT_ARRAY_SIZE", "3"}});
}

TEST(ArrayTest, CsvManifestRowsBecomeEnvironments) {
  TempDir dir;
  dir.File("m.csv", "REGION,LR\nus-east,0.1\n\"eu, west\",\"0.2\"\n");
  auto e = ExpandOk(ArraySource{.manifest = "m.csv"}, dir.path());
  ASSERT_EQ(e.size(), 2u);
  ExpectEnv(e[1], {{"REGION", "eu, west"}, {"LR", "0.2"}, {"COHORT_ARRAY_INDEX", "1"}});
}

TEST(ArrayTest, BadManifestsAreProblemsWithLines) {
  TempDir dir;
  dir.File("ragged.csv", "A,B\n1,2\n3\n");
  dir.File("badname.csv", "A,not a name\n1,2\n");
  dir.File("empty.csv", "");
  std::vector<Problem> ps = ExpandProblems(ArraySource{.manifest = "ragged.csv"}, dir.path());
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_NE(ps[0].where.find("line 3"), std::string::npos) << Dump(ps);
  ps = ExpandProblems(ArraySource{.manifest = "badname.csv"}, dir.path());
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_NE(ps[0].what.find("'not a name' cannot be one"), std::string::npos) << Dump(ps);
  EXPECT_NE(ps[0].what.find("--array-manifest-columns"), std::string::npos) << Dump(ps);
  ps = ExpandProblems(ArraySource{.manifest = "empty.csv"}, dir.path());
  EXPECT_TRUE(HasProblem(ps, "array.manifest", "empty")) << Dump(ps);
  ps = ExpandProblems(ArraySource{.manifest = "missing.csv"}, dir.path());
  EXPECT_TRUE(HasProblem(ps, "array.manifest", "cannot read")) << Dump(ps);
}

TEST(ArrayTest, SqliteQueryRowsBecomeElements) {
  TempDir dir;
  const std::string db_path = dir.path() + "/meta.db";
  ASSERT_NO_FATAL_FAILURE(
      RunSqlite(db_path,
                "CREATE TABLE datasets(name TEXT, rows INTEGER, ready INTEGER);"
                "INSERT INTO datasets VALUES ('a', 10, 1), ('b', 20, 0), ('c', 30, 1);"));
  ArraySource src{.from_sql = "SELECT name AS DATASET, rows AS N FROM datasets WHERE ready = 1 "
                              "ORDER BY name",
                  .db = "sqlite://" + db_path};
  auto e = ExpandOk(src);
  ASSERT_EQ(e.size(), 2u);
  ExpectEnv(e[0], {{"DATASET", "a"}});
  ExpectEnv(e[1], {{"DATASET", "c"}, {"N", "30"}});

  // A syntax error names the character; a write is refused; the file is unchanged.
  src.from_sql = "SELEC name FROM datasets";
  std::vector<Problem> ps = ExpandProblems(src);
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_NE(ps[0].where.find("array.from_sql (character"), std::string::npos) << Dump(ps);
  EXPECT_NE(ps[0].what.find("syntax error"), std::string::npos) << Dump(ps);
  src.from_sql = "DELETE FROM datasets";
  EXPECT_FALSE(ExpandProblems(src).empty());
  src.from_sql = "SELECT name FROM missing_table";
  ps = ExpandProblems(src);
  EXPECT_TRUE(HasProblem(ps, "array.from_sql", "no such table")) << Dump(ps);
  src.from_sql = "SELECT name AS DATASET FROM datasets WHERE ready = 1";
  ASSERT_EQ(ExpandOk(src).size(), 2u);
  src.db = "mysql://x";
  ps = ExpandProblems(src);
  EXPECT_TRUE(HasProblem(ps, "array.db", "sqlite")) << Dump(ps);
}

TEST(JobDbTest, HistorySurvivesReopening) {
  TempDir dir;
  const std::string path = dir.path() + "/jobs.db";
  int64_t id;
  {
    auto db = JobDb::Open(path);
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    JobRecord j;
    j.name = "x";
    j.backend = "local";
    j.spec_yaml = "name: x\n";
    j.submitted_at = 1;
    j.array_size = 2;
    auto inserted = (*db)->Insert(j);
    ASSERT_TRUE(inserted.ok());
    id = *inserted;
    j.id = id;
    j.state = JobState::kFailed;
    j.exit_code = 3;
    ASSERT_TRUE((*db)->Update(j).ok());
    ElementRecord e;
    e.index = 1;
    e.state = JobState::kFailed;
    e.exit_code = 3;
    ASSERT_TRUE((*db)->UpdateElement(id, e).ok());
  }
  auto db = JobDb::Open(path);
  ASSERT_TRUE(db.ok());
  auto j = (*db)->Find("x");
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->id, id);
  EXPECT_EQ(j->state, JobState::kFailed);
  EXPECT_EQ(j->exit_code, 3);
  auto elements = (*db)->Elements(id);
  ASSERT_TRUE(elements.ok());
  ASSERT_EQ(elements->size(), 2u);
  EXPECT_EQ((*elements)[0].state, JobState::kPending);
  EXPECT_EQ((*elements)[1].exit_code, 3);
  EXPECT_EQ((*db)->Find("nope").status().code(), StatusCode::kNotFound);
}

// The children of an array over targets: found through their parent, not listed or found
// by name on their own; a history written before targets existed gains the columns.
TEST(JobDbTest, ChildJobsBelongToTheirParentAndOldHistoriesOpen) {
  TempDir dir;
  const std::string path = dir.path() + "/jobs.db";
  ASSERT_NO_FATAL_FAILURE(
      RunSqlite(path,
                "CREATE TABLE jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT "
                "NOT NULL, backend TEXT NOT NULL, spec_yaml TEXT NOT NULL, state TEXT "
                "NOT NULL, exit_code INTEGER, submitted_at REAL NOT NULL, started_at "
                "REAL NOT NULL DEFAULT 0, ended_at REAL NOT NULL DEFAULT 0, log_dir "
                "TEXT NOT NULL DEFAULT '', backend_id TEXT NOT NULL DEFAULT '', "
                "array_size INTEGER NOT NULL DEFAULT 0, concurrency INTEGER NOT NULL "
                "DEFAULT 0, detail TEXT NOT NULL DEFAULT '');"
                "INSERT INTO jobs (name, backend, spec_yaml, state, submitted_at) "
                "VALUES ('before', 'local', 'name: before', 'succeeded', 1);"));
  auto db = JobDb::Open(path);
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  EXPECT_EQ((*db)->Find("before")->state, JobState::kSucceeded);
  JobRecord parent;
  parent.name = "fan";
  parent.backend = kTargetsBackend;
  parent.spec_yaml = "name: fan\n";
  parent.array_size = 3;
  auto parent_id = (*db)->Insert(parent);
  ASSERT_TRUE(parent_id.ok());
  JobRecord child = parent;
  child.backend = "local";
  child.array_size = 2;
  child.parent_id = *parent_id;
  child.target = TargetRecord(Target{.name = "east", .backend = "local"}, {0, 2});
  auto child_id = (*db)->Insert(child);
  ASSERT_TRUE(child_id.ok());
  EXPECT_EQ((*db)->Find("fan")->id, *parent_id);  // the name is the parent's
  auto listed = (*db)->List(10);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 2u);  // "before" and the parent
  EXPECT_EQ((*listed)[0].id, *parent_id);
  auto children = (*db)->Children(*parent_id);
  ASSERT_TRUE(children.ok());
  ASSERT_EQ(children->size(), 1u);
  EXPECT_EQ((*children)[0].id, *child_id);
  EXPECT_EQ(ParseTargetRecord((*children)[0].target)->indices, (std::vector<int>{0, 2}));
}

// A row's state only moves forward: a writer with an older copy (the submitting command
// after the runner finished, a status poll) cannot undo the recorded end.
TEST(JobDbTest, StateOnlyMovesForward) {
  TempDir dir;
  auto db = JobDb::Open(dir.path() + "/jobs.db");
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  JobRecord j;
  j.name = "race";
  j.backend = "local";
  j.array_size = 1;
  auto id = (*db)->Insert(j);
  ASSERT_TRUE(id.ok());
  j.id = *id;
  JobRecord stale = j;  // what the submitter read before the runner started
  ASSERT_TRUE((*db)->SetBackendId(j.id, "4242").ok());
  j.state = JobState::kRunning;
  EXPECT_TRUE(*(*db)->Update(j));
  j.state = JobState::kSucceeded;
  j.exit_code = 0;
  EXPECT_TRUE(*(*db)->Update(j));
  EXPECT_FALSE(*(*db)->Update(stale));  // pending after succeeded: refused
  stale.state = JobState::kRunning;
  EXPECT_FALSE(*(*db)->Update(stale));
  stale.state = JobState::kFailed;
  EXPECT_FALSE(*(*db)->Update(stale));  // one final state never becomes another
  auto now = (*db)->Get(j.id);
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(now->state, JobState::kSucceeded);
  EXPECT_EQ(now->exit_code, 0);
  EXPECT_EQ(now->backend_id, "4242");  // Update never touches the backend's id

  ElementRecord e;
  e.index = 0;
  e.state = JobState::kSucceeded;
  e.exit_code = 0;
  EXPECT_TRUE(*(*db)->UpdateElement(j.id, e));
  e.state = JobState::kRunning;
  EXPECT_FALSE(*(*db)->UpdateElement(j.id, e));
  EXPECT_EQ((*(*db)->Elements(j.id))[0].state, JobState::kSucceeded);
}


// The names are what the database stores and users read: they must never change.
TEST(JobDbTest, StateNamesAreTheStoredStrings) {
  const std::pair<JobState, std::string_view> expected[] = {
      {JobState::kPending, "pending"},     {JobState::kRunning, "running"},
      {JobState::kSucceeded, "succeeded"}, {JobState::kFailed, "failed"},
      {JobState::kCancelled, "cancelled"}, {JobState::kLost, "lost"},
      {JobState::kUnknown, "unknown"}};
  for (const auto& [state, name] : expected) {
    EXPECT_EQ(StateName(state), name);
    EXPECT_EQ(ParseJobState(name), state) << name;
  }
  EXPECT_FALSE(ParseJobState("done").has_value());
  EXPECT_FALSE(ParseJobState("").has_value());
  ElementRecord e;
  e.state = JobState::kFailed;
  EXPECT_EQ(nlohmann::json(e.state), "failed");  // JSON holds the name too
  EXPECT_EQ(CountElementStates({e, e, ElementRecord{}}), "2 failed, 1 pending");
}

// ---------------------------------------------------------------------------------------
// Accelerators, placement, metrics, kubernetes fields, targets

constexpr const char* kAcceleratorSpec = R"(
name: neuron
image: img
entrypoint: python3
args: [train.py, --data, "${DATA}", --region=$REGION, --pid-kept=$$, --literal=$$REGION]
nnodes: 2
resources:
  cpu: 8
  extended: {aws.amazon.com/neuron: 1, vpc.amazonaws.com/efa: 4}
placement:
  node_selector: {node.kubernetes.io/instance-type: trn1.32xlarge}
  tolerations:
    - {key: aws.amazon.com/neuron, operator: Exists, effect: NoSchedule}
    - {key: spot, value: "true", effect: NoExecute, toleration_seconds: 60}
metrics: {port: 9400}
kubernetes: {master: false, clean_pod_policy: All, ttl_seconds_after_finished: 600}
array: {manifest: regions.csv, columns: [REGION, DATA], target_by: REGION}
targets:
  - {name: us-east-1, backend: local, concurrency: 2, env: {AWS_REGION: us-east-1}}
  - {name: eu, backend: kubernetes, context: eu-ctx, namespace: ml, flavor: indexed}
  - {name: hpc, backend: slurm, cluster: c2, partition: gpu}
)";

TEST(JobSpecTest, AcceleratorPlacementMetricsAndTargetsRoundTrip) {
  std::vector<Problem> ps;
  JobSpec spec = ParseJobSpec(kAcceleratorSpec, &ps);
  ASSERT_TRUE(ps.empty()) << Dump(ps);
  EXPECT_EQ(spec.resources.extended.at("aws.amazon.com/neuron"), 1);
  EXPECT_EQ(spec.resources.extended.at("vpc.amazonaws.com/efa"), 4);
  EXPECT_EQ(spec.placement.node_selector.at("node.kubernetes.io/instance-type"), "trn1.32xlarge");
  ASSERT_EQ(spec.placement.tolerations.size(), 2u);
  EXPECT_EQ(spec.placement.tolerations[0].op, "Exists");
  EXPECT_EQ(spec.placement.tolerations[1].op, "Equal");
  EXPECT_EQ(spec.placement.tolerations[1].toleration_seconds, 60);
  EXPECT_EQ(spec.metrics.port, 9400);
  EXPECT_EQ(spec.kubernetes.master, false);
  EXPECT_EQ(spec.kubernetes.clean_pod_policy, "All");
  EXPECT_EQ(spec.kubernetes.ttl_seconds_after_finished, 600);
  EXPECT_EQ(spec.array.columns, (std::vector<std::string>{"REGION", "DATA"}));
  ASSERT_EQ(spec.targets.size(), 3u);
  EXPECT_EQ(spec.targets[0].concurrency, 2);
  EXPECT_EQ(spec.targets[0].env.at("AWS_REGION"), "us-east-1");
  EXPECT_EQ(spec.targets[1].context, "eu-ctx");
  EXPECT_EQ(spec.targets[1].kube_namespace, "ml");
  EXPECT_EQ(spec.targets[2].partition, "gpu");
  // What the history stores parses back to the same spec.
  ExpectRoundTrip(spec);
}

TEST(JobSpecTest, BadAcceleratorPlacementAndTargetFieldsAreProblems) {
  std::vector<Problem> ps;
  ParseJobSpec(R"(
name: x
entrypoint: sh
resources: {gpu: 1, extended: {neuron: 1, aws.amazon.com/neuron: 0, nvidia.com/gpu: 2, kubernetes.io/x: 1}}
placement:
  node_selector: {"bad key!": v}
  tolerations: [{key: k, operator: Exists, value: v}, {key: k, effect: Sometimes}, {operator: Equal}]
metrics: {host: 0.0.0.0}
kubernetes: {master: maybe, clean_pod_policy: Sometimes}
array: {range: "0-3", target_by: REGION}
targets:
  - {name: a, backend: local, context: c}
  - {name: a, backend: mars}
  - {backend: slurm, namespace: n}
)",
               &ps);
  ExpectProblems(ps, {{"resources.extended.neuron", "DOMAIN/NAME"},
                      {"resources.extended.aws.amazon.com/neuron", "at least 1"},
                      {"resources.extended.nvidia.com/gpu", "repeats resources.gpu"},
                      {"resources.extended.kubernetes.io/x", "DOMAIN/NAME"},
                      {"placement.node_selector.bad key!", "node label key"},
                      {"placement.tolerations[0].value", "empty with operator Exists"},
                      {"placement.tolerations[1].effect", "'Sometimes'"},
                      {"placement.tolerations[2].key", "required"},
                      {"metrics.port", "required"},
                      {"kubernetes.master", "'maybe'"},
                      {"kubernetes.clean_pod_policy", "None, Running or All"},
                      {"targets[0].context", "only applies to the kubernetes backend"},
                      {"targets[1].name", "earlier target"},
                      {"targets[1].backend", "'mars'"},
                      {"targets[2].name", "required"},
                      {"targets[2].namespace", "only applies to the kubernetes backend"}});
}

TEST(JobSpecTest, ArgsExpandTheJobsVariablesAndLeaveTheRest) {
  const std::map<std::string, std::string> vars = {{"REGION", "us-east-1"}, {"DATA", "s3://b/p x"}};
  EXPECT_EQ(ExpandArgs({"--region=$REGION", "${DATA}/part", "$REGION$REGION", "plain"}, vars),
            (std::vector<std::string>{"--region=us-east-1", "s3://b/p x/part", "us-east-1us-east-1",
                                      "plain"}));
  // Not the job's variables: left for the program or its shell (sh -c 'echo $RANK').
  EXPECT_EQ(ExpandArgs({"echo $RANK ${WORLD_SIZE} $$ $ 5$", "${unclosed"}, vars),
            (std::vector<std::string>{"echo $RANK ${WORLD_SIZE} $$ $ 5$", "${unclosed"}));
  // $$NAME keeps a job variable's name as text.
  EXPECT_EQ(ExpandArgs({"$$REGION", "$${DATA}", "$$$REGION"}, vars),
            (std::vector<std::string>{"$REGION", "${DATA}", "$$us-east-1"}));
  JobSpec spec;
  spec.args = {"--lr", "$LR", "--out=$OUT"};
  spec.env = {{"OUT", "/ckpt"}, {"LR", "0.1"}};
  const std::map<std::string, std::string> element = {{"LR", "0.5"}};
  EXPECT_EQ(ElementArgs(spec, &element), (std::vector<std::string>{"--lr", "0.5", "--out=/ckpt"}));
  EXPECT_EQ(ElementArgs(spec, nullptr), (std::vector<std::string>{"--lr", "0.1", "--out=/ckpt"}));
}

TEST(ArrayTest, HeaderlessManifestTakesItsColumnNamesFromTheSpec) {
  TempDir dir;
  dir.File("regions.csv", "us-east-1, s3://bucket/east\nus-west-2, s3://bucket/west\n");
  ArraySource source{.manifest = "regions.csv"};
  source.columns = {"REGION", "DATA"};
  auto elements = ExpandOk(source, dir.path());
  ASSERT_EQ(elements.size(), 2u);
  ExpectEnv(elements[0], {{"REGION", "us-east-1"}, {"DATA", "s3://bucket/east"}});
  ExpectEnv(elements[1], {{"DATA", "s3://bucket/west"}, {"COHORT_ARRAY_SIZE", "2"}});
  source.columns = {"REGION"};
  const std::vector<Problem> ps = ExpandProblems(source, dir.path());
  EXPECT_TRUE(HasProblem(ps, "array.manifest (" + dir.path() + "/regions.csv line 1)",
                         "array.columns names 1 columns"))
      << Dump(ps);
}

std::vector<ArrayElement> RegionElements(const std::vector<std::string>& regions) {
  std::vector<ArrayElement> out;
  for (size_t i = 0; i < regions.size(); ++i) {
    out.push_back({static_cast<int>(i),
                   {{"REGION", regions[i]},
                    {"COHORT_ARRAY_INDEX", std::to_string(i)},
                    {"COHORT_ARRAY_SIZE", std::to_string(regions.size())}}});
  }
  return out;
}

TEST(TargetsTest, ElementsGoToTheTargetTheirColumnNames) {
  std::vector<Problem> ps;
  JobSpec spec = ParseJobSpec(kAcceleratorSpec, &ps);
  ASSERT_TRUE(ps.empty()) << Dump(ps);
  spec.array.concurrency = 5;
  auto shares = SplitByTarget(spec, RegionElements({"eu", "us-east-1", "eu", "us-east-1", "eu"}), &ps);
  ASSERT_TRUE(ps.empty()) << Dump(ps);
  ASSERT_EQ(shares.size(), 2u);  // hpc got no element
  EXPECT_EQ(shares[0].target.name, "us-east-1");
  EXPECT_EQ(shares[0].indices, (std::vector<int>{1, 3}));
  EXPECT_EQ(shares[0].spec.array.concurrency, 2);  // the target's
  EXPECT_EQ(shares[0].spec.env.at("AWS_REGION"), "us-east-1");
  EXPECT_TRUE(shares[0].spec.targets.empty());
  EXPECT_EQ(shares[1].target.name, "eu");
  EXPECT_EQ(shares[1].indices, (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(shares[1].spec.array.concurrency, 5);  // the array's
  // Elements are numbered per target; the array's own index and size stay.
  EXPECT_EQ(shares[1].elements[2].index, 2);
  ExpectEnv(shares[1].elements[2], {{"COHORT_ARRAY_INDEX", "4"},
                                    {"COHORT_ARRAY_SIZE", "5"},
                                    {"COHORT_ARRAY_TARGET", "eu"}});
  // The child record keeps where the elements went.
  auto record = ParseTargetRecord(TargetRecord(shares[1].target, shares[1].indices));
  ASSERT_TRUE(record.ok());
  EXPECT_EQ(record->target.context, "eu-ctx");
  EXPECT_EQ(record->indices, (std::vector<int>{0, 2, 4}));
  BackendOptions options = TargetOptions(BackendOptions{}, record->target);
  EXPECT_EQ(options.kube_context, "eu-ctx");
  EXPECT_EQ(options.kube_namespace, "ml");
  EXPECT_EQ(options.kube_flavor, "indexed");
}

TEST(TargetsTest, RoundRobinAndUnknownTargetsOrColumns) {
  std::vector<Problem> ps;
  JobSpec spec = ParseJobSpec(kAcceleratorSpec, &ps);
  ASSERT_TRUE(ps.empty());
  spec.array.target_by = "round-robin";
  auto shares = SplitByTarget(spec, RegionElements({"x", "y", "z", "w"}), &ps);
  ASSERT_TRUE(ps.empty()) << Dump(ps);
  ASSERT_EQ(shares.size(), 3u);
  EXPECT_EQ(shares[0].indices, (std::vector<int>{0, 3}));
  EXPECT_EQ(shares[2].indices, (std::vector<int>{2}));
  spec.array.target_by = "REGION";
  SplitByTarget(spec, RegionElements({"eu", "ap-south-1"}), &ps);
  EXPECT_TRUE(HasProblem(ps, "array element 1", "REGION 'ap-south-1' names no target (targets: "
                                                 "us-east-1, eu, hpc)"))
      << Dump(ps);
  ps.clear();
  spec.array.target_by = "ZONE";
  SplitByTarget(spec, RegionElements({"eu"}), &ps);
  EXPECT_TRUE(HasProblem(ps, "array.target_by", "'ZONE' is not a column")) << Dump(ps);
}

}  // namespace
}  // namespace cohort::launch
