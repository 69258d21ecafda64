// The slurm backend (see slurm_backend.h): renders the sbatch script, runs the Slurm client
// commands (sbatch, scontrol, scancel, sinfo) with their output captured and a deadline,
// and maps what they print to cohort's job states.
// Thread-safety: the free functions are pure; a backend instance is used by one thread.
#include "cohort/launch/slurm_backend.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <set>

#include "cohort/base/exit_codes.h"
#include "cohort/base/file.h"
#include "cohort/base/strings.h"
#include "cohort/base/subprocess.h"
#include "cohort/base/time.h"
#include "cohort/base/worker_env.h"
#include "cohort/launch/agent_command.h"
#include "cohort/launch/job_env.h"
#include "cohort/launch/spec_walker.h"

namespace cohort::launch {
namespace {

namespace fs = std::filesystem;

// Sbatch and scancel answer within seconds on a healthy controller; a controller that does
// not answer is reported as unreachable rather than waited on.
constexpr int64_t kCommandTimeoutMs = 60000;

// A value on an #SBATCH line. sbatch splits those lines on blanks and strips a pair of
// double quotes, so a value with blanks is written in double quotes; quotes, backslashes
// and line breaks cannot be carried at all.
Result<std::string> SbatchValue(std::string_view value, std::string_view what) {
  if (value.empty()) return InvalidArgument("{} is empty", what);
  bool plain = true;
  for (char c : value) {
    if (c == '"' || c == '\\' || c == '\n' || c == '\r') {
      return InvalidArgument(
          "{} '{}' cannot be written on an #SBATCH line (it holds a double quote, a "
          "backslash or a line break)",
          what, value);
    }
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' ||
          c == '/' || c == ':' || c == '=' || c == ',' || c == '+' || c == '@' || c == '%')) {
      plain = false;
    }
  }
  return plain ? std::string(value) : fmt::format("\"{}\"", value);
}

// Slurm expands %j, %A, %a... in --output; a literal % in the directory is written %%.
std::string EscapePercent(std::string_view path) {
  std::string out;
  for (char c : path) {
    if (c == '%') out += '%';
    out += c;
  }
  return out;
}

// Writes `text` to `path`, readable by its owner only from the start (a job script holds
// the job's environment).
Status WritePrivateFile(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus(fmt::format("cannot write {}", path), errno);
  ::fchmod(fd, 0600);  // the file may have existed with a wider mode
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return ErrnoStatus(fmt::format("cannot write {}", path), err);
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) return ErrnoStatus(fmt::format("cannot write {}", path), errno);
  return Status::Ok();
}

// The output of one Slurm client command.
struct CommandOutput : CapturedOutput {
  // The controller (or this client's configuration) is out of reach, as the client's own
  // output says: trying later, or from a configured machine, may work (kUnavailable);
  // anything else is Slurm refusing the request (kFailedPrecondition).
  bool Unreachable() const {
    const std::string& text = err.empty() ? out : err;
    return text.find("Could not establish a configuration source") != std::string::npos ||
           text.find("Unable to contact slurm controller") != std::string::npos ||
           text.find("Connection refused") != std::string::npos ||
           text.find("Socket timed out") != std::string::npos;
  }
  StatusCode FailureCode() const {
    return Unreachable() ? StatusCode::kUnavailable : StatusCode::kFailedPrecondition;
  }
  // What went wrong, in one line where Slurm's own words are a screenful.
  std::string Message() const {
    std::string text(Trim(err.empty() ? out : err));
    if (text.find("Could not establish a configuration source") != std::string::npos) {
      return "the Slurm client found no configuration: set SLURM_CONF to the cluster's "
             "slurm.conf (or install /etc/slurm/slurm.conf)";
    }
    if (text.find("Unable to contact slurm controller") != std::string::npos) {
      return "the Slurm controller does not answer (" + LastLine(text) + ")";
    }
    return text.empty() ? status.Describe() : text;
  }
  static std::string LastLine(const std::string& text) {
    auto lines = Split(text, '\n');
    return lines.empty() ? text : std::string(Trim(lines.back()));
  }
};

