// rdzv_bench: time for N agents (threads, each with its own store connection) to complete one
// rendezvous round (min = max = N), from the start of the first agent thread until every
// agent's Next() returned. Connections are opened before the clock starts ("connect_seconds").
// Prints one JSON line:
//   {"agents": N, "backend": B, "seconds": S, "connect_seconds": C, "reps": K, "all": [...]}
// Usage: rdzv_bench [--agents N] [--reps K] [--join-timeout SEC] [--last-call SEC]
//                   [--backend embedded|etcd] [--endpoints host:port,...]
//   embedded  a StoreServer on 127.0.0.1 (fresh per rep), one TcpStore per agent
//   etcd      an etcd v3 cluster at --endpoints, one EtcdStore per agent; each rep uses its
//             own random key prefix, so reps and runs never see each other's keys
// "seconds" is the median of K reps.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cohort/base/strings.h"
#include "cohort/rendezvous/rendezvous.h"
#include "cohort/store/etcd_store.h"
#include "cohort/store/store_server.h"
#include "cohort/store/tcp_store.h"

using namespace cohort;

namespace {

Duration SecondsToDuration(double s) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}

int Usage() {
  fmt::print(stderr,
             "usage: rdzv_bench [--agents N] [--reps K] [--join-timeout SEC] [--last-call SEC]\n"
             "                  [--backend embedded|etcd] [--endpoints host:port,...]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int agents = 256, reps = 5;
  double join_timeout_s = 60, last_call_s = 1;
  std::string backend = "embedded", endpoints_text;
  for (int i = 1; i < argc; i += 2) {
    std::string flag = argv[i];
    if (i + 1 >= argc) return Usage();
    std::string value = argv[i + 1];
    if (flag == "--agents") {
      agents = std::atoi(value.c_str());
    } else if (flag == "--reps") {
      reps = std::atoi(value.c_str());
    } else if (flag == "--join-timeout") {
      join_timeout_s = std::atof(value.c_str());
    } else if (flag == "--last-call") {
      last_call_s = std::atof(value.c_str());
    } else if (flag == "--backend") {
      backend = value;
    } else if (flag == "--endpoints") {
      endpoints_text = value;
    } else {
      return Usage();
    }
  }
  if (agents < 1 || reps < 1 || (backend != "embedded" && backend != "etcd")) return Usage();
  std::vector<std::string> endpoints;
  if (backend == "etcd") {
    auto parsed = store::ParseEtcdEndpoints(endpoints_text);
    if (!parsed.ok() || parsed->empty()) {
      fmt::print(stderr, "rdzv_bench: --backend etcd needs --endpoints host:port,...: {}\n",
                 parsed.ok() ? "empty" : parsed.status().ToString());
      return 2;
    }
    endpoints = std::move(parsed).value();
  }
  store::RaiseFileLimit();
  std::vector<double> times, connect_times;
  for (int rep = 0; rep < reps; ++rep) {
    std::string token = RandomHex(16);
    std::unique_ptr<store::StoreServer> server;
    if (backend == "embedded") {
      auto started = store::StoreServer::Start({.host = "127.0.0.1", .port = 0, .token = token});
      if (!started.ok()) {
        fmt::print(stderr, "{}\n", started.status().ToString());
        return 1;
      }
      server = std::move(started).value();
    }
    std::string prefix = fmt::format("rdzvbench-{}", RandomHex(8));
    auto connect_start = SteadyClock::now();
    std::vector<std::shared_ptr<store::Store>> stores;
    for (int i = 0; i < agents; ++i) {
      if (backend == "embedded") {
        auto s = store::TcpStore::Connect(
            {.host = "127.0.0.1", .port = server->port(), .token = token},
            Deadline::AfterMs(10000));
        if (!s.ok()) {
          fmt::print(stderr, "agent {}: {}\n", i, s.status().ToString());
          return 1;
        }
        stores.emplace_back(std::move(s).value());
      } else {
        store::EtcdStoreOptions options;
        options.endpoints = endpoints;
        options.prefix = prefix;
        auto s = store::EtcdStore::Connect(options, Deadline::AfterMs(10000));
        if (!s.ok()) {
          fmt::print(stderr, "agent {}: {}\n", i, s.status().ToString());
          return 1;
        }
        stores.emplace_back(std::move(s).value());
      }
    }
    connect_times.push_back(SecondsSince(connect_start));
    rendezvous::RendezvousConfig config;
    config.run_id = fmt::format("bench{}", rep);
    config.min_nodes = config.max_nodes = agents;
    config.join_timeout = SecondsToDuration(join_timeout_s);
    config.last_call = SecondsToDuration(last_call_s);
    std::atomic<int> failures{0};
    std::mutex error_mu;
    std::string first_error;
    auto start = SteadyClock::now();
    std::vector<std::thread> threads;
    threads.reserve(agents);
    for (int i = 0; i < agents; ++i) {
      threads.emplace_back([&, i] {
        rendezvous::NodeInfo self{fmt::format("host{}", i), "127.0.0.1", 1, ""};
        rendezvous::Rendezvous r(stores[i], config, self);
        auto info = r.Next();
        if (!info.ok()) {
          failures++;
          std::lock_guard<std::mutex> lock(error_mu);
          if (first_error.empty()) first_error = info.status().ToString();
        } else if (info->group_world_size != agents) {
          failures++;
          std::lock_guard<std::mutex> lock(error_mu);
          if (first_error.empty())
            first_error = fmt::format("world size {} != {}", info->group_world_size, agents);
        }
      });
    }
    for (auto& t : threads) t.join();
    times.push_back(SecondsSince(start));
    if (failures) {
      fmt::print(stderr, "{} of {} agents failed to rendezvous ({}): {}\n", failures.load(),
                 agents, backend, first_error);
      return 1;
    }
    stores.clear();  // closes the connections (and etcd leases) before the next rep
  }
  std::vector<double> all = times;
  std::sort(times.begin(), times.end());
  std::sort(connect_times.begin(), connect_times.end());
  std::string all_text;
  for (size_t i = 0; i < all.size(); ++i)
    all_text += fmt::format("{}{:.6f}", i ? ", " : "", all[i]);
  fmt::print(
      "{{\"agents\": {}, \"backend\": \"{}\", \"seconds\": {:.6f}, \"connect_seconds\": {:.6f}, "
      "\"reps\": {}, \"all\": [{}]}}\n",
      agents, backend, times[times.size() / 2], connect_times[connect_times.size() / 2], reps,
      all_text);
  return 0;
}
