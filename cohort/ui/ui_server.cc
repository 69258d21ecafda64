// `cohort ui`'s HTTP server: routes, the token off loopback, the anti-forgery value of
// POSTs (ui_server.h). Thread-safety: see the header.
#include "cohort/ui/ui_server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <sys/socket.h>

#include "cohort/base/strings.h"
#include "cohort/ui/page.h"
#include "cohort/ui/svg.h"

namespace cohort::ui {
namespace {

constexpr const char kTokenCookie[] = "cohort_ui_token";

bool SameSecret(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// The value of cookie `name` in the request's Cookie header, or "".
std::string CookieValue(const httplib::Request& req, std::string_view name) {
  const std::string header = req.get_header_value("Cookie");
  for (const std::string& part : Split(header, ';')) {
    const std::string_view kv = Trim(part);
    const size_t eq = kv.find('=');
    if (eq != std::string_view::npos && kv.substr(0, eq) == name) {
      return std::string(kv.substr(eq + 1));
    }
  }
  return "";
}

int64_t IdOf(const httplib::Request& req) {
  return ParseInt64(req.matches[1].str()).value_or(-1);
}

}  // namespace

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

UiServer::UiServer(UiOptions options) : o_(std::move(options)) {
  context_.home = o_.home;
  context_.cohort_bin = o_.cohort_bin;
  context_.csrf = RandomHex(16);
}

UiServer::~UiServer() { Stop(); }

void UiServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

void UiServer::Send(const Reply& reply, httplib::Response& res) {
  res.status = reply.status;
  for (const auto& [k, v] : reply.headers) res.set_header(k, v);
  if (!reply.location.empty()) {
    res.set_header("Location", reply.location);
    return;
  }
  res.set_content(reply.body, reply.content_type);
}

bool UiServer::Authorized(const httplib::Request& req, httplib::Response& res) const {
  res.set_header("X-Frame-Options", "DENY");
  res.set_header("X-Content-Type-Options", "nosniff");
  if (o_.token.empty()) return true;
  const std::string query_token = req.get_param_value("token");
  if (!query_token.empty() && SameSecret(query_token, o_.token)) {
    // Remember it in a cookie and drop it from the address bar (and from the history).
    res.set_header("Set-Cookie", fmt::format("{}={}; Path=/; HttpOnly; SameSite=Strict",
                                             kTokenCookie, o_.token));
    res.status = 303;
    res.set_header("Location", req.path);
    return false;
  }
  std::string given = CookieValue(req, kTokenCookie);
  const std::string auth = req.get_header_value("Authorization");
  if (auth.rfind("Bearer ", 0) == 0) given = auth.substr(7);
  if (!given.empty() && SameSecret(given, o_.token)) return true;
  res.status = 401;
  res.set_content(Layout("Token required", Section::kJobs,
                         "<h1>Token required</h1><p class=\"notice\">This cohort ui listens "
                         "beyond loopback: open it once as <code>/?token=TOKEN</code> (the token "
                         "it was started with), or send <code>Authorization: Bearer TOKEN</code>."
                         "</p>"),
                  "text/html; charset=utf-8");
  return false;
}

void UiServer::Route() {
  httplib::Server& s = *server_;
  const UiContext& c = context_;
  // A GET page: authorised, then the page of the request's values.
  auto get = [this, &s](const std::string& pattern,
                        std::function<Reply(const httplib::Request&)> page) {
    s.Get(pattern, [this, page](const httplib::Request& req, httplib::Response& res) {
      if (Authorized(req, res)) Send(page(req), res);
    });
  };
  // A POST action: authorised and carrying this server's anti-forgery value.
  auto post = [this, &s](const std::string& pattern,
                         std::function<Reply(const httplib::Request&)> action) {
    s.Post(pattern, [this, action](const httplib::Request& req, httplib::Response& res) {
      if (!Authorized(req, res)) return;
      if (!SameSecret(req.get_param_value("csrf"), context_.csrf)) {
        res.status = 403;
        res.set_content("refused: the form did not come from this cohort ui (reload the page)",
                        "text/plain; charset=utf-8");
        return;
      }
      Send(action(req), res);
    });
  };
  get("/", [&c](const auto& req) { return JobsPage(c, req.params); });
  get("/healthz", [](const auto&) { return Reply{200, "ok\n", "text/plain"}; });
  get(R"(/jobs/(\d+))", [&c](const auto& req) { return JobPage(c, IdOf(req), req.params); });
  get(R"(/jobs/(\d+)/log)", [&c](const auto& req) { return JobLogPage(c, IdOf(req), req.params); });
  get(R"(/jobs/(\d+)/log\.txt)",
      [&c](const auto& req) { return JobLogText(c, IdOf(req), req.params); });
  // An action's confirmation page at <base>/<id>/<verb>; its form posts back there.
  auto confirm = [&get, &c](std::string_view base, std::string_view verb, std::string title,
                            Section section, std::string question) {
    get(fmt::format(R"({}/(\d+)/{})", base, verb),
        [&c, base, verb, title, section, question](const auto& req) {
          const std::string id = std::to_string(IdOf(req));
          return Reply{200, ConfirmPage(fmt::format(fmt::runtime(title), id), section,
                                        fmt::format(fmt::runtime(question), id),
                                        fmt::format("{}/{}/{}", base, id, verb), c.csrf,
                                        fmt::format("{}/{}", base, id))};
        });
  };
  confirm("/jobs", "cancel", "cancel job {}", Section::kJobs,
          "Cancel job {}? Its workers are stopped; what they wrote stays.");
  confirm("/jobs", "resubmit", "resubmit job {}", Section::kJobs,
          "Submit job {}'s spec again, as a new job on the same backend?");
  confirm("/pipelines", "resume", "resume run {}", Section::kPipelines,
          "Run the steps of run {} that did not succeed again?");
  post(R"(/jobs/(\d+)/cancel)", [&c](const auto& req) { return CancelJob(c, IdOf(req)); });
  post(R"(/jobs/(\d+)/resubmit)", [&c](const auto& req) { return ResubmitJob(c, IdOf(req)); });
  get("/pipelines", [&c](const auto& req) { return PipelinesPage(c, req.params); });
  get(R"(/pipelines/(\d+))",
      [&c](const auto& req) { return PipelineRunPage(c, IdOf(req), req.params); });
  get(R"(/pipelines/(\d+)/steps/([^/]+))", [&c](const auto& req) {
    return PipelineStepPage(c, IdOf(req), req.matches[2].str());
  });
  get(R"(/pipelines/(\d+)/steps/([^/]+)/log\.txt)", [&c](const auto& req) {
    return PipelineStepLogText(c, IdOf(req), req.matches[2].str(), req.params);
  });
  post(R"(/pipelines/(\d+)/resume)", [&c](const auto& req) { return ResumeRun(c, IdOf(req)); });
  get("/compare", [&c](const auto& req) { return ComparePage(c, req.params); });
}

Result<std::unique_ptr<UiServer>> UiServer::Start(UiOptions options) {
  if (!IsLoopbackHost(options.host) && options.token.empty()) {
    return InvalidArgument(
        "cohort ui would listen on {} without a token: anyone who reaches that address could "
        "read every job's logs and cancel jobs. Give one (--token-file FILE or COHORT_UI_TOKEN), "
        "or keep the default --host 127.0.0.1",
        options.host);
  }
  std::unique_ptr<UiServer> u(new UiServer(std::move(options)));
  u->server_ = std::make_unique<httplib::Server>();
  u->server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  const int threads = std::max(2, u->o_.threads);
  u->server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  u->server_->set_keep_alive_timeout(2);
  u->server_->set_read_timeout(5, 0);
  u->server_->set_write_timeout(10, 0);
  u->Route();
  const std::string& host = u->o_.host;
  if (u->o_.port == 0) {
    u->port_ = u->server_->bind_to_any_port(host);
  } else if (u->server_->bind_to_port(host, u->o_.port)) {
    u->port_ = u->o_.port;
  }
  if (u->port_ <= 0) {
    return AlreadyExists("cannot listen on {}:{} (the port is in use, or the address is not "
                         "this machine's): choose another with --port, or 0 for any",
                         host, u->o_.port);
  }
  UiServer* raw = u.get();
  u->thread_ = std::thread([raw] { raw->server_->listen_after_bind(); });
  return u;
}

}  // namespace cohort::ui
