// Tests of the TensorBoard event writer. The file is read back independently of the
// writer: frames are split and both CRCs checked with a bit-at-a-time CRC32C written here
// (itself checked against the RFC 3720 vectors) and the mask applied here; each record is
// decoded by the real protobuf library from tensorboard_event.proto (compiled by protoc at
// build time). The last tests run cohort-train under `cohort run` when both are built.
//
// Thread-safety: single-threaded tests.
#include "cohort/metrics/tensorboard.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cohort/base/strings.h"
#include "cohort/base/subprocess.h"
#include "cohort/metrics/tensorboard_event.pb.h"

namespace cohort::metrics {
namespace {

namespace fs = std::filesystem;
using tbproto::TbEvent;

// --- an independent reader --------------------------------------------------------------

// CRC32C one bit at a time (reflected polynomial 0x82f63b78).
uint32_t ReferenceCrc32c(std::string_view data) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char byte : data) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

uint32_t ReferenceMask(uint32_t crc) {
  uint32_t rotated = (crc >> 15) | (crc << 17);
  return static_cast<uint32_t>(uint64_t{rotated} + 0xa282ead8u);
}

uint64_t LoadLe(std::string_view bytes) {
  uint64_t v = 0;
  for (size_t i = bytes.size(); i-- > 0;) v = (v << 8) | static_cast<unsigned char>(bytes[i]);
  return v;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Splits a TFRecord file into record payloads; on a bad CRC or a truncated frame sets
// *error (naming the offset) and returns the records before it.
std::vector<std::string> ReadFrames(std::string_view file, std::string* error) {
  std::vector<std::string> records;
  size_t off = 0;
  error->clear();
  while (off < file.size()) {
    if (file.size() - off < 12) {
      *error = fmt::format("truncated header at offset {}", off);
      return records;
    }
    std::string_view len_bytes = file.substr(off, 8);
    uint32_t len_crc = static_cast<uint32_t>(LoadLe(file.substr(off + 8, 4)));
    if (len_crc != ReferenceMask(ReferenceCrc32c(len_bytes))) {
      *error = fmt::format("length CRC mismatch at offset {}", off);
      return records;
    }
    uint64_t len = LoadLe(len_bytes);
    if (file.size() - off - 12 < len + 4) {
      *error = fmt::format("truncated record at offset {}", off);
      return records;
    }
    std::string_view data = file.substr(off + 12, len);
    uint32_t data_crc = static_cast<uint32_t>(LoadLe(file.substr(off + 12 + len, 4)));
    if (data_crc != ReferenceMask(ReferenceCrc32c(data))) {
      *error = fmt::format("data CRC mismatch at offset {}", off);
      return records;
    }
    records.emplace_back(data);
    off += 12 + len + 4;
  }
  return records;
}

// Decodes one record with protobuf; fails the test on bytes protobuf does not accept or
// fields the .proto does not declare.
TbEvent Decode(const std::string& record) {
  TbEvent event;
  EXPECT_TRUE(event.ParseFromString(record)) << "protobuf rejected a record";
  EXPECT_TRUE(event.GetReflection()->GetUnknownFields(event).empty())
      << "record has fields outside tensorboard_event.proto";
  if (event.has_summary()) {
    for (const auto& v : event.summary().value()) {
      EXPECT_TRUE(v.GetReflection()->GetUnknownFields(v).empty());
    }
  }
  return event;
}

struct Scalar {
  std::string tag;
  int64_t step;
  float value;
  double wall_time;
};

// Reads and checks a whole event file: valid frames, first record is the file version,
// every other record is one scalar.
std::vector<Scalar> ReadScalars(const std::string& path) {
  std::string error;
  std::vector<std::string> records = ReadFrames(ReadAll(path), &error);
  EXPECT_EQ(error, "") << path;
  EXPECT_FALSE(records.empty()) << path;
  std::vector<Scalar> out;
  for (size_t i = 0; i < records.size(); ++i) {
    TbEvent e = Decode(records[i]);
    if (i == 0) {
      EXPECT_EQ(e.file_version(), "brain.Event:2");
      EXPECT_FALSE(e.has_summary());
      EXPECT_GT(e.wall_time(), 1.6e9);  // a real wall clock (after 2020)
      continue;
    }
    EXPECT_EQ(e.file_version(), "");
    EXPECT_EQ(e.summary().value_size(), 1);
    if (e.summary().value_size() != 1) continue;
    out.push_back(
        {e.summary().value(0).tag(), e.step(), e.summary().value(0).simple_value(), e.wall_time()});
  }
  return out;
}

std::vector<std::string> EventFiles(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (StartsWith(entry.path().filename().string(), "events.out.tfevents.")) {
      files.push_back(entry.path().string());
    }
  }
  return files;
}

class TempDir {
 public:
  TempDir() {
    std::string templ = (fs::temp_directory_path() / "cohort_tb_XXXXXX").string();
    path_ = ::mkdtemp(templ.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// --- CRC and encoding -------------------------------------------------------------------

TEST(TensorBoardCrc, KnownAnswers) {
  // "123456789" and the RFC 3720 (iSCSI) section B.4 vectors.
  std::string zeros(32, '\0'), ones(32, '\xff'), up(32, '\0'), down(32, '\0');
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<char>(i);
    down[i] = static_cast<char>(31 - i);
  }
  const std::vector<std::pair<std::string, uint32_t>> cases = {
      {"123456789", 0xe3069283u}, {zeros, 0x8a9136aau}, {ones, 0x62a8ab43u},
      {up, 0x46dd794eu},          {down, 0x113fdb5cu},  {"", 0x0u}};
  for (const auto& [data, want] : cases) {
    EXPECT_EQ(ReferenceCrc32c(data), want);
    EXPECT_EQ(Crc32c(data), want);
  }
}

TEST(TensorBoardCrc, LibraryMatchesReferenceAtEveryLength) {
  std::string data;
  uint32_t x = 12345;
  for (int len = 0; len < 600; ++len) {
    EXPECT_EQ(Crc32c(data), ReferenceCrc32c(data)) << "length " << len;
    EXPECT_EQ(MaskCrc32c(Crc32c(data)), ReferenceMask(ReferenceCrc32c(data)));
    x = x * 1103515245u + 12345u;
    data.push_back(static_cast<char>(x >> 16));
  }
}

TEST(TensorBoardEncoding, ScalarEventDecodesWithProtobuf) {
  const std::vector<int64_t> steps = {0,  1,         127,      128, 300, int64_t{1} << 40,
                                      -1, INT64_MIN, INT64_MAX};
  for (int64_t step : steps) {
    std::string bytes = EncodeScalarEvent("a/b c", step, -1.25f, 1700000000.125);
    TbEvent e = Decode(bytes);
    EXPECT_EQ(e.step(), step);
    EXPECT_EQ(e.wall_time(), 1700000000.125);
    ASSERT_EQ(e.summary().value_size(), 1);
    EXPECT_EQ(e.summary().value(0).tag(), "a/b c");
    EXPECT_EQ(e.summary().value(0).simple_value(), -1.25f);
    // Same bytes as protobuf's own serialization of the same message (which leaves out a
    // proto3 field holding its default, step 0; the writer always writes the step).
    if (step != 0) {
      EXPECT_EQ(e.SerializeAsString(), bytes) << "step " << step;
    }
  }
  TbEvent v = Decode(EncodeFileVersionEvent(1.5));
  EXPECT_EQ(v.file_version(), "brain.Event:2");
  EXPECT_EQ(v.wall_time(), 1.5);
}

TEST(TensorBoardEncoding, LongTagUsesMultiByteLength) {
  std::string tag(300, 'x');
  TbEvent e = Decode(EncodeScalarEvent(tag, 7, 2.0f, 3.0));
  ASSERT_EQ(e.summary().value_size(), 1);
  EXPECT_EQ(e.summary().value(0).tag(), tag);
}

// --- the writer ---------------------------------------------------------------------------

TEST(EventWriter, WritesScalarsTensorBoardCanRead) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/run/a";  // parents created
  struct In {
    std::string tag;
    int64_t step;
    double value;
  };
  const std::vector<In> in = {{"train/loss", 0, 2.302585},   {"train/lr", 0, 0.05},
                              {"train/loss", 10, 1.5},       {"train/delta", 10, -3.75},
                              {"train/loss", 20, 0.1},       {"train/delta", 20, -1e-6},
                              {"test/accuracy", 20, 0.8125}, {"big", 1LL << 40, 1e30}};
  std::string path;
  {
    auto w = EventWriter::Open(dir);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    path = (*w)->path();
    EXPECT_EQ(fs::path(path).parent_path(), fs::path(dir));
    double t = 1700000000.0;
    for (const auto& s : in) {
      ASSERT_TRUE((*w)->AddScalar(s.tag, s.step, s.value, t).ok());
      t += 0.5;
    }
  }  // the destructor flushes
  // events.out.tfevents.<unix seconds>.<hostname>.<pid>
  std::string name = fs::path(path).filename().string();
  std::vector<std::string> parts = Split(name, '.');
  ASSERT_GE(parts.size(), 6u) << name;
  EXPECT_EQ(parts[0] + "." + parts[1] + "." + parts[2], "events.out.tfevents");
  EXPECT_NEAR(std::stod(parts[3]), static_cast<double>(std::time(nullptr)), 120);
  EXPECT_EQ(parts.back(), std::to_string(::getpid()));

  // Every TensorBoard event file starts with the same 12 bytes: the 24-byte length of the
  // file_version record and its masked CRC.
  const std::string head = ReadAll(path).substr(0, 12);
  EXPECT_EQ(head, std::string("\x18\0\0\0\0\0\0\0\xa3\x7f\x4b\x22", 12));

  std::vector<Scalar> got = ReadScalars(path);
  ASSERT_EQ(got.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(got[i].tag, in[i].tag);
    EXPECT_EQ(got[i].step, in[i].step);
    EXPECT_EQ(got[i].value, static_cast<float>(in[i].value)) << in[i].tag;
    EXPECT_EQ(got[i].wall_time, 1700000000.0 + 0.5 * static_cast<double>(i));
  }
  EXPECT_LT(got[3].value, 0);
  EXPECT_NEAR(got[0].value, 2.302585, 1e-6);
}

TEST(EventWriter, FlushMakesRecordsVisibleAndCloseEndsWriting) {
  TempDir tmp;
  auto w = EventWriter::Open(tmp.path());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(ReadScalars((*w)->path()).size(), 0u);  // file_version record already there
  ASSERT_TRUE((*w)->AddScalar("x", 1, 1.0).ok());
  ASSERT_TRUE((*w)->Flush().ok());
  std::vector<Scalar> got = ReadScalars((*w)->path());
  ASSERT_EQ(got.size(), 1u);
  EXPECT_NEAR(got[0].wall_time, WallSeconds(), 60);  // default wall time is now
  ASSERT_TRUE((*w)->Close().ok());
  Status st = (*w)->AddScalar("x", 2, 2.0);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_EQ((*w)->Flush().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*w)->AddScalar("", 2, 2.0).code(), StatusCode::kInvalidArgument);
}

TEST(EventWriter, ManyScalarsPastTheBufferLimit) {
  TempDir tmp;
  std::string path;
  constexpr int kCount = 5000;  // ~250 KiB: several automatic flushes
  {
    auto w = EventWriter::Open(tmp.path());
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    path = (*w)->path();
    for (int i = 0; i < kCount; ++i) {
      ASSERT_TRUE((*w)->AddScalar("series/with/a/longish/tag", i, 0.5 * i - 7.0).ok());
    }
  }
  std::vector<Scalar> got = ReadScalars(path);
  ASSERT_EQ(got.size(), static_cast<size_t>(kCount));
  for (int i = 0; i < kCount; ++i) {
    ASSERT_EQ(got[i].step, i);
    ASSERT_EQ(got[i].value, static_cast<float>(0.5 * i - 7.0));
  }
}

TEST(EventWriter, TwoWritersInOneDirectoryGetTwoFiles) {
  TempDir tmp;
  auto a = EventWriter::Open(tmp.path());
  auto b = EventWriter::Open(tmp.path());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->path(), (*b)->path());
  EXPECT_NE((*b)->path().find("tfevents"), std::string::npos);
  ASSERT_TRUE((*a)->AddScalar("a", 1, 1).ok());
  ASSERT_TRUE((*b)->AddScalar("b", 1, 2).ok());
  ASSERT_TRUE((*a)->Close().ok());
  ASSERT_TRUE((*b)->Close().ok());
  EXPECT_EQ(EventFiles(tmp.path()).size(), 2u);
  EXPECT_EQ(ReadScalars((*a)->path()).at(0).tag, "a");
  EXPECT_EQ(ReadScalars((*b)->path()).at(0).tag, "b");
}

