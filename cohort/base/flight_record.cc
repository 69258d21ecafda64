// Flight-record format (see flight_record.h). Thread-safety: pure functions.
#include "cohort/base/flight_record.h"

#include <fmt/format.h>

#include <sstream>

#include "cohort/base/strings.h"

namespace cohort {

std::string FlightRecordPath(const std::string& dir, int rank) {
  return fmt::format("{}/rank{}.txt", dir, rank);
}

std::string FormatFlightRecord(int rank, const std::vector<FlightRecordEntry>& entries) {
  std::string out = fmt::format("cohort flight recorder, rank {}: last {} operation(s)\n", rank,
                                entries.size());
  out += fmt::format("  {:>6} {:<14} {:<9} {:>5} {:>12} {:>5} {:<10} {:>10} {:>10}\n", "seq", "op",
                     "type", "redop", "count", "root", "state", "start", "ms");
  for (const FlightRecordEntry& e : entries) {
    out += fmt::format("  {:>6} {:<14} {:<9} {:>5} {:>12} {:>5} {:<10} {:>10.3f} {:>10.3f}{}\n",
                       e.seq, e.op, e.dtype, e.redop, e.count, e.root, e.state, e.start, e.ms,
                       e.error.empty() ? "" : "  " + e.error);
  }
  return out;
}

std::optional<FlightRecordEntry> LastFlightRecordEntry(std::string_view text) {
  std::optional<FlightRecordEntry> last;
  for (const std::string& line : Split(text, '\n')) {
    std::string_view t = Trim(line);
    if (t.empty() || !std::isdigit(static_cast<unsigned char>(t[0]))) continue;  // headers
    std::istringstream fields{std::string(t)};
    FlightRecordEntry e;
    if (!(fields >> e.seq >> e.op >> e.dtype >> e.redop >> e.count >> e.root >> e.state >>
          e.start >> e.ms)) {
      continue;
    }
    std::getline(fields, e.error);
    e.error = std::string(Trim(e.error));
    last = std::move(e);
  }
  return last;
}

}  // namespace cohort
