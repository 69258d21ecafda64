// Unit tests of the worker environment contract: what the agent writes is what a worker
// reads, every malformed or missing variable is named, and a worker of several ranks
// without a store is told so.
#include "cohort/base/worker_env.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <set>

namespace cohort {
namespace {

// Replaces this process's job variables with `vars` for the test's lifetime.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::vector<std::pair<std::string, std::string>>& vars) {
    UnsetAll();
    for (const auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
  }
  ~ScopedEnv() { UnsetAll(); }

 private:
  static void UnsetAll() {
    for (const auto* names : {&AgentOwnedVariables(), &PassThroughVariables()}) {
      for (const auto& name : *names) ::unsetenv(name.c_str());
    }
  }
};

WorkerEnv Sample() {
  WorkerEnv w;
  w.rank = 3;
  w.local_rank = 1;
  w.world_size = 4;
  w.local_world_size = 2;
  w.group_rank = 1;
  w.group_world_size = 2;
  w.role_rank = 3;
  w.role_world_size = 4;
  w.role_name = "trainer";
  w.master_addr = "10.0.0.1";
  w.master_port = 29500;
  w.restart_count = 2;
  w.max_restarts = 5;
  w.run_id = "job-7";
  w.error_file = "/tmp/e.json";
  w.omp_num_threads = 1;
  w.attempt = 4;
  w.round = 9;
  w.listen_addr = "10.0.0.2";
  w.flight_recorder_dir = "/tmp/fr";
  w.metrics_dir = "/tmp/m";
  w.metrics_history_s = 1.5;
  return w;
}

TEST(WorkerEnvTest, WhatTheAgentWritesAWorkerReads_CohortStore) {
  WorkerEnv w = Sample();
  w.store.kind = JobStoreAccess::Kind::kTcp;
  w.store.addr = "10.0.0.1";
  w.store.port = 29400;
  w.store.token = "secret";
  w.store.round_prefix = "rdzv/r9/";
  ScopedEnv env(WriteWorkerEnv(w));
  Result<WorkerEnv> r = ReadWorkerEnv();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->rank, 3);
  EXPECT_EQ(r->local_rank, 1);
  EXPECT_EQ(r->world_size, 4);
  EXPECT_EQ(r->local_world_size, 2);
  EXPECT_EQ(r->group_rank, 1);
  EXPECT_EQ(r->group_world_size, 2);
  EXPECT_EQ(r->role_name, "trainer");
  EXPECT_EQ(r->master_addr, "10.0.0.1");
  EXPECT_EQ(r->master_port, 29500);
  EXPECT_EQ(r->restart_count, 2);
  EXPECT_EQ(r->max_restarts, 5);
  EXPECT_EQ(r->run_id, "job-7");
  EXPECT_EQ(r->error_file, "/tmp/e.json");
  EXPECT_EQ(r->omp_num_threads, 1);
  EXPECT_EQ(r->attempt, 4);
  EXPECT_EQ(r->round, 9);
  EXPECT_EQ(r->listen_addr, "10.0.0.2");
  EXPECT_EQ(r->flight_recorder_dir, "/tmp/fr");
  EXPECT_EQ(r->metrics_dir, "/tmp/m");
  EXPECT_DOUBLE_EQ(r->metrics_history_s, 1.5);
  EXPECT_EQ(r->store.kind, JobStoreAccess::Kind::kTcp);
  EXPECT_EQ(r->store.addr, "10.0.0.1");
  EXPECT_EQ(r->store.port, 29400);
  EXPECT_EQ(r->store.token, "secret");
  EXPECT_EQ(r->store.round_prefix, "rdzv/r9/");
  EXPECT_EQ(JobStoreMissing(*r), "");
}

TEST(WorkerEnvTest, WhatTheAgentWritesAWorkerReads_Etcd) {
  WorkerEnv w = Sample();
  w.store.kind = JobStoreAccess::Kind::kEtcd;
  w.store.etcd_endpoints = {"http://a:2379", "http://b:2379"};
  w.store.etcd_prefix = "job-7";
  w.store.etcd_ca_file = "/ca";
  w.store.etcd_cert_file = "/cert";
  w.store.etcd_key_file = "/key";
  w.store.etcd_user = "root";
  w.store.etcd_password = "never-written";
  w.store.etcd_request_timeout_s = 2.5;
  auto written = WriteWorkerEnv(w);
  for (const auto& [k, v] : written) {
    EXPECT_NE(k, worker_env::kEtcdPassword);
    EXPECT_NE(v, "never-written");
  }
  ScopedEnv env(written);
  ::setenv(worker_env::kEtcdPassword, "inherited", 1);
  Result<WorkerEnv> r = ReadWorkerEnv();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->store.kind, JobStoreAccess::Kind::kEtcd);
  EXPECT_EQ(r->store.etcd_endpoints, w.store.etcd_endpoints);
  EXPECT_EQ(r->store.etcd_prefix, "job-7");
  EXPECT_EQ(r->store.etcd_ca_file, "/ca");
  EXPECT_EQ(r->store.etcd_cert_file, "/cert");
  EXPECT_EQ(r->store.etcd_key_file, "/key");
  EXPECT_EQ(r->store.etcd_user, "root");
  EXPECT_EQ(r->store.etcd_password, "inherited");
  EXPECT_DOUBLE_EQ(r->store.etcd_request_timeout_s, 2.5);
  EXPECT_EQ(JobStoreMissing(*r), "");
}

