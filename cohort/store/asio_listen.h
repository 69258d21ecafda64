// ListenOn: opens an asio acceptor the way both of the project's store servers need it.
// Internal to cohort/store. Thread-safety: call before the acceptor's io_context runs.
#pragma once

#include <asio.hpp>
#include <string>
#include <string_view>

#include "cohort/base/status.h"

namespace cohort::store {

// Binds `acceptor` to host:port (port 0: a free one) with SO_REUSEADDR, listens (backlog
// 4096) and makes it close-on-exec, so that no worker inherits it. `who` starts the
// error messages ("store server", "torch store").
Status ListenOn(asio::ip::tcp::acceptor& acceptor, const std::string& host, int port,
                std::string_view who);

}  // namespace cohort::store
