// Tests of cohort/ui/svg: escaping, the state colours, the DAG (escaping of every string,
// layered layout read back from the emitted transforms, skipped and cached steps, links,
// dropped edges to unknown steps, cycles, truncated subtitles) and the line chart (one path
// per series, points sorted by x, non-finite points skipped, "no data", nice ticks, no
// division by zero on a single point or a flat series).
//
// Thread-safety: single-threaded tests of pure functions.
#include "cohort/ui/svg.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace cohort::ui {
namespace {

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Every match of `pattern`'s first group in `text`.
std::vector<std::string> AllOf(const std::string& text, const std::string& pattern) {
  std::vector<std::string> out;
  std::regex re(pattern);
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it) {
    out.push_back((*it)[1].str());
  }
  return out;
}

struct Point {
  double x = 0, y = 0;
};

// Each step's translate(x,y), by its data-step.
std::map<std::string, Point> StepPositions(const std::string& svg) {
  std::map<std::string, Point> out;
  std::regex re(
      R"re(<g class="step" data-step="([^"]*)"[^>]*)re"
      R"re(transform="translate\(([-\d.]+),([-\d.]+)\)")re");
  for (std::sregex_iterator it(svg.begin(), svg.end(), re), end; it != end; ++it) {
    out[(*it)[1].str()] = {std::stod((*it)[2].str()), std::stod((*it)[3].str())};
  }
  return out;
}

// The points of a path's d="M x y L x y ...".
std::vector<Point> PathPoints(const std::string& d) {
  std::vector<Point> out;
  std::regex re(R"re([ML]([-\d.]+) ([-\d.]+))re");
  for (std::sregex_iterator it(d.begin(), d.end(), re), end; it != end; ++it) {
    out.push_back({std::stod((*it)[1].str()), std::stod((*it)[2].str())});
  }
  return out;
}

std::vector<std::string> SeriesPaths(const std::string& svg) {
  return AllOf(svg, R"re(<path class="series" data-series="[^"]*" d="([^"]*)")re");
}

DagNode Node(std::string name, std::string state = "succeeded") {
  return DagNode{std::move(name), std::move(state), "", "", false};
}

// ---- Escape and StateColour ----------------------------------------------------------------

