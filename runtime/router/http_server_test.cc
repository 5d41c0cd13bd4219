// HttpServer over real loopback sockets, with a raw-socket client (http_test_client.h).
#include "runtime/router/http_server.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "runtime/router/http_test_client.h"

namespace tandem::router {
namespace {

using testing::Fetch;
using testing::RawRequest;
using testing::TestConnection;

std::unique_ptr<HttpServer> StartServer(HttpHandler handler, HttpServerOptions options = {}) {
  options.host = "127.0.0.1";
  options.port = 0;
  options.num_threads = 2;
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start(std::move(options), std::move(handler));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

void Echo(HttpRequest req, std::shared_ptr<HttpExchange> ex) {
  ex->Respond({200, "text/plain", {{"X-Method", req.method}}, req.path + "|" + req.body});
}

TEST(HttpServerTest, RespondsAndKeepsConnectionAlive) {
  auto server = StartServer(Echo);
  ASSERT_NE(server, nullptr);
  EXPECT_GT(server->port(), 0);
  TestConnection conn(server->port());
  ASSERT_TRUE(conn.connected());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(conn.Send(RawRequest("POST", "/a?x=1", absl::StrCat("body", i))));
    auto r = conn.ReadResponse();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, absl::StrCat("/a|body", i));
    EXPECT_EQ(r->Header("x-method"), "POST");
    EXPECT_EQ(r->Header("connection"), "keep-alive");
  }
}

TEST(HttpServerTest, PipelinedRequestsAnswerInOrder) {
  auto server = StartServer(Echo);
  ASSERT_NE(server, nullptr);
  TestConnection conn(server->port());
  ASSERT_TRUE(conn.Send(RawRequest("POST", "/1", "a") + RawRequest("POST", "/2", "b")));
  auto r1 = conn.ReadResponse();
  auto r2 = conn.ReadResponse();
  ASSERT_TRUE(r1.has_value() && r2.has_value());
  EXPECT_EQ(r1->body, "/1|a");
  EXPECT_EQ(r2->body, "/2|b");
}

TEST(HttpServerTest, ConnectionCloseIsHonoured) {
  auto server = StartServer(Echo);
  ASSERT_NE(server, nullptr);
  TestConnection conn(server->port());
  ASSERT_TRUE(conn.Send(RawRequest("GET", "/x", "", /*keep_alive=*/false)));
  auto r = conn.ReadResponse();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->Header("connection"), "close");
  EXPECT_TRUE(conn.PeerClosed());
}

TEST(HttpServerTest, OversizedBodyGets413WithoutReadingIt) {
  std::atomic<int> handled{0};
  HttpServerOptions options;
  options.max_body_bytes = 1000;
  auto server = StartServer(
      [&](HttpRequest req, std::shared_ptr<HttpExchange> ex) {
        ++handled;
        Echo(std::move(req), std::move(ex));
      },
      options);
  ASSERT_NE(server, nullptr);
  // Declared too large: answered from the header alone (no body is ever sent).
  TestConnection conn(server->port());
  ASSERT_TRUE(conn.Send("POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1001\r\n\r\n"));
  auto r = conn.ReadResponse();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 413);
  // Actually sent in full, chunked: the limit applies while reading.
  TestConnection conn2(server->port());
  std::string chunked = "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 3; ++i) absl::StrAppend(&chunked, "1f4\r\n", std::string(500, 'x'), "\r\n");
  chunked += "0\r\n\r\n";
  ASSERT_TRUE(conn2.Send(chunked));
  auto r2 = conn2.ReadResponse();
  ASSERT_TRUE(r2.has_value());
  EXPECT_EQ(r2->status, 413);
  // Exactly at the limit is fine.
  auto ok = Fetch(server->port(), "POST", "/x", std::string(1000, 'y'));
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(handled.load(), 1);
}

TEST(HttpServerTest, MalformedRequestGets400) {
  auto server = StartServer(Echo);
  ASSERT_NE(server, nullptr);
  TestConnection conn(server->port());
  ASSERT_TRUE(conn.Send("THIS IS NOT HTTP\r\n\r\n"));
  auto r = conn.ReadResponse();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(Fetch(server->port(), "GET", "/still-up")->status, 200);
}

TEST(HttpServerTest, ChunksAreFlushedOneByOne) {
  absl::Mutex mu;
  std::shared_ptr<HttpExchange> held;
  absl::Notification got_request;
  auto server = StartServer([&](HttpRequest, std::shared_ptr<HttpExchange> ex) {
    ex->StartStream(200, "text/event-stream", {});
    ex->WriteChunk("data: one\n\n");
    absl::MutexLock lock(&mu);
    held = ex;
    if (!got_request.HasBeenNotified()) got_request.Notify();
  });
  ASSERT_NE(server, nullptr);
  TestConnection conn(server->port());
  ASSERT_TRUE(conn.Send(RawRequest("GET", "/s", "")));
  auto head = conn.ReadHead();
  ASSERT_TRUE(head.has_value());
  EXPECT_TRUE(head->chunked);
  EXPECT_EQ(head->Header("content-type"), "text/event-stream");
  // The first chunk arrives while the handler still holds the exchange (nothing more written).
  EXPECT_EQ(conn.ReadChunk(), "data: one\n\n");
  got_request.WaitForNotification();
  {
    absl::MutexLock lock(&mu);
    held->WriteChunk("data: two\n\n");
    held->EndStream();
    held.reset();
  }
  EXPECT_EQ(conn.ReadChunk(), "data: two\n\n");
  EXPECT_EQ(conn.ReadChunk(), "");
  // The connection is reusable afterwards.
  ASSERT_TRUE(conn.Send(RawRequest("GET", "/s2", "")));
  EXPECT_TRUE(conn.ReadHead().has_value());
}

