// The compare page of `cohort ui` (pages.h): the loss (by step) and samples/s (by seconds
// since the first sample) of the chosen jobs on one chart each, a table of their last
// values, and a choice of recent jobs to add.
// Thread-safety: each call opens its own JobDb; nothing is shared.
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "cohort/base/strings.h"
#include "cohort/launch/job_db.h"
#include "cohort/ui/metrics_history.h"
#include "cohort/ui/page.h"
#include "cohort/ui/pages.h"
#include "cohort/ui/svg.h"

namespace cohort::ui {
namespace {

std::string LastValue(const std::vector<Series>& series, const std::string& name) {
  for (const auto& s : series) {
    if (s.name != name || s.points.empty()) continue;
    auto last = std::max_element(s.points.begin(), s.points.end());
    return fmt::format("{:.4g}", last->second);
  }
  return "";
}

std::string Chooser(launch::JobDb& db, const std::set<int64_t>& chosen) {
  auto jobs = db.List(60);
  if (!jobs.ok()) return "";
  std::string items;
  for (const auto& j : *jobs) {
    items += fmt::format(
        "<label class=\"card\"><input type=\"checkbox\" name=\"job\" value=\"{0}\"{1}> "
        "job {0} {2} {3}</label>",
        j.id, chosen.count(j.id) ? " checked" : "", Escape(j.name),
        Badge(launch::StateName(j.state)));
  }
  return "<h2>Jobs</h2><form method=\"get\" action=\"/compare\"><div class=\"cards\">" + items +
         "</div><div class=\"actions\"><button class=\"button\" type=\"submit\">Compare"
         "</button></div></form>\n";
}

}  // namespace

Reply ComparePage(const UiContext& c, const Query& q) {
  std::set<int64_t> chosen;
  for (auto [it, end] = q.equal_range("job"); it != end; ++it) {
    if (auto id = ParseInt64(it->second)) chosen.insert(*id);
  }
  auto opened = OpenJobHistory(c);
  std::unique_ptr<launch::JobDb> db = opened.ok() ? std::move(*opened) : nullptr;
  std::vector<launch::JobRecord> jobs;
  std::string missing;
  for (int64_t id : chosen) {
    auto j = db ? db->Get(id) : Result<launch::JobRecord>(NotFound("no job history"));
    if (j.ok()) {
      jobs.push_back(*j);
    } else {
      missing += fmt::format(" {}", id);
    }
  }
  const JobCurves curves = CurvesOf(jobs);
  const std::vector<Series>& loss = curves.loss;
  const std::vector<Series>& speed = curves.speed;
  std::string body = "<h1>Compare runs</h1>\n";
  if (!missing.empty()) {
    body += fmt::format("<p class=\"notice\">No such job:{}</p>", Escape(missing));
  }
  if (!jobs.empty()) {
    std::string rows;
    for (const auto& j : jobs) {
      const std::string name = fmt::format("job {} {}", j.id, j.name);
      auto backend = BackendFor(c, j);
      const std::string live = backend.ok() ? LiveJobPageUrl(**backend, j) : "";
      rows += fmt::format(
          "<tr data-job=\"{0}\"><td><a href=\"/jobs/{0}\">{0}</a></td><td>{1}</td><td>{2}</td>"
          "<td class=\"n\">{3}</td><td class=\"n\">{4}</td><td>{5}</td></tr>",
          j.id, Escape(j.name), Badge(launch::StateName(j.state)), LastValue(loss, name),
          LastValue(speed, name),
          live.empty() ? "" : fmt::format("<a class=\"live\" href=\"{}\">live</a>", Escape(live)));
    }
    body += "<div class=\"scroll\"><table id=\"compared\"><tr><th>job</th><th>name</th>"
            "<th>state</th><th>last loss</th><th>last samples/s</th><th>running</th></tr>" + rows +
            "</table></div>\n";
    body += "<h2>Loss</h2><div class=\"scroll\" id=\"loss\">" +
            RenderLineChartSvg("loss by step", "step", "loss", loss) + "</div>\n";
    body += "<h2>Throughput</h2><div class=\"scroll\" id=\"speed\">" +
            RenderLineChartSvg("samples/s", "seconds since the first sample", "samples/s",
                               speed) + "</div>\n";
  } else {
    body += "<p class=\"muted\">Choose jobs below (or on the jobs page) to draw their curves.</p>";
  }
  if (db) body += Chooser(*db, chosen);
  return Reply{200, Layout("Compare", Section::kCompare, body)};
}

}  // namespace cohort::ui
