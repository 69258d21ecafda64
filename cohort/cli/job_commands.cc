// Job commands (see job_commands.h). Thread-safety: main thread only.
#include "cohort/cli/job_commands.h"

#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "cohort/base/backoff.h"
#include "cohort/base/exit_codes.h"
#include "cohort/base/file.h"
#include "cohort/base/strings.h"
#include "cohort/base/time.h"
#include "cohort/cli/cli_util.h"
#include "cohort/cli/exec_sibling.h"
#include "cohort/launch/array.h"
#include "cohort/launch/backend.h"
#include "cohort/launch/job_db.h"
#include "cohort/launch/job_spec.h"
#include "cohort/launch/local_backend.h"
#include "cohort/launch/submit.h"
#include "cohort/launch/targets.h"
#include "cohort/pipeline/condition.h"

namespace cohort::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using launch::Backend;
using launch::JobDb;
using launch::JobRecord;
using launch::JobStatus;





struct Common {
  std::string home = launch::DefaultCohortHome();
  bool json = false;
  void Add(CLI::App& app) {
    app.add_option("--home", home, "job history and local logs (default $COHORT_HOME or ~/.cohort)");
    app.add_flag("--json", json, "print JSON");
  }
  launch::BackendOptions Options() const {
    launch::BackendOptions o;
    o.home = home;
    o.cohort_bin = SiblingPath("cohort");
    return o;
  }
};

Result<std::unique_ptr<JobDb>> OpenDb(const Common& c) {
  return JobDb::Open(launch::JobDbPath(c.home));
}

Result<JobStatus> Refresh(JobDb& db, JobRecord& job, const launch::BackendOptions& options) {
  COHORT_ASSIGN_OR_RETURN(auto backend, launch::MakeBackendForJob(job, options));
  return launch::RefreshJob(db, *backend, job);
}

// A job of the history, found by id or name, and (when asked) the backend that runs it.
struct OpenedJob {
  std::unique_ptr<JobDb> db;
  JobRecord job;
  std::unique_ptr<launch::Backend> backend;
};

// -1 to go on with `out` filled, else the exit code (the error printed for `command`).
int OpenJob(const Common& c, const std::string& id, const char* command, bool with_backend,
            OpenedJob* out) {
  auto db = OpenDb(c);
  if (!db.ok()) return CommandFailed(command, db.status(), kExitBackend);
  auto job = (*db)->Find(id);
  if (!job.ok()) return CommandFailed(command, job.status(), kExitNoSuchJob);
  out->db = std::move(*db);
  out->job = std::move(*job);
  if (!with_backend) return -1;
  auto backend = launch::MakeBackendForJob(out->job, c.Options());
  if (!backend.ok()) return CommandFailed(command, backend.status(), kExitBackend);
  out->backend = std::move(*backend);
  return -1;
}

json JobJson(const JobRecord& j, const JobStatus* s) {
  json out = {{"id", j.id},           {"name", j.name},
              {"backend", j.backend}, {"state", j.state},
              {"submitted_at", j.submitted_at}, {"started_at", j.started_at},
              {"ended_at", j.ended_at}, {"log_dir", j.log_dir},
              {"backend_id", j.backend_id}, {"array_size", j.array_size},
              {"detail", j.detail}};
  out["exit_code"] = j.exit_code ? json(*j.exit_code) : json(nullptr);
  if (s) {
    json elements = json::array();
    for (const auto& e : s->elements) {
      elements.push_back({{"index", e.index},
                          {"target", e.target},
                          {"state", e.state},
                          {"exit_code", e.exit_code ? json(*e.exit_code) : json(nullptr)},
                          {"log_dir", e.log_dir},
                          {"detail", e.detail}});
    }
    out["elements"] = elements;
  }
  return out;
}