TEST(SvgEscape, ReplacesTheFiveSpecialCharacters) {
  EXPECT_EQ(Escape(R"(a&b<c>"d'e)"), "a&amp;b&lt;c&gt;&quot;d&#39;e");
  EXPECT_EQ(Escape("plain text, ünïcode"), "plain text, ünïcode");
  EXPECT_EQ(Escape(""), "");
}

TEST(SvgStateColour, KnownStatesAreDistinctAndUnknownIsGrey) {
  const char* states[] = {"succeeded", "failed", "running", "pending", "cancelled",
                          "lost",      "cached", "skipped", "not-run"};
  std::set<std::string_view> colours;
  for (const char* s : states) {
    std::string_view c = StateColour(s);
    EXPECT_EQ(c.size(), 7u) << s;
    EXPECT_EQ(c[0], '#') << s;
    colours.insert(c);
  }
  EXPECT_EQ(colours.size(), std::size(states));
  std::string_view unknown = StateColour("no-such-state");
  ASSERT_EQ(unknown.size(), 7u);
  EXPECT_EQ(unknown.substr(1, 2), unknown.substr(3, 2));  // r == g == b: a grey
  EXPECT_EQ(unknown.substr(3, 2), unknown.substr(5, 2));
}

// ---- DAG -----------------------------------------------------------------------------------

TEST(SvgDag, EscapesEveryStringFromTheHistory) {
  DagNode evil{"<script>", "fa\"iled", "a & b < c", "/run?a=1&b=\"2\"", false};
  std::string svg = RenderDagSvg({evil, Node("next")}, {{"<script>", "next", true}});
  EXPECT_EQ(svg.find("<script>"), std::string::npos);
  EXPECT_NE(svg.find("data-step=\"&lt;script&gt;\""), std::string::npos);
  EXPECT_NE(svg.find(">&lt;script&gt;</text>"), std::string::npos);
  EXPECT_NE(svg.find("data-state=\"fa&quot;iled\""), std::string::npos);
  EXPECT_NE(svg.find("a &amp; b &lt; c"), std::string::npos);
  EXPECT_NE(svg.find("href=\"/run?a=1&amp;b=&quot;2&quot;\""), std::string::npos);
  EXPECT_NE(svg.find("data-from=\"&lt;script&gt;\""), std::string::npos);
}

TEST(SvgDag, DiamondIsLaidOutInLayers) {
  std::string svg =
      RenderDagSvg({Node("a"), Node("b"), Node("c"), Node("d")},
                   {{"a", "b", true}, {"a", "c", false}, {"b", "d", true}, {"c", "d", true}});
  auto at = StepPositions(svg);
  ASSERT_EQ(at.size(), 4u) << svg;
  EXPECT_EQ(at["b"].x, at["c"].x);
  EXPECT_LT(at["a"].x, at["b"].x);
  EXPECT_LT(at["b"].x, at["d"].x);
  EXPECT_LT(at["b"].y, at["c"].y);  // input order within a layer, top to bottom
  EXPECT_EQ(Count(svg, "class=\"edge\""), 4u);
}

TEST(SvgDag, LayerIsOneRightOfTheDeepestDependency) {
  // a -> b -> c and a -> c: c sits right of b, not next to b.
  std::string svg = RenderDagSvg({Node("c"), Node("b"), Node("a")},
                                 {{"a", "c", false}, {"b", "c", false}, {"a", "b", false}});
  auto at = StepPositions(svg);
  EXPECT_LT(at["a"].x, at["b"].x);
  EXPECT_LT(at["b"].x, at["c"].x);
}

TEST(SvgDag, SizeAndViewBoxFollowTheLayout) {
  std::string one = RenderDagSvg({Node("a")}, {});
  std::string chain =
      RenderDagSvg({Node("a"), Node("b"), Node("c")}, {{"a", "b", false}, {"b", "c", false}});
  std::string column = RenderDagSvg({Node("a"), Node("b"), Node("c")}, {});
  auto size = [](const std::string& svg) {
    std::smatch m;
    EXPECT_TRUE(std::regex_search(
        svg, m, std::regex(R"re(width="(\d+)" height="(\d+)" viewBox="0 0 (\d+) (\d+)")re")));
    EXPECT_EQ(m[1].str(), m[3].str());
    EXPECT_EQ(m[2].str(), m[4].str());
    return Point{std::stod(m[1].str()), std::stod(m[2].str())};
  };
  EXPECT_GT(size(chain).x, size(one).x);
  EXPECT_EQ(size(chain).y, size(one).y);
  EXPECT_GT(size(column).y, size(one).y);
  EXPECT_EQ(size(column).x, size(one).x);
  EXPECT_NE(one.find("class=\"dag\""), std::string::npos);
  EXPECT_NE(one.find("role=\"img\""), std::string::npos);
  EXPECT_NE(one.find("aria-label=\""), std::string::npos);
}

TEST(SvgDag, SkippedAndCachedStepsAreMarked) {
  DagNode skipped{"only-slurm", "skipped", "skipped: {{params.x}} == 'a'", "", false};
  DagNode cached{"prep", "cached", "from run 12", "", true};
  std::string svg = RenderDagSvg({cached, skipped, Node("train")}, {});
  EXPECT_NE(svg.find(R"(data-step="only-slurm" data-state="skipped")"), std::string::npos);
  EXPECT_NE(svg.find("skipped: {{params.x}} == &#39;a&#39;"), std::string::npos);
  EXPECT_NE(svg.find(R"(data-step="prep" data-state="cached" data-cached="true")"),
            std::string::npos);
  EXPECT_EQ(Count(svg, "data-cached=\"true\""), 1u);
  EXPECT_EQ(Count(svg, ">cached</text>"), 1u);
  EXPECT_EQ(Count(svg, "<text class=\"subtitle\""), 3u);
}

TEST(SvgDag, EdgesToUnknownStepsAreDropped) {
  std::string svg = RenderDagSvg({Node("a"), Node("b")},
                                 {{"a", "b", true}, {"a", "ghost", true}, {"ghost", "b", false}});
  EXPECT_EQ(Count(svg, "class=\"edge\""), 1u);
  EXPECT_EQ(svg.find("ghost"), std::string::npos);
}

TEST(SvgDag, EdgesAreBeziersSolidWhenPassingOutputs) {
  std::string svg =
      RenderDagSvg({Node("a"), Node("b"), Node("c")}, {{"a", "b", true}, {"a", "c", false}});
  auto solid = AllOf(svg, R"re((<path class="edge" data-from="a" data-to="b"[^>]*>))re");
  auto dashed = AllOf(svg, R"re((<path class="edge" data-from="a" data-to="c"[^>]*>))re");
  ASSERT_EQ(solid.size(), 1u);
  ASSERT_EQ(dashed.size(), 1u);
  EXPECT_EQ(solid[0].find("stroke-dasharray"), std::string::npos);
  EXPECT_NE(dashed[0].find("stroke-dasharray"), std::string::npos);
  EXPECT_NE(solid[0].find(" C"), std::string::npos);
  EXPECT_NE(solid[0].find("marker-end=\"url(#"), std::string::npos);
  EXPECT_NE(svg.find("<defs><marker"), std::string::npos);
  // From a's right side (x + 180) to b's left side.
  auto at = StepPositions(svg);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      solid[0], m, std::regex(R"re(d="M([-\d.]+) [-\d.]+ C.*, ([-\d.]+) [-\d.]+")re")));
  EXPECT_DOUBLE_EQ(std::stod(m[1].str()), at["a"].x + 180);
  EXPECT_DOUBLE_EQ(std::stod(m[2].str()), at["b"].x);
}

