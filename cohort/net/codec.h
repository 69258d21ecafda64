// Framed binary codec: every message is a frame of [u32 little-endian body length][body].
// Writer appends fixed-width little-endian integers and length-prefixed strings; Reader
// parses them with bounds checks (a malformed body makes Reader report failure, never
// read out of bounds).
//
// Thread-safety: value types, one owner at a time.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/base/status.h"
#include "cohort/base/time.h"
#include "cohort/net/socket.h"

namespace cohort::net {

class Writer {
 public:
  Writer() { buf_.resize(4); }  // room for the frame length
  Writer& U8(uint8_t v) { return Raw(&v, 1); }
  Writer& U32(uint32_t v) { return Little(v); }
  Writer& U64(uint64_t v) { return Little(v); }
  Writer& I64(int64_t v) { return Little(static_cast<uint64_t>(v)); }
  Writer& Str(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    return Raw(s.data(), s.size());
  }
  Writer& StrList(const std::vector<std::string>& list) {
    U32(static_cast<uint32_t>(list.size()));
    for (const auto& s : list) Str(s);
    return *this;
  }
  // Fills in the frame length and returns the whole frame.
  std::string& Finish() {
    uint32_t body = static_cast<uint32_t>(buf_.size() - 4);
    for (int i = 0; i < 4; ++i) buf_[i] = static_cast<char>((body >> (8 * i)) & 0xff);
    return buf_;
  }

 private:
  template <typename T>
  Writer& Little(T v) {
    char bytes[sizeof(T)];
    for (size_t i = 0; i < sizeof(T); ++i) bytes[i] = static_cast<char>((v >> (8 * i)) & 0xff);
    return Raw(bytes, sizeof(T));
  }
  Writer& Raw(const void* p, size_t n) {
    buf_.append(static_cast<const char*>(p), n);
    return *this;
  }
  std::string buf_;
};

class Reader {
 public:
  explicit Reader(std::string_view body) : data_(body) {}
  bool U8(uint8_t* v) { return Little(v); }
  bool U32(uint32_t* v) { return Little(v); }
  bool U64(uint64_t* v) { return Little(v); }
  bool I64(int64_t* v) {
    uint64_t u;
    if (!Little(&u)) return false;
    *v = static_cast<int64_t>(u);
    return true;
  }
  bool Str(std::string* s) {
    uint32_t n;
    if (!U32(&n) || n > data_.size() - pos_) return false;
    s->assign(data_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  // `max_items` bounds the list length a peer can make us allocate.
  bool StrList(std::vector<std::string>* list, uint32_t max_items) {
    uint32_t n;
    if (!U32(&n) || n > max_items) return false;
    list->resize(n);
    for (auto& s : *list) {
      if (!Str(&s)) return false;
    }
    return true;
  }
  bool AtEnd() const { return pos_ == data_.size(); }

 private:
  template <typename T>
  bool Little(T* v) {
    if (data_.size() - pos_ < sizeof(T)) return false;
    T out = 0;
    for (size_t i = 0; i < sizeof(T); ++i) {
      out |= static_cast<T>(static_cast<unsigned char>(data_[pos_ + i])) << (8 * i);
    }
    pos_ += sizeof(T);
    *v = out;
    return true;
  }
  std::string_view data_;
  size_t pos_ = 0;
};

inline uint32_t DecodeFrameLength(const char header[4]) {
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(static_cast<unsigned char>(header[i])) << (8 * i);
  return n;
}

// Reads one frame body from a blocking-style socket; frames over `max_size` are refused.
inline Status ReadFrame(Socket& sock, std::string* body, uint32_t max_size, Deadline deadline) {
  char header[4];
  COHORT_RETURN_IF_ERROR(sock.RecvAll(header, 4, deadline));
  uint32_t n = DecodeFrameLength(header);
  if (n > max_size) return DataLoss("frame of {} bytes exceeds the limit of {}", n, max_size);
  body->resize(n);
  return sock.RecvAll(body->data(), n, deadline);
}

}  // namespace cohort::net