void PrintStatus(const JobRecord& j, const JobStatus& s) {
  std::string exit = j.exit_code ? fmt::format(", exit {}", *j.exit_code) : "";
  fmt::print("job {} {} ({}): {}{}\n", j.id, j.name, j.backend, j.state, exit);
  fmt::print("  submitted {}", FormatTime(j.submitted_at));
  if (j.started_at > 0) fmt::print(", started {}", FormatTime(j.started_at));
  if (j.ended_at > 0) fmt::print(", ended {}", FormatTime(j.ended_at));
  fmt::print("\n");
  if (j.backend == launch::kTargetsBackend) {
    if (!j.backend_id.empty()) fmt::print("  one job per target: {}\n", j.backend_id);
  } else if (!j.backend_id.empty()) {
    fmt::print("  {} id: {}\n", j.backend, j.backend_id);
  }
  if (!j.log_dir.empty()) fmt::print("  logs: {}\n", j.log_dir);
  if (!j.detail.empty()) fmt::print("  detail: {}\n", j.detail);
  if (s.elements.empty()) return;
  std::map<std::string, int> counts;
  for (const auto& e : s.elements) counts[e.state]++;
  std::string summary;
  for (const auto& [state, n] : counts) summary += fmt::format("{}{} {}", summary.empty() ? "" : ", ", n, state);
  fmt::print("  elements: {} ({})\n", s.elements.size(), summary);
  const bool targets = std::any_of(s.elements.begin(), s.elements.end(),
                                   [](const launch::ElementRecord& e) { return !e.target.empty(); });
  size_t width = 6;
  for (const auto& e : s.elements) width = std::max(width, e.target.size());
  auto row = [&](const std::string& index, const std::string& target, const std::string& state,
                 const std::string& exit, const std::string& detail) {
    fmt::print("  {:>6}  {}{:<10} {:>5}  {}\n", index,
               targets ? fmt::format("{:<{}}  ", target, width) : "", state, exit, detail);
  };
  row("INDEX", "TARGET", "STATE", "EXIT", "DETAIL");
  for (const auto& e : s.elements) {
    row(std::to_string(e.index), e.target, e.state,
        e.exit_code ? std::to_string(*e.exit_code) : "-", e.detail);
  }
}

int JobExitCode(const std::string& state) {
  if (state == "succeeded") return kExitOk;
  if (state == "cancelled") return kExitJobCancelled;
  return kExitWorkerFailed;
}

// Polls until the job reaches a final state; prints each new state once.
int WaitForEnd(JobDb& db, JobRecord& job, const launch::BackendOptions& options, bool quiet) {
  auto backend = launch::MakeBackendForJob(job, options);
  if (!backend.ok()) {
    fmt::print(stderr, "cohort: {}\n", backend.status().message());
    return kExitBackend;
  }
  std::string last;
  // Polling an external engine: no event to wait on.
  Backoff poll(std::chrono::milliseconds(100), std::chrono::milliseconds(1000));
  for (;;) {
    auto s = launch::RefreshJob(db, **backend, job);
    if (!s.ok()) {
      fmt::print(stderr, "cohort: cannot read the state of job {}: {}\n", job.id,
                 s.status().message());
      return kExitBackend;
    }
    if (s->state != last && !quiet) {
      fmt::print("job {}: {}\n", job.id, s->state);
      std::fflush(stdout);
      last = s->state;
    }
    if (launch::IsFinalState(s->state)) {
      if (!quiet) PrintStatus(job, *s);
      return JobExitCode(s->state);
    }
    poll.Sleep();
  }
}

// The spec at `path` with its pipeline templates filled in from `--set` values: KEY=VALUE
// fills {{params.KEY}}, steps.S.outputs.O=VALUE fills {{steps.S.outputs.O}}. A template
// left without value is a problem naming the --set that fills it; so is a --set that fills
// no template of the spec (a typo would otherwise be ignored).
Result<std::string> FillTemplates(const std::string& spec_text, const std::string& path,
                                  const std::vector<std::string>& sets, bool unused_ok,
                                  std::vector<launch::Problem>* problems) {
  std::map<std::string, std::string> values, flag_of;
  for (const std::string& set : sets) {
    const size_t eq = set.find('=');
    if (eq == std::string::npos || eq == 0) {
      problems->push_back({"--set " + set, "is not KEY=VALUE (e.g. --set lr=0.1)"});
      continue;
    }
    std::string key = set.substr(0, eq);
    if (!StartsWith(key, "params.") && !StartsWith(key, "steps.")) key = "params." + key;
    values[key] = set.substr(eq + 1);
    flag_of[key] = set.substr(0, eq);
  }
  std::set<std::string> missing, used, templates;
  auto text = pipeline::SubstituteTemplatesInYaml(spec_text, [&](const pipeline::Ref& ref)
                                                              -> Result<std::string> {
    templates.insert("{{" + ref.ToString() + "}}");
    auto it = values.find(ref.ToString());
    if (it != values.end()) {
      used.insert(it->first);
      return it->second;
    }
    missing.insert(ref.ToString());
    return "{{" + ref.ToString() + "}}";
  });
  if (!text.ok()) {  // a malformed template
    problems->push_back({path, text.status().message()});
    return spec_text;
  }
  for (const auto& [key, flag] : flag_of) {
    if (used.count(key) || unused_ok) continue;
    problems->push_back(
        {"--set " + flag,
         templates.empty()
             ? fmt::format("{} has no template to fill (no {{{{{}}}}} in it)", path, key)
             : fmt::format("{} has no {{{{{}}}}} to fill; its templates: {}", path, key,
                           fmt::join(templates, ", "))});
  }
  for (const std::string& name : missing) {
    const std::string flag = StartsWith(name, "params.") ? name.substr(7) : name;
    problems->push_back({path, fmt::format("{{{{{}}}}} has no value: pass --set {}=VALUE (`cohort "
                                           "pipeline run` fills it from the pipeline)",
                                           name, flag)});
  }
  return text;
}

