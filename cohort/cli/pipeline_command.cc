// `cohort pipeline ...` (see pipeline_command.h). Thread-safety: main thread only.
#include "cohort/cli/pipeline_command.h"

#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cohort/base/exit_codes.h"
#include "cohort/base/file.h"
#include "cohort/cli/cli_util.h"
#include "cohort/cli/exec_sibling.h"
#include "cohort/launch/local_backend.h"
#include "cohort/launch/yaml_emit.h"
#include "cohort/pipeline/argo.h"
#include "cohort/pipeline/executor.h"
#include "cohort/pipeline/pipeline_spec.h"
#include "cohort/pipeline/run_db.h"

namespace cohort::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using pipeline::Problem;

constexpr const char* kUsage =
    "Usage: cohort pipeline <command> [options]\n"
    "\n"
    "  run SPEC [-p KEY=VALUE]... [--parallel N]   run a pipeline on this machine\n"
    "  resume RUN                                  re-run a failed run from its failed steps\n"
    "  status RUN [--json]                         a run and its steps\n"
    "  list [--json]                               recent runs\n"
    "  export SPEC --format argo [-p KEY=VALUE]... [--image IMG]\n"
    "                                              an Argo Workflow manifest (YAML)\n"
    "  validate SPEC [-p KEY=VALUE]...             check a spec; run nothing\n";




// The spec, its text and the resolved parameters; problems (all of them) otherwise.
struct Loaded {
  pipeline::PipelineSpec spec;
  std::string text;
  std::string path;
  std::map<std::string, std::string> params;
};

int LoadAndValidate(const std::string& name, const std::string& path,
                    const std::vector<std::string>& param_flags, bool check_jobs, Loaded* out) {
  std::vector<Problem> problems;
  auto text = ReadFileToString(path);
  if (!text.ok()) {
    fmt::print(stderr, "cohort pipeline {}: the pipeline spec: {}\n", name,
               text.status().message());
    return kExitInvalidSpec;
  }
  out->text = std::move(*text);
  out->path = fs::absolute(path).string();
  out->spec = pipeline::ParsePipelineSpec(out->text, fs::path(out->path).parent_path().string(),
                                          &problems);
  std::map<std::string, std::string> overrides;
  for (const auto& p : param_flags) {
    size_t eq = p.find('=');
    if (eq == std::string::npos || eq == 0) {
      problems.push_back({"-p " + p, "expected KEY=VALUE"});
      continue;
    }
    overrides[p.substr(0, eq)] = p.substr(eq + 1);
  }
  out->params = pipeline::ResolveParameters(out->spec, overrides, &problems);
  if (check_jobs && problems.empty()) pipeline::CheckJobSteps(out->spec, out->params, &problems);
  if (!problems.empty()) {
    fmt::print(stderr, "cohort pipeline {}: {}: {} problem(s); nothing was run:\n{}", name, path,
               problems.size(), launch::FormatProblems(problems));
    return kExitInvalidSpec;
  }
  return -1;
}

int Execute(const std::string& name, const std::string& home, int parallel,
            const std::function<Result<pipeline::RunOutcome>(const pipeline::ExecutorOptions&)>&
                body) {
  pipeline::ExecutorOptions o;
  o.home = home;
  o.cohort_bin = SiblingPath("cohort");
  o.parallel = parallel;
  o.cancel_fd = SignalFd();
  o.progress = [](const std::string& line) {
    fmt::print("{}\n", line);
    std::fflush(stdout);
  };
  auto outcome = body(o);
  int sig = 0;
  if (o.cancel_fd >= 0) {
    signalfd_siginfo info{};
    if (::read(o.cancel_fd, &info, sizeof(info)) == sizeof(info)) sig = info.ssi_signo;
    ::close(o.cancel_fd);
  }
  if (!outcome.ok()) {
    fmt::print(stderr, "cohort pipeline {}: {}\n", name, outcome.status().message());
    return ExitCodeFor(outcome.status(), ExitContext::kJobCommand, kExitBackend);
  }
  fmt::print("run {}: {}  (cohort pipeline status {})\n", outcome->run_id, pipeline::StateName(outcome->state),
             outcome->run_id);
  if (outcome->state == pipeline::RunState::kSucceeded) return kExitOk;
  if (outcome->state == pipeline::RunState::kCancelled) return sig ? ExitCodeForSignal(sig) : kExitJobCancelled;
  return kExitWorkerFailed;
}

