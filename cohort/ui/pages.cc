// What the pages of `cohort ui` share (pages.h): request values, replies, and logs read
// from an offset and followed by a small script.
// Thread-safety: pure functions over files.
#include "cohort/ui/pages.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "cohort/base/strings.h"
#include "cohort/launch/local_backend.h"
#include "cohort/ui/page.h"
#include "cohort/ui/svg.h"

namespace cohort::ui {

std::string Param(const Query& q, std::string_view key, std::string_view fallback) {
  auto it = q.find(std::string(key));
  return it == q.end() ? std::string(fallback) : it->second;
}

namespace {

// A read-only history, or nullptr when its file does not exist.
template <typename Db>
Result<std::unique_ptr<Db>> OpenHistory(const std::string& path) {
  auto db = Db::OpenReadOnly(path);
  if (!db.ok() && db.status().code() == StatusCode::kNotFound) return std::unique_ptr<Db>();
  return db;
}

}  // namespace

Result<std::unique_ptr<launch::JobDb>> OpenJobHistory(const UiContext& c) {
  return OpenHistory<launch::JobDb>(launch::JobDbPath(c.home));
}

Result<std::unique_ptr<pipeline::RunDb>> OpenRunHistory(const UiContext& c) {
  return OpenHistory<pipeline::RunDb>(pipeline::RunDbPath(c.home));
}

namespace {

// `what` from the history `opened` by `get`, or the page that says why not.
template <typename Db, typename Record, typename Get>
Found<Db, Record> Find(Result<std::unique_ptr<Db>> opened, const std::string& what, Get get) {
  Found<Db, Record> out;
  if (!opened.ok()) {
    out.instead = ErrorPage(opened.status().ToString());
    return out;
  }
  out.db = std::move(*opened);
  auto record = out.db ? get(*out.db) : Result<Record>(NotFound("no history yet"));
  if (record.ok()) {
    out.record = std::move(*record);
  } else {
    out.instead = NotFoundPage(what);
  }
  return out;
}

}  // namespace

Found<launch::JobDb, launch::JobRecord> FindJob(const UiContext& c, int64_t id) {
  return Find<launch::JobDb, launch::JobRecord>(OpenJobHistory(c), fmt::format("job {}", id),
              [id](launch::JobDb& db) { return db.Get(id); });
}

Found<pipeline::RunDb, pipeline::RunRecord> FindRun(const UiContext& c, int64_t id) {
  return Find<pipeline::RunDb, pipeline::RunRecord>(OpenRunHistory(c), fmt::format("pipeline run {}", id),
              [id](pipeline::RunDb& db) { return db.GetRun(id); });
}

Result<std::unique_ptr<launch::Backend>> BackendFor(const UiContext& c,
                                                    const launch::JobRecord& job) {
  launch::BackendOptions o;
  o.home = c.home;
  o.cohort_bin = c.cohort_bin;
  return launch::MakeBackendForJob(job, o);
}

std::string KeyValues(const std::map<std::string, std::string>& values,
                      std::string_view separator) {
  std::string out;
  for (const auto& [k, v] : values) {
    out += fmt::format("{}<code>{}={}</code>", out.empty() ? "" : separator, Escape(k),
                       Escape(v));
  }
  return out;
}

Reply NotFoundPage(std::string_view what) {
  Reply r;
  r.status = 404;
  r.body = Layout("Not found", Section::kJobs,
                  fmt::format("<h1>Not found</h1><p class=\"notice\" id=\"not-found\">{}</p>"
                              "<p><a href=\"/\">All jobs</a></p>",
                              Escape(what)));
  return r;
}

Reply ErrorPage(const std::string& what) {
  Reply r;
  r.status = 500;
  r.body = Layout("Error", Section::kJobs,
                  fmt::format("<h1>Error</h1><p class=\"notice\">{}</p>", Escape(what)));
  return r;
}

Reply Redirect(std::string location) {
  Reply r;
  r.status = 303;
  r.location = std::move(location);
  return r;
}

FileChunk ReadFileChunk(const std::string& path, int64_t offset, int64_t max_bytes) {
  FileChunk chunk;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return chunk;
  chunk.exists = true;
  const int64_t size = static_cast<int64_t>(in.tellg());
  if (offset < 0) offset = std::max<int64_t>(0, size - max_bytes);
  if (offset > size) offset = size;  // the file was replaced by a shorter one
  const int64_t n = std::min<int64_t>(size - offset, max_bytes);
  chunk.text.resize(static_cast<size_t>(n));
  in.seekg(offset);
  in.read(chunk.text.data(), n);
  chunk.text.resize(static_cast<size_t>(in.gcount()));
  chunk.next_offset = offset + static_cast<int64_t>(chunk.text.size());
  return chunk;
}

std::string LogBody(std::string_view heading, const std::string& path, std::string_view text_url,
                    bool live) {
  const FileChunk tail = ReadFileChunk(path, -1, 256 << 10);
  std::string body = fmt::format("<h1>{}</h1>\n<p class=\"muted\"><code>{}</code>{}</p>\n",
                                 Escape(heading), Escape(path),
                                 live ? " · <span id=\"following\">following</span>" : "");
  body += fmt::format("<pre id=\"log\" data-offset=\"{}\">{}</pre>\n", tail.next_offset,
                      tail.exists ? Escape(tail.text) : "(no log yet)");
  if (!live) return body;
  // Follow: ask for what was appended since the offset, every second, until the job ends.
  body += fmt::format(R"js(<script>
(function(){{
  var pre=document.getElementById('log'), sep='{0}'.indexOf('?')<0?'?':'&';
  function poll(){{
    fetch('{0}'+sep+'offset='+pre.dataset.offset,{{cache:'no-store'}}).then(function(r){{
      var done=r.headers.get('X-Cohort-Done')==='1', next=r.headers.get('X-Cohort-Offset');
      return r.text().then(function(t){{
        if(pre.textContent==='(no log yet)')pre.textContent='';
        if(t){{var end=pre.scrollTop+pre.clientHeight>=pre.scrollHeight-4;
          pre.textContent+=t; if(end)pre.scrollTop=pre.scrollHeight;}}
        if(next)pre.dataset.offset=next;
        if(done){{document.getElementById('following').textContent='ended';}}
        else setTimeout(poll,1000);
      }});
    }}).catch(function(){{setTimeout(poll,3000);}});
  }}
  setTimeout(poll,1000);
}})();
</script>)js",
                      text_url);
  return body;
}

Reply LogTextReply(const std::string& path, const Query& q, bool live) {
  const int64_t offset = ParseInt64(Param(q, "offset", "-1")).value_or(-1);
  const FileChunk chunk = ReadFileChunk(path, offset, 1 << 20);
  Reply r;
  r.content_type = "text/plain; charset=utf-8";
  r.body = chunk.text;
  r.headers["X-Cohort-Offset"] = std::to_string(chunk.next_offset);
  r.headers["X-Cohort-Done"] = live ? "0" : "1";
  r.headers["Cache-Control"] = "no-store";
  return r;
}

}  // namespace cohort::ui