struct SubmitFlags {
  std::string spec_path, backend_name, array, manifest, sql, db_url;
  // The one-line submit: `cohort submit [flags] -- PROGRAM ARGS...` (no spec file).
  std::vector<std::string> command;
  std::string nnodes = "1", image, name;
  int nproc_per_node = 1, gpu = 0;
  std::string kube_flavor = "pytorchjob";
  std::string image_cohort = "cohort";
  std::vector<std::string> manifest_columns, sets;
  int concurrency = 0;
  bool dry_run = false, wait = false;
  bool set_unused_ok = false;  // (the Argo export, for a spec it could not read)
};

void AddSubmitFlags(CLI::App& app, SubmitFlags& f) {
  app.add_option("spec", f.spec_path,
                 "job spec (YAML); or none, and the program after --: "
                 "cohort submit --nnodes 2 --nproc-per-node 4 -- train.py --epochs 3");
  app.add_option("--nnodes", f.nnodes, "one-line submit: nodes, N or MIN:MAX (default 1)");
  app.add_option("--nproc-per-node", f.nproc_per_node,
                 "one-line submit: workers per node (default 1)")
      ->check(CLI::PositiveNumber);
  app.add_option("--image", f.image, "one-line submit: the container image (kubernetes)");
  app.add_option("--gpu", f.gpu, "one-line submit: GPUs per node")->check(CLI::NonNegativeNumber);
  app.add_option("--name", f.name, "one-line submit: the job's name (default: the program's)");
  app.add_option("--backend", f.backend_name, "local (default), slurm or kubernetes")
      ->envname("COHORT_BACKEND");
  app.add_option("--array", f.array, "array over a range: 0-99 or 0-98:2");
  app.add_option("--array-manifest", f.manifest, "array over the rows of a CSV file");
  app.add_option("--array-manifest-columns", f.manifest_columns,
                 "the manifest has no header row: these name its columns (a,b,...)")
      ->delimiter(',');
  app.add_option("--array-from-sql", f.sql, "array over the rows of a SELECT");
  // One value per --set (never the spec after it: the spec is no longer a required
  // positional that CLI11 would keep back).
  app.add_option("--set", f.sets,
                 "fill a template of the spec: KEY=VALUE for {{params.KEY}}, "
                 "steps.S.outputs.O=VALUE for a step output (repeatable)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->allow_extra_args(false);
  app.add_flag("--set-unused-ok", f.set_unused_ok)->group("");  // hidden
  app.add_option("--db", f.db_url,
                 "database of --array-from-sql: sqlite:///path or postgresql://...");
  app.add_option("--concurrency", f.concurrency, "array elements running at once")
      ->check(CLI::PositiveNumber);
  app.add_option("--kube-flavor", f.kube_flavor, "pytorchjob (default), volcano or indexed");
  app.add_option("--cohort-in-image", f.image_cohort,
                 "kubernetes: the cohort binary inside the image (default: cohort, on PATH)");
  app.add_flag("--dry-run", f.dry_run, "print what would be submitted; submit nothing");
  app.add_flag("--wait", f.wait, "wait for the end; exit 0 succeeded, 1 failed, 9 cancelled");
}

// The array flags override the spec (flag > env > spec > default): a source given on the
// command line replaces the spec's source as a whole (its range, manifest and columns,
// query; the database only when the new source is not a query), keeping how elements run
// (concurrency, target_by). A --backend beside targets is refused.
void ApplySubmitFlags(const SubmitFlags& f, launch::JobSpec* spec,
                      std::vector<launch::Problem>* problems) {
  const int array_flags = !f.array.empty() + !f.manifest.empty() + !f.sql.empty();
  if (array_flags > 1) {
    problems->push_back({"--array/--array-manifest/--array-from-sql", "give only one"});
  } else if (array_flags == 1) {
    launch::ArraySource replaced;
    replaced.range = f.array;
    replaced.manifest = f.manifest.empty() ? "" : fs::absolute(f.manifest).string();
    replaced.from_sql = f.sql;
    if (!f.sql.empty()) replaced.db = spec->array.db;
    replaced.concurrency = spec->array.concurrency;
    replaced.target_by = spec->array.target_by;
    spec->array = std::move(replaced);
  }
  if (!f.db_url.empty()) spec->array.db = f.db_url;
  if (!f.sql.empty() && spec->array.db.empty()) {
    problems->push_back({"--db", "required with --array-from-sql (sqlite:///path.db or "
                                 "postgresql://user@host/db)"});
  }
  if (f.concurrency > 0) spec->array.concurrency = f.concurrency;
  if (!f.manifest_columns.empty()) {
    if (spec->array.manifest.empty()) {
      problems->push_back({"--array-manifest-columns", "only used with a manifest "
                                                       "(--array-manifest or array.manifest)"});
    }
    spec->array.columns = f.manifest_columns;
  }
  // A spec with targets sends each element where its target says; a --backend too would
  // be ignored, so it is refused.
  if (!spec->targets.empty() && !f.backend_name.empty() &&
      f.backend_name != launch::kTargetsBackend) {
    problems->push_back({"--backend", fmt::format("the spec's targets choose the backends of "
                                                  "its elements; leave out --backend {}",
                                                  f.backend_name)});
  }
}

// The spec of a one-line submit, as YAML: the program after `--` and the flags, checked
// like a spec file (a problem names the flag).
std::string OneLineSpecYaml(const SubmitFlags& f, std::vector<launch::Problem>* problems) {
  launch::JobSpec spec;
  spec.entrypoint = f.command[0];
  spec.args.assign(f.command.begin() + 1, f.command.end());
  spec.image = f.image;
  spec.nproc_per_node = f.nproc_per_node;
  spec.resources.gpu = f.gpu;
  if (auto range = launch::ParseNnodesText(f.nnodes); !range.ok()) {
    problems->push_back({"--nnodes", range.status().message()});
  } else {
    std::tie(spec.min_nodes, spec.max_nodes) = *range;
  }
  spec.name = f.name;
  if (spec.name.empty()) {  // the program's name as a DNS label: train.py -> train
    std::string stem = fs::path(f.command[0]).stem().string();
    for (char& ch : stem) {
      ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '-';
    }
    const size_t first = stem.find_first_not_of('-');
    stem = first == std::string::npos ? "" : stem.substr(first, 63);
    while (!stem.empty() && stem.back() == '-') stem.pop_back();
    spec.name = stem.empty() ? "job" : stem;
  }
  return launch::JobSpecToYaml(spec);
}

void PrintSubmitted(const JobRecord& job, bool json, bool wait) {
  if (json) {
    fmt::print("{}\n", JobJson(job, nullptr).dump());
  } else {
    fmt::print("submitted job {} ({}) to {}{}{}\n", job.id, job.name, job.backend,
               job.array_size ? fmt::format(", {} elements", job.array_size) : "",
               job.backend_id.empty() ? "" : fmt::format(" [{}]", job.backend_id));
    if (!wait) {
      fmt::print("  cohort status {}   cohort logs {}   cohort cancel {}\n", job.id, job.id,
                 job.id);
    }
  }
  std::fflush(stdout);
}

}  // namespace

