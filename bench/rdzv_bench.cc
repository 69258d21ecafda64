// rdzv_bench: time for N agents (threads, each with its own TCP connection) to complete one
// rendezvous round on the embedded store. Prints one JSON line:
//   {"agents": N, "seconds": S, "connect_seconds": C}
// Usage: rdzv_bench [--agents N] [--reps K]   (median of K reps)
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "cohort/base/strings.h"
#include "cohort/rendezvous/rendezvous.h"
#include "cohort/store/store_server.h"
#include "cohort/store/tcp_store.h"

using namespace cohort;

int main(int argc, char** argv) {
  int agents = 256, reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--agents") agents = std::atoi(argv[i + 1]);
    if (flag == "--reps") reps = std::atoi(argv[i + 1]);
  }
  store::RaiseFileLimit();
  std::vector<double> times, connect_times;
  for (int rep = 0; rep < reps; ++rep) {
    std::string token = RandomHex(16);
    auto server = store::StoreServer::Start({.host = "127.0.0.1", .port = 0, .token = token});
    if (!server.ok()) {
      fmt::print(stderr, "{}\n", server.status().ToString());
      return 1;
    }
    auto connect_start = SteadyClock::now();
    std::vector<std::shared_ptr<store::Store>> stores;
    for (int i = 0; i < agents; ++i) {
      auto s = store::TcpStore::Connect(
          {.host = "127.0.0.1", .port = (*server)->port(), .token = token},
          Deadline::AfterMs(10000));
      if (!s.ok()) {
        fmt::print(stderr, "{}\n", s.status().ToString());
        return 1;
      }
      stores.emplace_back(std::move(s).value());
    }
    connect_times.push_back(SecondsSince(connect_start));
    rendezvous::RendezvousConfig config;
    config.run_id = fmt::format("bench{}", rep);
    config.min_nodes = config.max_nodes = agents;
    config.join_timeout = std::chrono::seconds(60);
    std::atomic<int> failures{0};
    auto start = SteadyClock::now();
    std::vector<std::thread> threads;
    for (int i = 0; i < agents; ++i) {
      threads.emplace_back([&, i] {
        rendezvous::NodeInfo self{fmt::format("host{}", i), "127.0.0.1", 1, ""};
        rendezvous::Rendezvous r(stores[i], config, self);
        if (!r.Next().ok()) failures++;
      });
    }
    for (auto& t : threads) t.join();
    times.push_back(SecondsSince(start));
    if (failures) {
      fmt::print(stderr, "{} agents failed to rendezvous\n", failures.load());
      return 1;
    }
  }
  std::sort(times.begin(), times.end());
  std::sort(connect_times.begin(), connect_times.end());
  fmt::print("{{\"agents\": {}, \"seconds\": {:.6f}, \"connect_seconds\": {:.6f}}}\n", agents,
             times[times.size() / 2], connect_times[connect_times.size() / 2]);
  return 0;
}