// Where the run history and logs live (--home), and for the reading commands --json.
struct HistoryFlags {
  std::string home = launch::DefaultCohortHome();
  bool json = false;
  void Add(CLI::App& app, bool with_json) {
    app.add_option("--home", home, "run history and logs (default $COHORT_HOME or ~/.cohort)");
    if (with_json) app.add_flag("--json", json, "print JSON");
  }
};

int Run(const std::vector<std::string>& args) {
  CLI::App app("Run a pipeline on this machine.", "cohort pipeline run");
  std::string spec_path;
  HistoryFlags h;
  std::vector<std::string> params;
  int parallel = 2;
  app.add_option("spec", spec_path, "pipeline spec (YAML)")->required();
  app.add_option("-p,--param", params, "parameter KEY=VALUE (repeatable)");
  app.add_option("--parallel", parallel, "steps running at once (default 2)")
      ->check(CLI::PositiveNumber);
  h.Add(app, /*with_json=*/false);
  if (int rc = ParseCommandLine(app, args, "pipeline run"); rc >= 0) return rc;
  Loaded l;
  if (int rc = LoadAndValidate("run", spec_path, params, true, &l); rc >= 0) return rc;
  return Execute("run", h.home, parallel, [&](const pipeline::ExecutorOptions& o) {
    return pipeline::ExecuteNew(l.spec, l.path, l.text, l.params, o);
  });
}

int ResumeRun(const std::vector<std::string>& args) {
  CLI::App app("Re-run a failed or cancelled run from the steps that did not succeed.",
               "cohort pipeline resume");
  int64_t run_id = 0;
  HistoryFlags h;
  int parallel = 2;
  app.add_option("run", run_id, "run id")->required();
  app.add_option("--parallel", parallel, "steps running at once (default 2)")
      ->check(CLI::PositiveNumber);
  h.Add(app, /*with_json=*/false);
  if (int rc = ParseCommandLine(app, args, "pipeline resume"); rc >= 0) return rc;
  return Execute("resume", h.home, parallel, [&](const pipeline::ExecutorOptions& o) {
    return pipeline::Resume(run_id, o);
  });
}

json RunJson(const pipeline::RunRecord& r) {
  json j = {{"id", r.id},           {"pipeline", r.pipeline}, {"spec_path", r.spec_path},
            {"params", r.params},   {"state", pipeline::StateName(r.state)},       {"started_at", r.started_at},
            {"ended_at", r.ended_at}, {"detail", r.detail},
            {"log_dir", pipeline::RunLogDir(launch::DefaultCohortHome(), r.id)}};
  j["exit_code"] = r.exit_code ? json(*r.exit_code) : json(nullptr);
  return j;
}

