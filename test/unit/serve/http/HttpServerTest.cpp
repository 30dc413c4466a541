// dgemma-serve's HTTP layer against a real server on 127.0.0.1 (an ephemeral port, run() on its own
// thread) and clients that write raw bytes over POSIX sockets. Waits have generous limits that only
// turn a hang into a failure; nothing here measures time.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "TestClient.h"
#include "runtime/serve/http/HttpServer.h"
#include "test/unit/TestSupport.h"

namespace dgemma::serve {
namespace {

using test::TestClient;
constexpr auto kGenerousWait = std::chrono::seconds(30);

// Runs a server's io loop on a thread for the length of a test.
class RunningServer {
 public:
  RunningServer(HttpServerOptions options, Handler handler)
      : server_(std::move(options), std::move(handler)), thread_([this] {
          server_.run();
          runReturned_.set_value();
        }) {}
  ~RunningServer() {
    server_.drain(0);
    thread_.join();
  }
  HttpServer& server() { return server_; }
  int port() const { return server_.boundPort(); }
  bool runReturns() { return runReturnedFuture_.wait_for(kGenerousWait) == std::future_status::ready; }

 private:
  HttpServer server_;
  std::promise<void> runReturned_;
  std::future<void> runReturnedFuture_ = runReturned_.get_future();
  std::thread thread_;
};

// Exchanges a handler hands over to the test thread, which answers them.
class ExchangeMailbox {
 public:
  void put(std::shared_ptr<Exchange> exchange) {
    std::lock_guard lock(mutex_);
    exchanges_.push_back(std::move(exchange));
    arrived_.notify_all();
  }
  std::shared_ptr<Exchange> take() {
    std::unique_lock lock(mutex_);
    if (!arrived_.wait_for(lock, kGenerousWait, [&] { return !exchanges_.empty(); })) return nullptr;
    std::shared_ptr<Exchange> exchange = exchanges_.front();
    exchanges_.pop_front();
    return exchange;
  }
  size_t size() {
    std::lock_guard lock(mutex_);
    return exchanges_.size();
  }

