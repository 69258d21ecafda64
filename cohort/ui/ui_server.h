// UiServer: `cohort ui`'s HTTP server (cpp-httplib) over $COHORT_HOME's job and pipeline
// histories: it routes each request to its page (pages.h) and guards it.
//   - Bound to loopback by default; any other address needs a token (the request carries
//     it as ?token=, which sets a cookie, as a cookie, or as "Authorization: Bearer"),
//     compared in constant time; without it every page answers 401.
//   - What changes something (cancel, resubmit, resume) is a POST from the page's own form:
//     it must carry the server's anti-forgery value (a random one per server), so that
//     another web page cannot post to it through the user's browser.
//
// Thread-safety: Start/Stop from the owning thread; requests run on httplib's pool, each
// on its own database connections (pages.h); the server's own state is immutable after
// Start.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "cohort/base/status.h"
#include "cohort/ui/pages.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}

namespace cohort::ui {

struct UiOptions {
  std::string home;              // $COHORT_HOME
  std::string host = "127.0.0.1";
  int port = 0;                  // 0: any free port (see port())
  std::string token;             // required when `host` is not a loopback address
  std::string cohort_bin;        // the `cohort` that actions run
  int threads = 16;              // requests served at once
};

// 127.0.0.0/8, ::1 and "localhost".
bool IsLoopbackHost(const std::string& host);

class UiServer {
 public:
  // kInvalidArgument: off loopback without a token; kAlreadyExists: the port is taken.
  static Result<std::unique_ptr<UiServer>> Start(UiOptions options);
  ~UiServer();
  int port() const { return port_; }
  void Stop();

 private:
  explicit UiServer(UiOptions options);
  void Route();
  // Whether the request may be served (else `res` holds the 401 or the cookie's redirect).
  bool Authorized(const httplib::Request& req, httplib::Response& res) const;
  // Serves `reply` (status, body, redirect, headers).
  static void Send(const Reply& reply, httplib::Response& res);

  UiOptions o_;
  UiContext context_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace cohort::ui