TEST(EventWriter, CorruptionIsDetectedByTheCrcs) {
  TempDir tmp;
  std::string path;
  {
    auto w = EventWriter::Open(tmp.path());
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    path = (*w)->path();
    ASSERT_TRUE((*w)->AddScalar("train/loss", 1, 0.75).ok());
    ASSERT_TRUE((*w)->AddScalar("train/loss", 2, 0.5).ok());
  }
  const std::string good = ReadAll(path);
  std::string error;
  ASSERT_EQ(ReadFrames(good, &error).size(), 3u);
  ASSERT_EQ(error, "");
  const size_t first_len = 12 + LoadLe(std::string_view(good).substr(0, 8)) + 4;
  const size_t second_len = 12 + LoadLe(std::string_view(good).substr(first_len, 8)) + 4;

  // A flipped bit anywhere in the second record's data: its data CRC fails.
  for (size_t i = first_len + 12; i < first_len + second_len - 4; ++i) {
    std::string bad = good;
    bad[i] ^= 0x10;
    std::vector<std::string> r = ReadFrames(bad, &error);
    EXPECT_EQ(r.size(), 1u);
    EXPECT_EQ(error, fmt::format("data CRC mismatch at offset {}", first_len)) << "byte " << i;
  }
  // In its length: the length CRC fails.
  std::string bad = good;
  bad[first_len] ^= 0x01;
  ReadFrames(bad, &error);
  EXPECT_EQ(error, fmt::format("length CRC mismatch at offset {}", first_len));
  // In a stored CRC.
  bad = good;
  bad[first_len + second_len - 1] ^= 0x80;
  ReadFrames(bad, &error);
  EXPECT_EQ(error, fmt::format("data CRC mismatch at offset {}", first_len));
  // A cut file.
  ReadFrames(std::string_view(good).substr(0, good.size() - 3), &error);
  EXPECT_NE(error.find("truncated"), std::string::npos) << error;
}