namespace {

// The form of a submit: a spec file or a program after `--`, not both; the one-liner's flags
// only with a program; a program where the spec goes refused as one. -1 to go on.
int CheckSubmitForm(const CLI::App& app, const SubmitFlags& f) {
  const bool one_line = !f.command.empty();
  if (one_line == !f.spec_path.empty()) {
    fmt::print(stderr, "cohort submit: give a job spec (cohort submit job.yaml) or a program "
                       "after -- (cohort submit --nnodes 2 --nproc-per-node 4 -- train.py), "
                       "{}\n", one_line ? "not both" : "one of them");
    return kExitUsage;
  }
  for (const char* flag : {"--nnodes", "--nproc-per-node", "--image", "--gpu", "--name"}) {
    if (!one_line && app.count(flag) > 0) {
      fmt::print(stderr, "cohort submit: {} is for a one-line submit (a program after --); "
                         "with a job spec, set it in the spec\n", flag);
      return kExitUsage;
    }
  }
  if (one_line || EndsWith(f.spec_path, ".yaml") || EndsWith(f.spec_path, ".yml") ||
      EndsWith(f.spec_path, ".json")) {
    return -1;
  }
  const std::string ext = fs::path(f.spec_path).extension().string();
  if (ext == ".py" || ext == ".sh" || ext == ".ipynb" ||
      (ext.empty() && ::access(f.spec_path.c_str(), X_OK) == 0)) {
    fmt::print(stderr,
               "cohort submit: {} is a program, not a job spec (YAML): submit it in one line, "
               "e.g. cohort submit --nnodes 2 --nproc-per-node 4 -- {} ARGS (add --dry-run "
               "to see the spec, --backend to choose where it runs)\n",
               f.spec_path, f.spec_path);
    return kExitInvalidSpec;
  }
  return -1;
}

// A submit on its way: the spec as the backend runs it, its elements, every problem.
struct PreparedSubmit {
  std::string source;  // the spec's path, or "the command line"
  std::string base;    // where relative paths start
  bool parsed = false;
  bool overridden = false;
  launch::JobSpec spec;
  std::string backend_name;
  launch::BackendOptions options;
  std::unique_ptr<launch::Backend> backend;
  std::vector<launch::ArrayElement> elements;
  std::vector<launch::Problem> problems;
};

// 1. The spec (the file, or built from the command line), its templates filled, the flags
// applied, validated again as it will be stored. -1 to go on.
int ReadSubmittedSpec(const SubmitFlags& f, PreparedSubmit* p) {
  const bool one_line = !f.command.empty();
  p->source = one_line ? "the command line" : f.spec_path;
  p->base = one_line ? fs::current_path().string()
                     : fs::absolute(f.spec_path).parent_path().string();
  Result<std::string> read = one_line ? Result<std::string>(OneLineSpecYaml(f, &p->problems))
                                      : ReadFileToString(f.spec_path);
  if (!read.ok()) {
    return CommandFailed("submit", read.status().WithContext("the job spec"), kExitInvalidSpec);
  }
  auto text = FillTemplates(*read, p->source, f.sets, f.set_unused_ok, &p->problems);
  if (!text.ok()) return CommandFailed("submit", text.status(), kExitInvalidSpec);
  p->parsed = p->problems.empty();  // (a template left unfilled: not parsed)
  if (p->parsed) p->spec = launch::ParseJobSpec(*text, &p->problems);
  ApplySubmitFlags(f, &p->spec, &p->problems);
  // Validated as the job that will run: the spec as it is stored, flags applied (the
  // runner and `cohort status` read that record).
  if (p->problems.empty()) {
    std::vector<launch::Problem> stored;
    (void)launch::ParseJobSpec(launch::JobSpecToYaml(p->spec), &stored);
    for (launch::Problem& problem : stored) {
      problem.what += " (in the spec with the command line's flags applied)";
      p->problems.push_back(std::move(problem));
    }
  }
  return -1;
}

// 2. The backend: pods run the image's cohort; local and Slurm nodes run this very binary
// (Slurm nodes share the file system with the submit host). The spec as it runs there: its
// override merged (targets: each target's when its share is made; every one checked here).
int ChooseSubmitBackend(const Common& c, const SubmitFlags& f, PreparedSubmit* p) {
  p->backend_name = launch::BackendOfSpec(p->spec, f.backend_name);
  if (p->backend_name.empty()) p->backend_name = "local";
  p->options = c.Options();
  p->options.kube_flavor = f.kube_flavor;
  p->options.dry_run = f.dry_run;
  p->options.cohort_in_image = f.image_cohort;
  if (p->backend_name == "kubernetes" || p->backend_name == "k8s") {
    p->options.cohort_bin = f.image_cohort;
  }
  auto backend = launch::MakeBackend(p->backend_name, p->options);
  if (!backend.ok()) return CommandFailed("submit", backend.status(), kExitUsage);
  p->backend = std::move(*backend);
  p->overridden = !p->spec.overrides.empty();
  if (p->backend_name == launch::kTargetsBackend) {
    for (const auto& [name, text] : p->spec.overrides) {
      launch::SpecForBackend(p->spec, name, &p->problems);
    }
  } else {
    p->spec = launch::SpecForBackend(p->spec, p->backend_name, &p->problems);
  }
  if (launch::SharesSubmitHostFiles(p->spec, p->backend_name)) {
    launch::ResolveEntrypointPath(&p->spec, p->base);
  }
  return -1;
}

// 3. The elements, validated by the backend. What the backend finds (resources this
// machine or partition lacks) joins the spec's own problems, in one answer (a field
// already named is not named twice).
void ExpandAndValidate(PreparedSubmit* p) {
  if (!p->parsed) return;
  std::vector<std::string> notes;
  std::vector<launch::Problem> more;
  p->elements = launch::ExpandArray(p->spec.array, p->base, &more, &notes);
  for (const std::string& note : notes) fmt::print(stderr, "cohort submit: note: {}\n", note);
  if (more.empty()) p->backend->Validate(p->spec, p->elements, &more);
  std::set<std::string> named;
  for (const launch::Problem& problem : p->problems) named.insert(problem.where);
  for (launch::Problem& problem : more) {
    if (!named.count(problem.where)) p->problems.push_back(std::move(problem));
  }
}

// --dry-run: the spec when it was built or merged here (to keep), then the rendering.
int PrintDryRun(const SubmitFlags& f, const PreparedSubmit& p) {
  auto rendered = p.backend->Render(p.spec, p.elements);
  if (!rendered.ok()) return CommandFailed("submit", rendered.status(), kExitBackend);
  if (!f.command.empty()) {
    fmt::print("# The job spec built from the command line (save it, e.g. as job.yaml, and "
               "`cohort submit job.yaml`):\n{}\n# What would be submitted:\n",
               launch::JobSpecToYaml(p.spec));
  } else if (p.overridden && p.backend_name != launch::kTargetsBackend) {
    fmt::print("# The job spec for {} (overrides.{} merged):\n{}\n# What would be "
               "submitted:\n",
               p.backend_name, p.backend_name == "k8s" ? "kubernetes" : p.backend_name,
               launch::JobSpecToYaml(p.spec));
  }
  fmt::print("{}", *rendered);
  return kExitOk;
}

}  // namespace

