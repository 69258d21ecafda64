// The Store contract: one parameterized gtest suite (StoreContract) that every Store
// implementation must pass. A test file includes this header once, defines
//   std::unique_ptr<cohort::store::contract::StoreFactory>
//   cohort::store::contract::MakeFactory(const std::string& kind);
// (nullptr skips the case, e.g. when a server binary is missing) and instantiates
//   INSTANTIATE_TEST_SUITE_P(Name, StoreContract, ::testing::Values("kind", ...));
// Ranks never sleep to order events: every check holds whatever the interleaving.
//
// Thread-safety: test code; each case runs its own threads and joins them.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cohort/store/store.h"

namespace cohort::store::contract {

inline Deadline Soon() { return Deadline::AfterMs(5000); }

// Builds clients of one fresh store of a kind; keeps what it needs (server, file) alive.
class StoreFactory {
 public:
  virtual ~StoreFactory() = default;
  virtual std::shared_ptr<Store> Make() = 0;  // a new client of the same store
};

std::unique_ptr<StoreFactory> MakeFactory(const std::string& kind);

class StoreContract : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    factory_ = MakeFactory(GetParam());
    if (!factory_) GTEST_SKIP() << "store kind '" << GetParam() << "' is not available here";
    store_ = factory_->Make();
    ASSERT_NE(store_, nullptr);
  }
  std::unique_ptr<StoreFactory> factory_;
  std::shared_ptr<Store> store_;
};

TEST_P(StoreContract, SetGetDeleteCheckNumKeys) {
  ASSERT_TRUE(store_->Set("a", "1", Soon()).ok());
  ASSERT_TRUE(store_->Set("b", std::string("\0bin\xff", 5), Soon()).ok());
  EXPECT_EQ(*store_->Get("a", Soon()), "1");
  EXPECT_EQ(*store_->Get("b", Soon()), std::string("\0bin\xff", 5));
  EXPECT_TRUE(*store_->Check({"a", "b"}, Soon()));
  EXPECT_FALSE(*store_->Check({"a", "zz"}, Soon()));
  EXPECT_EQ(*store_->NumKeys(Soon()), 2);
  EXPECT_TRUE(*store_->Delete("a", Soon()));
  EXPECT_FALSE(*store_->Delete("a", Soon()));
  EXPECT_FALSE(*store_->Check({"a"}, Soon()));
  EXPECT_EQ(*store_->NumKeys(Soon()), 1);
}

TEST_P(StoreContract, PeekReadsPresentAndAbsentKeysWithoutWaiting) {
  ASSERT_TRUE(store_->Set("p1", "one", Soon()).ok());
  ASSERT_TRUE(store_->Set("p3", "", Soon()).ok());
  auto start = SteadyClock::now();
  auto r = store_->Peek({"p1", "p2", "p3"}, Soon());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_LT(SecondsSince(start), 2.0);  // absent keys do not wait for the deadline
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[0], std::optional<std::string>("one"));
  EXPECT_EQ((*r)[1], std::nullopt);
  EXPECT_EQ((*r)[2], std::optional<std::string>(""));  // present but empty
  EXPECT_TRUE(store_->Peek({}, Soon())->empty());
}

TEST_P(StoreContract, GetTimesOutAtDeadline) {
  auto start = SteadyClock::now();
  auto r = store_->Get("missing", Deadline::AfterMs(100));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().ToString();
  EXPECT_GE(SecondsSince(start), 0.09);
  EXPECT_LT(SecondsSince(start), 3.0);
  EXPECT_EQ(store_->Wait({"missing"}, Deadline::AfterMs(100)).code(),
            StatusCode::kDeadlineExceeded);
  // The store stays usable after a timeout.
  ASSERT_TRUE(store_->Set("k", "v", Soon()).ok());
  EXPECT_EQ(*store_->Get("k", Soon()), "v");
}

TEST_P(StoreContract, BeatAddsPeeksAndWaits) {
  ASSERT_TRUE(store_->Set("peer", "7", Soon()).ok());
  auto start = SteadyClock::now();
  auto r = store_->Beat("me", {"peer", "absent"}, {"next"}, Deadline::AfterMs(150));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->waited) << "the wait key does not exist: the deadline is not an error";
  EXPECT_GE(SecondsSince(start), 0.1);
  ASSERT_EQ(r->peeked.size(), 2u);
  EXPECT_EQ(r->peeked[0], "7");
  EXPECT_FALSE(r->peeked[1]);
  EXPECT_EQ(*store_->Add("me", 0, Soon()), 1);
  // Beats count on from the counter as it is, also when another client moved it meanwhile.
  ASSERT_TRUE(store_->Beat("me", {}, {"peer"}, Soon()).ok());
  EXPECT_EQ(*factory_->Make()->Add("me", 10, Soon()), 12);
  auto counted = store_->Beat("me", {"me"}, {"peer"}, Soon());
  ASSERT_TRUE(counted.ok()) << counted.status().ToString();
  EXPECT_EQ(counted->peeked[0], "13") << "peeks read after the beat";
  EXPECT_EQ(counted->waited, "7");
  EXPECT_EQ(*store_->Add("me", 0, Soon()), 13);
  ASSERT_TRUE(store_->Set("me", "1", Soon()).ok());  // this client's own write: counted on
  ASSERT_TRUE(store_->Beat("me", {}, {"peer"}, Soon()).ok());
  EXPECT_EQ(*store_->Add("me", 0, Soon()), 2);
  ASSERT_TRUE(store_->Set("me", "1", Soon()).ok());
  // A waiting beat is woken by another client's write; an empty beat key adds nothing.
  std::thread writer([&] { ASSERT_TRUE(factory_->Make()->Set("next", "over", Soon()).ok()); });
  auto woken = store_->Beat("", {}, {"next"}, Deadline::AfterMs(20000));
  writer.join();
  ASSERT_TRUE(woken.ok()) << woken.status().ToString();
  EXPECT_EQ(woken->waited, "over");
  EXPECT_EQ(*store_->Add("me", 0, Soon()), 1);
}