TEST(SvgDag, CycleIsBrokenAndEveryStepDrawn) {
  std::string svg = RenderDagSvg(
      {Node("a"), Node("b"), Node("c"), Node("d")},
      {{"a", "b", true}, {"b", "c", true}, {"c", "a", true}, {"d", "d", false}, {"c", "d", true}});
  auto at = StepPositions(svg);
  EXPECT_EQ(at.size(), 4u);
  EXPECT_LT(at["a"].x, at["b"].x);  // the cycle is cut before its first step in input order
  EXPECT_LT(at["b"].x, at["c"].x);
  EXPECT_LT(at["c"].x, at["d"].x);
  EXPECT_EQ(Count(svg, "class=\"edge\""), 5u);
}

TEST(SvgDag, LongSubtitleIsCutWithTheWholeTextAsTooltip) {
  std::string whole = "skipped: {{params.cluster}} == 'slurm-east-1'";
  std::string svg = RenderDagSvg({DagNode{"s", "skipped", whole, "", false}}, {});
  EXPECT_NE(svg.find("<title>" + Escape(whole) + "</title>"), std::string::npos);
  EXPECT_NE(svg.find("\u2026</text>"), std::string::npos);
  std::string short_one =
      RenderDagSvg({DagNode{"s", "succeeded", "2 attempts, 12.3 s", "", false}}, {});
  EXPECT_EQ(short_one.find("<title>"), std::string::npos);
  EXPECT_NE(short_one.find(">2 attempts, 12.3 s</text>"), std::string::npos);
}

TEST(SvgDag, StepWithHrefIsALink) {
  DagNode linked{"a", "running", "", "/runs/7/steps/a", false};
  std::string svg = RenderDagSvg({linked, Node("b")}, {});
  EXPECT_EQ(Count(svg, "<a href="), 1u);
  EXPECT_NE(svg.find("<a href=\"/runs/7/steps/a\">"), std::string::npos);
}

TEST(SvgDag, NoStepsIsStillAnSvg) {
  std::string svg = RenderDagSvg({}, {{"a", "b", true}});
  EXPECT_NE(svg.find("class=\"dag\""), std::string::npos);
  EXPECT_EQ(Count(svg, "class=\"step\""), 0u);
  EXPECT_EQ(Count(svg, "class=\"edge\""), 0u);
}

// ---- Line chart ----------------------------------------------------------------------------