int Status(const std::vector<std::string>& args) {
  CLI::App app("Show a pipeline run and its steps.", "cohort pipeline status");
  int64_t run_id = 0;
  HistoryFlags h;
  app.add_option("run", run_id, "run id")->required();
  h.Add(app, /*with_json=*/true);
  if (int rc = ParseCommandLine(app, args, "pipeline status"); rc >= 0) return rc;
  const std::string& home = h.home;
  const bool as_json = h.json;
  auto db = pipeline::RunDb::Open(pipeline::RunDbPath(home));
  if (!db.ok()) return CommandFailed("pipeline status", db.status(), kExitBackend);
  auto run = (*db)->GetRun(run_id);
  if (!run.ok()) return CommandFailed("pipeline status", run.status(), kExitNoSuchJob);
  auto steps = (*db)->Steps(run_id);
  if (!steps.ok()) return CommandFailed("pipeline status", steps.status(), kExitBackend);
  if (as_json) {
    json j = RunJson(*run);
    j["log_dir"] = pipeline::RunLogDir(home, run->id);
    json js = json::array();
    for (const auto& s : *steps) {
      js.push_back({{"name", s.name},
                    {"state", pipeline::StateName(s.state)},
                    {"attempts", s.attempts},
                    {"exit_code", s.exit_code ? json(*s.exit_code) : json(nullptr)},
                    {"started_at", s.started_at},
                    {"ended_at", s.ended_at},
                    {"outputs", s.outputs},
                    {"cache_key", s.cache_key},
                    {"log_dir", s.log_dir},
                    {"detail", s.detail}});
    }
    j["steps"] = js;
    fmt::print("{}\n", j.dump(2));
    return kExitOk;
  }
  fmt::print("run {} of pipeline {}: {}\n", run->id, run->pipeline, pipeline::StateName(run->state));
  fmt::print("  spec: {}\n", run->spec_path);
  std::string ps;
  for (const auto& [k, v] : run->params) ps += fmt::format("{}{}={}", ps.empty() ? "" : " ", k, v);
  fmt::print("  parameters: {}\n", ps.empty() ? "-" : ps);
  fmt::print("  started {}, ended {}\n", FormatTime(run->started_at), FormatTime(run->ended_at));
  fmt::print("  logs: {}\n", pipeline::RunLogDir(home, run->id));
  fmt::print("  {:<20} {:<10} {:>8} {:>5} {:>9}  {}\n", "STEP", "STATE", "ATTEMPTS", "EXIT",
             "DURATION", "DETAIL");
  for (const auto& s : *steps) {
    std::string duration =
        s.ended_at > 0 && s.started_at > 0 ? fmt::format("{:.1f}s", s.ended_at - s.started_at)
                                           : "-";
    std::string detail = s.detail;
    for (const auto& [k, v] : s.outputs) detail += fmt::format("{}{}={}", detail.empty() ? "" : "; ", k, v);
    fmt::print("  {:<20} {:<10} {:>8} {:>5} {:>9}  {}\n", s.name, pipeline::StateName(s.state), s.attempts,
               s.exit_code ? std::to_string(*s.exit_code) : "-", duration, detail);
  }
  return kExitOk;
}

int List(const std::vector<std::string>& args) {
  CLI::App app("List recent pipeline runs.", "cohort pipeline list");
  HistoryFlags h;
  int limit = 20;
  h.Add(app, /*with_json=*/true);
  app.add_option("-n,--limit", limit, "at most this many runs (default 20)");
  if (int rc = ParseCommandLine(app, args, "pipeline list"); rc >= 0) return rc;
  const bool as_json = h.json;
  auto db = pipeline::RunDb::Open(pipeline::RunDbPath(h.home));
  if (!db.ok()) return CommandFailed("pipeline list", db.status(), kExitBackend);
  auto runs = (*db)->ListRuns(limit);
  if (!runs.ok()) return CommandFailed("pipeline list", runs.status(), kExitBackend);
  if (as_json) {
    json j = json::array();
    for (const auto& r : *runs) j.push_back(RunJson(r));
    fmt::print("{}\n", j.dump(2));
    return kExitOk;
  }
  fmt::print("{:>5}  {:<20} {:<10} {:<19}  {}\n", "RUN", "PIPELINE", "STATE", "STARTED",
             "PARAMETERS");
  for (const auto& r : *runs) {
    std::string ps;
    for (const auto& [k, v] : r.params) ps += fmt::format("{}{}={}", ps.empty() ? "" : " ", k, v);
    fmt::print("{:>5}  {:<20} {:<10} {:<19}  {}\n", r.id, r.pipeline, pipeline::StateName(r.state),
               FormatTime(r.started_at), ps);
  }
  return kExitOk;
}

