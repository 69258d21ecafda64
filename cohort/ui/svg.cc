// SVG drawings for `cohort ui` (see svg.h): escaping, the state colours, a pipeline run's DAG
// laid out in layers, and line charts with round-number ticks and a legend. Everything drawn
// from a caller's string is escaped here.
//
// Thread-safety: pure functions (no shared state; every call builds its own string).
#include "cohort/ui/svg.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <unordered_map>

namespace cohort::ui {

namespace {

// ---- Shared helpers ------------------------------------------------------------------------

constexpr std::string_view kEllipsis = "\u2026";
constexpr std::string_view kFontFamily = "system-ui, -apple-system, Segoe UI, sans-serif";

bool IsUtf8Continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// `text` cut to at most `max_chars` code points, the last one an ellipsis when it was cut.
// Returns {drawn text, whether it was cut}.
std::pair<std::string, bool> Truncate(std::string_view text, size_t max_chars) {
  size_t chars = 0;
  size_t cut = std::string_view::npos;  // byte offset after `max_chars - 1` code points
  for (size_t i = 0; i < text.size(); ++i) {
    if (IsUtf8Continuation(text[i])) continue;
    if (chars == max_chars - 1) cut = i;
    ++chars;
  }
  if (chars <= max_chars) return {std::string(text), false};
  std::string out(text.substr(0, cut));
  out += kEllipsis;
  return {out, true};
}

// The escaped text of a <text> element: the drawn text, cut to `max_chars`, with the whole
// text in a <title> child (a tooltip) when it was cut.
std::string TextContent(std::string_view text, size_t max_chars) {
  auto [drawn, cut] = Truncate(text, max_chars);
  if (!cut) return Escape(drawn);
  return fmt::format("<title>{}</title>{}", Escape(text), Escape(drawn));
}

// Relative luminance (WCAG) of a "#rrggbb" colour; 0.5 for anything else.
double Luminance(std::string_view colour) {
  if (colour.size() != 7 || colour[0] != '#') return 0.5;
  auto hex = [&](size_t at) {
    char c = colour[at];
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : 0;
  };
  auto channel = [&](size_t at) {
    double c = (hex(at) * 16 + hex(at + 1)) / 255.0;
    return c <= 0.03928 ? c / 12.92 : std::pow((c + 0.055) / 1.055, 2.4);
  };
  return 0.2126 * channel(1) + 0.7152 * channel(3) + 0.0722 * channel(5);
}

// White or near-black, whichever contrasts more with `fill`.
std::string_view TextColourOn(std::string_view fill) {
  double l = Luminance(fill);
  double with_white = 1.05 / (l + 0.05);
  double with_black = (l + 0.05) / 0.05;
  return with_white >= with_black ? "#ffffff" : "#1a1a1a";
}

// A short, stable hash (FNV-1a) for ids that must not collide between drawings on one page.
uint32_t Fnv1a(std::string_view text, uint32_t hash = 2166136261u) {
  for (char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 16777619u;
  }
  return hash;
}

// ---- DAG -----------------------------------------------------------------------------------

constexpr int kBoxWidth = 180;
constexpr int kBoxHeight = 54;
constexpr int kLayerGap = 72;  // between the boxes of neighbouring layers
constexpr int kRowGap = 22;    // between the boxes of one layer
constexpr int kDagMargin = 16;
constexpr size_t kNameChars = 22;
constexpr size_t kCachedNameChars = 15;  // the "cached" badge takes the box's top right
constexpr size_t kSubtitleChars = 28;
constexpr std::string_view kEdgeColour = "#757575";
constexpr std::string_view kSkippedText = "#616161";

struct IndexedEdge {
  int from = 0, to = 0;
  const DagEdge* edge = nullptr;
};

// The edges between known steps, by the steps' indexes (the first step of a repeated name).
std::vector<IndexedEdge> IndexEdges(const std::vector<DagNode>& nodes,
                                    const std::vector<DagEdge>& edges) {
  std::unordered_map<std::string_view, int> index;
  for (size_t i = 0; i < nodes.size(); ++i) index.emplace(nodes[i].name, static_cast<int>(i));
  std::vector<IndexedEdge> out;
  for (const auto& e : edges) {
    auto from = index.find(e.from), to = index.find(e.to);
    if (from == index.end() || to == index.end()) continue;
    out.push_back({from->second, to->second, &e});
  }
  return out;
}

// Each step's layer: 0 without dependencies, else 1 + its deepest dependency's layer (a
// longest-path layering, Kahn's order). A cycle is broken by placing its first step in
// input order as if its dependencies still waiting were absent; self-edges are ignored.
std::vector<int> AssignLayers(size_t count, const std::vector<IndexedEdge>& edges) {
  std::vector<std::vector<int>> dependents(count);
  std::vector<int> waiting_on(count, 0);
  for (const auto& e : edges) {
    if (e.from == e.to) continue;
    dependents[e.from].push_back(e.to);
    ++waiting_on[e.to];
  }
  std::vector<int> layer(count, 0);
  std::vector<bool> placed(count, false);
  std::deque<int> ready;
  for (size_t i = 0; i < count; ++i) {
    if (waiting_on[i] == 0) ready.push_back(static_cast<int>(i));
  }
  size_t placed_count = 0, first_unplaced = 0;
  while (placed_count < count) {
    if (ready.empty()) {  // every unplaced step waits on another: a cycle
      while (placed[first_unplaced]) ++first_unplaced;
      ready.push_back(static_cast<int>(first_unplaced));
    }
    int step = ready.front();
    ready.pop_front();
    if (placed[step]) continue;
    placed[step] = true;
    ++placed_count;
    for (int next : dependents[step]) {
      if (placed[next]) continue;
      layer[next] = std::max(layer[next], layer[step] + 1);
      if (--waiting_on[next] == 0) ready.push_back(next);
    }
  }
  return layer;
}

struct DagLayout {
  std::vector<int> x, y;  // each box's top left
  int width = 0, height = 0;
};

DagLayout LayOut(size_t count, const std::vector<IndexedEdge>& edges) {
  std::vector<int> layer = AssignLayers(count, edges);
  int layers = 0;
  for (int l : layer) layers = std::max(layers, l + 1);
  std::vector<int> rows_in_layer(static_cast<size_t>(layers), 0);
  DagLayout out;
  int rows = 0;
  for (size_t i = 0; i < count; ++i) {
    int row = rows_in_layer[static_cast<size_t>(layer[i])]++;
    rows = std::max(rows, row + 1);
    out.x.push_back(kDagMargin + layer[i] * (kBoxWidth + kLayerGap));
    out.y.push_back(kDagMargin + row * (kBoxHeight + kRowGap));
  }
  out.width = 2 * kDagMargin + layers * kBoxWidth + std::max(0, layers - 1) * kLayerGap;
  out.height = 2 * kDagMargin + rows * kBoxHeight + std::max(0, rows - 1) * kRowGap;
  return out;
}

// A cubic bezier from the middle of `from`'s right side to the middle of `to`'s left side.
std::string EdgePath(const DagLayout& layout, const IndexedEdge& e, std::string_view marker) {
  double x1 = layout.x[static_cast<size_t>(e.from)] + kBoxWidth;
  double y1 = layout.y[static_cast<size_t>(e.from)] + kBoxHeight / 2.0;
  double x2 = layout.x[static_cast<size_t>(e.to)];
  double y2 = layout.y[static_cast<size_t>(e.to)] + kBoxHeight / 2.0;
  double bend = std::max(36.0, std::abs(x2 - x1) / 2.0);
  bool solid = e.edge->passes_outputs;
  return fmt::format(
      "<path class=\"edge\" data-from=\"{}\" data-to=\"{}\" data-outputs=\"{}\" "
      "d=\"M{} {} C{} {}, {} {}, {} {}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"{} "
      "marker-end=\"url(#{})\"/>\n",
      Escape(e.edge->from), Escape(e.edge->to), solid ? "true" : "false", x1, y1, x1 + bend, y1,
      x2 - bend, y2, x2, y2, kEdgeColour, solid ? "" : " stroke-dasharray=\"6 4\"", marker);
}

// The inside of a step's <g>: box, name, subtitle and, when cached, the badge.
std::string StepBody(const DagNode& node) {
  bool skipped = node.state == "skipped";
  std::string_view fill = StateColour(node.state);
  std::string_view text_colour = skipped ? kSkippedText : TextColourOn(fill);
  std::string out = fmt::format(
      "<rect width=\"{}\" height=\"{}\" rx=\"6\" fill=\"{}\" stroke=\"{}\" "
      "stroke-width=\"1\"{}/>\n",
      kBoxWidth, kBoxHeight, fill, skipped ? "#9e9e9e" : "#000000",
      skipped ? " stroke-dasharray=\"4 3\"" : " stroke-opacity=\"0.25\"");
  out += fmt::format(
      "<text class=\"name\" x=\"10\" y=\"22\" fill=\"{}\" font-size=\"13\" "
      "font-weight=\"600\">{}</text>\n",
      text_colour, TextContent(node.name, node.cached ? kCachedNameChars : kNameChars));
  out += fmt::format(
      "<text class=\"subtitle\" x=\"10\" y=\"42\" fill=\"{}\" font-size=\"11\"{}>{}</text>\n",
      text_colour, skipped ? " font-style=\"italic\"" : " fill-opacity=\"0.9\"",
      TextContent(node.subtitle, kSubtitleChars));
  if (node.cached) {
    out += fmt::format(
        "<g class=\"cached-badge\"><rect x=\"{}\" y=\"6\" width=\"48\" height=\"16\" rx=\"8\" "
        "fill=\"#004d40\"/><text x=\"{}\" y=\"18\" fill=\"#ffffff\" font-size=\"10\" "
        "text-anchor=\"middle\">cached</text></g>\n",
        kBoxWidth - 54, kBoxWidth - 30);
  }
  return out;
}

std::string StepGroup(const DagNode& node, int x, int y) {
  std::string out = fmt::format(
      "<g class=\"step\" data-step=\"{}\" data-state=\"{}\"{} transform=\"translate({},{})\">\n",
      Escape(node.name), Escape(node.state), node.cached ? " data-cached=\"true\"" : "", x, y);
  if (node.href.empty()) {
    out += StepBody(node);
  } else {
    out += fmt::format("<a href=\"{}\">\n{}</a>\n", Escape(node.href), StepBody(node));
  }
  out += "</g>\n";
  return out;
}

std::string ArrowMarker(std::string_view id) {
  return fmt::format(
      "<defs><marker id=\"{}\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" "
      "markerHeight=\"7\" orient=\"auto-start-reverse\"><path d=\"M0 0 L10 5 L0 10 z\" "
      "fill=\"{}\"/></marker></defs>\n",
      id, kEdgeColour);
}

// ---- Line chart ----------------------------------------------------------------------------

constexpr int kChartWidth = 640;
constexpr int kChartHeight = 320;
constexpr int kPlotLeft = 80;  // room for tick labels like 0.00016 and the y label
constexpr int kPlotRight = kChartWidth - 150;  // the legend lies right of the plot
constexpr int kPlotTop = 40;
constexpr int kPlotBottom = kChartHeight - 48;
constexpr int kTargetTicks = 5;
constexpr size_t kLegendChars = 18;
constexpr int kLegendRow = 18;
constexpr std::string_view kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                         "#9467bd", "#8c564b", "#e377c2", "#17becf"};
constexpr size_t kPaletteSize = std::size(kPalette);

struct Axis {
  double lo = 0, hi = 1, step = 1;  // the drawn range (from the first tick to the last)
  std::vector<double> ticks;
};

// The nearest of 1, 2, 5, 10 times a power of ten to `raw` (so a range split in about
// kTargetTicks steps gets about 4 to 9 of them).
double NiceStep(double raw) {
  double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double fraction = raw / magnitude;
  double nice = fraction < 1.5 ? 1 : fraction < 3 ? 2 : fraction < 7 ? 5 : 10;
  return nice * magnitude;
}

// An axis over [lo, hi] with ticks at multiples of a nice step covering it. A zero range is
// widened around its value; a range too wide or narrow for doubles gets ticks at its ends.
Axis NiceAxis(double lo, double hi) {
  if (!(hi > lo)) {
    double pad = lo == 0 ? 1 : std::abs(lo) * 0.5;
    lo -= pad;
    hi += pad;
  }
  Axis axis{lo, hi, hi - lo, {lo, hi}};
  double raw = (hi - lo) / kTargetTicks;
  if (!std::isfinite(raw) || !(raw > 0)) return axis;
  double step = NiceStep(raw);
  double first = std::floor(lo / step) * step, last = std::ceil(hi / step) * step;
  double count = std::round((last - first) / step);
  if (!std::isfinite(first) || !std::isfinite(last) || !(count >= 1) || count > 100) {
    return axis;
  }
  axis = Axis{first, last, step, {}};
  for (int i = 0; i <= static_cast<int>(count); ++i) {
    double value = first + i * step;
    if (std::abs(value) < step * 1e-9) value = 0;  // -0.0 and 1e-17 drawn as 0
    axis.ticks.push_back(value);
  }
  axis.hi = axis.ticks.back();
  return axis;
}

// `value` as a tick label on `axis`: as many decimals as the step needs; on an axis reaching
// ten thousand or more, in the largest of k, M, G, T that the axis reaches and that needs at
// most one decimal for the step (250k, 1.5M), else in full.
std::string TickLabel(double value, const Axis& axis) {
  static constexpr std::pair<double, std::string_view> kUnits[] = {
      {1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "k"}};
  double step = axis.step;
  double largest = std::max(std::abs(axis.lo), std::abs(axis.hi));
  if (value == 0) return "0";
  if (!std::isfinite(step) || !(step > 1e-6) || largest >= 1e16) {
    return fmt::format("{:.3g}", value);
  }
  double scale = 1;
  std::string_view unit;
  for (const auto& [size, name] : kUnits) {
    if (largest >= 1e4 && largest >= size && step >= size / 10) {
      scale = size;
      unit = name;
      break;
    }
  }
  int decimals = std::clamp(static_cast<int>(-std::floor(std::log10(step / scale) + 1e-9)), 0, 8);
  return fmt::format("{:.{}f}{}", value / scale, decimals, unit);
}

// Where a value falls between `from` and `to` (pixels); halves keep huge ranges finite.
double Scale(double value, const Axis& axis, double from, double to) {
  double span = axis.hi / 2 - axis.lo / 2;
  double t = span > 0 ? (value / 2 - axis.lo / 2) / span : 0.5;
  return from + t * (to - from);
}

std::string ChartOpen(std::string_view title) {
  std::string label = title.empty() ? std::string("chart") : Escape(title);
  return fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" style=\"max-width:100%;height:auto\" role=\"img\" "
      "aria-label=\"{2}\" font-family=\"{3}\" font-size=\"11\" fill=\"#333333\">\n"
      "<text class=\"title\" x=\"{4}\" y=\"24\" font-size=\"14\" font-weight=\"600\">{5}</text>\n",
      kChartWidth, kChartHeight, label, kFontFamily, kPlotLeft, Escape(title));
}