int SubmitCommand(const std::vector<std::string>& args) {
  CLI::App app("Submit a job spec to a backend.", "cohort submit");
  Common c;
  c.Add(app);
  SubmitFlags f;
  AddSubmitFlags(app, f);
  // Everything after `--` is the program of a one-line submit, never cohort's flags.
  const auto dash = std::find(args.begin(), args.end(), "--");
  if (int rc = ParseCommandLine(app, std::vector<std::string>(args.begin(), dash), "submit");
      rc >= 0) {
    return rc;
  }
  if (dash != args.end()) f.command.assign(dash + 1, args.end());
  if (int rc = CheckSubmitForm(app, f); rc >= 0) return rc;

  PreparedSubmit p;
  if (int rc = ReadSubmittedSpec(f, &p); rc >= 0) return rc;
  if (int rc = ChooseSubmitBackend(c, f, &p); rc >= 0) return rc;
  ExpandAndValidate(&p);
  if (!p.problems.empty()) {  // nothing is submitted with a problem
    fmt::print(stderr, "cohort submit: {}: {} problem(s); nothing was submitted:\n{}", p.source,
               p.problems.size(), launch::FormatProblems(p.problems));
    return kExitInvalidSpec;
  }
  if (f.dry_run) return PrintDryRun(f, p);

  // 4. Submit and record; wait when asked.
  auto db = OpenDb(c);
  if (!db.ok()) return CommandFailed("submit", db.status(), kExitBackend);
  auto submitted = launch::SubmitJob(**db, *p.backend, p.spec, p.elements, c.home);
  if (!submitted.ok()) return CommandFailed("submit", submitted.status(), kExitBackend);
  PrintSubmitted(*submitted, c.json, f.wait);
  if (!f.wait) return kExitOk;
  return WaitForEnd(**db, *submitted, p.options, c.json);
}

