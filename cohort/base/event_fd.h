// EventFd: an eventfd as a wake-up between threads (a thread notifies; another polls fd()
// among its other descriptors). Non-blocking and close-on-exec; closed with the object.
//
// Thread-safety: Notify, Drain and Readable may be called from any thread; the object must
// outlive every thread that uses it.
#pragma once

namespace cohort {

class EventFd {
 public:
  EventFd();
  ~EventFd();
  EventFd(const EventFd&) = delete;
  EventFd& operator=(const EventFd&) = delete;

  int fd() const { return fd_; }
  void Notify() const;
  void Drain() const;            // reads the count (readable again only after a Notify)
  bool Readable() const;         // notified and not drained (does not wait)

 private:
  int fd_;
};

}  // namespace cohort