// Gridlines, axis lines, tick labels and axis labels.
std::string ChartAxes(const Axis& x, const Axis& y, std::string_view x_label,
                      std::string_view y_label) {
  std::string out = "<g class=\"grid\" stroke=\"#e5e7eb\" stroke-width=\"1\">\n";
  for (double t : x.ticks) {
    double px = Scale(t, x, kPlotLeft, kPlotRight);
    out += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\"/>\n", px,
                       kPlotTop, kPlotBottom);
  }
  for (double t : y.ticks) {
    double py = Scale(t, y, kPlotBottom, kPlotTop);
    out += fmt::format("<line x1=\"{0}\" y1=\"{2:.1f}\" x2=\"{1}\" y2=\"{2:.1f}\"/>\n", kPlotLeft,
                       kPlotRight, py);
  }
  out += fmt::format(
      "</g>\n<path class=\"axes\" d=\"M{0} {1} L{0} {2} L{3} {2}\" fill=\"none\" "
      "stroke=\"#9ca3af\"/>\n",
      kPlotLeft, kPlotTop, kPlotBottom, kPlotRight);
  for (double t : x.ticks) {
    out += fmt::format(
        "<text class=\"tick x\" data-value=\"{:.12g}\" x=\"{:.1f}\" y=\"{}\" "
        "text-anchor=\"middle\">{}</text>\n",
        t, Scale(t, x, kPlotLeft, kPlotRight), kPlotBottom + 16, TickLabel(t, x));
  }
  for (double t : y.ticks) {
    out += fmt::format(
        "<text class=\"tick y\" data-value=\"{:.12g}\" x=\"{}\" y=\"{:.1f}\" "
        "text-anchor=\"end\">{}</text>\n",
        t, kPlotLeft - 6, Scale(t, y, kPlotBottom, kPlotTop) + 4, TickLabel(t, y));
  }
  out += fmt::format(
      "<text class=\"axis-label x\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n"
      "<text class=\"axis-label y\" transform=\"translate(12,{}) rotate(-90)\" "
      "text-anchor=\"middle\">{}</text>\n",
      (kPlotLeft + kPlotRight) / 2, kChartHeight - 10, Escape(x_label),
      (kPlotTop + kPlotBottom) / 2, Escape(y_label));
  return out;
}