TEST(EventWriter, OpenUnderARegularFileFailsClearly) {
  TempDir tmp;
  const std::string file = tmp.path() + "/plain";
  std::ofstream(file) << "not a directory";
  auto w = EventWriter::Open(file + "/logs");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find(file + "/logs"), std::string::npos) << w.status().ToString();
  EXPECT_NE(w.status().message().find("Not a directory"), std::string::npos)
      << w.status().ToString();

  auto w2 = EventWriter::Open(file);  // the directory itself is a file
  ASSERT_FALSE(w2.ok());
  EXPECT_NE(w2.status().message().find(file), std::string::npos) << w2.status().ToString();

  EXPECT_EQ(EventWriter::Open("").status().code(), StatusCode::kInvalidArgument);
}

TEST(EventWriter, OpenInAReadOnlyDirectoryFailsClearly) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/ro";
  fs::create_directory(dir);
  ::chmod(tmp.path().c_str(), 0755);
  ::chmod(dir.c_str(), 0555);
  auto denied = [&dir]() {
    auto w = EventWriter::Open(dir);
    return !w.ok() && w.status().code() == StatusCode::kPermissionDenied &&
           w.status().message().find(dir) != std::string::npos;
  };
  if (::geteuid() != 0) {
    EXPECT_TRUE(denied());
  } else {
    // root ignores permission bits: try as user nobody in a child process.
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
      ::_exit(denied() ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "wait status " << status;
  }
  ::chmod(dir.c_str(), 0755);
}

