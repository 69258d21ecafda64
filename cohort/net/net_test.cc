// Tests for sockets with deadlines and the frame codec, on 127.0.0.1 port 0.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "cohort/net/codec.h"
#include "cohort/net/socket.h"

namespace cohort::net {
namespace {

TEST(SocketTest, ConnectSendReceive) {
  auto listener = Listen({.host = "127.0.0.1", .port = 0});
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  int port = *listener->LocalPort();
  ASSERT_GT(port, 0);
  auto client = Connect("127.0.0.1", port, Deadline::AfterMs(2000));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  ASSERT_TRUE(*listener->WaitReadable(Deadline::AfterMs(2000)));
  Socket server(::accept4(listener->fd(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(server.valid());

  Writer w;
  w.U8(7).U64(1234567890123ull).I64(-5).Str("hello").StrList({"a", "bc"});
  std::string& frame = w.Finish();
  ASSERT_TRUE(client->SendAll(frame.data(), frame.size(), Deadline::AfterMs(2000)).ok());
  std::string body;
  ASSERT_TRUE(ReadFrame(server, &body, 1 << 20, Deadline::AfterMs(2000)).ok());
  Reader r(body);
  uint8_t u8;
  uint64_t u64;
  int64_t i64;
  std::string s;
  std::vector<std::string> list;
  ASSERT_TRUE(r.U8(&u8) && r.U64(&u64) && r.I64(&i64) && r.Str(&s) && r.StrList(&list, 10));
  EXPECT_TRUE(r.AtEnd());
  EXPECT_EQ(u8, 7);
  EXPECT_EQ(u64, 1234567890123ull);
  EXPECT_EQ(i64, -5);
  EXPECT_EQ(s, "hello");
  EXPECT_EQ(list, (std::vector<std::string>{"a", "bc"}));
}

// The owner of a connection's other end, as the kernel's socket diagnostics report it: this
// process's user for a connection of its own, another user's for a child that dropped to
// nobody (the torch store admits only the first).
TEST(SocketTest, LocalPeerUidNamesTheConnectingUser) {
  auto listener = Listen({.host = "127.0.0.1", .port = 0});
  ASSERT_TRUE(listener.ok());
  const int port = *listener->LocalPort();
  auto client = Connect("127.0.0.1", port, Deadline::AfterMs(2000));
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE(*listener->WaitReadable(Deadline::AfterMs(2000)));
  Socket accepted(::accept4(listener->fd(), nullptr, nullptr, SOCK_CLOEXEC));
  auto uid = LocalPeerUid(accepted.fd());
  ASSERT_TRUE(uid.ok()) << uid.status().ToString();
  ASSERT_TRUE(uid->has_value());
  EXPECT_EQ(**uid, ::geteuid());
  if (::geteuid() != 0) return;
  int up[2], down[2];  // child -> parent: connected; parent -> child: looked
  ASSERT_EQ(::pipe(up), 0);
  ASSERT_EQ(::pipe(down), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    auto c = Connect("127.0.0.1", port, Deadline::AfterMs(2000));
    char b = 0;
    (void)!::write(up[1], &b, 1);
    (void)!::read(down[0], &b, 1);  // the connection is held until the parent looked
    ::_exit(c.ok() ? 0 : 3);
  }
  char b = 0;
  ASSERT_EQ(::read(up[0], &b, 1), 1);
  ASSERT_TRUE(*listener->WaitReadable(Deadline::AfterMs(2000)));
  Socket theirs(::accept4(listener->fd(), nullptr, nullptr, SOCK_CLOEXEC));
  auto other = LocalPeerUid(theirs.fd());
  (void)!::write(down[1], &b, 1);
  int status = 0;
  ::waitpid(child, &status, 0);
  for (int fd : {up[0], up[1], down[0], down[1]}) ::close(fd);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  ASSERT_TRUE(other->has_value());
  EXPECT_EQ(**other, 65534u);
}

TEST(SocketTest, ReceiveTimesOutAndDetectsClose) {
  auto listener = Listen({.host = "127.0.0.1", .port = 0});
  ASSERT_TRUE(listener.ok());
  auto client = Connect("127.0.0.1", *listener->LocalPort(), Deadline::AfterMs(2000));
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE(*listener->WaitReadable(Deadline::AfterMs(2000)));
  Socket server(::accept4(listener->fd(), nullptr, nullptr, SOCK_CLOEXEC));
  char byte;
  Status st = client->RecvAll(&byte, 1, Deadline::AfterMs(50));
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
  server.Close();
  st = client->RecvAll(&byte, 1, Deadline::AfterMs(2000));
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
}

TEST(SocketTest, ConnectToClosedPortFailsAtDeadline) {
  int port;
  {
    auto listener = Listen({.host = "127.0.0.1", .port = 0});
    port = *listener->LocalPort();
  }
  auto start = SteadyClock::now();
  auto client = Connect("127.0.0.1", port, Deadline::AfterMs(200));
  EXPECT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_LT(SecondsSince(start), 2.0);
}

TEST(CodecTest, MalformedBodiesAreRejected) {
  std::string body = "\x05\x00\x00\x00hi";  // string claims 5 bytes, has 2
  Reader r(body);
  std::string s;
  EXPECT_FALSE(r.Str(&s));
  std::string list_body = std::string("\xff\xff\xff\x7f", 4);
  Reader r2(list_body);
  std::vector<std::string> list;
  EXPECT_FALSE(r2.StrList(&list, 1000));
}

TEST(SocketTest, ReservedPortBlocksPortZeroButAllowsReuseAddrListen) {
  auto reserved = ReservePort("127.0.0.1", 0);
  ASSERT_TRUE(reserved.ok());
  int port = *reserved->LocalPort();
  auto listener = Listen({.host = "0.0.0.0", .port = port, .reuse_addr = true});
  EXPECT_TRUE(listener.ok()) << listener.status().ToString();
}

}  // namespace
}  // namespace cohort::net