// Runs a Slurm client command with stdout/stderr captured, killed at the deadline.
Result<CommandOutput> RunCommand(const std::vector<std::string>& argv,
                                 const std::vector<std::pair<std::string, std::string>>& env,
                                 Deadline deadline) {
  auto r = RunAndCapture(argv, MergeEnvironment(env), "", deadline);
  if (r.ok()) return CommandOutput{std::move(*r)};
  if (r.status().code() == StatusCode::kDeadlineExceeded) {
    return DeadlineExceeded("{} did not answer within {} s", fmt::join(argv, " "),
                            kCommandTimeoutMs / 1000);
  }
  return Status(r.status().code() == StatusCode::kNotFound ? StatusCode::kUnavailable
                                                           : r.status().code(),
                fmt::format("cannot run {}: {} (is the Slurm client installed here?)", argv[0],
                            r.status().message()));
}

class SlurmBackend final : public Backend {
 public:
  explicit SlurmBackend(BackendOptions options) : options_(std::move(options)) {
    if (options_.cohort_bin.empty()) options_.cohort_bin = "cohort";
    if (options_.cohort_bin.find('/') != std::string::npos) {
      std::error_code ec;
      fs::path abs = fs::absolute(options_.cohort_bin, ec);
      if (!ec) options_.cohort_bin = abs.string();
    }
  }

  std::string name() const override { return "slurm"; }

  void Validate(const JobSpec& spec, const std::vector<ArrayElement>& elements,
                std::vector<Problem>* problems) override {
    slurm::CheckSpec(spec, problems);
    for (const ArrayElement& e : elements) {
      for (const auto& [k, v] : e.env) {
        if (!IsEnvName(k)) {
          problems->push_back({fmt::format("array element {}", e.index),
                               fmt::format("'{}' is not an environment variable name", k)});
        }
      }
    }
    auto sinfo = RunCommand(WithCluster({"sinfo", "-h", "-o", "%P %D %c %m %G"}), {},
                            Deadline::AfterMs(kCommandTimeoutMs));
    if (!sinfo.ok() || !sinfo->status.success()) {
      const std::string why = sinfo.ok() ? sinfo->Message() : sinfo.status().message();
      if (options_.dry_run) {
        // A preview needs no Slurm: the script says what was not checked.
        unchecked_ = fmt::format("not checked against Slurm's partitions (sinfo failed: {})",
                                 std::string(Trim(why)));
        return;
      }
      problems->push_back(
          {"", fmt::format("Slurm is unreachable from this machine: sinfo failed: {} "
                           "(`cohort submit --dry-run` previews the batch script without Slurm)",
                           why)});
      return;
    }
    slurm::CheckAgainstPartitions(spec, slurm::ParseSinfo(sinfo->out), problems);
  }

  Result<std::string> Render(const JobSpec& spec,
                             const std::vector<ArrayElement>& elements) override {
    // The log directory is only known once the job is recorded; show where it will be.
    COHORT_ASSIGN_OR_RETURN(std::string script, Script(spec, elements, options_.home + "/logs/<id>"));
    if (unchecked_.empty()) return script;
    const size_t shebang = script.find('\n') + 1;
    return script.insert(shebang, "# cohort: " + unchecked_ + "\n");
  }

  Result<std::string> Submit(const JobRecord& job, const JobSpec& spec,
                             const std::vector<ArrayElement>& elements) override {
    COHORT_ASSIGN_OR_RETURN(std::string script, Script(spec, elements, job.log_dir));
    std::error_code ec;
    fs::create_directories(job.log_dir, ec);
    if (ec) return Unavailable("cannot create {}: {}", job.log_dir, ec.message());
    const std::string path = job.log_dir + "/job.sbatch";
    COHORT_RETURN_IF_ERROR(WritePrivateFile(path, script));
    COHORT_ASSIGN_OR_RETURN(CommandOutput r, RunCommand(WithCluster({"sbatch", "--parsable", path}),
                                                        {{kEnvJobId, std::to_string(job.id)},
                                                         {kEnvJobName, job.name}},
                                                        Deadline::AfterMs(kCommandTimeoutMs)));
    if (!r.status.success()) {
      const std::string why = r.Message();
      return Status(r.FailureCode(), fmt::format("sbatch {}: {}", path, why));
    }
    // --parsable prints "<id>" or "<id>;<cluster>".
    std::string id(Trim(r.out.substr(0, r.out.find(';'))));
    if (!ParseInt64(id)) {
      return Internal("sbatch printed '{}' instead of a job id", std::string(Trim(r.out)));
    }
    return id;
  }