TEST(EventWriter, WriteErrorIsReportedAndSticky) {
  TempDir tmp;
  // In a child limited to 4 KiB files (RLIMIT_FSIZE; SIGXFSZ ignored, so write fails EFBIG).
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit limit{.rlim_cur = 4096, .rlim_max = 4096};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(2);
    auto w = EventWriter::Open(tmp.path());
    if (!w.ok()) ::_exit(3);
    Status first;
    int added = 0;
    for (; added < 100000 && first.ok(); ++added) {
      first = (*w)->AddScalar("train/loss", added, 1.0);
      if (first.ok() && added % 10 == 0) first = (*w)->Flush();
    }
    if (first.ok() || first.message().find((*w)->path()) == std::string::npos) ::_exit(4);
    // Every later call gives the same error; nothing more is written.
    if ((*w)->AddScalar("x", 1, 1).message() != first.message()) ::_exit(5);
    if ((*w)->Flush().message() != first.message()) ::_exit(6);
    if (fs::file_size((*w)->path()) > 4096) ::_exit(7);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "wait status " << status;
  // The complete records before the failure are intact.
  std::vector<std::string> files = EventFiles(tmp.path());
  ASSERT_EQ(files.size(), 1u);
  std::string error;
  std::vector<std::string> records = ReadFrames(ReadAll(files[0]), &error);
  EXPECT_GT(records.size(), 10u);
  for (const auto& r : records) Decode(r);
}