// Series `index`'s stroke: the palette's colours, dashed from the second time round.
std::string StrokeOf(size_t index) {
  std::string out = fmt::format("stroke=\"{}\"", kPalette[index % kPaletteSize]);
  if (index >= kPaletteSize) out += " stroke-dasharray=\"6 3\"";
  return out;
}

std::string SeriesPath(const Series& s, size_t index, const Axis& x, const Axis& y) {
  std::string d;
  for (const auto& [vx, vy] : s.points) {
    d += fmt::format("{}{:.1f} {:.1f}", d.empty() ? "M" : " L", Scale(vx, x, kPlotLeft, kPlotRight),
                     Scale(vy, y, kPlotBottom, kPlotTop));
  }
  std::string out = fmt::format(
      "<path class=\"series\" data-series=\"{}\" d=\"{}\" fill=\"none\" {} stroke-width=\"2\" "
      "stroke-linejoin=\"round\" stroke-linecap=\"round\"/>\n",
      Escape(s.name), d, StrokeOf(index));
  if (s.points.size() == 1) {  // a lone point draws no line: mark it
    out += fmt::format(
        "<circle class=\"point\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n",
        Scale(s.points[0].first, x, kPlotLeft, kPlotRight),
        Scale(s.points[0].second, y, kPlotBottom, kPlotTop), kPalette[index % kPaletteSize]);
  }
  return out;
}