TEST_P(StoreContract, AppendGivesDistinctTicketsWithTheirRecords) {
  constexpr int kClients = 4, kEach = 25;
  std::vector<std::thread> threads;
  std::vector<std::vector<int64_t>> tickets(kClients);
  // A waiter on the last record is woken by the append that writes it.
  std::thread waiter([&] {
    auto client = factory_->Make();
    Status s = client->WaitAppended("tickets", "rec", kClients * kEach, Deadline::AfterMs(20000));
    ASSERT_TRUE(s.ok()) << s.ToString();
  });
  for (int t = 0; t < kClients; ++t) {
    threads.emplace_back([&, t] {
      auto client = factory_->Make();
      for (int i = 0; i < kEach; ++i) {
        auto ticket = client->Append("tickets", "rec", fmt::format("from {}", t), Soon());
        ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
        tickets[t].push_back(*ticket);
      }
    });
  }
  for (auto& th : threads) th.join();
  waiter.join();
  auto records = store_->ReadAppended("tickets", "rec", 1, kClients * kEach, Soon());
  ASSERT_TRUE(records.ok()) << records.status().ToString();
  ASSERT_EQ(records->size(), size_t{kClients * kEach});
  std::set<int64_t> all;
  for (int t = 0; t < kClients; ++t) {
    for (int64_t ticket : tickets[t]) {
      all.insert(ticket);
      // Each ticket's record is the one its taker wrote, alone or among the others.
      EXPECT_EQ((*records)[ticket - 1], fmt::format("from {}", t));
      auto one = store_->ReadAppended("tickets", "rec", ticket, 1, Soon());
      ASSERT_TRUE(one.ok()) << one.status().ToString();
      EXPECT_EQ(one->at(0), fmt::format("from {}", t));
    }
  }
  ASSERT_EQ(all.size(), size_t{kClients * kEach});
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kClients * kEach);
  EXPECT_EQ(*store_->CountTickets("tickets", Soon()), kClients * kEach);
  EXPECT_EQ(*store_->CountTickets("no tickets", Soon()), 0);
}

TEST_P(StoreContract, JoinAppendsAndReadsUnlessAKeyExists) {
  ASSERT_TRUE(store_->Set("state", "s1", Soon()).ok());
  Store::JoinRequest join{"slot", "node", "me", {"closed"}, {"state", "absent"}, ""};
  auto first = store_->Join(join, Soon());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->ticket, 1);
  ASSERT_EQ(first->read.size(), 2u);
  EXPECT_EQ(first->read[0], "s1");
  EXPECT_EQ(first->read[1], std::nullopt);
  join.record = "you";
  auto second = factory_->Make()->Join(join, Soon());
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->ticket, 2);
  // A key that appears after a join's moment is seen by GetSince from that moment on,
  // whether it was written before the call (replayed) or during it (woken).
  ASSERT_TRUE(store_->Set("layout", "L", Soon()).ok());
  int64_t seen = second->seen;
  EXPECT_EQ(*store_->GetSince("layout", &seen, Soon()), "L");
  // The mark given back is of the value's write: a key written after it is seen from there.
  std::thread writer([&] { ASSERT_TRUE(factory_->Make()->Set("later", "v", Soon()).ok()); });
  auto later = store_->GetSince("later", &seen, Deadline::AfterMs(20000));
  writer.join();
  ASSERT_TRUE(later.ok()) << later.status().ToString();
  EXPECT_EQ(*later, "v");
  // Once an unless key exists the join is refused: no ticket, nothing read.
  ASSERT_TRUE(store_->Set("closed", "2", Soon()).ok());
  join.record = "late";
  auto refused = store_->Join(join, Soon());
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  EXPECT_EQ(refused->ticket, 0);
  EXPECT_TRUE(refused->read.empty());
  EXPECT_EQ(*store_->CountTickets("slot", Soon()), 2);
  EXPECT_EQ(*store_->ReadAppended("slot", "node", 1, 2, Soon()),
            (std::vector<std::string>{"me", "you"}));
  // Waiting for a ticket not yet taken times out at the deadline.
  EXPECT_EQ(store_->WaitAppended("slot", "node", 3, Deadline::AfterMs(300)).code(),
            StatusCode::kDeadlineExceeded);
}