TEST(SvgChart, OnePathPerSeriesAndAResponsiveBox) {
  std::vector<Series> series = {
      {"run-1", {{0, 1}, {1, 0.5}}}, {"run-2", {{0, 2}, {2, 1}}}, {"run-3", {{1, 3}, {3, 0.1}}}};
  std::string svg = RenderLineChartSvg("loss", "step", "loss", series);
  EXPECT_EQ(SeriesPaths(svg).size(), series.size());
  EXPECT_NE(svg.find("class=\"chart\""), std::string::npos);
  EXPECT_NE(svg.find("viewBox=\"0 0 640 320\""), std::string::npos);
  EXPECT_NE(svg.find("style=\"max-width:100%;height:auto\""), std::string::npos);
  EXPECT_NE(svg.find("data-series=\"run-2\""), std::string::npos);
  EXPECT_NE(svg.find(">loss</text>"), std::string::npos);
  EXPECT_NE(svg.find(">step</text>"), std::string::npos);
  EXPECT_EQ(Count(svg, "class=\"legend-item\""), series.size());
  std::set<std::string> colours;
  for (const auto& c : AllOf(svg, R"re(<path class="series"[^>]*stroke="(#[0-9a-f]{6})")re")) {
    colours.insert(c);
  }
  EXPECT_EQ(colours.size(), series.size());
}

TEST(SvgChart, PointsAreDrawnSortedByX) {
  std::string svg =
      RenderLineChartSvg("t", "x", "y", {{"s", {{3, 1}, {1, 5}, {4, 2}, {0, 0}, {2, 9}}}});
  auto paths = SeriesPaths(svg);
  ASSERT_EQ(paths.size(), 1u);
  auto points = PathPoints(paths[0]);
  ASSERT_EQ(points.size(), 5u);
  for (size_t i = 1; i < points.size(); ++i) EXPECT_LT(points[i - 1].x, points[i].x);
  EXPECT_LT(points[2].y, points[0].y);  // y 9 (at x 2) is drawn above y 0 (at x 0)
}

TEST(SvgChart, NonFinitePointsAreSkipped) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  std::string svg = RenderLineChartSvg(
      "t", "x", "y", {{"s", {{0, 1}, {1, nan}, {nan, 2}, {2, inf}, {3, -inf}, {4, 3}}}});
  auto paths = SeriesPaths(svg);
  ASSERT_EQ(paths.size(), 1u);
  EXPECT_EQ(PathPoints(paths[0]).size(), 2u);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

TEST(SvgChart, NoDataSaysSo) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto& series : {std::vector<Series>{}, std::vector<Series>{{"empty", {}}},
                             std::vector<Series>{{"nan", {{nan, nan}, {1, nan}}}}}) {
    std::string svg = RenderLineChartSvg("loss", "step", "loss", series);
    EXPECT_NE(svg.find("class=\"chart\""), std::string::npos);
    EXPECT_NE(svg.find("no data"), std::string::npos);
    EXPECT_TRUE(SeriesPaths(svg).empty());
  }
}

// Whether the ticks of `axis` ("x" or "y") are evenly spaced multiples of 1, 2 or 5 x 10^k.
void ExpectNiceTicks(const std::string& svg, const std::string& axis) {
  std::vector<double> ticks;
  for (const auto& v : AllOf(svg, "class=\"tick " + axis + "\" data-value=\"([^\"]+)\"")) {
    ticks.push_back(std::stod(v));
  }
  ASSERT_GE(ticks.size(), 2u) << axis << "\n" << svg;
  double step = ticks[1] - ticks[0];
  ASSERT_GT(step, 0);
  double mantissa = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
  bool nice = std::abs(mantissa - 1) < 1e-6 || std::abs(mantissa - 2) < 1e-6 ||
              std::abs(mantissa - 5) < 1e-6;
  EXPECT_TRUE(nice) << axis << " step " << step;
  for (size_t i = 0; i < ticks.size(); ++i) {
    EXPECT_NEAR(ticks[i] - ticks[0], i * step, step * 1e-6) << axis;
    double multiple = ticks[i] / step;
    EXPECT_NEAR(multiple, std::round(multiple), 1e-6) << axis << " tick " << ticks[i];
  }
}

