// Test-only harness of the tests against real etcd processes (etcd_store_test.cc): etcd
// members (Debian etcd-server, /usr/bin/etcd) started with their data in a temp dir on free
// loopback ports, over http or https with client certificates, and stopped by SIGKILL; plain
// HTTP requests to them (health, status, auth setup); and a store client of them.
//
// Thread-safety: test code; an EtcdCluster is used from the test's own thread.
#pragma once

#include <curl/curl.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cohort/base/strings.h"
#include "cohort/store/etcd_store.h"

namespace cohort::store::etcd_test {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

inline constexpr const char* kEtcd = "/usr/bin/etcd";

inline Deadline Soon() { return Deadline::AfterMs(5000); }

// A free loopback port: bind port 0, read it, close (etcd cannot bind port 0 itself).
inline int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return -1;
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

inline size_t Append(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// TLS material for https members (CA, and a client certificate the members trust).
struct TlsFiles {
  std::string ca, cert, key;
};

// A plain HTTP request for the harness (health, status, auth setup); "" on failure.
inline std::string Http(const std::string& url, const std::string* post_body = nullptr,
                        long timeout_ms = 1000, const TlsFiles* tls = nullptr) {
  CURL* h = curl_easy_init();
  std::string out;
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  if (tls) {
    curl_easy_setopt(h, CURLOPT_CAINFO, tls->ca.c_str());
    curl_easy_setopt(h, CURLOPT_SSLCERT, tls->cert.c_str());
    curl_easy_setopt(h, CURLOPT_SSLKEY, tls->key.c_str());
  }
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &Append);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &out);
  if (post_body) curl_easy_setopt(h, CURLOPT_POSTFIELDS, post_body->c_str());
  long code = 0;
  CURLcode rc = curl_easy_perform(h);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
  curl_easy_cleanup(h);
  return rc == CURLE_OK && code == 200 ? out : std::string();
}

// N etcd members on loopback; killed (SIGKILL) and reaped on destruction.
class EtcdCluster {
 public:
  struct Member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    pid_t pid = -1;
  };

  ~EtcdCluster() {
    for (size_t i = 0; i < members_.size(); ++i) Kill(i);
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  // Members serve clients over https with these files and require client certificates.
  void UseTls(TlsFiles files, std::string server_cert, std::string server_key) {
    tls_ = std::move(files);
    server_cert_ = std::move(server_cert);
    server_key_ = std::move(server_key);
  }

  // Starts `n` members and waits until every one reports healthy.
  bool Start(int n, const std::vector<std::string>& extra_flags, std::string* error) {
    dir_ = fs::temp_directory_path() / ("cohort-etcd-test-" + RandomHex(6));
    fs::create_directories(dir_);
    std::string initial;
    for (int i = 0; i < n; ++i) {
      Member m{"s" + std::to_string(i), FreePort(), FreePort()};
      initial += fmt::format("{}{}=http://127.0.0.1:{}", i ? "," : "", m.name, m.peer_port);
      members_.push_back(m);
    }
    const std::string token = "cohort-test-" + RandomHex(4);
    for (auto& m : members_) {
      std::string client =
          fmt::format("{}://127.0.0.1:{}", tls_ ? "https" : "http", m.client_port);
      std::string peer = fmt::format("http://127.0.0.1:{}", m.peer_port);
      std::vector<std::string> args = {kEtcd,
                                       "--name",
                                       m.name,
                                       "--data-dir",
                                       (dir_ / m.name).string(),
                                       "--listen-client-urls",
                                       client,
                                       "--advertise-client-urls",
                                       client,
                                       "--listen-peer-urls",
                                       peer,
                                       "--initial-advertise-peer-urls",
                                       peer,
                                       "--initial-cluster",
                                       initial,
                                       "--initial-cluster-token",
                                       token,
                                       "--initial-cluster-state",
                                       "new",
                                       "--heartbeat-interval",
                                       "50",
                                       "--election-timeout",
                                       "500",
                                       "--logger",
                                       "zap",
                                       "--log-level",
                                       "error"};
      args.insert(args.end(), extra_flags.begin(), extra_flags.end());
      if (tls_) {
        for (const std::string& a : {std::string("--cert-file"), server_cert_,
                                     std::string("--key-file"), server_key_,
                                     std::string("--trusted-ca-file"), tls_->ca,
                                     std::string("--client-cert-auth")}) {
          args.push_back(a);
        }
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      std::string log = (dir_ / (m.name + ".log")).string();
      int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      pid_t pid = ::fork();
      if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (log_fd >= 0) {
          ::dup2(log_fd, 1);
          ::dup2(log_fd, 2);
        }
        ::execv(kEtcd, argv.data());
        ::_exit(127);
      }
      if (log_fd >= 0) ::close(log_fd);
      if (pid < 0) {
        *error = "fork failed";
        return false;
      }
      m.pid = pid;
    }
    // Wait for /health of every member (a harness wait for an external process).
    auto give_up = SteadyClock::now() + 20s;
    for (auto& m : members_) {
      std::string url =
          fmt::format("{}://127.0.0.1:{}/health", tls_ ? "https" : "http", m.client_port);
      while (Http(url, nullptr, 1000, tls_ ? &*tls_ : nullptr).find("\"true\"") ==
             std::string::npos) {
        if (SteadyClock::now() > give_up) {
          *error =
              fmt::format("etcd member {} not healthy in 20 s (logs in {})", m.name, dir_.string());
          return false;
        }
        std::this_thread::sleep_for(50ms);
      }
    }
    return true;
  }

  std::string Endpoint(size_t i) const {
    return fmt::format("127.0.0.1:{}", members_[i].client_port);
  }
  std::vector<std::string> Endpoints() const {
    std::vector<std::string> out;
    for (size_t i = 0; i < members_.size(); ++i) out.push_back(Endpoint(i));
    return out;
  }
  size_t size() const { return members_.size(); }

  void Kill(size_t i) {
    if (members_[i].pid <= 0) return;
    ::kill(members_[i].pid, SIGKILL);
    ::waitpid(members_[i].pid, nullptr, 0);
    members_[i].pid = -1;
  }

  // The index of the current leader, or -1.
  int Leader() const {
    std::string empty = "{}";
    for (size_t i = 0; i < members_.size(); ++i) {
      if (members_[i].pid <= 0) continue;
      std::string r =
          Http(fmt::format("http://127.0.0.1:{}/v3/maintenance/status", members_[i].client_port),
               &empty);
      json j = json::parse(r, nullptr, false);
      if (j.is_discarded() || !j.contains("leader")) continue;
      if (j["header"].value("member_id", "") == j["leader"].get<std::string>()) {
        return static_cast<int>(i);
      }
    }
    return -1;
  }

  std::string Post(size_t i, const std::string& path, const json& body) const {
    std::string text = body.dump();
    return Http(fmt::format("http://127.0.0.1:{}{}", members_[i].client_port, path), &text);
  }

 private:
  fs::path dir_;
  std::vector<Member> members_;
  std::optional<TlsFiles> tls_;
  std::string server_cert_, server_key_;
};

inline std::shared_ptr<EtcdStore> Connect(const std::vector<std::string>& endpoints,
                                          const std::string& prefix,
                                          Duration request_timeout = 5s) {
  EtcdStoreOptions o;
  o.endpoints = endpoints;
  o.prefix = prefix;
  o.request_timeout = request_timeout;
  auto s = EtcdStore::Connect(o, Soon());
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (!s.ok()) return nullptr;
  return std::shared_ptr<EtcdStore>(std::move(s).value());
}

}  // namespace cohort::store::etcd_test