  Result<JobStatus> Poll(const JobRecord& job) override {
    if (job.backend_id.empty()) return FailedPrecondition("job {} has no Slurm job id", job.id);
    COHORT_ASSIGN_OR_RETURN(CommandOutput r,
                            RunCommand(WithCluster({"scontrol", "show", "job", "-o", job.backend_id}), {},
                                       Deadline::AfterMs(kCommandTimeoutMs)));
    JobStatus s;
    if (r.status.success()) {
      s = slurm::StatusFromRecords(slurm::ParseScontrolRecords(r.out), job.array_size);
    } else if (r.Message().find("Invalid job id") == std::string::npos) {
      return Unavailable("scontrol show job {}: {}", job.backend_id, r.Message());
    }
    // Whatever scontrol did not report (the job, or elements, already purged from the
    // controller) comes from the files the job left.
    if (job.array_size == 0) {
      if (s.state == JobState::kUnknown) {
        ElementRecord e = slurm::StatusFromFiles(job.log_dir, job.backend_id);
        s.state = e.state;
        s.exit_code = e.exit_code;
        s.detail = e.detail;
      }
      return s;
    }
    if (s.elements.size() != static_cast<size_t>(job.array_size)) {
      s.elements.assign(static_cast<size_t>(job.array_size), ElementRecord{});
      for (ElementRecord& e : s.elements) e.state = JobState::kUnknown;  // nothing reported yet
    }
    for (int i = 0; i < job.array_size; ++i) {
      ElementRecord& e = s.elements[static_cast<size_t>(i)];
      e.index = i;
      if (e.state == JobState::kUnknown) {
        e = slurm::StatusFromFiles(job.log_dir, fmt::format("{}_{}", job.backend_id, i));
        e.index = i;
      }
      e.log_dir = fmt::format("{}/{}", job.log_dir, i);
    }
    slurm::AggregateElements(&s);
    return s;
  }

  Status Cancel(const JobRecord& job) override {
    if (job.backend_id.empty()) return FailedPrecondition("job {} has no Slurm job id", job.id);
    return Scancel(job.backend_id);
  }

  // One task of the Slurm array: scancel <id>_<index>.
  Status CancelElement(const JobRecord& job, int element) override {
    if (job.backend_id.empty()) return FailedPrecondition("job {} has no Slurm job id", job.id);
    return Scancel(fmt::format("{}_{}", job.backend_id, element));
  }

  Status Scancel(const std::string& id) {
    COHORT_ASSIGN_OR_RETURN(CommandOutput r, RunCommand(WithCluster({"scancel", id}), {},
                                                        Deadline::AfterMs(kCommandTimeoutMs)));
    const std::string why = r.Message();
    // scancel exits 0 even for some refusals; it says so on stderr.
    if (r.status.success() && Trim(r.err).empty()) return Status::Ok();
    if (why.find("Invalid job id") != std::string::npos) {
      return NotFound("Slurm does not know job {} (already finished and purged?)", id);
    }
    if (why.find("already completing or completed") != std::string::npos) {
      return FailedPrecondition("Slurm job {} has already ended", id);
    }
    if (r.status.success()) return Status::Ok();
    return Status(r.FailureCode(), fmt::format("scancel {}: {}", id, why));
  }

  Result<std::string> LogPath(const JobRecord& job, int element, int rank) override {
    if (job.array_size > 0 && element < 0) {
      return InvalidArgument("job {} is an array of {} elements: choose one with --element", job.id,
                             job.array_size);
    }
    if (job.array_size > 0 && element >= job.array_size) {
      return InvalidArgument("job {} has elements 0..{}", job.id, job.array_size - 1);
    }
    if (job.array_size == 0 && element >= 0) {
      return InvalidArgument("job {} is not an array; leave out --element", job.id);
    }
    if (job.backend_id.empty()) return NotFound("job {} was never submitted to Slurm", job.id);
    if (rank < 0) return slurm::OutputPath(job.log_dir, job.backend_id, element);
    // The newest attempt's log of that rank: <unit>/ranks/<run-id>/attempt_<k>/<rank>/.
    const std::string unit =
        job.log_dir + "/" + (element < 0 ? std::string("job") : std::to_string(element));
    std::string best;
    int best_attempt = -1;
    std::error_code ec;
    for (const auto& run : fs::directory_iterator(unit + "/ranks", ec)) {
      std::error_code ec2;
      for (const auto& attempt : fs::directory_iterator(run.path(), ec2)) {
        const std::string name = attempt.path().filename().string();
        if (!StartsWith(name, "attempt_")) continue;
        int k = static_cast<int>(ParseInt64(name.substr(8)).value_or(-1));
        fs::path log = attempt.path() / std::to_string(rank) / "stdout.log";
        if (k > best_attempt && fs::exists(log, ec2)) {
          best_attempt = k;
          best = log.string();
        }
      }
    }
    if (best.empty()) {
      return NotFound("no log of rank {} under {}/ranks (yet; the nodes write it there)", rank,
                      unit);
    }
    return best;
  }