// One row per series right of the plot, as many as fit, then "+N more".
std::string Legend(const std::vector<Series>& series) {
  const size_t fit = static_cast<size_t>((kPlotBottom - kPlotTop) / kLegendRow);
  std::string out = "<g class=\"legend\">\n";
  for (size_t i = 0; i < series.size(); ++i) {
    int y = kPlotTop + static_cast<int>(i) * kLegendRow;
    if (i + 1 == fit && series.size() > fit) {
      out += fmt::format("<text x=\"{}\" y=\"{}\">+{} more</text>\n", kPlotRight + 16, y + 4,
                         series.size() - i);
      break;
    }
    out += fmt::format(
        "<g class=\"legend-item\" data-series=\"{}\"><line x1=\"{}\" y1=\"{}\" x2=\"{}\" "
        "y2=\"{}\" {} stroke-width=\"3\"/><text x=\"{}\" y=\"{}\">{}</text></g>\n",
        Escape(series[i].name), kPlotRight + 16, y, kPlotRight + 34, y, StrokeOf(i),
        kPlotRight + 40, y + 4, TextContent(series[i].name, kLegendChars));
  }
  out += "</g>\n";
  return out;
}

}  // namespace

std::string Escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string_view StateColour(std::string_view state) {
  static constexpr std::pair<std::string_view, std::string_view> kColours[] = {
      {"succeeded", "#2e7d32"},  // green
      {"failed", "#c62828"},     // red
      {"running", "#1565c0"},    // blue
      {"pending", "#f2c14e"},    // amber
      {"cancelled", "#4a4a4a"},  // dark grey
      {"lost", "#7b1fa2"},       // purple
      {"cached", "#26a69a"},     // teal green
      {"skipped", "#e6e6e6"},    // light grey
      {"not-run", "#9e9e9e"},    // grey
  };
  for (const auto& [name, colour] : kColours) {
    if (name == state) return colour;
  }
  return "#9e9e9e";
}

