// What both of the project's store servers (the cohort store and torch's TCPStore) run on:
// ListenOn opens their listening socket, and AsioServer owns the io thread, the acceptor and
// the accept loop, handing each accepted connection to the server. Internal to cohort/store.
//
// Thread-safety: AsioServer's Start and Stop are called by the owner's thread; everything
// else (the accept callback, the owner's handlers) runs on the one io thread.
#pragma once

#include <asio.hpp>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "cohort/base/status.h"

namespace cohort::store {

// Binds `acceptor` to host:port (port 0: a free one) with SO_REUSEADDR, listens (backlog
// 4096) and makes it close-on-exec, so that no worker inherits it. `who` starts the
// error messages ("store server", "torch store").
Status ListenOn(asio::ip::tcp::acceptor& acceptor, const std::string& host, int port,
                std::string_view who);

class AsioServer {
 public:
  // Gets each accepted socket (close-on-exec, TCP_NODELAY) on the io thread.
  using OnAccept = std::function<void(asio::ip::tcp::socket)>;

  AsioServer() = default;
  AsioServer(const AsioServer&) = delete;
  AsioServer& operator=(const AsioServer&) = delete;

  asio::io_context& io() { return io_; }
  // Listens on host:port and starts the io thread `thread_name`, which accepts until Stop.
  // A failed accept (typically EMFILE) is retried after 50 ms rather than spinning.
  Status Start(const std::string& host, int port, std::string_view who,
               const char* thread_name, OnAccept on_accept);
  int port() const { return port_; }
  // Once: on the io thread, stops accepting and runs `close_all` (the owner closes its
  // connections), then stops the loop; joins the io thread.
  void Stop(const std::function<void()>& close_all);

 private:
  void Accept();

  asio::io_context io_;
  asio::ip::tcp::acceptor acceptor_{io_};
  asio::steady_timer retry_accept_{io_};
  OnAccept on_accept_;
  std::string who_;
  int port_ = 0;
  std::thread thread_;
  std::once_flag stop_once_;
};

}  // namespace cohort::store