int StatusCommand(const std::vector<std::string>& args) {
  CLI::App app("Show a job's state (and its array elements).", "cohort status");
  Common c;
  c.Add(app);
  std::string id;
  bool wait = false;
  app.add_option("job", id, "job id or name (default: list recent jobs)");
  app.add_flag("--wait", wait, "wait until the job ends");
  if (int rc = ParseCommandLine(app, args, "status"); rc >= 0) return rc;
  if (id.empty()) return ListCommand(args);
  OpenedJob o;
  if (int rc = OpenJob(c, id, "status", /*with_backend=*/false, &o); rc >= 0) return rc;
  JobRecord& job = o.job;
  if (wait) return WaitForEnd(*o.db, job, c.Options(), c.json);
  auto s = Refresh(*o.db, job, c.Options());
  if (!s.ok()) {
    fmt::print(stderr, "cohort status: job {}: {}\n", job.id, s.status().message());
    return kExitBackend;
  }
  if (c.json) {
    fmt::print("{}\n", JobJson(job, &*s).dump(1));
  } else {
    PrintStatus(job, *s);
  }
  return kExitOk;
}

int ListCommand(const std::vector<std::string>& args) {
  CLI::App app("List recent jobs.", "cohort list");
  Common c;
  c.Add(app);
  int limit = 50;
  std::string ignored;
  app.add_option("--limit", limit, "how many (newest first)");
  app.add_option("job", ignored)->group("");  // `cohort status` without a job comes here
  app.allow_extras();
  if (int rc = ParseCommandLine(app, args, "list"); rc >= 0) return rc;
  auto db = OpenDb(c);
  if (!db.ok()) return CommandFailed("list", db.status(), kExitBackend);
  auto jobs = (*db)->List(limit);
  if (!jobs.ok()) return CommandFailed("list", jobs.status(), kExitBackend);
  json out = json::array();
  if (!c.json) {
    fmt::print("{:>5}  {:<24} {:<11} {:<10} {:>5} {:>9}  {}\n", "ID", "NAME", "BACKEND", "STATE",
               "EXIT", "ELEMENTS", "SUBMITTED");
  }
  for (auto& j : *jobs) {
    if (!launch::IsFinalState(j.state)) (void)Refresh(**db, j, c.Options());
    if (c.json) {
      out.push_back(JobJson(j, nullptr));
      continue;
    }
    fmt::print("{:>5}  {:<24} {:<11} {:<10} {:>5} {:>9}  {}\n", j.id, j.name, j.backend, j.state,
               j.exit_code ? std::to_string(*j.exit_code) : "-",
               j.array_size ? std::to_string(j.array_size) : "-", FormatTime(j.submitted_at));
  }
  if (c.json) fmt::print("{}\n", out.dump(1));
  return kExitOk;
}

