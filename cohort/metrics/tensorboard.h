// TensorBoard event files: EventWriter appends scalar summaries to
// `<dir>/events.out.tfevents.<unix seconds>.<hostname>.<pid>`, the file name TensorBoard
// scans a log directory for.
//
// File format (what TensorBoard reads):
//   * The file is a sequence of TFRecords. Each record is
//       uint64 length (little-endian) | uint32 masked CRC32C of those 8 bytes |
//       `length` bytes of data         | uint32 masked CRC32C of the data
//     with mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32).
//   * Each record's data is one serialized `Event` protobuf message:
//       Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
//                 Summary summary = 5; }
//       Summary { repeated Value value = 1; }
//       Value   { string tag = 1; float simple_value = 2; }
//   * The first record is an Event carrying only wall_time and
//     file_version "brain.Event:2"; every scalar is one Event with one Value.
// The messages are encoded here by hand (varints, fixed64/fixed32, length-delimited
// fields); there is no protobuf runtime dependency. CRC32C comes from Intel ISA-L
// (crc32_iscsi).
//
// Thread-safety: an EventWriter has no internal locking; use each writer from one thread
// at a time (one writer per thread). Distinct writers are independent. The free functions
// are pure and may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "cohort/base/status.h"
#include "cohort/base/time.h"

namespace cohort::metrics {

// CRC32C (Castagnoli polynomial, reflected, init and final xor 0xffffffff), as TFRecord
// framing uses it. Crc32c("123456789") == 0xe3069283.
uint32_t Crc32c(std::string_view data);
// The TFRecord mask applied to every stored CRC.
uint32_t MaskCrc32c(uint32_t crc);
// `data` framed as one TFRecord (length, masked CRC of the length, data, masked CRC of data).
std::string FrameRecord(std::string_view data);

// Serialized Event messages (the data of one record).
std::string EncodeFileVersionEvent(double wall_time);
std::string EncodeScalarEvent(std::string_view tag, int64_t step, float value, double wall_time);

class EventWriter {
 public:
  // Creates `dir` (with missing parents) and a new event file in it, and writes the
  // file_version record. Errors: the directory or file cannot be created or written.
  static Result<std::unique_ptr<EventWriter>> Open(const std::string& dir);

  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;
  // Flushes; a failure here is logged, not reported (call Close() to see it).
  ~EventWriter();

  // Buffers one scalar (stored as a 32-bit float, TensorBoard's simple_value). The buffer
  // is written out when it passes 64 KiB and on Flush(); an error from that write is
  // returned here.
  Status AddScalar(std::string_view tag, int64_t step, double value,
                   double wall_time = WallSeconds());
  // Writes the buffered records to the file (write(2); no fsync). After a failed write
  // the file may end in a partial record, so the writer stops: every later call returns
  // that first error.
  Status Flush();
  // Flushes and closes the file; later calls return FailedPrecondition.
  Status Close();

  const std::string& path() const { return path_; }

 private:
  EventWriter(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  Status Append(std::string_view event);

  std::string path_;
  int fd_ = -1;
  std::string buffer_;  // framed records not yet written
  Status error_;        // first write error; sticky
};

}  // namespace cohort::metrics
