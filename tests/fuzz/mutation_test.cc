// Deterministic mutation fuzzing of everything cohort parses from outside: store frames
// (against a live StoreServer, before and after HELLO), job specs, pipeline specs, `when`
// conditions, checkpoint files and idx data files. Each target starts from valid seeds and
// applies seeded random mutations (bit flips, byte changes, insertions, deletions,
// duplicated and truncated ranges); a crash, sanitizer report or hang fails the test. The
// iterations per target come from COHORT_FUZZ_ITERATIONS (default 300: a short bounded run
// for CI; run with 100000 for a long one, ideally in the asan preset).
//
// Thread-safety: a test program; the store server runs its own thread.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "cohort/base/strings.h"
#include "cohort/launch/job_spec.h"
#include "cohort/net/codec.h"
#include "cohort/pipeline/condition.h"
#include "cohort/pipeline/pipeline_spec.h"
#include "cohort/store/protocol.h"
#include "cohort/store/store_server.h"
#include "cohort/store/tcp_store.h"
#include "cohort/train/checkpoint_file.h"
#include "cohort/train/data_files.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;

int Iterations() {
  const char* v = std::getenv("COHORT_FUZZ_ITERATIONS");
  int n = v ? std::atoi(v) : 0;
  return n > 0 ? n : 300;
}

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}
  std::string Mutate(std::string s) {
    const int edits = 1 + static_cast<int>(rng_() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t n = s.size();
      switch (rng_() % 6) {
        case 0:
          if (n) s[rng_() % n] ^= static_cast<char>(1u << (rng_() % 8));
          break;
        case 1:
          if (n) s[rng_() % n] = Interesting();
          break;
        case 2:
          s.insert(n ? rng_() % n : 0, 1 + rng_() % 8, Interesting());
          break;
        case 3:
          if (n) s.erase(rng_() % n, 1 + rng_() % 16);
          break;
        case 4:
          if (n) {
            size_t at = rng_() % n, len = 1 + rng_() % std::min<size_t>(n - at, 64);
            s.insert(rng_() % n, s.substr(at, len));
          }
          break;
        case 5:
          if (n) s.resize(rng_() % n);
          break;
      }
    }
    return s;
  }

 private:
  char Interesting() {
    static const char kBytes[] = {0, 1, '\xff', '\x7f', '\x80', '(', ')', '{', '}', '[', ']',
                                  ':', '-', '!', '&', '|', '\'', '"', '\n', ' ', '*', '&'};
    return rng_() % 2 ? kBytes[rng_() % sizeof(kBytes)] : static_cast<char>(rng_());
  }
  std::mt19937_64 rng_;
};

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// --- store frames -----------------------------------------------------------------------

int ConnectLoopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{0, 200000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

std::string Frame(net::Writer& w) { return w.Finish(); }

TEST(MutationFuzz, StoreFramesBeforeAndAfterHello) {
  auto server = store::StoreServer::Start({.host = "127.0.0.1", .port = 0, .token = "tok"});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int port = (*server)->port();
  using store::protocol::Op;
  auto hello = [](const std::string& token) {
    net::Writer w;
    w.U8(static_cast<uint8_t>(Op::kHello)).U64(1).Str(store::protocol::kMagic);
    w.U32(store::protocol::kVersion).Str(token);
    return Frame(w);
  };
  std::vector<std::string> seeds;
  {
    net::Writer w;
    w.U8(static_cast<uint8_t>(Op::kSet)).U64(2).Str("k").Str("v");
    seeds.push_back(Frame(w));
  }
  {
    net::Writer w;
    w.U8(static_cast<uint8_t>(Op::kGet)).U64(3).Str("k").I64(10);
    seeds.push_back(Frame(w));
  }
  {
    net::Writer w;
    w.U8(static_cast<uint8_t>(Op::kAdd)).U64(4).Str("n").I64(5);
    seeds.push_back(Frame(w));
  }
  {
    net::Writer w;
    w.U8(static_cast<uint8_t>(Op::kMultiGet)).U64(5).StrList({"k", "n"}).I64(10);
    seeds.push_back(Frame(w));
  }
  const std::string good_hello = hello("tok");
  Mutator m(1);
  const int n = Iterations();
  for (int i = 0; i < n; ++i) {
    int fd = ConnectLoopback(port);
    ASSERT_GE(fd, 0);
    const bool before_hello = i % 3 == 0;
    std::string bytes = before_hello ? m.Mutate(good_hello)
                                     : good_hello + m.Mutate(seeds[i % seeds.size()]);
    (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    char buf[256];
    (void)!::recv(fd, buf, sizeof(buf), 0);  // whatever comes back within 200 ms
    ::close(fd);
  }
  // The server is alive and serves a well-behaved client.
  auto client = store::TcpStore::Connect({.host = "127.0.0.1", .port = port, .token = "tok"},
                                         Deadline::AfterMs(10000));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  ASSERT_TRUE((*client)->Set("after", "fuzz", Deadline::AfterMs(5000)).ok());
  EXPECT_EQ(*(*client)->Get("after", Deadline::AfterMs(5000)), "fuzz");
}

// --- specs and conditions -----------------------------------------------------------------

TEST(MutationFuzz, JobSpecs) {
  std::vector<std::string> seeds = {
      ReadFile(fs::path(COHORT_SOURCE_DIR) / "examples/pipelines/train-job.yaml"),
      "name: a\nentrypoint: /bin/true\nnproc_per_node: 2\nnnodes: 1:3\nenv: {A: b}\n"
      "array: {range: 0-3, concurrency: 2}\nresources: {cpus: 2, memory: 1Gi, gpus: 0}\n",
  };
  Mutator m(2);
  for (int i = 0; i < Iterations(); ++i) {
    std::vector<launch::Problem> problems;
    (void)launch::ParseJobSpec(m.Mutate(seeds[i % seeds.size()]), &problems);
    // A refused spec says what is wrong (exit 6 prints these lines).
    for (const auto& p : problems) ASSERT_FALSE(p.what.empty()) << p.ToString();
  }
}

TEST(MutationFuzz, PipelineSpecs) {
  const std::string seed =
      ReadFile(fs::path(COHORT_SOURCE_DIR) / "examples/pipelines/fmnist.yaml");
  ASSERT_FALSE(seed.empty());
  Mutator m(3);
  for (int i = 0; i < Iterations(); ++i) {
    std::vector<launch::Problem> problems;
    (void)pipeline::ParsePipelineSpec(m.Mutate(seed), COHORT_SOURCE_DIR "/examples/pipelines",
                                      &problems);
    for (const auto& p : problems) ASSERT_FALSE(p.what.empty()) << p.ToString();
  }
}

TEST(MutationFuzz, WhenConditions) {
  const std::vector<std::string> seeds = {
      "{{params.runtime}} == 'cluster' && !({{steps.train.outputs.accuracy}} < 0.8)",
      "(({{params.x}} >= 1) || {{params.flag}}) && true != false",
  };
  Mutator m(4);
  for (int i = 0; i < Iterations() * 4; ++i) {
    (void)pipeline::ParseCondition(m.Mutate(seeds[i % seeds.size()]));
  }
}

// --- files ----------------------------------------------------------------------------------

TEST(MutationFuzz, CheckpointFiles) {
  const std::string seed = train::EncodeCheckpoint(
      {.meta = R"({"model":"mlp","global_step":3})", .payload = std::string(300, '\x11')});
  ASSERT_TRUE(train::DecodeCheckpoint(seed, "seed").ok());
  Mutator m(5);
  for (int i = 0; i < Iterations() * 4; ++i) {
    const std::string mutant = m.Mutate(seed);
    // A damaged checkpoint is never restored: whatever decodes is byte for byte the seed.
    if (train::DecodeCheckpoint(mutant, "mutant").ok()) {
      ASSERT_EQ(mutant, seed);
    }
  }
}

TEST(MutationFuzz, IdxDataFiles) {
  // A 3 x 4 x 5 idx file of unsigned bytes (type 0x08, 3 dimensions, big-endian sizes).
  std::string seed = {0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0, 5};
  seed += std::string(60, '\x2a');
  const fs::path dir = fs::temp_directory_path() / ("cohort-fuzz-" + RandomHex(6));
  fs::create_directories(dir);
  const fs::path file = dir / "mutant-idx3-ubyte";
  Mutator m(6);
  for (int i = 0; i < Iterations(); ++i) {
    { std::ofstream(file, std::ios::binary) << m.Mutate(seed); }
    auto read = train::ReadIdxFile(file.string());
    // Errors name the file, so the user knows which download is damaged.
    if (!read.ok()) {
      ASSERT_NE(read.status().message().find(file.string()), std::string::npos)
          << read.status().ToString();
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace cohort