int Export(const std::vector<std::string>& args) {
  CLI::App app("Export a pipeline for a workflow engine.", "cohort pipeline export");
  std::string spec_path, format = "argo", output;
  std::vector<std::string> params;
  pipeline::ArgoOptions options;
  app.add_option("spec", spec_path, "pipeline spec (YAML)")->required();
  app.add_option("--format", format, "argo (an Argo Workflow; Kubeflow runs it too)")
      ->check(CLI::IsMember({"argo"}));
  app.add_option("-p,--param", params, "parameter KEY=VALUE (repeatable)");
  app.add_option("--image", options.image, "container image of the steps (default cohort:latest)");
  app.add_option("--service-account", options.service_account, "the workflow's service account");
  app.add_flag("--rbac", options.rbac,
               "also write the ServiceAccount, Role and RoleBinding the steps need to submit "
               "jobs to Kubernetes (service account <pipeline>-cohort unless named)");
  app.add_option("--workspace-claim", options.workspace_claim,
                 "a PersistentVolumeClaim mounted in every step (overrides workspace.claim)");
  app.add_option("--workspace-path", options.workspace_path,
                 "where the workspace is mounted (default /workspace)");
  app.add_option("-o,--output", output, "write to this file (default: stdout)");
  if (int rc = ParseCommandLine(app, args, "pipeline export"); rc >= 0) return rc;
  Loaded l;
  if (int rc = LoadAndValidate("export", spec_path, params, false, &l); rc >= 0) return rc;
  if (!options.workspace_path.empty() && options.workspace_path[0] != '/') {
    fmt::print(stderr, "cohort pipeline export: --workspace-path '{}' must be absolute\n",
               options.workspace_path);
    return kExitInvalidValue;
  }
  const std::vector<std::string> submitting = pipeline::StepsSubmittingToKubernetes(l.spec);
  if (!submitting.empty() && !options.rbac && options.service_account.empty()) {
    fmt::print(stderr,
               "cohort pipeline export: note: step(s) {} submit jobs to Kubernetes from their "
               "pod: run the workflow with a service account that may (add --rbac to write "
               "one, or --service-account NAME)\n",
               fmt::join(submitting, ", "));
  }
  // The RBAC objects first (applied before the workflow uses them), then the Workflow.
  std::vector<nlohmann::json> objects = pipeline::ArgoRbacObjects(l.spec, options);
  objects.push_back(pipeline::ExportArgo(l.spec, l.params, options));
  std::string yaml;
  for (const auto& object : objects) {
    auto emitted = launch::JsonToYaml(object);
    if (!emitted.ok()) return CommandFailed("pipeline export", emitted.status(), kExitInternal);
    yaml += (yaml.empty() ? "" : "---\n") + *emitted;
  }
  if (output.empty()) {
    fmt::print("{}", yaml);
  } else {
    std::ofstream out(output);
    out << yaml;
    if (!out) {
      fmt::print(stderr, "cohort pipeline export: cannot write {}\n", output);
      return kExitInternal;
    }
  }
  return kExitOk;
}

int Validate(const std::vector<std::string>& args) {
  CLI::App app("Check a pipeline spec (and its job specs); run nothing.",
               "cohort pipeline validate");
  std::string spec_path;
  std::vector<std::string> params;
  app.add_option("spec", spec_path, "pipeline spec (YAML)")->required();
  app.add_option("-p,--param", params, "parameter KEY=VALUE (repeatable)");
  if (int rc = ParseCommandLine(app, args, "pipeline validate"); rc >= 0) return rc;
  Loaded l;
  if (int rc = LoadAndValidate("validate", spec_path, params, true, &l); rc >= 0) return rc;
  fmt::print("{}: pipeline {} is valid ({} steps)\n", spec_path, l.spec.name, l.spec.steps.size());
  return kExitOk;
}

}  // namespace

int PipelineCommand(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
    fmt::print("{}", kUsage);
    return args.empty() ? kExitUsage : kExitOk;
  }
  std::vector<std::string> rest(args.begin() + 1, args.end());
  const std::string& sub = args[0];
  if (sub == "run") return Run(rest);
  if (sub == "resume") return ResumeRun(rest);
  if (sub == "status") return Status(rest);
  if (sub == "list") return List(rest);
  if (sub == "export") return Export(rest);
  if (sub == "validate") return Validate(rest);
  fmt::print(stderr, "cohort pipeline: unknown command '{}'\n\n{}", sub, kUsage);
  return kExitUsage;
}

}  // namespace cohort::cli