 private:
  // `argv` aimed at the target's cluster (-M), when the options name one.
  std::vector<std::string> WithCluster(std::vector<std::string> argv) const {
    if (!options_.slurm_cluster.empty()) {
      argv.insert(argv.begin() + 1, {"-M", options_.slurm_cluster});
    }
    return argv;
  }

  Result<std::string> Script(const JobSpec& spec, const std::vector<ArrayElement>& elements,
                             const std::string& log_dir) const {
    return RenderSbatch(spec, elements, options_.cohort_bin, log_dir, options_.slurm_cluster);
  }

  BackendOptions options_;
  std::string unchecked_;  // set by Validate when a dry run could not reach Slurm
};

}  // namespace

// `set -- ARGS...`: the program's arguments as the script's positional parameters.
static std::string SetArgs(std::vector<std::string> args) {
  args.insert(args.begin(), {"set", "--"});
  return ShellJoin(args);
}

// Placeholders of AgentArgv's line that the script writes as shell expansions.
constexpr const char* kJobIdWord = "\x01job-id";
constexpr const char* kLogDirWord = "\x01log-dir";
constexpr const char* kFirstNodeWord = "\x01first-node";

namespace {

// Everything the script must render is valid (volumes are a cluster-side matter it does not
// render).
Status CheckRenderable(const JobSpec& spec, const std::vector<ArrayElement>& elements) {
  std::vector<Problem> problems;
  slurm::CheckSpec(spec, &problems);
  for (const ArrayElement& e : elements) {
    for (const auto& [k, v] : e.env) {
      if (!IsEnvName(k)) {
        problems.push_back({fmt::format("array element {}", e.index),
                            fmt::format("'{}' is not an environment variable name", k)});
      }
    }
  }
  std::erase_if(problems, [](const Problem& p) {
    return StartsWith(p.where, "volumes") || StartsWith(p.where, "mounts");
  });
  if (!problems.empty()) return InvalidArgument("{}", FormatProblems(problems));
  if (spec.entrypoint.empty()) return InvalidArgument("entrypoint: required");
  if (spec.min_nodes < 1 || spec.max_nodes < spec.min_nodes) {
    return InvalidArgument("nnodes: '{}' is not N or MIN:MAX", spec.NnodesText());
  }
  return Status::Ok();
}

// The #SBATCH lines: allocation, resources, partition, array range, output files.
Result<std::string> Directives(const JobSpec& spec, size_t elements, const std::string& log_dir,
                               const std::string& cluster) {
  std::string s;
  auto directive = [&](const std::string& option) { s += "#SBATCH " + option + "\n"; };
  if (!cluster.empty()) {
    COHORT_ASSIGN_OR_RETURN(std::string value, SbatchValue(cluster, "cluster"));
    directive("--clusters=" + value);
  }
  COHORT_ASSIGN_OR_RETURN(std::string name, SbatchValue(spec.name, "name"));
  directive("--job-name=" + name);
  directive(spec.min_nodes == spec.max_nodes
                ? fmt::format("--nodes={}", spec.min_nodes)
                : fmt::format("--nodes={}-{}", spec.min_nodes, spec.max_nodes));
  directive("--ntasks-per-node=1");
  if (int cpus = slurm::CpusPerTask(spec); cpus > 0) directive(fmt::format("--cpus-per-task={}", cpus));
  if (int64_t mib = slurm::MemoryMib(spec); mib > 0) directive(fmt::format("--mem={}M", mib));
  std::vector<std::string> gres;
  if (spec.resources.gpu > 0) gres.push_back(fmt::format("gpu:{}", spec.resources.gpu));
  for (const auto& [resource, count] : spec.resources.extended) {
    gres.push_back(fmt::format("{}:{}", slurm::GresName(resource), count));
  }
  if (!gres.empty()) directive(fmt::format("--gres={}", fmt::join(gres, ",")));
  if (!spec.queue.empty()) {
    COHORT_ASSIGN_OR_RETURN(std::string queue, SbatchValue(spec.queue, "queue"));
    directive("--partition=" + queue);
  }
  if (!spec.priority.empty()) {
    directive(fmt::format("--nice={}", *ParseInt64(spec.priority)));
  }
  if (elements > 0) {
    std::string range = fmt::format("--array=0-{}", elements - 1);
    if (spec.array.concurrency > 0) range += fmt::format("%{}", spec.array.concurrency);
    directive(range);
  }
  const std::string pattern = elements > 0 ? "slurm-%A_%a.out" : "slurm-%j.out";
  COHORT_ASSIGN_OR_RETURN(std::string output,
                          SbatchValue(EscapePercent(log_dir) + "/" + pattern, "log directory"));
  directive("--output=" + output);
  directive("--error=" + output);
  return s;
}

// The job's environment, then each array element's (picked by its index) or the single
// job's; sets $unit, $tag and the program's arguments as positional parameters.
std::string EnvironmentSection(const JobSpec& spec, const std::vector<ArrayElement>& elements) {
  std::string s;
  if (!spec.env.empty()) {
    s += "\n# The job's environment.\n";
    for (const auto& [k, v] : spec.env) s += fmt::format("export {}={}\n", k, ShellQuote(v));
  }
  s += fmt::format("export {}={}\n", kEnvJobName, ShellQuote(spec.name));
  if (elements.empty()) {
    s += "unit=job\n"
         "tag=\"$SLURM_JOB_ID\"\n";
    s += SetArgs(ElementArgs(spec, nullptr)) + "  # the program's arguments\n";
    return s;
  }
  s += "\n# Each array element's environment, picked by its index.\n";
  s += "case \"${SLURM_ARRAY_TASK_ID:-}\" in\n";
  for (const ArrayElement& e : elements) {
    s += fmt::format("  {})\n", e.index);
    for (const auto& [k, v] : e.env) s += fmt::format("    export {}={}\n", k, ShellQuote(v));
    s += "    " + SetArgs(ElementArgs(spec, &e.env)) + "\n";
    s += "    ;;\n";
  }
  s += "  *)\n"
       "    echo \"cohort: this script has no array element '${SLURM_ARRAY_TASK_ID:-}'\" >&2\n"
       "    exit 2\n"
       "    ;;\n"
       "esac\n"
       "unit=\"$SLURM_ARRAY_TASK_ID\"\n"
       "tag=\"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}\"\n";
  return s;
}

// The agents' rendezvous: fills `plan` and returns the shell lines it needs (the shared
// token; the first node's address when the store is served inside the allocation, which
// sets *first_node_serves).
std::string RendezvousSection(const JobSpec& spec, AgentPlan* plan, bool* first_node_serves) {
  *first_node_serves = false;
  if (spec.max_nodes <= 1) return "";
  plan->rdzv_endpoint = spec.rdzv.endpoint;
  if (spec.rdzv.backend == "etcd") {
    plan->rdzv_backend = "etcd";
    return "";
  }
  plan->rdzv_backend = "c10d";
  std::string s = fmt::format(
      "\n# Shared secret of this job's rendezvous store, the same on every node.\n"
      "{0}=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n')\n"
      "export {0}\n",
      worker_env::kToken);
  if (!spec.rdzv.endpoint.empty()) return s;
  s += "\n# The agent on the first node of the allocation (SLURM_NODEID=0) serves the "
       "store;\n"
       "# the others reach it at that node's address (NodeAddr, else its name).\n"
       "first_node=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n"
       "rdzv_host=$(scontrol show node -o \"$first_node\" | tr ' ' '\\n' | "
       "sed -n 's/^NodeAddr=//p')\n"
       "rdzv_host=${rdzv_host:-$first_node}\n"
       "if [ -z \"$rdzv_host\" ]; then\n"
       "  echo \"cohort: cannot tell the first node of '$SLURM_JOB_NODELIST'\" >&2\n"
       "  exit 1\n"
       "fi\n";
  plan->rdzv_endpoint = kFirstNodeWord;
  *first_node_serves = true;
  return s;
}

// `srun ... cohort run ... "$@"`: one agent per node, then the exit code kept on disk.
std::string SrunSection(const JobSpec& spec, const std::string& cohort_bin,
                        const AgentPlan& plan, bool first_node_serves) {
  std::string s = "\n# One `cohort run` per node.\n";
  s += "srun --nodes=\"$SLURM_JOB_NUM_NODES\" --ntasks=\"$SLURM_JOB_NUM_NODES\" "
       "--ntasks-per-node=1";
  if (int cpus = slurm::CpusPerTask(spec); cpus > 0) s += fmt::format(" --cpus-per-task={}", cpus);
  s += " --kill-on-bad-exit=0 \\\n";
  if (first_node_serves) {
    // Every node's address may resolve to the same host (several slurmd on one machine),
    // so which agent serves the store is said explicitly rather than guessed.
    s += "  /bin/bash -c 'if [ \"${SLURM_NODEID:-0}\" = 0 ]; then h=1; else h=0; fi; "
         "export PET_RDZV_CONF=\"is_host=$h\"; exec \"$@\"' cohort-agent \\\n";
  }
  // Words the shell must expand stand in AgentArgv's line as placeholders, written out raw
  // here; everything else is quoted.
  const std::map<std::string, std::string> raw = {
      {kJobIdWord, "\"$SLURM_JOB_ID\""},
      {kLogDirWord, "\"$log_dir/$unit/ranks\""},
      {kFirstNodeWord, fmt::format("\"$rdzv_host\":{}", spec.rdzv.port)}};
  // One flag group per line: the rendezvous, its id and logs, metrics, the program.
  static const std::set<std::string> kLineBreakBefore = {"--rdzv-backend", "--rdzv-id",
                                                         "--metrics-port", "--"};
  s += " ";
  for (const std::string& word : AgentArgv(spec, cohort_bin, plan, std::nullopt)) {
    auto it = raw.find(word);
    s += kLineBreakBefore.count(word) ? " \\\n  " : " ";
    s += it != raw.end() ? it->second : ShellQuote(word);
  }
  s += " \"$@\"";
  s += "\nrc=$?\n"
       "# The exit code outlives the controller's memory of the job.\n"
       "printf '%s\\n' \"$rc\" > \"$log_dir/slurm-$tag.exit\"\n"
       "exit \"$rc\"\n";
  return s;
}

}  // namespace