// --- cohort-train end to end ----------------------------------------------------------------

struct RunResult {
  ExitStatus status;
  std::string output;
};

// Runs argv with stdout+stderr to a file; kills its process group after `timeout_s`.
RunResult RunBounded(const std::vector<std::string>& argv, const std::string& log, int timeout_s) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv(*e);
    std::string key = kv.substr(0, kv.find('='));
    if (StartsWith(key, "PET_") || StartsWith(key, "TORCHELASTIC_") || StartsWith(key, "COHORT_") ||
        key == "RANK" || key == "LOCAL_RANK" || key == "WORLD_SIZE" || key == "LOCAL_WORLD_SIZE" ||
        key == "MASTER_ADDR" || key == "MASTER_PORT" || key == "GROUP_RANK" ||
        key == "GROUP_WORLD_SIZE" || key == "ROLE_RANK" || key == "ROLE_NAME" ||
        key == "ROLE_WORLD_SIZE") {
      continue;
    }
    env.push_back(kv);
  }
  SpawnOptions opts;
  opts.argv = argv;
  opts.env = env;
  opts.capture_output = false;
  opts.output_file = log;
  RunResult r;
  auto child = Spawn(opts);
  if (!child.ok()) {
    r.output = child.status().ToString();
    return r;
  }
  pollfd p{.fd = child->pidfd, .events = POLLIN, .revents = 0};
  int ready = ::poll(&p, 1, timeout_s * 1000);
  if (ready <= 0) SignalGroup(child->pid, SIGKILL);
  r.status = Reap(child->pid);
  ::close(child->pidfd);
  r.output = ReadAll(log);
  if (ready <= 0) r.output += fmt::format("\n[killed after {} s]", timeout_s);
  return r;
}