 private:
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::deque<std::shared_ptr<Exchange>> exchanges_;
};

// Answers "METHOD PATH QUERY BODY" at once.
Handler echo(std::atomic<int>* calls = nullptr) {
  return [calls](std::shared_ptr<Exchange> exchange) {
    if (calls) ++*calls;
    const HttpRequest& request = exchange->request();
    exchange->respond(HttpResponse{
        200, "text/plain", request.method + " " + request.path + " " + request.query + " " + request.body, {}});
  };
}

// Paths under /held go to the mailbox; others are echoed.
Handler holdOrEcho(ExchangeMailbox& mailbox) {
  return [&mailbox, echoNow = echo()](std::shared_ptr<Exchange> exchange) {
    if (exchange->request().path.rfind("/held", 0) == 0) {
      mailbox.put(std::move(exchange));
    } else {
      echoNow(std::move(exchange));
    }
  };
}

std::string get(const std::string& target) { return "GET " + target + " HTTP/1.1\r\nHost: test\r\n\r\n"; }

TEST(HttpServer, ServesTwoRequestsOnOneKeepAliveConnection) {
  RunningServer running({}, echo());
  TestClient client(running.port());
  ASSERT_TRUE(client.send(get("/v1/models?limit=2")));
  test::ReceivedResponse first = client.readResponse();
  EXPECT_EQ(first.status, 200);
  EXPECT_EQ(first.body, "GET /v1/models limit=2 ");
  EXPECT_EQ(first.header("connection"), "");
  ASSERT_TRUE(client.send(get("/unknown/path")));
  test::ReceivedResponse second = client.readResponse();
  EXPECT_EQ(second.status, 200);
  EXPECT_EQ(second.body, "GET /unknown/path  ");
  EXPECT_EQ(running.server().openConnections(), 1u);
}

TEST(HttpServer, AnswersHeadWithoutTheBody) {
  RunningServer running({}, echo());
  TestClient client(running.port());
  ASSERT_TRUE(client.send("HEAD /health HTTP/1.1\r\nHost: test\r\n\r\n"));
  test::ReceivedResponse head = client.readHead();
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.header("content-length"), std::to_string(std::string("HEAD /health  ").size()));
  // No body follows: the next response starts right after the head.
  ASSERT_TRUE(client.send(get("/next")));
  EXPECT_EQ(client.readResponse().body, "GET /next  ");
}

TEST(HttpServer, AnswersPipelinedRequestsInOrder) {
  RunningServer running({}, echo());
  TestClient client(running.port());
  ASSERT_TRUE(client.send(get("/one") + get("/two")));
  EXPECT_EQ(client.readResponse().body, "GET /one  ");
  EXPECT_EQ(client.readResponse().body, "GET /two  ");
}

TEST(HttpServer, DeliversAPostBodyIntactWithLowerCasedHeaders) {
  std::string seenHeader;
  RunningServer running({}, [&seenHeader](std::shared_ptr<Exchange> exchange) {
    seenHeader = exchange->request().header("x-custom-name");
    exchange->respond(HttpResponse{200, "application/octet-stream", exchange->request().body, {}});
  });
  std::string body;
  for (size_t i = 0; i < 300000; ++i) body.push_back(static_cast<char>(i * 7919 % 256));
  TestClient client(running.port());
  ASSERT_TRUE(client.send("POST /v1/completions HTTP/1.1\r\nHost: test\r\nX-Custom-NAME: Value\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body));
  test::ReceivedResponse response = client.readResponse();
  EXPECT_EQ(response.status, 200);
  EXPECT_TRUE(response.body == body) << "the echoed body differs (" << response.body.size() << " bytes)";
  EXPECT_EQ(seenHeader, "Value");
}

TEST(HttpServer, AnswersAContentLengthOverTheLimitWith413WithoutCallingTheHandler) {
  std::atomic<int> calls{0};
  HttpServerOptions options;
  options.maxBodyBytes = 1000;
  RunningServer running(options, echo(&calls));
  TestClient client(running.port());
  ASSERT_TRUE(client.send("POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Length: 5000\r\n\r\n"));
  test::ReceivedResponse response = client.readResponse();
  EXPECT_EQ(response.status, 413);
  EXPECT_EQ(response.header("connection"), "close");
  EXPECT_TRUE(dgemma::test::mentions(response.body, "1000"));
  EXPECT_TRUE(client.closedByServer());
  EXPECT_EQ(calls, 0);
}

TEST(HttpServer, AnswersAChunkedBodyPassingTheLimitWith413) {
  std::atomic<int> calls{0};
  HttpServerOptions options;
  options.maxBodyBytes = 1000;
  RunningServer running(options, echo(&calls));
  TestClient client(running.port());
  std::string chunk = "258\r\n" + std::string(600, 'x') + "\r\n";
  client.send("POST /v1/completions HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk + chunk +
              chunk + "0\r\n\r\n");
  test::ReceivedResponse response = client.readResponse();
  EXPECT_EQ(response.status, 413);
  EXPECT_TRUE(client.closedByServer());
  EXPECT_EQ(calls, 0);
}

TEST(HttpServer, AcceptsAChunkedBodyWithinTheLimit) {
  RunningServer running({}, echo());
  TestClient client(running.port());
  ASSERT_TRUE(
      client.send("POST /c HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
                  "6\r\n world\r\n0\r\n\r\n"));
  EXPECT_EQ(client.readResponse().body, "POST /c  hello world");
}

TEST(HttpServer, AnswersAMalformedRequestLineWith400AndCloses) {
  std::atomic<int> calls{0};
  RunningServer running({}, echo(&calls));
  TestClient client(running.port());
  ASSERT_TRUE(client.send("THIS IS NOT HTTP\r\n\r\n"));
  test::ReceivedResponse response = client.readResponse();
  EXPECT_EQ(response.status, 400);
  EXPECT_TRUE(dgemma::test::mentions(response.body, "malformed request"));
  EXPECT_TRUE(client.closedByServer());
  EXPECT_EQ(calls, 0);
}

TEST(HttpServer, AnswersAMalformedHeaderWith400) {
  std::atomic<int> calls{0};
  RunningServer running({}, echo(&calls));
  TestClient client(running.port());
  ASSERT_TRUE(client.send("GET / HTTP/1.1\r\nHost: test\r\nno colon here\r\n\r\n"));
  EXPECT_EQ(client.readResponse().status, 400);
  EXPECT_TRUE(client.closedByServer());
  EXPECT_EQ(calls, 0);
}

TEST(HttpServer, AnswersAHeaderOverTheLimitWith431) {
  HttpServerOptions options;
  options.maxHeaderBytes = 1024;
  RunningServer running(options, echo());
  TestClient client(running.port());
  client.send("GET / HTTP/1.1\r\nHost: test\r\nX-Big: " + std::string(4000, 'a') + "\r\n\r\n");
  EXPECT_EQ(client.readResponse().status, 431);
  EXPECT_TRUE(client.closedByServer());
}

TEST(HttpServer, FormatsItsOwnErrorsWithTheGivenFormatter) {
  HttpServerOptions options;
  options.errorBody = [](int status, const std::string& message) {
    return "status " + std::to_string(status) + ": " + message;
  };
  RunningServer running(options, echo());
  TestClient client(running.port());
  ASSERT_TRUE(client.send("THIS IS NOT HTTP\r\n\r\n"));
  EXPECT_TRUE(dgemma::test::mentions(client.readResponse().body, "status 400: malformed request"));
}

TEST(HttpServer, AnswersAThrowingHandlerWith500) {
  RunningServer running({}, [](std::shared_ptr<Exchange>) { throw std::runtime_error("engine unavailable"); });
  TestClient client(running.port());
  ASSERT_TRUE(client.send(get("/v1/models")));
  test::ReceivedResponse response = client.readResponse();
  EXPECT_EQ(response.status, 500);
  EXPECT_TRUE(dgemma::test::mentions(response.body, "engine unavailable"));
}

TEST(HttpServer, AnswersAnExchangeDroppedUnansweredWith500) {
  RunningServer running({}, [](std::shared_ptr<Exchange>) {});
  TestClient client(running.port());
  ASSERT_TRUE(client.send(get("/v1/models")));
  test::ReceivedResponse response = client.readResponse();
  EXPECT_EQ(response.status, 500);
  EXPECT_TRUE(dgemma::test::mentions(response.body, "dropped without a response"));
  ASSERT_TRUE(client.send(get("/v1/models")));
  EXPECT_EQ(client.readResponse().status, 500);
}

TEST(HttpServer, ClosesAStreamWhoseExchangeIsDroppedUnfinished) {
  ExchangeMailbox mailbox;
  RunningServer running({}, holdOrEcho(mailbox));
  TestClient client(running.port());
  ASSERT_TRUE(client.send(get("/held/stream")));
  std::shared_ptr<Exchange> exchange = mailbox.take();
  ASSERT_NE(exchange, nullptr);
  exchange->startStream(200, "text/event-stream");
  ASSERT_TRUE(exchange->writeChunk("data: 1\n\n"));
  exchange.reset();
  EXPECT_EQ(client.readHead().status, 200);
  EXPECT_EQ(client.readChunk(), "data: 1\n\n");
  EXPECT_TRUE(client.closedByServer());
}

TEST(HttpServer, StreamsAResponseChunkByChunk) {
  ExchangeMailbox mailbox;
  RunningServer running({}, holdOrEcho(mailbox));
  TestClient client(running.port());
  ASSERT_TRUE(client.send(get("/held/stream")));
  std::shared_ptr<Exchange> exchange = mailbox.take();
  ASSERT_NE(exchange, nullptr);
  exchange->startStream(200, "text/event-stream", {{"X-Request-Id", "r1"}});
  // Each chunk is read before the next is written: it must have been sent on its own.
  ASSERT_TRUE(exchange->writeChunk("data: 1\n\n"));
  test::ReceivedResponse head = client.readHead();
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.header("content-type"), "text/event-stream");
  EXPECT_EQ(head.header("cache-control"), "no-cache");
  EXPECT_EQ(head.header("transfer-encoding"), "chunked");
  EXPECT_EQ(head.header("x-request-id"), "r1");
  EXPECT_EQ(client.readChunk(), "data: 1\n\n");
  ASSERT_TRUE(exchange->writeChunk("data: 2\n\n"));
  EXPECT_EQ(client.readChunk(), "data: 2\n\n");
  exchange->endStream();
  EXPECT_EQ(client.readChunk(), "");
  EXPECT_THROW(exchange->writeChunk("late"), std::logic_error);
  // The connection stays open for the next request.
  ASSERT_TRUE(client.send(get("/after")));
  EXPECT_EQ(client.readResponse().body, "GET /after  ");
}

TEST(HttpServer, StreamsToAnHttp10ClientUntilClose) {
  ExchangeMailbox mailbox;
  RunningServer running({}, holdOrEcho(mailbox));
  TestClient client(running.port());
  ASSERT_TRUE(client.send("GET /held HTTP/1.0\r\n\r\n"));
  std::shared_ptr<Exchange> exchange = mailbox.take();
  ASSERT_NE(exchange, nullptr);
  exchange->startStream(200, "text/plain");
  exchange->writeChunk("abc");
  exchange->writeChunk("def");
  exchange->endStream();
  test::ReceivedResponse head = client.readHead();
  EXPECT_EQ(head.header("transfer-encoding"), "");
  EXPECT_EQ(head.header("connection"), "close");
  std::string body;
  while (!client.closedByServer()) body += client.readSome();
  EXPECT_EQ(body, "abcdef");
}

TEST(HttpServer, NoticesAClientLeavingMidStream) {
  ExchangeMailbox mailbox;
  RunningServer running({}, holdOrEcho(mailbox));
  TestClient client(running.port());
  ASSERT_TRUE(client.send(get("/held/stream")));
  std::shared_ptr<Exchange> exchange = mailbox.take();
  ASSERT_NE(exchange, nullptr);
  std::promise<void> gone;
  exchange->onClientGone([&gone] { gone.set_value(); });
  exchange->startStream(200, "text/event-stream");
  ASSERT_TRUE(exchange->writeChunk("data: 1\n\n"));
  client.readHead();
  EXPECT_EQ(client.readChunk(), "data: 1\n\n");
  EXPECT_FALSE(exchange->clientGone());
  client.close();
  ASSERT_EQ(gone.get_future().wait_for(kGenerousWait), std::future_status::ready);
  EXPECT_TRUE(exchange->clientGone());
  EXPECT_FALSE(exchange->writeChunk("data: 2\n\n"));
  exchange->endStream();
}

TEST(HttpServer, RunsAGoneCallbackRegisteredAfterTheClientLeft) {
  ExchangeMailbox mailbox;
  RunningServer running({}, holdOrEcho(mailbox));
  std::promise<void> firstGone;
  {
    TestClient client(running.port());
    ASSERT_TRUE(client.send(get("/held")));
    std::shared_ptr<Exchange> exchange = mailbox.take();
    ASSERT_NE(exchange, nullptr);
    exchange->onClientGone([&firstGone] { firstGone.set_value(); });
    client.close();
    ASSERT_EQ(firstGone.get_future().wait_for(kGenerousWait), std::future_status::ready);
    std::promise<void> secondGone;
    exchange->onClientGone([&secondGone] { secondGone.set_value(); });
    EXPECT_EQ(secondGone.get_future().wait_for(kGenerousWait), std::future_status::ready);
  }
}

TEST(HttpServer, TreatsAStreamReaderThatFallsTooFarBehindAsGone) {
  ExchangeMailbox mailbox;
  HttpServerOptions options;
  options.maxQueuedStreamBytes = 1 << 20;
  RunningServer running(options, holdOrEcho(mailbox));
  TestClient client(running.port());
  ASSERT_TRUE(client.send(get("/held/stream")));
  std::shared_ptr<Exchange> exchange = mailbox.take();
  ASSERT_NE(exchange, nullptr);
  std::promise<void> gone;
  exchange->onClientGone([&gone] { gone.set_value(); });
  exchange->startStream(200, "text/event-stream");
  // The client reads nothing: once the socket buffers are full, the queue grows until it overflows.
  std::string piece(64 << 10, 'x');
  bool refused = false;
  for (int i = 0; i < 100000 && !refused; ++i) refused = !exchange->writeChunk(piece);
  EXPECT_TRUE(refused);
  ASSERT_EQ(gone.get_future().wait_for(kGenerousWait), std::future_status::ready);
}

TEST(HttpServer, AnswersANewConnectionWhileAThousandIdleOnesAreOpen) {
  RunningServer running({}, echo());
  std::vector<std::unique_ptr<TestClient>> idle;
  for (int i = 0; i < 1000; ++i) idle.push_back(std::make_unique<TestClient>(running.port()));
  TestClient client(running.port());
  ASSERT_TRUE(client.send(get("/v1/models")));
  EXPECT_EQ(client.readResponse().status, 200);
  // Connections are accepted in order, so the thousand idle ones were accepted before this one.
  EXPECT_EQ(running.server().openConnections(), 1001u);
  EXPECT_EQ(running.server().refusedConnections(), 0u);
}

TEST(HttpServer, ClosesAConnectionIdleLongerThanTheIdleTimeout) {
  HttpServerOptions options;
  options.idleTimeoutSeconds = 0.5;
  RunningServer running(options, echo());
  TestClient client(running.port());
  ASSERT_TRUE(client.send(get("/v1/models")));
  EXPECT_EQ(client.readResponse().status, 200);
  EXPECT_TRUE(client.closedByServer());
  TestClient silent(running.port());
  EXPECT_TRUE(silent.closedByServer());
}

TEST(HttpServer, AnswersARequestThatDoesNotArriveInTimeWith408) {
  HttpServerOptions options;
  options.requestTimeoutSeconds = 0.5;
  RunningServer running(options, echo());
  TestClient client(running.port());
  ASSERT_TRUE(client.send("GET / HTTP/1.1\r\nHost: te"));
  EXPECT_EQ(client.readResponse().status, 408);
  EXPECT_TRUE(client.closedByServer());
}

TEST(HttpServer, RefusesConnectionsBeyondMaxConnections) {
  HttpServerOptions options;
  options.maxConnections = 2;
  RunningServer running(options, echo());
  TestClient first(running.port());
  TestClient second(running.port());
  ASSERT_TRUE(first.send(get("/1")));
  ASSERT_TRUE(second.send(get("/2")));
  EXPECT_EQ(first.readResponse().status, 200);
  EXPECT_EQ(second.readResponse().status, 200);
  TestClient third(running.port());
  EXPECT_TRUE(third.closedByServer());
  EXPECT_EQ(running.server().refusedConnections(), 1u);
  ASSERT_TRUE(first.send(get("/again")));
  EXPECT_EQ(first.readResponse().status, 200);
}

TEST(HttpServer, DrainFinishesAStreamAnswersLateRequestsWith503AndStops) {
  ExchangeMailbox mailbox;
  RunningServer running({}, holdOrEcho(mailbox));
  TestClient streaming(running.port());
  ASSERT_TRUE(streaming.send(get("/held/stream")));
  std::shared_ptr<Exchange> exchange = mailbox.take();
  ASSERT_NE(exchange, nullptr);
  exchange->startStream(200, "text/event-stream");
  ASSERT_TRUE(exchange->writeChunk("data: 1\n\n"));
  EXPECT_EQ(streaming.readHead().status, 200);
  EXPECT_EQ(streaming.readChunk(), "data: 1\n\n");

  TestClient late(running.port());
  ASSERT_TRUE(late.send("POST /held/late HTTP/1.1\r\nHost: test\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"));
  EXPECT_EQ(late.readHead().status, 100);
  TestClient idle(running.port());
  ASSERT_TRUE(idle.send(get("/ping")));
  EXPECT_EQ(idle.readResponse().status, 200);

  running.server().drain(30);
  // The io thread runs posted work in order: once this chunk arrives, the drain has begun.
  ASSERT_TRUE(exchange->writeChunk("data: 2\n\n"));
  EXPECT_EQ(streaming.readChunk(), "data: 2\n\n");
  EXPECT_TRUE(idle.closedByServer());
  EXPECT_FALSE(TestClient::canConnect(running.port()));
  ASSERT_TRUE(late.send("hello"));
  test::ReceivedResponse refused = late.readResponse();
  EXPECT_EQ(refused.status, 503);
  EXPECT_EQ(refused.header("connection"), "close");
  EXPECT_EQ(mailbox.size(), 0u);

  exchange->endStream();
  EXPECT_EQ(streaming.readChunk(), "");
  EXPECT_TRUE(streaming.closedByServer());
  EXPECT_TRUE(running.runReturns());
  EXPECT_EQ(running.server().openConnections(), 0u);
}

TEST(HttpServer, DrainClosesWhatIsLeftAtItsDeadline) {
  ExchangeMailbox mailbox;
  RunningServer running({}, holdOrEcho(mailbox));
  TestClient client(running.port());
  ASSERT_TRUE(client.send(get("/held/forever")));
  std::shared_ptr<Exchange> exchange = mailbox.take();
  ASSERT_NE(exchange, nullptr);
  std::promise<void> gone;
  exchange->onClientGone([&gone] { gone.set_value(); });
  running.server().drain(0.2);
  EXPECT_TRUE(running.runReturns());
  EXPECT_EQ(gone.get_future().wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_TRUE(client.closedByServer());
}

TEST(HttpServer, AnswersAnExchangeFromAnotherThread) {
  ExchangeMailbox mailbox;
  RunningServer running({}, holdOrEcho(mailbox));
  std::thread engine([&mailbox] {
    std::shared_ptr<Exchange> exchange = mailbox.take();
    if (exchange)
      exchange->respond(HttpResponse{201, "application/json", "{\"from\":\"engine\"}", {{"Retry-After", "1"}}});
  });
  TestClient client(running.port());
  ASSERT_TRUE(client.send(get("/held/engine")));
  test::ReceivedResponse response = client.readResponse();
  engine.join();
  EXPECT_EQ(response.status, 201);
  EXPECT_EQ(response.body, "{\"from\":\"engine\"}");
  EXPECT_EQ(response.header("retry-after"), "1");
  EXPECT_EQ(response.header("content-type"), "application/json");
}

TEST(HttpServer, RejectsASecondAnswer) {
  ExchangeMailbox mailbox;
  RunningServer running({}, holdOrEcho(mailbox));
  TestClient client(running.port());
  ASSERT_TRUE(client.send(get("/held")));
  std::shared_ptr<Exchange> exchange = mailbox.take();
  ASSERT_NE(exchange, nullptr);
  exchange->respond(HttpResponse{});
  EXPECT_THROW(exchange->respond(HttpResponse{}), std::logic_error);
  EXPECT_THROW(exchange->startStream(200, "text/plain"), std::logic_error);
  EXPECT_EQ(client.readResponse().status, 200);
}

TEST(HttpServer, AnswersExpect100ContinueWhenTheBodyWillBeAccepted) {
  RunningServer running({}, echo());
  TestClient client(running.port());
  ASSERT_TRUE(client.send("POST /e HTTP/1.1\r\nHost: test\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"));
  EXPECT_EQ(client.readHead().status, 100);
  ASSERT_TRUE(client.send("hello"));
  test::ReceivedResponse response = client.readResponse();
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.body, "POST /e  hello");
}

TEST(HttpServer, AnswersExpect100ContinueWith413WhenTheBodyIsTooLarge) {
  std::atomic<int> calls{0};
  HttpServerOptions options;
  options.maxBodyBytes = 1000;
  RunningServer running(options, echo(&calls));
  TestClient client(running.port());
  ASSERT_TRUE(client.send("POST /e HTTP/1.1\r\nHost: test\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n"));
  EXPECT_EQ(client.readResponse().status, 413);
  EXPECT_TRUE(client.closedByServer());
  EXPECT_EQ(calls, 0);
}

TEST(HttpServer, ClosesAnHttp10ConnectionAfterItsResponse) {
  RunningServer running({}, echo());
  TestClient client(running.port());
  ASSERT_TRUE(client.send("GET /old HTTP/1.0\r\n\r\n"));
  test::ReceivedResponse response = client.readResponse();
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.header("connection"), "close");
  EXPECT_TRUE(client.closedByServer());
}

TEST(HttpServer, HonoursConnectionClose) {
  RunningServer running({}, echo());
  TestClient client(running.port());
  ASSERT_TRUE(client.send("GET /bye HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"));
  test::ReceivedResponse response = client.readResponse();
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.header("connection"), "close");
  EXPECT_TRUE(client.closedByServer());
}

