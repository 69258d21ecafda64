// EventFd (see event_fd.h). Thread-safety: as there.
#include "cohort/base/event_fd.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>

namespace cohort {

EventFd::EventFd() : fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

EventFd::~EventFd() {
  if (fd_ >= 0) ::close(fd_);
}

void EventFd::Notify() const {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(fd_, &one, sizeof(one));
}

void EventFd::Drain() const {
  uint64_t count;
  [[maybe_unused]] ssize_t n = ::read(fd_, &count, sizeof(count));
}

bool EventFd::Readable() const {
  pollfd p{fd_, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & POLLIN);
}

}  // namespace cohort