int LogsCommand(const std::vector<std::string>& args) {
  CLI::App app("Print a job's log.", "cohort logs");
  Common c;
  c.Add(app);
  std::string id;
  int element = -1, rank = -1;
  bool follow = false;
  app.add_option("job", id, "job id or name")->required();
  app.add_option("--element", element, "array element");
  app.add_option("--rank", rank, "one worker's log (default: the whole console)");
  app.add_flag("-f,--follow", follow, "keep printing until the job ends");
  if (int rc = ParseCommandLine(app, args, "logs"); rc >= 0) return rc;
  OpenedJob o;
  if (int rc = OpenJob(c, id, "logs", /*with_backend=*/true, &o); rc >= 0) return rc;
  if (launch::NeverSubmitted(o.job)) {  // the engine knows nothing of it: no logs anywhere
    fmt::print(stderr, "cohort logs: job {} has no logs: it was never submitted ({})\n",
               o.job.id, o.job.detail);
    return kExitNoSuchJob;
  }
  std::ifstream in;
  std::string path;
  Backoff poll(std::chrono::milliseconds(100), std::chrono::milliseconds(500));
  for (;;) {
    if (!in.is_open()) {
      auto p = o.backend->LogPath(o.job, element, rank);
      if (!p.ok() && (!follow || p.status().code() != StatusCode::kNotFound)) {
        fmt::print(stderr, "cohort logs: {}\n", p.status().message());
        return p.status().code() == StatusCode::kInvalidArgument ? kExitUsage : kExitNoSuchJob;
      }
      if (p.ok()) {
        path = *p;
        in.open(path);
        if (!in && !follow) {
          fmt::print(stderr, "cohort logs: no log at {} (yet)\n", path);
          return kExitNoSuchJob;
        }
      }
    }
    std::string line;
    while (in.is_open() && std::getline(in, line)) {
      if (in.eof()) {  // a partial last line: print it when it is complete
        in.clear();
        in.seekg(-static_cast<std::streamoff>(line.size()), std::ios::cur);
        break;
      }
      fmt::print("{}\n", line);
    }
    in.clear();
    std::fflush(stdout);
    if (!follow) return kExitOk;
    auto s = launch::RefreshJob(*o.db, *o.backend, o.job);
    if (s.ok() && launch::IsFinalState(s->state)) {
      // One more pass for what the job wrote before it ended.
      while (in.is_open() && std::getline(in, line)) fmt::print("{}\n", line);
      return kExitOk;
    }
    poll.Sleep();  // following a file: poll like tail -f
  }
}

