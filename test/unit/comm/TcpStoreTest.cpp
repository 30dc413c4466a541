// The TcpStore rank 0 serves for a rendezvous across hosts: keys set by one client are seen by the
// others, a reader waits for a key, a missing key times out naming it, and Gloo ranks connect
// through it.
#include <gloo/common/error.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "runtime/comm/GlooCommunicator.h"
#include "runtime/comm/LocalAddress.h"
#include "runtime/comm/TcpStore.h"
#include "support/Error.h"
#include "test/unit/comm/GlooRanks.h"

namespace dgemma {
namespace {

using namespace std::chrono_literals;

std::vector<char> bytes(const std::string& text) { return std::vector<char>(text.begin(), text.end()); }

TEST(TcpStore, ClientsShareKeys) {
  TcpStoreServer server(0, 2, 5s);
  TcpStore first("127.0.0.1", server.port(), 5s);
  TcpStore second("127.0.0.1", server.port(), 5s);
  first.set("rank0", bytes("address-0"));
  first.set("empty", {});
  EXPECT_EQ(second.get("rank0"), bytes("address-0"));
  EXPECT_EQ(second.get("empty"), std::vector<char>{});
  second.set("rank0", bytes("replaced"));
  EXPECT_EQ(first.get("rank0"), bytes("replaced"));
}

TEST(TcpStore, GetWaitsForAKeySetLater) {
  TcpStoreServer server(0, 2, 5s);
  TcpStore reader("127.0.0.1", server.port(), 5s);
  std::thread writer([&] {
    TcpStore client("127.0.0.1", server.port(), 5s);
    std::this_thread::sleep_for(200ms);
    client.set("late", bytes("value"));
  });
  EXPECT_EQ(reader.get("late"), bytes("value"));
  writer.join();
}

TEST(TcpStore, AMissingKeyTimesOutNamingIt) {
  TcpStoreServer server(0, 1, 5s);
  TcpStore client("127.0.0.1", server.port(), 5s);
  client.set("a", bytes("1"));
  const auto start = std::chrono::steady_clock::now();
  try {
    client.wait({"a", "b"}, 300ms);
    FAIL() << "the wait returned";
  } catch (const gloo::IoException& error) {
    EXPECT_NE(std::string(error.what()).find("key \"b\" did not appear within 300 ms"), std::string::npos) << error.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
}

TEST(TcpStore, AClientWaitsForTheServerToStart) {
  // Take a free port, then serve on it only after the client has started trying.
  int port;
  { port = TcpStoreServer(0, 0, 1s).port(); }
  std::optional<TcpStoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(300ms);
    server.emplace(port, 1, 5s);
  });
  TcpStore client("127.0.0.1", port, 5s);
  starter.join();
  client.set("k", bytes("v"));
  EXPECT_EQ(client.get("k"), bytes("v"));
}

TEST(TcpStore, NoServerIsAnErrorNamingTheAddress) {
  int port;
  { port = TcpStoreServer(0, 0, 1s).port(); }
  try {
    TcpStore client("127.0.0.1", port, 200ms);
    FAIL() << "connected to nothing";
  } catch (const RuntimeError& error) {
    EXPECT_NE(std::string(error.what()).find("tcp store 127.0.0.1:" + std::to_string(port) + " (MASTER_ADDR:MASTER_PORT): no server"),
              std::string::npos)
        << error.what();
  }
}

TEST(TcpStore, GlooRanksConnectThroughIt) {
  TcpStoreServer server(0, 3, 10s);
  const std::vector<std::string> failures =
      test::runOnRanks(3, [&](int64_t rank, const std::shared_ptr<gloo::rendezvous::Store>&) {
        std::unique_ptr<Communicator> communicator;
        {
          TcpStore store("127.0.0.1", server.port(), 10s);
          GlooOptions options;
          options.rank = rank;
          options.size = 3;
          options.timeout = 10s;
          options.prefix = "group";
          communicator = createGlooCommunicator(store, options);
        }
        float value = static_cast<float>(rank + 1);
        ExecContext context;
        communicator->allReduce(context, &value, 1, DType::F32, ReduceOp::Sum);
        if (value != 6.0f) throw std::runtime_error("sum " + std::to_string(value));
      });
  for (int64_t rank = 0; rank < 3; ++rank) EXPECT_EQ(failures[rank], "") << "rank " << rank;
}

TEST(LocalAddress, LoopbackRoutesThroughLoopback) { EXPECT_EQ(localAddressTowards("127.0.0.1"), "127.0.0.1"); }

TEST(LocalAddress, AnUnresolvableHostIsNamed) {
  try {
    localAddressTowards("no-such-host.invalid");
    FAIL();
  } catch (const RuntimeError& error) {
    EXPECT_NE(std::string(error.what()).find("MASTER_ADDR no-such-host.invalid: cannot resolve"), std::string::npos);
  }
}

}  // namespace
}  // namespace dgemma