TEST_P(StoreContract, AddIsAtomicAcrossClients) {
  constexpr int kClients = 4, kShared = 2, kAdds = 100;
  std::vector<std::thread> threads;
  for (int t = 0; t < kClients; ++t) {
    threads.emplace_back([&] {
      auto client = factory_->Make();
      for (int i = 0; i < kAdds; ++i) ASSERT_TRUE(client->Add("counter", 1, Soon()).ok());
    });
  }
  // The same store object from several threads at once.
  for (int t = 0; t < kShared; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kAdds; ++i) ASSERT_TRUE(store_->Add("counter", 1, Soon()).ok());
    });
  }
  for (auto& t : threads) t.join();
  const int total = (kClients + kShared) * kAdds;
  EXPECT_EQ(*store_->Add("counter", 0, Soon()), total);
  EXPECT_EQ(*store_->Get("counter", Soon()), std::to_string(total));
  EXPECT_EQ(*store_->Add("neg", -5, Soon()), -5);
  ASSERT_TRUE(store_->Set("text", "abc", Soon()).ok());
  EXPECT_EQ(store_->Add("text", 1, Soon()).status().code(), StatusCode::kInvalidArgument);
}

TEST_P(StoreContract, CompareSet) {
  EXPECT_EQ(*store_->CompareSet("c", "", "first", Soon()), "first");
  EXPECT_EQ(*store_->CompareSet("c", "", "second", Soon()), "first");
  EXPECT_EQ(*store_->CompareSet("c", "first", "third", Soon()), "third");
  EXPECT_EQ(*store_->CompareSet("c", "nope", "fourth", Soon()), "third");
  EXPECT_EQ(*store_->CompareSet("missing", "x", "y", Soon()), "");
  EXPECT_FALSE(*store_->Check({"missing"}, Soon()));
}

// CreateAll writes keys that are all absent, finds its own values written when sent again,
// and writes nothing when any key holds something else: every store here does it in one
// step (etcd: one txn; the others under their lock), so a key held further on leaves the
// keys before it unwritten too.
TEST_P(StoreContract, CreateAllWritesOnlyKeysThatAreAllAbsent) {
  EXPECT_TRUE(*store_->CreateAll({"closed", "layout", "next"}, {"2", "L", "N"}, Soon()));
  EXPECT_EQ(*store_->Peek({"closed", "layout", "next"}, Soon()),
            (std::vector<std::optional<std::string>>{"2", "L", "N"}));
  EXPECT_TRUE(*store_->CreateAll({"closed", "layout", "next"}, {"2", "L", "N"}, Soon()));
  EXPECT_FALSE(*store_->CreateAll({"closed", "other"}, {"3", "O"}, Soon()));
  EXPECT_EQ(*store_->Peek({"closed", "other"}, Soon()),
            (std::vector<std::optional<std::string>>{"2", std::nullopt}));
  EXPECT_FALSE(*store_->CreateAll({"first", "next"}, {"F", "M"}, Soon()));
  EXPECT_FALSE(store_->Peek({"first"}, Soon())->at(0).has_value());
  EXPECT_EQ(*store_->Get("next", Soon()), "N");
  EXPECT_EQ(store_->CreateAll({"a"}, {"1", "2"}, Soon()).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_P(StoreContract, WaitAndGetAreWokenByAnotherClient) {
  auto writer = factory_->Make();
  std::thread t([&] {
    // Whether the waiter blocks before or after these writes, it must see them.
    ASSERT_TRUE(writer->Set("w1", "x", Soon()).ok());
    ASSERT_TRUE(writer->MultiSet({"w2", "w3"}, {"y", "z"}, Soon()).ok());
    ASSERT_TRUE(writer->Set("late", "value", Soon()).ok());
  });
  EXPECT_TRUE(store_->Wait({"w1", "w2", "w3"}, Soon()).ok());
  auto values = store_->MultiGet({"w3", "w1"}, Soon());
  ASSERT_TRUE(values.ok()) << values.status().ToString();
  EXPECT_EQ(*values, (std::vector<std::string>{"z", "x"}));
  auto start = SteadyClock::now();
  EXPECT_EQ(*store_->Get("late", Soon()), "value");
  EXPECT_LT(SecondsSince(start), 2.0);
  t.join();
}

TEST_P(StoreContract, AbortUnblocksWaiters) {
  auto waiter = factory_->Make();
  std::atomic<bool> returned{false};
  std::thread t([&] {
    auto r = waiter->Get("never", Deadline::AfterMs(30000));
    EXPECT_EQ(r.status().code(), StatusCode::kCancelled) << r.status().ToString();
    returned = true;
  });
  // Abort before the call starts cancels it too, so no ordering is needed.
  auto start = SteadyClock::now();
  waiter->Abort();
  t.join();
  EXPECT_TRUE(returned);
  EXPECT_LT(SecondsSince(start), 5.0);
  EXPECT_EQ(waiter->Set("k", "v", Soon()).code(), StatusCode::kCancelled);
}

}  // namespace cohort::store::contract