Result<std::string> RenderSbatch(const JobSpec& spec, const std::vector<ArrayElement>& elements,
                                 const std::string& cohort_bin, const std::string& log_dir,
                                 const std::string& cluster) {
  COHORT_RETURN_IF_ERROR(CheckRenderable(spec, elements));
  COHORT_ASSIGN_OR_RETURN(std::string directives,
                          Directives(spec, elements.size(), log_dir, cluster));
  const bool multi = spec.max_nodes > 1;
  std::string s = "#!/bin/bash\n" + directives;
  s += fmt::format(
      "#\n"
      "# Generated by cohort for job '{}': one task per node runs `cohort run`, which starts\n"
      "# {} worker(s) on its node.{} See docs/slurm.md.\n\n",
      spec.name, spec.nproc_per_node,
      multi ? (spec.rdzv.backend == "etcd"
                   ? " The agents rendezvous in etcd."
                   : "\n# The agents rendezvous in the store served on the first node.")
            : "");
  s += "log_dir=" + ShellQuote(log_dir) + "\n";
  s += EnvironmentSection(spec, elements);
  AgentPlan plan;
  plan.metrics_host = "0.0.0.0";
  plan.rdzv_id = kJobIdWord;
  plan.log_dir = kLogDirWord;
  bool first_node_serves = false;
  s += RendezvousSection(spec, &plan, &first_node_serves);
  s += SrunSection(spec, cohort_bin, plan, first_node_serves);
  return s;
}

std::unique_ptr<Backend> MakeSlurmBackend(const BackendOptions& options) {
  return std::make_unique<SlurmBackend>(options);
}

}  // namespace cohort::launch
