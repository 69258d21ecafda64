// The style both monitoring pages (dashboard_page.cc, job_page.cc) share: page, headings,
// cards and tables. A macro so that each page stays one constant string (adjacent string
// literals are joined by the compiler). Thread-safety: a constant.
#pragma once

#define COHORT_PAGE_BASE_STYLE \
  "body{font:14px system-ui,sans-serif;margin:16px;background:#f7f7f9;color:#222}\n" \
  "h1{font-size:20px;margin:0 0 8px} h2{font-size:15px;margin:18px 0 6px}\n" \
  ".cards{display:flex;gap:10px;flex-wrap:wrap}\n" \
  ".card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:110px}\n" \
  ".card b{display:block;font-size:18px}\n" \
  "table{border-collapse:collapse;background:#fff;font-variant-numeric:tabular-nums}\n" \
  "td,th{border:1px solid #ddd;padding:3px 8px;text-align:right} th{background:#eee}\n" \
  "td.l,th.l{text-align:left}\n" \
  ".muted{color:#777}\n"
