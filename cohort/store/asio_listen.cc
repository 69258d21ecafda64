// Implements ListenOn (asio_listen.h).
#include "cohort/store/asio_listen.h"

#include <fcntl.h>
#include <pthread.h>

#include "cohort/base/log.h"

namespace cohort::store {

Status ListenOn(asio::ip::tcp::acceptor& acceptor, const std::string& host, int port,
                std::string_view who) {
  using asio::ip::tcp;
  asio::error_code ec;
  auto address = asio::ip::make_address(host, ec);
  if (ec) return InvalidArgument("{}: bad listen address '{}'", who, host);
  tcp::endpoint endpoint(address, static_cast<uint16_t>(port));
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(4096, ec);
  if (ec) return ErrnoStatus(fmt::format("{}: listen on {}:{}", who, host, port), ec.value());
  ::fcntl(acceptor.native_handle(), F_SETFD, FD_CLOEXEC);  // never inherited by workers
  return Status::Ok();
}

}  // namespace cohort::store

namespace cohort::store {

Status AsioServer::Start(const std::string& host, int port, std::string_view who,
                         const char* thread_name, OnAccept on_accept) {
  COHORT_RETURN_IF_ERROR(ListenOn(acceptor_, host, port, who));
  port_ = acceptor_.local_endpoint().port();
  who_ = who;
  on_accept_ = std::move(on_accept);
  Accept();
  thread_ = std::thread([this, thread_name] {
    pthread_setname_np(pthread_self(), thread_name);
    io_.run();
  });
  return Status::Ok();
}

void AsioServer::Stop(const std::function<void()>& close_all) {
  std::call_once(stop_once_, [&] {
    asio::post(io_, [&] {
      asio::error_code ec;
      acceptor_.close(ec);
      retry_accept_.cancel();
      close_all();
      io_.stop();
    });
    if (thread_.joinable()) thread_.join();
  });
}

void AsioServer::Accept() {
  acceptor_.async_accept([this](asio::error_code ec, asio::ip::tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) {
      COHORT_LOG_WARN("store", "{}: accept failed: {}; retrying", who_, ec.message());
      retry_accept_.expires_after(std::chrono::milliseconds(50));
      retry_accept_.async_wait([this](asio::error_code e) {
        if (!e) Accept();
      });
      return;
    }
    ::fcntl(socket.native_handle(), F_SETFD, FD_CLOEXEC);
    asio::error_code ignored;
    socket.set_option(asio::ip::tcp::no_delay(true), ignored);
    on_accept_(std::move(socket));
    Accept();
  });
}

}  // namespace cohort::store
