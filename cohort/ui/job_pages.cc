// The job pages of `cohort ui` (pages.h): the list with its filters, a job (state history,
// spec, exit, backend ids, an array's element grid, logs per rank, its loss curve), a log
// followed while the job runs, and the cancel and resubmit actions, which run the CLI.
// Thread-safety: each call opens its own JobDb; nothing is shared.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>

#include "cohort/base/strings.h"
#include "cohort/base/subprocess.h"
#include "cohort/launch/backend.h"
#include "cohort/launch/job_db.h"
#include "cohort/launch/local_backend.h"
#include "cohort/ui/metrics_history.h"
#include "cohort/ui/page.h"
#include "cohort/ui/pages.h"
#include "cohort/ui/svg.h"

namespace cohort::ui {
namespace {

namespace fs = std::filesystem;
using launch::ElementRecord;
using launch::JobDb;
using launch::JobRecord;
using launch::JobState;

// From its start to its end, or to now while it is not over.
std::string JobElapsed(const JobRecord& j) {
  return Elapsed(j.started_at, launch::IsFinalState(j.state) ? j.ended_at : 0);
}

// The jobs table's header (the list, an array's children).
constexpr const char kJobsHeader[] =
    "<tr><th></th><th>id</th><th>name</th><th>backend</th><th>state</th><th>elements</th>"
    "<th class=\"hide-narrow\">submitted (UTC)</th><th>duration</th><th>exit</th></tr>\n";

bool Matches(const JobRecord& j, const std::string& state, const std::string& backend,
             const std::string& name) {
  if (!state.empty() && launch::StateName(j.state) != state) return false;
  if (!backend.empty() && j.backend != backend) return false;
  return name.empty() || j.name.find(name) != std::string::npos;
}

std::string Select(std::string_view name, std::string_view label,
                   const std::vector<std::string>& values, const std::string& chosen) {
  std::string out = fmt::format("<label>{}<select name=\"{}\"><option value=\"\">any</option>",
                                label, name);
  for (const auto& v : values) {
    out += fmt::format("<option{}>{}</option>", v == chosen ? " selected" : "", Escape(v));
  }
  return out + "</select></label>";
}

std::string FilterForm(const std::string& state, const std::string& backend,
                       const std::string& name) {
  std::vector<std::string> states;
  for (JobState s : {JobState::kPending, JobState::kRunning, JobState::kSucceeded,
                     JobState::kFailed, JobState::kCancelled, JobState::kLost}) {
    states.emplace_back(launch::StateName(s));
  }
  return fmt::format(
      "<form class=\"filters\" method=\"get\" action=\"/\">{}{}"
      "<label>name<input name=\"name\" value=\"{}\" placeholder=\"part of a name\"></label>"
      "<button type=\"submit\" class=\"button\">Filter</button></form>\n",
      Select("state", "state", states, state),
      Select("backend", "backend", {"local", "slurm", "kubernetes", "targets"}, backend),
      Escape(name));
}

// "3 succeeded, 1 failed" for an array, "" otherwise.
std::string ElementSummary(JobDb& db, const JobRecord& j) {
  if (j.array_size <= 0) return "";
  auto elements = db.Elements(j.id);
  return elements.ok() ? launch::CountElementStates(*elements) : "";
}

std::string JobRow(JobDb& db, const JobRecord& j) {
  const std::string exit = j.exit_code ? std::to_string(*j.exit_code) : "";
  return fmt::format(
      "<tr data-job=\"{0}\"><td><input type=\"checkbox\" name=\"job\" value=\"{0}\" "
      "aria-label=\"compare job {0}\"></td><td class=\"n\"><a href=\"/jobs/{0}\">{0}</a></td>"
      "<td><a href=\"/jobs/{0}\">{1}</a></td><td>{2}</td><td>{3}</td><td>{4}</td>"
      "<td class=\"hide-narrow\">{5}</td><td class=\"n\">{6}</td><td class=\"n\">{7}</td></tr>\n",
      j.id, Escape(j.name), Escape(j.backend), Badge(launch::StateName(j.state)),
      Escape(ElementSummary(db, j)), FormatTime(j.submitted_at), JobElapsed(j), exit);
}

std::string Card(std::string_view label, std::string_view value_html) {
  return fmt::format("<div class=\"card\"><span>{}</span><b>{}</b></div>", label,
                     value_html.empty() ? "–" : value_html);
}

// The job's state over time: what the history records (submitted, started, ended).
std::string StateHistory(const JobRecord& j) {
  std::string rows = fmt::format("<tr><td>{}</td><td>submitted</td></tr>",
                                 FormatTime(j.submitted_at));
  if (j.started_at > 0) {
    rows += fmt::format("<tr><td>{}</td><td>{}</td></tr>", FormatTime(j.started_at),
                        Badge("running"));
  }
  if (launch::IsFinalState(j.state)) {
    rows += fmt::format("<tr><td>{}</td><td>{}{}</td></tr>", FormatTime(j.ended_at),
                        Badge(launch::StateName(j.state)),
                        j.exit_code ? fmt::format(" exit {}", *j.exit_code) : "");
  }
  return "<h2>State history</h2><div class=\"scroll\"><table id=\"history\"><tr><th>time (UTC)"
         "</th><th>state</th></tr>" + rows + "</table></div>\n";
}

std::string ElementGrid(const JobRecord& j, const std::vector<ElementRecord>& elements) {
  std::string cells;
  for (const auto& e : elements) {
    const std::string state(launch::StateName(e.state));
    cells += fmt::format(
        "<a class=\"cell element\" data-element=\"{0}\" data-state=\"{1}\" "
        "style=\"background:{2};color:{7}\" href=\"/jobs/{3}/log?element={0}\" title=\"{4}\">"
        "<b>#{0}</b>{1}<br>{5}{6}</a>",
        e.index, Escape(state), StateColour(state), j.id, Escape(e.detail), Escape(e.target),
        e.started_at > 0 ? " " + Elapsed(e.started_at, e.ended_at) : "", StateTextColour(state));
  }
  return fmt::format("<h2>Elements ({})</h2><div class=\"grid\" id=\"elements\">{}</div>\n",
                     Escape(launch::CountElementStates(elements)), cells);
}

// Links to the console and to each rank's log that exists (local jobs keep them).
std::string LogLinks(launch::Backend& backend, const JobRecord& j, int element) {
  const std::string base = fmt::format("/jobs/{}/log?element={}", j.id, element);
  std::string links = fmt::format("<a class=\"button\" href=\"{}\">console</a>", base);
  for (int rank = 0; rank < 256; ++rank) {
    auto p = backend.LogPath(j, element, rank);
    std::error_code ec;
    if (!p.ok() || !fs::exists(*p, ec)) break;
    links += fmt::format(" <a class=\"button rank-log\" href=\"{}&amp;rank={}\">rank {}</a>",
                         base, rank, rank);
  }
  return "<h2>Logs</h2><div class=\"actions\">" + links + "</div>\n";
}

std::string JobActions(launch::Backend* backend, const JobRecord& j) {
  std::string out = "<div class=\"actions\">";
  if (!launch::IsFinalState(j.state)) {
    out += fmt::format("<a class=\"button danger\" id=\"cancel\" href=\"/jobs/{}/cancel\">"
                       "Cancel…</a>", j.id);
  }
  out += fmt::format("<a class=\"button\" id=\"resubmit\" href=\"/jobs/{}/resubmit\">"
                     "Resubmit…</a>", j.id);
  out += fmt::format(" <a class=\"button\" href=\"/compare?job={}\">curves</a>", j.id);
  const std::string live = backend != nullptr ? LiveJobPageUrl(*backend, j) : "";
  if (!live.empty()) {
    out += fmt::format(" <a class=\"button\" id=\"live\" href=\"{}\">live job page</a>",
                       Escape(live));
  }
  return out + "</div>\n";
}

std::string JobCards(const JobRecord& j) {
  std::string cards = Card("state", Badge(launch::StateName(j.state))) +
                      Card("exit code", j.exit_code ? std::to_string(*j.exit_code) : "") +
                      Card("backend", Escape(j.backend)) +
                      Card("backend id", Escape(j.backend_id)) +
                      Card("submitted", FormatTime(j.submitted_at)) +
                      Card("started", FormatTime(j.started_at)) +
                      Card("ended", FormatTime(j.ended_at)) +
                      Card("duration", JobElapsed(j));
  if (j.array_size > 0) {
    cards += Card("elements", fmt::format("{} (at once: {})", j.array_size,
                                          j.concurrency > 0 ? std::to_string(j.concurrency)
                                                            : std::string("all")));
  }
  if (j.parent_id > 0) {
    cards += Card("array over targets", fmt::format("<a href=\"/jobs/{0}\">job {0}</a>",
                                                    j.parent_id));
  }
  return "<div class=\"cards\" id=\"summary\">" + cards + "</div>\n";
}

std::string ChildrenTable(JobDb& db, const JobRecord& j) {
  auto children = db.Children(j.id);
  if (!children.ok() || children->empty()) return "";
  std::string rows;
  for (const auto& child : *children) rows += JobRow(db, child);
  return std::string("<h2>Per target</h2><div class=\"scroll\"><table>") + kJobsHeader + rows +
         "</table></div>\n";
}

}  // namespace

std::string LiveJobPageUrl(launch::Backend& backend, const JobRecord& j) {
  if (j.state != JobState::kRunning || j.array_size > 0) return "";
  auto path = backend.LogPath(j, -1, -1);
  if (!path.ok()) return "";
  // The dashboard the job's agent printed ("dashboard on http://...") in its console.
  const FileChunk head = ReadFileChunk(*path, 0, 64 << 10);
  static const std::regex kDashboard(R"(dashboard on (https?://[^\s/]+/))");
  std::smatch m;
  if (!std::regex_search(head.text, m, kDashboard)) return "";
  return m[1].str() + "job";
}

Reply JobsPage(const UiContext& c, const Query& q) {
  const std::string state = Param(q, "state"), backend = Param(q, "backend"),
                    name = Param(q, "name");
  auto db = OpenJobHistory(c);
  if (!db.ok()) return ErrorPage(db.status().ToString());
  std::string rows;
  int shown = 0;
  if (*db) {
    auto jobs = (*db)->List(2000);
    if (!jobs.ok()) return ErrorPage(jobs.status().ToString());
    for (const auto& j : *jobs) {
      if (!Matches(j, state, backend, name)) continue;
      rows += JobRow(**db, j);
      if (++shown >= 500) break;
    }
  }
  std::string body = "<h1>Jobs</h1>\n" + FilterForm(state, backend, name);
  if (shown == 0) {
    body += "<p class=\"muted\" id=\"empty\">No job matches (jobs appear here once "
            "<code>cohort submit</code> ran with this COHORT_HOME).</p>";
  } else {
    body += fmt::format(
        "<form method=\"get\" action=\"/compare\"><div class=\"scroll\"><table id=\"jobs\">"
        "{}{}</table></div><div class=\"actions\"><button class=\"button\" type=\"submit\">"
        "Compare the chosen jobs</button></div></form>",
        kJobsHeader, rows);
  }
  return Reply{200, Layout("Jobs", Section::kJobs, body)};
}

Reply JobPage(const UiContext& c, int64_t id, const Query& q) {
  auto found = FindJob(c, id);
  if (found.instead) return *found.instead;
  launch::JobDb& db = *found.db;
  const JobRecord& j = found.record;
  std::string body = fmt::format("<h1>Job {} · {}</h1>\n", j.id, Escape(j.name));
  if (const std::string note = Param(q, "note"); !note.empty()) {
    body += fmt::format("<pre class=\"notice\" id=\"note\">{}</pre>\n", Escape(note));
  }
  body += JobCards(j);
  if (!j.detail.empty()) {
    body += fmt::format("<p class=\"notice\" id=\"detail\">{}</p>\n", Escape(j.detail));
  }
  auto backend = BackendFor(c, j);  // one for the page: its logs and its live page
  launch::Backend* b = backend.ok() ? backend->get() : nullptr;
  body += JobActions(b, j) + StateHistory(j);
  if (j.array_size > 0) {
    auto elements = db.Elements(j.id);
    if (elements.ok()) body += ElementGrid(j, *elements);
  } else if (b != nullptr) {
    body += LogLinks(*b, j, -1);
  }
  body += ChildrenTable(db, j);
  const std::vector<Series> loss = CurvesOf({j}).loss;
  if (!loss.empty()) {
    body += "<h2>Loss</h2><div class=\"scroll\">" +
            RenderLineChartSvg("loss", "step", "loss", loss) + "</div>\n";
  }
  body += fmt::format("<h2>Spec</h2><pre id=\"spec\">{}</pre>\n", Escape(j.spec_yaml));
  return Reply{200, Layout(fmt::format("Job {}", j.id), Section::kJobs, body,
                           launch::IsFinalState(j.state) ? 0 : 5)};
}

// The log file a request names (?element=&rank=), through the job's backend.
static Result<std::pair<JobRecord, std::string>> JobLogPath(const UiContext& c, int64_t id,
                                                            const Query& q) {
  COHORT_ASSIGN_OR_RETURN(auto db, OpenJobHistory(c));
  if (!db) return NotFound("no job history in {}", c.home);
  COHORT_ASSIGN_OR_RETURN(JobRecord job, db->Get(id));
  const int element = static_cast<int>(ParseInt64(Param(q, "element", "-1")).value_or(-1));
  const int rank = static_cast<int>(ParseInt64(Param(q, "rank", "-1")).value_or(-1));
  COHORT_ASSIGN_OR_RETURN(auto backend, BackendFor(c, job));
  COHORT_ASSIGN_OR_RETURN(std::string path, backend->LogPath(job, element, rank));
  if (job.array_size > 0 && element >= 0) {  // the element's own state says if it is live
    COHORT_ASSIGN_OR_RETURN(auto elements, db->Elements(job.id));
    for (const auto& e : elements) {
      if (e.index == element && launch::IsFinalState(e.state)) job.state = e.state;
    }
  }
  return std::make_pair(std::move(job), std::move(path));
}

Reply JobLogPage(const UiContext& c, int64_t id, const Query& q) {
  auto found = JobLogPath(c, id, q);
  if (!found.ok()) return NotFoundPage(found.status().message());
  const auto& [job, path] = *found;
  const std::string element = Param(q, "element", "-1"), rank = Param(q, "rank", "-1");
  const std::string which =
      (element != "-1" ? " · element " + element : std::string()) +
      (rank != "-1" ? " · rank " + rank : std::string(" · console"));
  const std::string text_url =
      fmt::format("/jobs/{}/log.txt?element={}&rank={}", id, UrlEncode(element), UrlEncode(rank));
  const std::string body =
      fmt::format("<p><a href=\"/jobs/{0}\">← job {0}</a></p>", id) +
      LogBody(fmt::format("Job {} · {}{}", id, job.name, which), path, text_url,
              !launch::IsFinalState(job.state));
  return Reply{200, Layout(fmt::format("Log of job {}", id), Section::kJobs, body)};
}

Reply JobLogText(const UiContext& c, int64_t id, const Query& q) {
  auto found = JobLogPath(c, id, q);
  if (!found.ok()) return NotFoundPage(found.status().message());
  return LogTextReply(found->second, q, !launch::IsFinalState(found->first.state));
}

// Runs the `cohort` CLI (what the user would type) and gives back its output.
static Result<CapturedOutput> RunCli(const UiContext& c, std::vector<std::string> args,
                                     Duration timeout) {
  args.insert(args.begin(), c.cohort_bin);
  args.push_back("--home");
  args.push_back(c.home);
  return RunAndCapture(args, {}, "", Deadline::After(timeout));
}

static std::string Said(const Result<CapturedOutput>& out) {
  if (!out.ok()) return out.status().ToString();
  return fmt::format("{}{}({})", out->out, out->err, out->status.Describe());
}

Reply CancelJob(const UiContext& c, int64_t id) {
  auto out = RunCli(c, {"cancel", std::to_string(id)}, std::chrono::seconds(60));
  return Redirect(fmt::format("/jobs/{}?note={}", id,
                              UrlEncode("cohort cancel " + std::to_string(id) + ": " + Said(out))));
}

Reply ResubmitJob(const UiContext& c, int64_t id) {
  auto found = FindJob(c, id);
  if (found.instead) return *found.instead;
  const JobRecord& job = found.record;
  const fs::path dir = fs::path(c.home) / "ui" / "resubmitted";
  std::error_code ec;
  fs::create_directories(dir, ec);
  const fs::path spec = dir / fmt::format("job{}-{:.0f}.yaml", id, WallSeconds() * 1000);
  if (!(std::ofstream(spec) << job.spec_yaml)) {
    return Redirect(fmt::format("/jobs/{}?note={}", id,
                                UrlEncode("cannot write the spec to " + spec.string())));
  }
  std::vector<std::string> args = {"submit", spec.string(), "--json"};
  if (job.backend != "targets") {
    args.push_back("--backend");
    args.push_back(job.backend);
  }
  auto out = RunCli(c, args, std::chrono::seconds(120));
  if (out.ok() && out->status.success()) {
    auto reply = nlohmann::json::parse(out->out, nullptr, false);
    if (reply.is_object() && reply.contains("id")) {
      return Redirect(fmt::format("/jobs/{}?note={}", reply["id"].get<int64_t>(),
                                  UrlEncode(fmt::format("resubmitted from job {}", id))));
    }
  }
  return Redirect(fmt::format("/jobs/{}?note={}", id, UrlEncode("cohort submit: " + Said(out))));
}

}  // namespace cohort::ui