TEST(WorkerEnvTest, NotLaunchedIsNotFound) {
  ScopedEnv env({});
  EXPECT_EQ(ReadWorkerEnv().status().code(), StatusCode::kNotFound);
}

TEST(WorkerEnvTest, MalformedOrHalfSetVariablesAreNamed) {
  struct Case {
    std::vector<std::pair<std::string, std::string>> vars;
    std::string names;
  };
  const std::vector<Case> cases = {
      {{{"RANK", "0"}}, "WORLD_SIZE"},
      {{{"WORLD_SIZE", "2"}}, "RANK"},
      {{{"RANK", "x"}, {"WORLD_SIZE", "2"}}, "RANK=x"},
      {{{"RANK", "2"}, {"WORLD_SIZE", "2"}}, "RANK=2"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE=0"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"COHORT_STORE_ADDR", "h"}}, "COHORT_STORE_PORT"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"COHORT_STORE_ADDR", "h"},
        {"COHORT_STORE_PORT", "http"}},
       "COHORT_STORE_PORT=http"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"COHORT_ETCD_ENDPOINTS", "a:1"}},
       "COHORT_ETCD_PREFIX"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "-1"}}, "MASTER_PORT=-1"},
  };
  for (const Case& c : cases) {
    ScopedEnv env(c.vars);
    Result<WorkerEnv> r = ReadWorkerEnv();
    ASSERT_FALSE(r.ok()) << c.names;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.names;
    EXPECT_NE(r.status().message().find(c.names), std::string::npos) << r.status().message();
  }
}

TEST(WorkerEnvTest, SeveralRanksWithoutAStoreAreToldWhatIsMissing) {
  ScopedEnv env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
  Result<WorkerEnv> r = ReadWorkerEnv();
  ASSERT_TRUE(r.ok());
  std::string missing = JobStoreMissing(*r);
  EXPECT_NE(missing.find("WORLD_SIZE=2"), std::string::npos) << missing;
  EXPECT_NE(missing.find("COHORT_STORE_ADDR"), std::string::npos) << missing;
  EXPECT_NE(missing.find("COHORT_ETCD_ENDPOINTS"), std::string::npos) << missing;
  EXPECT_NE(missing.find("cohort run"), std::string::npos) << missing;
  // One rank needs no store.
  ScopedEnv alone({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  EXPECT_EQ(JobStoreMissing(*ReadWorkerEnv()), "");
}

TEST(WorkerEnvTest, StaleJobVariablesOfTheLauncherDoNotReachTheWorker) {
  // The launcher itself runs inside another job (or a shell with leftovers): its
  // COHORT_STORE_* must not point an etcd job's worker at another store.
  ScopedEnv env({{"COHORT_STORE_ADDR", "stale"}, {"COHORT_STORE_PORT", "1"}, {"RANK", "7"},
                 {"OMP_NUM_THREADS", "3"}, {"COHORT_ETCD_PASSWORD", "pw"}});
  WorkerEnv w = Sample();
  w.omp_num_threads = 0;
  w.store.kind = JobStoreAccess::Kind::kEtcd;
  w.store.etcd_endpoints = {"http://e:2379"};
  w.store.etcd_prefix = "p";
  std::set<std::string> env_of_worker;
  for (const auto& kv : WorkerEnvironment(w)) env_of_worker.insert(kv);
  EXPECT_FALSE(env_of_worker.count("COHORT_STORE_ADDR=stale"));
  EXPECT_FALSE(env_of_worker.count("COHORT_STORE_PORT=1"));
  EXPECT_TRUE(env_of_worker.count("RANK=3"));
  EXPECT_TRUE(env_of_worker.count("COHORT_ETCD_ENDPOINTS=http://e:2379"));
  // The user's choices pass through.
  EXPECT_TRUE(env_of_worker.count("OMP_NUM_THREADS=3"));
  EXPECT_TRUE(env_of_worker.count("COHORT_ETCD_PASSWORD=pw"));
}

}  // namespace
}  // namespace cohort