namespace {

const launch::ElementRecord* FindElement(const JobStatus& s, int index) {
  for (const auto& e : s.elements) {
    if (e.index == index) return &e;
  }
  return nullptr;
}

// After a cancel: polls the backend (no event to wait on) until the job, or its element
// `element` (>= 0), reaches a final state or `timeout` passes. Whether it ended, and the
// last state seen ("unknown" when it could not be read).
std::pair<bool, std::string> PollUntilEnded(OpenedJob& o, int element, double timeout) {
  Backoff poll(std::chrono::milliseconds(50), std::chrono::milliseconds(500),
               Deadline::After(std::chrono::duration_cast<Duration>(
                   std::chrono::duration<double>(timeout))));
  for (;;) {
    auto s = launch::RefreshJob(*o.db, *o.backend, o.job);
    const launch::ElementRecord* e = s.ok() && element >= 0 ? FindElement(*s, element) : nullptr;
    const std::string state = !s.ok() ? "unknown"
                              : element < 0 ? s->state
                              : e != nullptr ? e->state
                                             : "unknown";
    if (launch::IsFinalState(state)) return {true, state};
    if (!poll.Sleep()) return {false, state};
  }
}

// `cohort cancel JOB --element I`: stops one element, waits (until `timeout`) for it to end.
int CancelOneElement(OpenedJob& o, int element, double timeout) {
  JobRecord& job = o.job;
  if (job.array_size == 0) {
    fmt::print(stderr, "cohort cancel: job {} is not an array; leave out --element\n", job.id);
    return kExitUsage;
  }
  if (element >= job.array_size) {
    fmt::print(stderr, "cohort cancel: job {} has elements 0..{}, not {}\n", job.id,
               job.array_size - 1, element);
    return kExitInvalidValue;
  }
  auto before = launch::RefreshJob(*o.db, *o.backend, job);
  const launch::ElementRecord* e = before.ok() ? FindElement(*before, element) : nullptr;
  if (e != nullptr && launch::IsFinalState(e->state)) {
    fmt::print(stderr, "cohort cancel: element {} of job {} already ended ({})\n", element,
               job.id, e->state);
    return kExitInvalidValue;
  }
  if (Status s = o.backend->CancelElement(job, element); !s.ok()) {
    fmt::print(stderr, "cohort cancel: job {} element {}: {}\n", job.id, element, s.message());
    return s.code() == StatusCode::kFailedPrecondition ? kExitInvalidValue : kExitBackend;
  }
  const auto [ended, state] = PollUntilEnded(o, element, timeout);
  if (!ended) {
    fmt::print(stderr, "cohort cancel: element {} of job {} asked to stop; still {} after {} s\n",
               element, job.id, state, timeout);
    return kExitBackend;
  }
  fmt::print("job {} element {}: {}\n", job.id, element, state);
  return kExitOk;
}

}  // namespace

int CancelCommand(const std::vector<std::string>& args) {
  CLI::App app("Cancel a job, or one element of an array job.", "cohort cancel");
  Common c;
  c.Add(app);
  std::string id;
  double timeout = 60;
  int element = -1;
  app.add_option("job", id, "job id or name")->required();
  app.add_option("--element", element, "stop only this element of an array (the others go on)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--timeout", timeout, "seconds to wait for the job to stop");
  if (int rc = ParseCommandLine(app, args, "cancel"); rc >= 0) return rc;
  OpenedJob o;
  if (int rc = OpenJob(c, id, "cancel", /*with_backend=*/true, &o); rc >= 0) return rc;
  if (element >= 0) return CancelOneElement(o, element, timeout);
  JobRecord& job = o.job;
  auto before = launch::RefreshJob(*o.db, *o.backend, job);
  if (before.ok() && launch::IsFinalState(before->state)) {
    fmt::print(stderr, "cohort cancel: job {} already ended ({})\n", job.id, before->state);
    return kExitInvalidValue;
  }
  if (Status s = o.backend->Cancel(job); !s.ok()) {
    fmt::print(stderr, "cohort cancel: job {}: {}\n", job.id, s.message());
    return kExitBackend;
  }
  const auto [ended, state] = PollUntilEnded(o, -1, timeout);
  if (!ended) {
    fmt::print(stderr, "cohort cancel: job {} asked to stop; still {} after {} s\n", job.id,
               state, timeout);
    return kExitBackend;
  }
  fmt::print("job {}: {}\n", job.id, state);
  return kExitOk;
}

int RunLocalJobCommand(const std::vector<std::string>& args) {
  CLI::App app("(internal) run a local job recorded in the job database.", "cohort _run-local-job");
  std::string home;
  int64_t id = 0;
  app.add_option("--home", home)->required();
  app.add_option("--job", id)->required();
  if (int rc = ParseCommandLine(app, args, "_run-local-job"); rc >= 0) return rc;
  return launch::RunLocalJob(home, id, SiblingPath("cohort"));
}

}  // namespace cohort::cli