// An HTTP/1.0 client cannot read chunked encoding: a stream reaches it as the raw body, ended by
// the server closing the connection.
TEST(HttpServerTest, StreamToAnHttp10ClientIsCloseDelimited) {
  auto server = StartServer([](HttpRequest, std::shared_ptr<HttpExchange> ex) {
    ex->StartStream(200, "text/event-stream", {});
    ex->WriteChunk("data: one\n\n");
    ex->WriteChunk("data: two\n\n");
    ex->EndStream();
  });
  ASSERT_NE(server, nullptr);
  TestConnection conn(server->port());
  ASSERT_TRUE(conn.Send("GET /s HTTP/1.0\r\nHost: localhost\r\n\r\n"));
  const std::string all = conn.ReadUntilClosed();
  EXPECT_EQ(all.find("Transfer-Encoding"), std::string::npos) << all;
  EXPECT_NE(all.find("Connection: close"), std::string::npos) << all;
  const size_t body = all.find("\r\n\r\n");
  ASSERT_NE(body, std::string::npos) << all;
  EXPECT_EQ(all.substr(body + 4), "data: one\n\ndata: two\n\n");
}

TEST(HttpServerTest, ClientDisconnectRunsCloseHandlerPromptly) {
  absl::Notification closed;
  absl::Mutex mu;
  std::shared_ptr<HttpExchange> held;
  auto server = StartServer([&](HttpRequest, std::shared_ptr<HttpExchange> ex) {
    ex->SetCloseHandler([&] { closed.Notify(); });
    absl::MutexLock lock(&mu);
    held = ex;  // never answered
  });
  ASSERT_NE(server, nullptr);
  {
    TestConnection conn(server->port());
    ASSERT_TRUE(conn.Send(RawRequest("POST", "/slow", "{}")));
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(closed.WaitForNotificationWithTimeout(absl::Seconds(2)));
  // Writes after the close are harmless no-ops.
  absl::MutexLock lock(&mu);
  held->Respond({200, "text/plain", {}, "late"});
  held.reset();
}

TEST(HttpServerTest, CloseHandlerNeverRunsAfterCompleteResponse) {
  std::atomic<int> closes{0};
  auto server = StartServer([&](HttpRequest req, std::shared_ptr<HttpExchange> ex) {
    ex->SetCloseHandler([&] { ++closes; });
    Echo(std::move(req), std::move(ex));
  });
  ASSERT_NE(server, nullptr);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(Fetch(server->port(), "GET", "/x")->status, 200);
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(closes.load(), 0);
}

TEST(HttpServerTest, DroppedExchangeAnswers500) {
  auto server = StartServer([](HttpRequest, std::shared_ptr<HttpExchange>) {});
  ASSERT_NE(server, nullptr);
  auto r = Fetch(server->port(), "GET", "/x");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 500);
}

TEST(HttpServerTest, IdleConnectionTimesOut) {
  HttpServerOptions options;
  options.idle_timeout = absl::Milliseconds(200);
  auto server = StartServer(Echo, options);
  ASSERT_NE(server, nullptr);
  TestConnection conn(server->port(), absl::Seconds(5));
  const absl::Time start = absl::Now();
  EXPECT_TRUE(conn.PeerClosed());
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST(HttpServerTest, StopClosesPendingExchangesAndRunsCloseHandlers) {
  absl::Notification closed;
  absl::Notification got_request;
  absl::Mutex mu;
  std::shared_ptr<HttpExchange> held;
  HttpServerOptions options;
  options.shutdown_grace = absl::Milliseconds(100);
  auto server = StartServer(
      [&](HttpRequest, std::shared_ptr<HttpExchange> ex) {
        ex->SetCloseHandler([&] { closed.Notify(); });
        absl::MutexLock lock(&mu);
        held = ex;
        got_request.Notify();
      },
      options);
  ASSERT_NE(server, nullptr);
  TestConnection conn(server->port());
  ASSERT_TRUE(conn.Send(RawRequest("POST", "/slow", "{}")));
  ASSERT_TRUE(got_request.WaitForNotificationWithTimeout(absl::Seconds(5)));
  const absl::Time start = absl::Now();
  server->Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_TRUE(closed.HasBeenNotified());
  EXPECT_TRUE(conn.PeerClosed());
  // The exchange outlives the server and is inert.
  absl::MutexLock lock(&mu);
  held->Respond({200, "text/plain", {}, "late"});
  held.reset();
  server.reset();
}

TEST(HttpServerTest, StopLetsInFlightResponseFinish) {
  auto server = StartServer([](HttpRequest, std::shared_ptr<HttpExchange> ex) {
    std::thread([ex] {
      absl::SleepFor(absl::Milliseconds(200));
      ex->Respond({200, "text/plain", {}, "done"});
    }).detach();
  });
  ASSERT_NE(server, nullptr);
  TestConnection conn(server->port());
  ASSERT_TRUE(conn.Send(RawRequest("GET", "/x", "")));
  absl::SleepFor(absl::Milliseconds(50));
  server->Stop();
  auto r = conn.ReadResponse();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body, "done");
}

TEST(HttpServerTest, PortInUseIsAnError) {
  auto server = StartServer(Echo);
  ASSERT_NE(server, nullptr);
  HttpServerOptions options;
  options.host = "127.0.0.1";
  options.port = server->port();
  auto second = HttpServer::Start(options, Echo);
  EXPECT_FALSE(second.ok());
  options.host = "not an address";
  options.port = 0;
  EXPECT_EQ(HttpServer::Start(options, Echo).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::router
