// `cohort submit` and `cohort _run-local-job` (see job_commands.h); status, list, logs and
// cancel are in job_view_commands.cc. Thread-safety: main thread only.
#include "cohort/cli/job_commands.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "cohort/base/exit_codes.h"
#include "cohort/base/file.h"
#include "cohort/base/strings.h"
#include "cohort/cli/cli_util.h"
#include "cohort/cli/exec_sibling.h"
#include "cohort/cli/job_commands_internal.h"
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
using launch::JobRecord;

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
int ChooseSubmitBackend(const JobCommandFlags& c, const SubmitFlags& f, PreparedSubmit* p) {
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
  JobCommandFlags c;
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
  auto db = OpenJobDb(c);
  if (!db.ok()) return CommandFailed("submit", db.status(), kExitBackend);
  auto submitted = launch::SubmitJob(**db, *p.backend, p.spec, p.elements, c.home);
  if (!submitted.ok()) return CommandFailed("submit", submitted.status(), kExitBackend);
  PrintSubmitted(*submitted, c.json, f.wait);
  if (!f.wait) return kExitOk;
  return WaitForEnd(**db, *submitted, p.options, c.json);
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
