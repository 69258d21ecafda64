// The pipeline pages of `cohort ui` (pages.h): the runs with their parameters, a run's DAG
// (steps by state, skipped steps with the condition that skipped them, cached steps marked,
// edges for dependencies and passed outputs) with its steps' table, a step (log, outputs,
// attempts, times), and resume, which runs `cohort pipeline resume` detached.
// Thread-safety: each call opens its own RunDb; nothing is shared.
#include <fmt/format.h>

#include <filesystem>
#include <regex>

#include "cohort/base/subprocess.h"
#include "cohort/pipeline/pipeline_spec.h"
#include "cohort/pipeline/run_db.h"
#include "cohort/ui/page.h"
#include "cohort/ui/pages.h"
#include "cohort/ui/svg.h"

namespace cohort::ui {
namespace {

namespace fs = std::filesystem;
using pipeline::RunRecord;
using pipeline::StepRecord;
using pipeline::StepState;

std::string RunRow(const RunRecord& r) {
  return fmt::format(
      "<tr data-run=\"{0}\"><td class=\"n\"><a href=\"/pipelines/{0}\">{0}</a></td>"
      "<td><a href=\"/pipelines/{0}\">{1}</a></td><td>{2}</td><td>{3}</td>"
      "<td class=\"hide-narrow\">{4}</td><td class=\"n\">{5}</td><td class=\"n\">{6}</td></tr>\n",
      r.id, Escape(r.pipeline), Badge(pipeline::StateName(r.state)), KeyValues(r.params, " "),
      FormatTime(r.started_at), Elapsed(r.started_at, r.ended_at),
      r.exit_code ? std::to_string(*r.exit_code) : "");
}

// Whether any text of `step` names an output of `from` ({{steps.<from>.outputs.X}}).
bool ReadsOutputsOf(const pipeline::Step& step, const std::string& from) {
  const std::string ref = "steps." + from + ".outputs";
  auto has = [&](const std::string& text) { return text.find(ref) != std::string::npos; };
  if (has(step.when) || has(step.shell) || has(step.job)) return true;
  for (const auto& arg : step.command) {
    if (has(arg)) return true;
  }
  for (const auto& [k, v] : step.env) {
    if (has(v)) return true;
  }
  return false;
}

std::string StepSubtitle(const pipeline::Step* spec, const StepRecord* s) {
  if (s == nullptr) return "pending";
  switch (s->state) {
    case StepState::kSkipped:
      return spec != nullptr && !spec->when.empty() ? "skipped: " + spec->when : "skipped";
    case StepState::kCached: return "cached from an earlier run";
    case StepState::kNotRun: return "a dependency failed";
    default: break;
  }
  std::string text = s->attempts > 1 ? fmt::format("{} attempts", s->attempts) : "";
  if (s->exit_code && *s->exit_code != 0) {
    text += (text.empty() ? "" : ", ") + fmt::format("exit {}", *s->exit_code);
  }
  if (s->started_at > 0) {
    text += (text.empty() ? "" : ", ") + Elapsed(s->started_at, s->ended_at);
  }
  return text;
}

// The run's DAG from its spec (as run) and its steps' records.
std::string RunDag(const RunRecord& run, const std::vector<StepRecord>& steps) {
  std::vector<launch::Problem> problems;
  const pipeline::PipelineSpec spec =
      pipeline::ParsePipelineSpec(run.spec_yaml, run.base_dir, &problems);
  std::map<std::string, const StepRecord*> by_name;
  for (const auto& s : steps) by_name[s.name] = &s;
  std::vector<DagNode> nodes;
  std::vector<DagEdge> edges;
  for (const auto& step : spec.steps) {
    auto it = by_name.find(step.name);
    const StepRecord* s = it == by_name.end() ? nullptr : it->second;
    DagNode n;
    n.name = step.name;
    n.state = s != nullptr ? std::string(pipeline::StateName(s->state)) : "pending";
    n.subtitle = StepSubtitle(&step, s);
    n.href = fmt::format("/pipelines/{}/steps/{}", run.id, UrlEncode(step.name));
    n.cached = s != nullptr && s->state == StepState::kCached;
    nodes.push_back(std::move(n));
    for (const auto& dep : step.depends) {
      edges.push_back(DagEdge{dep, step.name, ReadsOutputsOf(step, dep)});
    }
  }
  if (nodes.empty()) return "<p class=\"muted\">The run's spec could not be read.</p>";
  return "<div class=\"scroll\" id=\"dag\">" + RenderDagSvg(nodes, edges) +
         "</div><p class=\"muted\">Solid edges pass outputs; dashed edges only order steps.</p>\n";
}

std::string StepRow(int64_t run, const StepRecord& s, const pipeline::Step* spec) {
  return fmt::format(
      "<tr data-step=\"{1}\"><td><a href=\"/pipelines/{0}/steps/{2}\">{1}</a></td><td>{3}</td>"
      "<td class=\"n\">{4}</td><td class=\"n\">{5}</td><td class=\"hide-narrow\">{6}</td>"
      "<td class=\"n\">{7}</td><td>{8}</td><td class=\"condition\">{9}</td></tr>\n",
      run, Escape(s.name), UrlEncode(s.name), Badge(pipeline::StateName(s.state)), s.attempts,
      s.exit_code ? std::to_string(*s.exit_code) : "", FormatTime(s.started_at),
      Elapsed(s.started_at, s.ended_at), KeyValues(s.outputs, " "),
      spec != nullptr ? Escape(spec->when) : "");
}

bool IsOver(const RunRecord& r) { return r.state != pipeline::RunState::kRunning; }

}  // namespace

Reply PipelinesPage(const UiContext& c, const Query&) {
  auto db = OpenRunHistory(c);
  if (!db.ok()) return ErrorPage(db.status().ToString());
  std::string rows;
  if (*db) {
    auto runs = (*db)->ListRuns(500);
    if (!runs.ok()) return ErrorPage(runs.status().ToString());
    for (const auto& r : *runs) rows += RunRow(r);
  }
  std::string body = "<h1>Pipeline runs</h1>\n";
  if (rows.empty()) {
    body += "<p class=\"muted\" id=\"empty\">No pipeline run yet (<code>cohort pipeline run "
            "SPEC</code>).</p>";
  } else {
    body += "<div class=\"scroll\"><table id=\"runs\"><tr><th>id</th><th>pipeline</th>"
            "<th>state</th><th>parameters</th><th class=\"hide-narrow\">started (UTC)</th>"
            "<th>duration</th><th>exit</th></tr>\n" + rows + "</table></div>";
  }
  return Reply{200, Layout("Pipeline runs", Section::kPipelines, body)};
}

Reply PipelineRunPage(const UiContext& c, int64_t id, const Query& q) {
  auto found = FindRun(c, id);
  if (found.instead) return *found.instead;
  const RunRecord& run = found.record;
  auto steps = found.db->Steps(id);
  if (!steps.ok()) return ErrorPage(steps.status().ToString());
  std::vector<launch::Problem> problems;
  const auto spec = pipeline::ParsePipelineSpec(run.spec_yaml, run.base_dir, &problems);
  std::string body = fmt::format("<h1>Run {} · {}</h1>\n", id, Escape(run.pipeline));
  if (const std::string note = Param(q, "note"); !note.empty()) {
    body += fmt::format("<pre class=\"notice\" id=\"note\">{}</pre>\n", Escape(note));
  }
  body += fmt::format(
      "<div class=\"cards\" id=\"summary\"><div class=\"card\"><span>state</span><b>{}</b></div>"
      "<div class=\"card\"><span>started</span><b>{}</b></div><div class=\"card\"><span>"
      "duration</span><b>{}</b></div><div class=\"card\"><span>parameters</span><b>{}</b>"
      "</div></div>\n",
      Badge(pipeline::StateName(run.state)), FormatTime(run.started_at),
      Elapsed(run.started_at, run.ended_at), KeyValues(run.params, " "));
  if (!run.detail.empty()) {
    body += fmt::format("<p class=\"notice\" id=\"detail\">{}</p>\n", Escape(run.detail));
  }
  if (run.state == pipeline::RunState::kFailed || run.state == pipeline::RunState::kCancelled) {
    body += fmt::format("<div class=\"actions\"><a class=\"button\" id=\"resume\" "
                        "href=\"/pipelines/{}/resume\">Resume…</a></div>\n", id);
  }
  body += RunDag(run, *steps);
  std::string rows;
  for (const auto& s : *steps) rows += StepRow(id, s, spec.FindStep(s.name));
  body += "<h2>Steps</h2><div class=\"scroll\"><table id=\"steps\"><tr><th>step</th>"
          "<th>state</th><th>attempts</th><th>exit</th><th class=\"hide-narrow\">started</th>"
          "<th>duration</th><th>outputs</th><th>condition</th></tr>\n" + rows +
          "</table></div>\n";
  body += fmt::format("<h2>Spec</h2><pre id=\"spec\">{}</pre>\n", Escape(run.spec_yaml));
  return Reply{200, Layout(fmt::format("Run {}", id), Section::kPipelines, body,
                           IsOver(run) ? 0 : 3)};
}

Reply PipelineStepPage(const UiContext& c, int64_t id, const std::string& name) {
  auto found = FindRun(c, id);
  if (found.instead) return *found.instead;
  const RunRecord& run = found.record;
  auto steps = found.db->Steps(id);
  if (!steps.ok()) return ErrorPage(steps.status().ToString());
  const StepRecord* s = nullptr;
  for (const auto& step : *steps) {
    if (step.name == name) s = &step;
  }
  if (s == nullptr) return NotFoundPage(fmt::format("step '{}' of run {}", name, id));
  std::vector<launch::Problem> problems;
  const auto spec = pipeline::ParsePipelineSpec(run.spec_yaml, run.base_dir, &problems);
  const pipeline::Step* step_spec = spec.FindStep(name);
  std::string body = fmt::format("<p><a href=\"/pipelines/{0}\">← run {0}</a></p>", id);
  body += fmt::format("<h1>Step {} · run {}</h1>\n", Escape(name), id);
  body += "<div class=\"scroll\"><table id=\"step\">";
  auto row = [&](std::string_view k, const std::string& v_html) {
    body += fmt::format("<tr><th>{}</th><td>{}</td></tr>", k, v_html);
  };
  row("state", Badge(pipeline::StateName(s->state)));
  row("condition", step_spec != nullptr ? Escape(step_spec->when) : "");
  row("attempts", std::to_string(s->attempts));
  row("exit code", s->exit_code ? std::to_string(*s->exit_code) : "");
  row("started (UTC)", FormatTime(s->started_at));
  row("ended (UTC)", FormatTime(s->ended_at));
  row("duration", Elapsed(s->started_at, s->ended_at));
  row("why", Escape(s->detail));
  row("run parameters", KeyValues(run.params, " "));
  row("outputs", KeyValues(s->outputs, "<br>"));
  row("cache key", fmt::format("<code>{}</code>", Escape(s->cache_key)));
  body += "</table></div>\n";
  const std::string log = s->log_dir + "/output.log";
  const FileChunk head = ReadFileChunk(log, 0, 64 << 10);
  static const std::regex kSubmitted(R"(submitted job (\d+))");
  std::smatch m;
  if (std::regex_search(head.text, m, kSubmitted)) {
    body += fmt::format("<p><a class=\"button\" id=\"step-job\" href=\"/jobs/{0}\">its job {0}"
                        "</a></p>", m[1].str());
  }
  const bool live = s->state == StepState::kRunning || s->state == StepState::kPending;
  body += LogBody("Log", log,
                  fmt::format("/pipelines/{}/steps/{}/log.txt?", id, UrlEncode(name)), live);
  return Reply{200, Layout(fmt::format("Step {}", name), Section::kPipelines, body)};
}

Reply PipelineStepLogText(const UiContext& c, int64_t id, const std::string& name,
                          const Query& q) {
  auto db = OpenRunHistory(c);
  if (!db.ok() || !*db) return NotFoundPage(fmt::format("pipeline run {}", id));
  auto steps = (*db)->Steps(id);
  if (!steps.ok()) return NotFoundPage(fmt::format("pipeline run {}", id));
  for (const auto& s : *steps) {
    if (s.name != name) continue;
    const bool live = s.state == StepState::kRunning || s.state == StepState::kPending;
    return LogTextReply(s.log_dir + "/output.log", q, live);
  }
  return NotFoundPage(fmt::format("step '{}' of run {}", name, id));
}

Reply ResumeRun(const UiContext& c, int64_t id) {
  // `cohort pipeline resume` runs the steps to their end: detached (setsid -f), its output in
  // the run's log directory, so that the page answers at once.
  const std::string log = pipeline::RunLogDir(c.home, id) + fmt::format(
      "/resume-{:.0f}.log", WallSeconds() * 1000);
  std::error_code ec;
  fs::create_directories(fs::path(log).parent_path(), ec);
  auto out = RunAndCapture({"setsid", "-f", "sh", "-c",
                            "exec \"$0\" pipeline resume \"$1\" --home \"$2\" >\"$3\" 2>&1 "
                            "</dev/null",
                            c.cohort_bin, std::to_string(id), c.home, log},
                           {}, "", Deadline::After(std::chrono::seconds(10)));
  const std::string note =
      out.ok() && out->status.success()
          ? fmt::format("cohort pipeline resume {} started; its output: {}", id, log)
          : fmt::format("cohort pipeline resume {} could not start: {}", id,
                        out.ok() ? out->err + out->status.Describe() : out.status().ToString());
  return Redirect(fmt::format("/pipelines/{}?note={}", id, UrlEncode(note)));
}

}  // namespace cohort::ui
