// What every page of `cohort ui` shares: the layout (head, style, navigation, a page that
// fits a laptop and a phone, no script or font fetched from anywhere), state badges, and
// how times and durations are written.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

namespace cohort::ui {

// Which navigation entry is the current one.
enum class Section { kJobs, kPipelines, kCompare };

// A whole HTML page: `title` (escaped here), `body` (HTML, already escaped by the caller).
// `refresh_s` > 0: the page reloads itself that often (a job or run that is not over).
std::string Layout(std::string_view title, Section section, std::string_view body,
                   int refresh_s = 0);

// The text colour that reads on StateColour(state): dark on the light fills (skipped,
// pending), else white.
std::string_view StateTextColour(std::string_view state);

// <span class="badge state-<state>" data-state="<state>">state</span>, coloured as in
// StateColour.
std::string Badge(std::string_view state);

// "2026-12-05 20:10:03" (UTC) for unix seconds; "" for 0.
std::string FormatTime(double unix_seconds);
// "850 ms", "12.3 s", "4 min 05 s", "2 h 03 min"; "" for a negative duration.
std::string FormatDuration(double seconds);
// From `start` to `end` (0: to now); "" when it did not start.
std::string Elapsed(double start, double end);

// `text` for a URL's query value (RFC 3986 unreserved characters kept, the rest %XX).
std::string UrlEncode(std::string_view text);

// The confirmation page of an action (no script needed): `question`, and a form that POSTs
// to `action` with the server's anti-forgery value, or goes back to `back`.
std::string ConfirmPage(std::string_view title, Section section, std::string_view question,
                        std::string_view action, std::string_view csrf,
                        std::string_view back);

}  // namespace cohort::ui
