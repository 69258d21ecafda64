// SVG drawings for `cohort ui`'s pages, made on the server (no script, no external service):
// a pipeline run's DAG (steps coloured by state, skipped steps greyed with the condition
// that skipped them, cached steps marked, edges for dependencies and for outputs passed
// from one step to another) and line charts (loss, samples/s of several runs on one chart).
// Every string from the histories is escaped; the SVG is inline-able in HTML5.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cohort::ui {

// Text made safe for HTML and SVG text and attribute values (& < > " ').
std::string Escape(std::string_view text);

// The fill colour of a job, element or step state by its name ("succeeded", "failed",
// "running", "pending", "cancelled", "lost", "cached", "skipped", "not-run", ...), the same
// on every page; grey for a name it does not know.
std::string_view StateColour(std::string_view state);

struct DagNode {
  std::string name;      // the step's name, unique in the run
  std::string state;     // its state's name (see StateColour)
  std::string subtitle;  // a second line: "skipped: {{params.x}} == 'a'", "2 attempts, 12.3 s"
  std::string href;      // where a click on it goes ("" = not a link)
  bool cached = false;   // drawn with a mark (its outputs came from an earlier run)
};

struct DagEdge {
  std::string from, to;  // step names
  bool passes_outputs = false;  // `to` reads outputs of `from` (drawn solid; else dashed)
};

// The DAG laid out in layers (a step one layer right of its deepest dependency; spec order
// within a layer), as one <svg> element with class "dag"; each step is a <g> with
// class "step", data-step="<name>" and data-state="<state>" (and data-cached="true" when
// cached), holding its box, its name, its subtitle and, when cached, a "cached" label;
// each edge a <path> with class "edge" and data-from / data-to. Edges naming an unknown
// step are left out.
std::string RenderDagSvg(const std::vector<DagNode>& nodes, const std::vector<DagEdge>& edges);

struct Series {
  std::string name;                              // legend label (escaped when drawn)
  std::vector<std::pair<double, double>> points;  // (x, y), any order: drawn sorted by x
};

// A line chart of the series on common axes (ticks at round numbers, a legend with each
// series' colour), as one <svg> element with class "chart"; each series a <path> with
// class "series" and data-series="<name>". Non-finite points are skipped; no series or no
// point: a chart that says "no data".
std::string RenderLineChartSvg(std::string_view title, std::string_view x_label,
                               std::string_view y_label, const std::vector<Series>& series);

}  // namespace cohort::ui