std::string RenderDagSvg(const std::vector<DagNode>& nodes, const std::vector<DagEdge>& edges) {
  std::vector<IndexedEdge> indexed = IndexEdges(nodes, edges);
  DagLayout layout = LayOut(nodes.size(), indexed);
  uint32_t hash = Fnv1a("dag");
  for (const auto& n : nodes) hash = Fnv1a(n.name, Fnv1a("\n", hash));
  std::string marker = fmt::format("dag-arrow-{:08x}", hash);

  int width = std::max(layout.width, kBoxWidth + 2 * kDagMargin);
  int height = std::max(layout.height, kBoxHeight + 2 * kDagMargin);
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"dag\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" role=\"img\" aria-label=\"Pipeline DAG: {2} step{3}, {4} "
      "dependenc{5}\" font-family=\"{6}\">\n",
      width, height, nodes.size(), nodes.size() == 1 ? "" : "s", indexed.size(),
      indexed.size() == 1 ? "y" : "ies", kFontFamily);
  out += ArrowMarker(marker);
  if (nodes.empty()) {
    out += fmt::format(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#616161\">"
        "no steps</text>\n",
        width / 2, height / 2 + 4);
  }
  out += "<g class=\"edges\">\n";
  for (const auto& e : indexed) out += EdgePath(layout, e, marker);
  out += "</g>\n<g class=\"steps\">\n";
  for (size_t i = 0; i < nodes.size(); ++i) out += StepGroup(nodes[i], layout.x[i], layout.y[i]);
  out += "</g>\n</svg>\n";
  return out;
}