std::string BuiltBinary(const std::string& name) {
  std::string path = std::string(COHORT_BINARY_DIR) + "/cohort/cli/" + name;
  return ::access(path.c_str(), X_OK) == 0 ? path : "";
}

TEST(TensorBoardTrain, TwoWorkersWriteTheTrainingScalars) {
  const std::string cohort = BuiltBinary("cohort");
  const std::string trainer = BuiltBinary("cohort-train");
  if (cohort.empty() || trainer.empty()) GTEST_SKIP() << "cohort or cohort-train not built";
  TempDir tmp;
  const std::string tb = tmp.path() + "/tb";
  RunResult r = RunBounded({cohort,
                            "run",
                            "--nproc-per-node",
                            "2",
                            "--",
                            trainer,
                            "--dataset",
                            "synthetic",
                            "--model",
                            "mlp",
                            "--max-steps",
                            "50",
                            "--log-every",
                            "10",
                            "--batch-size",
                            "32",
                            "--tensorboard-dir",
                            tb,
                            "--tag",
                            "tensorboard_test"},
                           tmp.path() + "/log", 240);
  ASSERT_TRUE(r.status.success()) << r.status.Describe() << "\n" << r.output;

  std::vector<std::string> files = EventFiles(tb);
  ASSERT_EQ(files.size(), 1u) << "only rank 0 writes";
  std::map<std::string, std::map<int64_t, float>> series;
  for (const Scalar& s : ReadScalars(files[0])) series[s.tag][s.step] = s.value;

  const std::vector<int64_t> logged = {10, 20, 30, 40, 50};
  for (const char* tag :
       {"train/loss", "train/samples_per_s", "train/comm_wait_fraction", "train/epoch"}) {
    ASSERT_EQ(series.count(tag), 1u) << tag << "\n" << r.output;
    std::vector<int64_t> steps;
    for (const auto& [step, value] : series[tag]) {
      steps.push_back(step);
      EXPECT_TRUE(std::isfinite(value)) << tag << " step " << step;
    }
    EXPECT_EQ(steps, logged) << tag;
  }
  for (const auto& [step, loss] : series["train/loss"]) EXPECT_GT(loss, 0) << step;
  for (const auto& [step, sps] : series["train/samples_per_s"]) EXPECT_GT(sps, 0) << step;
  for (const auto& [step, f] : series["train/comm_wait_fraction"]) {
    EXPECT_GE(f, 0) << step;
    EXPECT_LE(f, 1.0f) << step;
  }
  // Fractional epochs done: 8192 synthetic samples / (2 workers x batch 32) = 128 steps each.
  for (const auto& [step, epoch] : series["train/epoch"]) {
    EXPECT_EQ(epoch, static_cast<float>(step / 128.0)) << step;
  }
  ASSERT_EQ(series["test/accuracy"].size(), 1u);
  EXPECT_EQ(series["test/accuracy"].begin()->first, 50);
  float acc = series["test/accuracy"].begin()->second;
  EXPECT_GE(acc, 0);
  EXPECT_LE(acc, 1);
  // The same accuracy the trainer printed.
  EXPECT_NE(r.output.find(fmt::format("test_accuracy {:.4f}", acc)), std::string::npos) << r.output;
}

TEST(TensorBoardTrain, UnwritableDirectoryWarnsAndTrainingContinues) {
  const std::string trainer = BuiltBinary("cohort-train");
  if (trainer.empty()) GTEST_SKIP() << "cohort-train not built";
  TempDir tmp;
  const std::string file = tmp.path() + "/plain";
  std::ofstream(file) << "x";
  RunResult r = RunBounded({trainer, "--dataset", "synthetic", "--model", "mlp", "--max-steps", "5",
                            "--log-every", "5", "--tensorboard-dir", file + "/tb"},
                           tmp.path() + "/log", 120);
  ASSERT_TRUE(r.status.success()) << r.status.Describe() << "\n" << r.output;
  EXPECT_NE(r.output.find("warning: --tensorboard-dir"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("test_accuracy"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace cohort::metrics
