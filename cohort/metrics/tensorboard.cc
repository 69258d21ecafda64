// Implements TensorBoard event files: hand-encoded Event protobufs in TFRecord frames with
// masked CRC32C (from ISA-L). Thread-safety: see tensorboard.h (one writer per thread).
#include "cohort/metrics/tensorboard.h"

#include <fcntl.h>
#include <isa-l/crc.h>
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <ctime>
#include <filesystem>
#include <system_error>

#include "cohort/base/log.h"

namespace cohort::metrics {
namespace {

constexpr size_t kFlushBytes = 64 * 1024;
constexpr std::string_view kFileVersion = "brain.Event:2";

// Protobuf wire types.
constexpr uint32_t kVarint = 0;
constexpr uint32_t kFixed64 = 1;
constexpr uint32_t kLengthDelimited = 2;
constexpr uint32_t kFixed32 = 5;

// Field numbers of the messages described in tensorboard.h.
constexpr uint32_t kEventWallTime = 1;
constexpr uint32_t kEventStep = 2;
constexpr uint32_t kEventFileVersion = 3;
constexpr uint32_t kEventSummary = 5;
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1;
constexpr uint32_t kValueSimpleValue = 2;

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutTag(std::string* out, uint32_t field, uint32_t wire_type) {
  PutVarint(out, (uint64_t{field} << 3) | wire_type);
}

void PutLittleEndian(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PutDouble(std::string* out, uint32_t field, double v) {
  PutTag(out, field, kFixed64);
  PutLittleEndian(out, std::bit_cast<uint64_t>(v), 8);
}

void PutFloat(std::string* out, uint32_t field, float v) {
  PutTag(out, field, kFixed32);
  PutLittleEndian(out, std::bit_cast<uint32_t>(v), 4);
}

// int64 fields are varints of the two's-complement value (negative numbers take 10 bytes).
void PutInt64(std::string* out, uint32_t field, int64_t v) {
  PutTag(out, field, kVarint);
  PutVarint(out, static_cast<uint64_t>(v));
}

// Strings and embedded messages: tag, byte length, bytes.
void PutBytes(std::string* out, uint32_t field, std::string_view bytes) {
  PutTag(out, field, kLengthDelimited);
  PutVarint(out, bytes.size());
  out->append(bytes);
}

std::string Hostname() {
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  std::string host(name);
  for (char& c : host) {
    if (c == '/') c = '_';
  }
  return host;
}

}  // namespace

uint32_t Crc32c(std::string_view data) {
  // ISA-L's crc32_iscsi neither inverts its input state nor its result, and takes an int
  // length: start from all ones, feed chunks, invert at the end.
  uint32_t state = 0xffffffffu;
  auto* p = reinterpret_cast<unsigned char*>(const_cast<char*>(data.data()));
  size_t left = data.size();
  constexpr size_t kChunk = size_t{1} << 30;
  while (left > 0) {
    size_t n = std::min(left, kChunk);
    state = crc32_iscsi(p, static_cast<int>(n), state);
    p += n;
    left -= n;
  }
  return state ^ 0xffffffffu;
}

uint32_t MaskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

std::string FrameRecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  PutLittleEndian(&out, data.size(), 8);
  PutLittleEndian(&out, MaskCrc32c(Crc32c(std::string_view(out).substr(0, 8))), 4);
  out.append(data);
  PutLittleEndian(&out, MaskCrc32c(Crc32c(data)), 4);
  return out;
}

std::string EncodeFileVersionEvent(double wall_time) {
  std::string event;
  PutDouble(&event, kEventWallTime, wall_time);
  PutBytes(&event, kEventFileVersion, kFileVersion);
  return event;
}

std::string EncodeScalarEvent(std::string_view tag, int64_t step, float value, double wall_time) {
  std::string summary_value;
  PutBytes(&summary_value, kValueTag, tag);
  PutFloat(&summary_value, kValueSimpleValue, value);
  std::string summary;
  PutBytes(&summary, kSummaryValue, summary_value);
  std::string event;
  PutDouble(&event, kEventWallTime, wall_time);
  PutInt64(&event, kEventStep, step);
  PutBytes(&event, kEventSummary, summary);
  return event;
}

Result<std::unique_ptr<EventWriter>> EventWriter::Open(const std::string& dir) {
  // 1. The directory, with missing parents.
  if (dir.empty()) return InvalidArgument("TensorBoard log directory is empty");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return ErrnoStatus(fmt::format("cannot create TensorBoard log directory {}", dir), ec.value());
  }
  if (!std::filesystem::is_directory(dir, ec)) {
    return FailedPrecondition("TensorBoard log directory {} is not a directory", dir);
  }
  // 2. A file name no other writer has: O_EXCL, with a numeric suffix if two writers of
  // this process open in the same second (TensorBoard matches "tfevents" in the name).
  const std::string base =
      fmt::format("{}/events.out.tfevents.{}.{}.{}", dir, static_cast<int64_t>(std::time(nullptr)),
                  Hostname(), static_cast<int64_t>(::getpid()));
  std::string path = base;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    if (attempt > 0) path = fmt::format("{}.{}", base, attempt);
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && (errno != EEXIST || attempt >= 100)) {
      return ErrnoStatus(fmt::format("cannot create TensorBoard event file {}", path), errno);
    }
  }
  // 3. The file_version record, written at once so that the file is valid from the start.
  std::unique_ptr<EventWriter> writer(new EventWriter(path, fd));
  COHORT_RETURN_IF_ERROR(writer->Append(EncodeFileVersionEvent(WallSeconds())));
  COHORT_RETURN_IF_ERROR(writer->Flush());
  return writer;
}

EventWriter::~EventWriter() {
  if (fd_ < 0) return;
  if (!error_.ok()) {  // already returned to the caller; nothing left to write
    ::close(fd_);
    return;
  }
  Status st = Close();
  if (!st.ok()) COHORT_LOG_WARN("metrics", "closing {}: {}", path_, st.ToString());
}

Status EventWriter::Append(std::string_view event) {
  if (!error_.ok()) return error_;
  if (fd_ < 0) return FailedPrecondition("TensorBoard event file {} is closed", path_);
  buffer_ += FrameRecord(event);
  if (buffer_.size() >= kFlushBytes) return Flush();
  return Status::Ok();
}

Status EventWriter::AddScalar(std::string_view tag, int64_t step, double value, double wall_time) {
  if (tag.empty()) return InvalidArgument("TensorBoard scalar tag is empty");
  return Append(EncodeScalarEvent(tag, step, static_cast<float>(value), wall_time));
}

Status EventWriter::Flush() {
  if (!error_.ok()) return error_;
  if (fd_ < 0) return FailedPrecondition("TensorBoard event file {} is closed", path_);
  size_t done = 0;
  while (done < buffer_.size()) {
    ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      error_ = ErrnoStatus(fmt::format("writing TensorBoard event file {}", path_), errno);
      buffer_.clear();
      return error_;
    }
    done += static_cast<size_t>(n);
  }
  buffer_.clear();
  return Status::Ok();
}

Status EventWriter::Close() {
  if (fd_ < 0) return FailedPrecondition("TensorBoard event file {} is closed", path_);
  Status st = Flush();
  if (::close(fd_) != 0 && st.ok()) {
    st = ErrnoStatus(fmt::format("closing TensorBoard event file {}", path_), errno);
  }
  fd_ = -1;
  return st;
}

}  // namespace cohort::metrics
