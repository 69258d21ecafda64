// The pages of `cohort ui` (job_pages.cc, pipeline_pages.cc, compare_page.cc), as functions
// of the request's values to a reply, so that the server (ui_server.cc) only routes. Each
// page opens its own database connection (JobDb, RunDb: one per thread) and only reads.
//
// Thread-safety: every function may run on any thread at once (nothing shared but files).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "cohort/launch/backend.h"
#include "cohort/launch/job_db.h"
#include "cohort/pipeline/run_db.h"

namespace cohort::ui {

// What every page needs from the server.
struct UiContext {
  std::string home;        // $COHORT_HOME: jobs.db, pipelines.db, logs
  std::string csrf;        // this server's anti-forgery value (forms that change something)
  std::string cohort_bin;  // the `cohort` the actions run (the same code as the CLI's)
};

// A request's query or form values (httplib::Params has this shape).
using Query = std::multimap<std::string, std::string>;
// The first value of `key`, or `fallback`.
std::string Param(const Query& q, std::string_view key, std::string_view fallback = "");

struct Reply {
  int status = 200;
  std::string body;
  std::string content_type = "text/html; charset=utf-8";
  std::string location;  // a redirect's target (status 303)
  std::map<std::string, std::string> headers;
};
// The job and pipeline histories, read-only; nullptr when there is none yet (the page says
// so, and nothing is created).
Result<std::unique_ptr<launch::JobDb>> OpenJobHistory(const UiContext& c);
Result<std::unique_ptr<pipeline::RunDb>> OpenRunHistory(const UiContext& c);
Reply NotFoundPage(std::string_view what);
// A 500 page saying what failed (a history that cannot be read).
Reply ErrorPage(const std::string& what);
Reply Redirect(std::string location);

// A record from a history with the open history it came from, or the page to answer instead
// (`instead`: 500 when the history cannot be read, 404 when it or the record is absent).
template <typename Db, typename Record>
struct Found {
  std::unique_ptr<Db> db;
  Record record;
  std::optional<Reply> instead;
};
Found<launch::JobDb, launch::JobRecord> FindJob(const UiContext& c, int64_t id);
Found<pipeline::RunDb, pipeline::RunRecord> FindRun(const UiContext& c, int64_t id);
// The backend that ran `job` (its logs, for one).
Result<std::unique_ptr<launch::Backend>> BackendFor(const UiContext& c,
                                                    const launch::JobRecord& job);
// "<code>k=v</code>" for each entry, joined by `separator` (parameters, outputs).
std::string KeyValues(const std::map<std::string, std::string>& values,
                      std::string_view separator);

// Jobs: the list (?state=&backend=&name=), a job, its log (?element=&rank=; .txt with
// &offset= for following), the confirmation pages of cancel and resubmit.
Reply JobsPage(const UiContext& c, const Query& q);
Reply JobPage(const UiContext& c, int64_t id, const Query& q);
Reply JobLogPage(const UiContext& c, int64_t id, const Query& q);
Reply JobLogText(const UiContext& c, int64_t id, const Query& q);
// What the page's buttons do: run `cohort cancel` / `cohort submit` (the CLI's code) and
// go back to the job (or to the new one) with what the command said.
Reply CancelJob(const UiContext& c, int64_t id);
Reply ResubmitJob(const UiContext& c, int64_t id);

// Pipelines: the runs, a run (its DAG), a step (logs, outputs), resume.
Reply PipelinesPage(const UiContext& c, const Query& q);
Reply PipelineRunPage(const UiContext& c, int64_t id, const Query& q);
Reply PipelineStepPage(const UiContext& c, int64_t id, const std::string& step);
Reply PipelineStepLogText(const UiContext& c, int64_t id, const std::string& step,
                          const Query& q);
Reply ResumeRun(const UiContext& c, int64_t id);

// A running job's live page (`<agent's dashboard>/job`, from the address its agent logged in
// the job's console, which `backend` finds), or "" (not running, an array, no endpoint).
std::string LiveJobPageUrl(launch::Backend& backend, const launch::JobRecord& job);

// Compare: loss and samples/s of the chosen jobs (?job=1&job=2) on one chart each.
Reply ComparePage(const UiContext& c, const Query& q);

// The tail of a file from `offset` (at most `max_bytes`; a negative offset: the last
// `max_bytes`), for following a log: the text, and the offset to ask from next.
struct FileChunk {
  std::string text;
  int64_t next_offset = 0;
  bool exists = false;
};
FileChunk ReadFileChunk(const std::string& path, int64_t offset, int64_t max_bytes);

// A log page: `path`'s last 256 KiB, followed (a small script asks `text_url`&offset=N every
// second) while `live`.
std::string LogBody(std::string_view heading, const std::string& path, std::string_view text_url,
                    bool live);
Reply LogTextReply(const std::string& path, const Query& q, bool live);

}  // namespace cohort::ui