std::string RenderLineChartSvg(std::string_view title, std::string_view x_label,
                               std::string_view y_label, const std::vector<Series>& series) {
  std::vector<Series> drawn;  // finite points only, sorted by x
  constexpr double kInf = std::numeric_limits<double>::infinity();
  double x_lo = kInf, x_hi = -kInf, y_lo = kInf, y_hi = -kInf;
  for (const auto& s : series) {
    Series& d = drawn.emplace_back(Series{s.name, {}});
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      d.points.emplace_back(x, y);
      x_lo = std::min(x_lo, x);
      x_hi = std::max(x_hi, x);
      y_lo = std::min(y_lo, y);
      y_hi = std::max(y_hi, y);
    }
    std::stable_sort(d.points.begin(), d.points.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
  }
  std::string out = ChartOpen(title);
  if (!(x_lo <= x_hi)) {  // no series or no finite point
    out += fmt::format(
        "<text class=\"no-data\" x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"14\" "
        "fill=\"#757575\">no data</text>\n</svg>\n",
        kChartWidth / 2, kChartHeight / 2);
    return out;
  }
  Axis x = NiceAxis(x_lo, x_hi), y = NiceAxis(y_lo, y_hi);
  out += ChartAxes(x, y, x_label, y_label);
  out += "<g class=\"lines\">\n";
  for (size_t i = 0; i < drawn.size(); ++i) {
    if (!drawn[i].points.empty()) out += SeriesPath(drawn[i], i, x, y);
  }
  out += "</g>\n" + Legend(drawn) + "</svg>\n";
  return out;
}

}  // namespace cohort::ui