TEST(SvgChart, TicksAreNiceNumbersCoveringTheData) {
  std::vector<std::vector<Series>> cases = {
      {{"a", {{0, 0.13}, {97, 2.71}}}},
      {{"a", {{1000, 1234.5}, {2500, 98765}}}, {"b", {{1200, 5000}}}},
      {{"a", {{-3.3, -0.004}, {0.7, 0.031}}}},
      {{"a", {{0, 123456789}, {1e6, 3}}}},
  };
  for (const auto& series : cases) {
    std::string svg = RenderLineChartSvg("t", "x", "y", series);
    ExpectNiceTicks(svg, "x");
    ExpectNiceTicks(svg, "y");
  }
}

TEST(SvgChart, TickLabelsAreShortAndUseUnitsForLargeValues) {
  auto y_labels = [](const std::vector<std::pair<double, double>>& points) {
    return AllOf(RenderLineChartSvg("t", "x", "y", {{"a", points}}),
                 R"re(class="tick y"[^>]*>([^<]*)<)re");
  };
  EXPECT_EQ(y_labels({{0, 0}, {10, 250000}}),
            (std::vector<std::string>{"0", "50k", "100k", "150k", "200k", "250k"}));
  EXPECT_EQ(y_labels({{0, 0}, {10, 1.2e6}}),
            (std::vector<std::string>{"0", "0.2M", "0.4M", "0.6M", "0.8M", "1.0M", "1.2M"}));
  EXPECT_EQ(y_labels({{0, 0}, {10, 1000}}),
            (std::vector<std::string>{"0", "200", "400", "600", "800", "1000"}));
  EXPECT_EQ(y_labels({{0, 0.1}, {10, 0.3}}),
            (std::vector<std::string>{"0.10", "0.15", "0.20", "0.25", "0.30"}));
}

TEST(SvgChart, SinglePointAndFlatSeriesDoNotDivideByZero) {
  for (const auto& series :
       {std::vector<Series>{{"one", {{5, 7}}}}, std::vector<Series>{{"flat", {{1, 0}, {9, 0}}}},
        std::vector<Series>{{"column", {{2, 1}, {2, 3}}}}}) {
    std::string svg = RenderLineChartSvg("t", "x", "y", series);
    auto paths = SeriesPaths(svg);
    ASSERT_EQ(paths.size(), 1u) << svg;
    for (const auto& p : PathPoints(paths[0])) {
      EXPECT_TRUE(std::isfinite(p.x) && std::isfinite(p.y));
      EXPECT_GE(p.x, 0);
      EXPECT_LE(p.x, 640);
      EXPECT_GE(p.y, 0);
      EXPECT_LE(p.y, 320);
    }
    EXPECT_EQ(svg.find("nan"), std::string::npos);
    EXPECT_EQ(svg.find("inf"), std::string::npos);
    ExpectNiceTicks(svg, "x");
    ExpectNiceTicks(svg, "y");
  }
}

TEST(SvgChart, NamesAndLabelsAreEscaped) {
  std::string svg =
      RenderLineChartSvg("<b>t</b>", "x & y", "'y'", {{"<script>", {{0, 1}, {1, 2}}}});
  EXPECT_EQ(svg.find("<script>"), std::string::npos);
  EXPECT_EQ(svg.find("<b>"), std::string::npos);
  EXPECT_NE(svg.find("data-series=\"&lt;script&gt;\""), std::string::npos);
  EXPECT_NE(svg.find("x &amp; y"), std::string::npos);
  EXPECT_NE(svg.find("&#39;y&#39;"), std::string::npos);
}

TEST(SvgChart, ManySeriesKeepDistinguishableStrokes) {
  std::vector<Series> series;
  for (int i = 0; i < 12; ++i) series.push_back({"run-" + std::to_string(i), {{0, i}, {1, i + 1}}});
  std::string svg = RenderLineChartSvg("t", "x", "y", series);
  EXPECT_EQ(SeriesPaths(svg).size(), series.size());
  std::set<std::string> strokes;
  for (const auto& s :
       AllOf(svg,
             R"re(<path class="series"[^>]*?( stroke="[^"]*"(?: stroke-dasharray="[^"]*")?))re")) {
    strokes.insert(s);
  }
  EXPECT_EQ(strokes.size(), series.size());
}

}  // namespace
}  // namespace cohort::ui