TEST(HttpServer, NamesHostAndPortWhenItCannotListen) {
  RunningServer running({}, echo());
  HttpServerOptions options;
  options.port = running.port();
  std::string message = dgemma::test::expectInputError([&] { HttpServer second(options, echo()); });
  EXPECT_TRUE(dgemma::test::mentions(message, "127.0.0.1:" + std::to_string(running.port())));
  options.port = 70000;
  EXPECT_TRUE(dgemma::test::mentions(dgemma::test::expectInputError([&] { HttpServer bad(options, echo()); }), "port"));
}

TEST(HttpServer, DrainsOnSigterm) {
  HttpServerOptions options;
  HttpServer server(options, echo());
  server.drainOnSignals(1);
  std::promise<void> returned;
  std::thread loop([&] {
    server.run();
    returned.set_value();
  });
  TestClient client(server.boundPort());
  ASSERT_TRUE(client.send(get("/ping")));
  EXPECT_EQ(client.readResponse().status, 200);
  std::raise(SIGTERM);
  EXPECT_EQ(returned.get_future().wait_for(kGenerousWait), std::future_status::ready);
  loop.join();
}

// The real curl with -N (no output buffering) prints each chunk as it arrives: it has printed the
// first event while the second is not yet written.
TEST(HttpServer, CurlReceivesAStreamChunkByChunk) {
  ASSERT_EQ(std::system("command -v curl > /dev/null 2>&1"), 0)
      << "curl is not installed (scripts/install-deps.sh installs it)";
  ExchangeMailbox mailbox;
  RunningServer running({}, holdOrEcho(mailbox));
  std::string command = "curl -sN --max-time 60 http://127.0.0.1:" + std::to_string(running.port()) + "/held/stream";
  FILE* curl = popen(command.c_str(), "r");
  ASSERT_NE(curl, nullptr);
  std::shared_ptr<Exchange> exchange = mailbox.take();
  ASSERT_NE(exchange, nullptr);
  exchange->startStream(200, "text/event-stream");
  char line[256];
  ASSERT_TRUE(exchange->writeChunk("data: one\n\n"));
  ASSERT_NE(fgets(line, sizeof line, curl), nullptr);
  EXPECT_STREQ(line, "data: one\n");
  ASSERT_NE(fgets(line, sizeof line, curl), nullptr);
  EXPECT_STREQ(line, "\n");
  ASSERT_TRUE(exchange->writeChunk("data: two\n\n"));
  ASSERT_NE(fgets(line, sizeof line, curl), nullptr);
  EXPECT_STREQ(line, "data: two\n");
  exchange->endStream();
  EXPECT_EQ(pclose(curl), 0);
}

}  // namespace
}  // namespace dgemma::serve
