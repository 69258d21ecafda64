// The layout, badges and time formats every page of `cohort ui` shares (page.h).
// Thread-safety: pure functions.
#include "cohort/ui/page.h"

#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <ctime>

#include "cohort/base/time.h"
#include "cohort/ui/svg.h"

namespace cohort::ui {
namespace {

// One style for every page: readable on a laptop, one column on a phone.
constexpr const char kStyle[] = R"css(
*{box-sizing:border-box}
body{font:14px system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2430}
header{background:#1d2430;color:#fff;padding:8px 16px;display:flex;gap:18px;align-items:center;flex-wrap:wrap}
header b{font-size:16px;margin-right:8px}
header a{color:#c9d3e3;text-decoration:none;padding:4px 2px}
header a.on{color:#fff;border-bottom:2px solid #6aa9ff}
main{padding:12px 16px;max-width:1200px}
h1{font-size:20px;margin:4px 0 10px;word-break:break-word} h2{font-size:15px;margin:18px 0 6px}
a{color:#1f5fbf}
.cards{display:flex;gap:8px;flex-wrap:wrap;margin-bottom:8px}
.card{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:6px 10px;min-width:110px}
.card>span{display:block;color:#687385;font-size:12px} .card>b{font-size:15px;word-break:break-all}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;background:#fff;font-variant-numeric:tabular-nums}
td,th{border:1px solid #dde1e7;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#eef1f5;font-weight:600}
td.n,th.n{text-align:right}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;color:#fff;font-size:12px;font-weight:600}
.muted{color:#687385}
pre{background:#fff;border:1px solid #dde1e7;padding:8px;overflow:auto;max-height:70vh;font-size:12px;white-space:pre-wrap;word-break:break-all}
form.filters{display:flex;gap:8px;flex-wrap:wrap;align-items:end;margin-bottom:10px}
form.filters label{display:flex;flex-direction:column;font-size:12px;color:#687385}
input,select,button{font:inherit;padding:4px 6px}
.button{display:inline-block;border:1px solid #b9c2cf;border-radius:5px;background:#fff;padding:4px 10px;text-decoration:none;color:#1d2430;cursor:pointer}
.button.danger{border-color:#c0392b;color:#c0392b}
.actions{display:flex;gap:8px;margin:8px 0;flex-wrap:wrap}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(92px,1fr));gap:6px}
.cell{display:block;border-radius:5px;padding:6px;color:#fff;text-decoration:none;font-size:12px;min-height:54px}
.cell b{display:block;font-size:14px}
.dag{background:#fff;border:1px solid #dde1e7;border-radius:6px;max-width:100%;height:auto}
.chart{background:#fff;border:1px solid #dde1e7;border-radius:6px}
.notice{background:#fff6dd;border:1px solid #e8d28a;padding:6px 10px;border-radius:5px}
@media (max-width:640px){main{padding:8px} td,th{padding:3px 5px} .hide-narrow{display:none}}
)css";

std::string_view SectionHref(Section s) {
  switch (s) {
    case Section::kJobs: return "/";
    case Section::kPipelines: return "/pipelines";
    case Section::kCompare: return "/compare";
  }
  return "/";
}

std::string NavLink(Section s, Section on, std::string_view label) {
  return fmt::format("<a href=\"{}\"{}>{}</a>", SectionHref(s), s == on ? " class=\"on\"" : "",
                     label);
}

}  // namespace

std::string Layout(std::string_view title, Section section, std::string_view body,
                   int refresh_s) {
  const std::string refresh =
      refresh_s > 0 ? fmt::format("<meta http-equiv=\"refresh\" content=\"{}\">\n", refresh_s)
                    : std::string();
  return fmt::format(
      "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\n{}"
      "<title>{} · cohort</title>\n<style>{}</style></head>\n<body>\n"
      "<header><b>cohort</b>{}{}{}</header>\n<main>\n{}\n</main>\n</body></html>\n",
      refresh, Escape(title), kStyle, NavLink(Section::kJobs, section, "Jobs"),
      NavLink(Section::kPipelines, section, "Pipelines"),
      NavLink(Section::kCompare, section, "Compare"), body);
}

std::string_view StateTextColour(std::string_view state) {
  return state == "skipped" || state == "pending" ? "#1d2430" : "#fff";
}

std::string Badge(std::string_view state) {
  const std::string s = Escape(state);
  return fmt::format("<span class=\"badge state-{0}\" data-state=\"{0}\" "
                     "style=\"background:{1};color:{2}\">{0}</span>",
                     s, StateColour(state), StateTextColour(state));
}

std::string FormatTime(double unix_seconds) {
  if (unix_seconds <= 0) return "";
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::string FormatDuration(double seconds) {
  if (!(seconds >= 0)) return "";
  if (seconds < 1) return fmt::format("{:.0f} ms", seconds * 1000);
  if (seconds < 60) return fmt::format("{:.1f} s", seconds);
  const auto whole = static_cast<int64_t>(std::llround(seconds));
  if (whole < 3600) return fmt::format("{} min {:02} s", whole / 60, whole % 60);
  return fmt::format("{} h {:02} min", whole / 3600, (whole % 3600) / 60);
}

std::string Elapsed(double start, double end) {
  if (start <= 0) return "";
  return FormatDuration((end > 0 ? end : WallSeconds()) - start);
}

std::string UrlEncode(std::string_view text) {
  std::string out;
  for (const unsigned char ch : text) {
    if (std::isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '~') {
      out += static_cast<char>(ch);
    } else {
      out += fmt::format("%{:02X}", ch);
    }
  }
  return out;
}

std::string ConfirmPage(std::string_view title, Section section, std::string_view question,
                        std::string_view action, std::string_view csrf,
                        std::string_view back) {
  const std::string body = fmt::format(
      "<h1>{0}</h1>\n<p class=\"notice\">{1}</p>\n"
      "<form method=\"post\" action=\"{2}\" class=\"actions\">"
      "<input type=\"hidden\" name=\"csrf\" value=\"{3}\">"
      "<button type=\"submit\" class=\"button danger\" id=\"confirm\">Yes, {0}</button>"
      "<a class=\"button\" href=\"{4}\">No, go back</a></form>",
      Escape(title), Escape(question), Escape(action), Escape(csrf), Escape(back));
  return Layout(title, section, body);
}

}  // namespace cohort::ui
