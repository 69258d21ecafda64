// Implements ListenOn (asio_listen.h).
#include "cohort/store/asio_listen.h"

#include <fcntl.h>

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
