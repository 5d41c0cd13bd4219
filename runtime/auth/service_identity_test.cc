#include "runtime/auth/service_identity.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::auth {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A temporary directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = testing::TempDir() + "/auth_XXXXXX";
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() { std::system(absl::StrCat("rm -rf '", path_, "'").c_str()); }
  std::string Write(const std::string& name, const std::string& text, mode_t mode) const {
    const std::string file = path_ + "/" + name;
    std::ofstream(file) << text;
    chmod(file.c_str(), mode);
    return file;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Worker.StreamStats that authenticates and then sends one message; counts the calls it served.
class CountingWorker final : public tandem::v1::Worker::Service {
 public:
  explicit CountingWorker(std::shared_ptr<const ServiceIdentity> identity)
      : identity_(std::move(identity)) {}
  grpc::Status StreamStats(grpc::ServerContext* context, const tandem::v1::StatsRequest*,
                           grpc::ServerWriter<tandem::v1::WorkerStats>* writer) override {
    if (grpc::Status s = identity_->Authenticate(*context); !s.ok()) return s;
    ++served;
    last_peer = identity_->Peer(*context);
    tandem::v1::WorkerStats stats;
    stats.set_role("test");
    writer->Write(stats);
    return grpc::Status::OK;
  }
  std::atomic<int> served{0};
  std::string last_peer;

 private:
  std::shared_ptr<const ServiceIdentity> identity_;
};

struct Server {
  std::unique_ptr<CountingWorker> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

Server Serve(std::shared_ptr<const ServiceIdentity> identity, const std::string& host) {
  Server out;
  out.service = std::make_unique<CountingWorker>(identity);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(host + ":0", identity->ServerCredentials(), &out.port);
  builder.RegisterService(out.service.get());
  out.server = builder.BuildAndStart();
  return out;
}

grpc::Status Call(const std::shared_ptr<grpc::Channel>& channel, std::string* role = nullptr) {
  auto stub = tandem::v1::Worker::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  tandem::v1::StatsRequest request;
  auto reader = stub->StreamStats(&context, request);
  tandem::v1::WorkerStats stats;
  while (reader->Read(&stats)) {
    if (role != nullptr) *role = stats.role();
  }
  return reader->Finish();
}

constexpr char kToken[] = "0123456789abcdef0123456789abcdef";
constexpr char kOtherToken[] = "fedcba9876543210fedcba9876543210";

TEST(ServiceIdentityTest, RefusesToRunWithoutACredentialUnlessAskedTo) {
  auto none = ServiceIdentity::Create({});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(), HasSubstr("--service-token-file"));
  EXPECT_THAT(none.status().message(), HasSubstr("--insecure-services"));

  ServiceAuthOptions insecure;
  insecure.allow_unauthenticated = true;
  auto identity = ServiceIdentity::Create(insecure);
  ASSERT_TRUE(identity.ok());
  EXPECT_EQ((*identity)->mode(), "none");
}

TEST(ServiceIdentityTest, TokenFileMustBePrivateAndHoldValidTokens) {
  TempDir dir;
  ServiceAuthOptions options;

  options.token_file = dir.path() + "/missing";
  EXPECT_EQ(ServiceIdentity::Create(options).status().code(), absl::StatusCode::kNotFound);

  options.token_file = dir.Write("shared", absl::StrCat(kToken, "\n"), 0644);
  auto shared = ServiceIdentity::Create(options);
  EXPECT_EQ(shared.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(shared.status().message(), HasSubstr("chmod 600"));

  options.token_file = dir.Write("empty", "\n  \n", 0600);
  EXPECT_EQ(ServiceIdentity::Create(options).status().code(), absl::StatusCode::kInvalidArgument);

  options.token_file = dir.Write("short", "tooshort\n", 0600);
  auto short_token = ServiceIdentity::Create(options);
  EXPECT_EQ(short_token.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(short_token.status().message(), HasSubstr("line 1"));

  options.token_file = dir.Write("two", absl::StrCat("  ", kToken, "  \n\n", kOtherToken), 0400);
  auto two = ServiceIdentity::Create(options);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ((*two)->mode(), "token");

  EXPECT_FALSE(ServiceIdentity::FromTokens({}).ok());
  EXPECT_FALSE(ServiceIdentity::FromTokens({"has space in the middle of it"}).ok());
}

TEST(ServiceIdentityTest, PartialTlsConfigurationIsRefused) {
  ServiceAuthOptions options;
  options.tls_ca_file = "/nonexistent/ca.pem";
  auto partial = ServiceIdentity::Create(options);
  EXPECT_EQ(partial.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(partial.status().message(), HasSubstr("--tls-key"));

  TempDir dir;
  options.tls_ca_file = dir.Write("ca.pem", "not pem", 0600);
  options.tls_cert_file = options.tls_ca_file;
  options.tls_key_file = options.tls_ca_file;
  auto not_pem = ServiceIdentity::Create(options);
  EXPECT_EQ(not_pem.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(not_pem.status().message(), HasSubstr("not a PEM"));
}

TEST(ServiceIdentityTest, TokenServerRejectsMissingAndWrongTokensAndTouchesNothing) {
  auto server_identity = ServiceIdentity::FromTokens({kToken, kOtherToken});
  ASSERT_TRUE(server_identity.ok());
  Server server = Serve(*server_identity, "127.0.0.1");
  ASSERT_NE(server.server, nullptr);
  const std::string address = absl::StrCat("127.0.0.1:", server.port);

  grpc::Status none = Call(ServiceIdentity::Unauthenticated()->Dial(address));
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(none.error_message(), HasSubstr("missing"));

  auto wrong = ServiceIdentity::FromTokens({"wrong-token-of-enough-length"});
  ASSERT_TRUE(wrong.ok());
  grpc::Status rejected = Call((*wrong)->Dial(address));
  EXPECT_EQ(rejected.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(rejected.error_message(), Not(HasSubstr(kToken)));
  EXPECT_EQ(server.service->served.load(), 0);

  // Either accepted token works (rotation).
  std::string role;
  EXPECT_TRUE(Call((*server_identity)->Dial(address), &role).ok());
  EXPECT_EQ(role, "test");
  auto rotated = ServiceIdentity::FromTokens({kOtherToken});
  ASSERT_TRUE(rotated.ok());
  EXPECT_TRUE(Call((*rotated)->Dial(address)).ok());
  EXPECT_EQ(server.service->served.load(), 2);
  EXPECT_EQ(server.service->last_peer, "deployment");
  server.server->Shutdown();
}

TEST(ServiceIdentityTest, BearerPrefixIsRequired) {
  auto identity = ServiceIdentity::FromTokens({kToken});
  ASSERT_TRUE(identity.ok());
  Server server = Serve(*identity, "127.0.0.1");
  auto channel = ServiceIdentity::Unauthenticated()->Dial(absl::StrCat("127.0.0.1:", server.port));
  auto stub = tandem::v1::Worker::NewStub(channel);
  grpc::ClientContext context;
  context.AddMetadata("authorization", kToken);  // no "Bearer "
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto reader = stub->StreamStats(&context, tandem::v1::StatsRequest());
  tandem::v1::WorkerStats stats;
  while (reader->Read(&stats)) {
  }
  grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(server.service->served.load(), 0);
  server.server->Shutdown();
}

// mTLS with a CA, server and client certificates made by the openssl CLI for this test.
class MtlsTest : public testing::Test {
 protected:
  void SetUp() override {
    if (std::system("openssl version > /dev/null 2>&1") != 0) {
      GTEST_FAIL() << "the openssl CLI is needed (quickstart installs it)";
    }
    const std::string d = dir_.path();
    const std::string script = absl::StrCat(
        "set -e; cd '", d, "';",
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 "
        "-subj /CN=test-ca 2>/dev/null;",
        "MakeCert() { openssl req -newkey rsa:2048 -nodes -keyout $1.key -out $1.csr "
        "-subj /CN=$1 2>/dev/null; printf 'subjectAltName=%s\\n' \"$2\" > $1.ext;"
        " openssl x509 -req -in $1.csr -CA $3.pem -CAkey $3.key -CAcreateserial -out $1.pem "
        "-days 2 -extfile $1.ext 2>/dev/null; chmod 600 $1.key; };",
        "MakeCert server 'IP:127.0.0.1,DNS:localhost' ca;",
        "MakeCert client 'DNS:router.tandem' ca;",
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout rogue-ca.key -out rogue-ca.pem "
        "-days 2 -subj /CN=rogue 2>/dev/null;",
        "MakeCert rogue 'DNS:router.tandem' rogue-ca;");
    const std::string file = dir_.Write("make-certs.sh", script, 0700);
    ASSERT_EQ(std::system(absl::StrCat("bash '", file, "'").c_str()), 0);
  }
  ServiceAuthOptions Options(const std::string& who, const std::string& ca = "ca") const {
    ServiceAuthOptions options;
    options.tls_ca_file = dir_.path() + "/" + ca + ".pem";
    options.tls_cert_file = dir_.path() + "/" + who + ".pem";
    options.tls_key_file = dir_.path() + "/" + who + ".key";
    return options;
  }
  TempDir dir_;
};

TEST_F(MtlsTest, RequiresAClientCertificateOfTheClusterCa) {
  auto server_identity = ServiceIdentity::Create(Options("server"));
  ASSERT_TRUE(server_identity.ok()) << server_identity.status();
  EXPECT_EQ((*server_identity)->mode(), "mtls");
  Server server = Serve(*server_identity, "127.0.0.1");
  ASSERT_NE(server.server, nullptr);
  const std::string address = absl::StrCat("127.0.0.1:", server.port);

  // Plaintext and a certificate of another CA are both refused before any handler runs.
  EXPECT_FALSE(Call(ServiceIdentity::Unauthenticated()->Dial(address)).ok());
  auto rogue = ServiceIdentity::Create(Options("rogue", "ca"));
  ASSERT_TRUE(rogue.ok()) << rogue.status();
  EXPECT_FALSE(Call((*rogue)->Dial(address)).ok());
  EXPECT_EQ(server.service->served.load(), 0);

  auto client = ServiceIdentity::Create(Options("client"));
  ASSERT_TRUE(client.ok()) << client.status();
  std::string role;
  grpc::Status ok = Call((*client)->Dial(address), &role);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(role, "test");
  EXPECT_EQ(server.service->served.load(), 1);
  EXPECT_THAT(server.service->last_peer, HasSubstr("router.tandem"));
  server.server->Shutdown();
}

// Certificates are reloaded from their files (here every second): a client whose CA bundle was
// wrong is fixed by rewriting the file, with no new identity and no restart.
TEST_F(MtlsTest, RewrittenFilesAreReloaded) {
  auto server_identity = ServiceIdentity::Create(Options("server"));
  ASSERT_TRUE(server_identity.ok());
  Server server = Serve(*server_identity, "127.0.0.1");
  const std::string address = absl::StrCat("127.0.0.1:", server.port);

  // The client trusts the rogue CA only: the server's certificate does not verify.
  const std::string bundle = dir_.path() + "/client-bundle.pem";
  std::filesystem::copy_file(dir_.path() + "/rogue-ca.pem", bundle);
  ServiceAuthOptions options = Options("client");
  options.tls_ca_file = bundle;
  options.tls_reload_interval = absl::Seconds(1);
  auto client = ServiceIdentity::Create(options);
  ASSERT_TRUE(client.ok());
  EXPECT_FALSE(Call((*client)->Dial(address)).ok());
  EXPECT_EQ(server.service->served.load(), 0);

  // Rotate the bundle to the cluster CA; within a few reload intervals new channels verify.
  std::filesystem::copy_file(dir_.path() + "/ca.pem", bundle,
                             std::filesystem::copy_options::overwrite_existing);
  bool reloaded = false;
  for (int i = 0; i < 40 && !reloaded; ++i) {
    absl::SleepFor(absl::Milliseconds(250));
    reloaded = Call((*client)->Dial(address)).ok();
  }
  EXPECT_TRUE(reloaded) << "the rewritten CA bundle was not picked up";
  EXPECT_GE(server.service->served.load(), 1);
  server.server->Shutdown();
}

TEST_F(MtlsTest, TokenOnTopOfMtlsIsCheckedToo) {
  TempDir tokens;
  ServiceAuthOptions server_options = Options("server");
  server_options.token_file = tokens.Write("token", kToken, 0600);
  auto server_identity = ServiceIdentity::Create(server_options);
  ASSERT_TRUE(server_identity.ok()) << server_identity.status();
  EXPECT_EQ((*server_identity)->mode(), "mtls+token");
  Server server = Serve(*server_identity, "127.0.0.1");
  const std::string address = absl::StrCat("127.0.0.1:", server.port);

  auto cert_only = ServiceIdentity::Create(Options("client"));
  ASSERT_TRUE(cert_only.ok());
  EXPECT_EQ(Call((*cert_only)->Dial(address)).error_code(), grpc::StatusCode::UNAUTHENTICATED);

  ServiceAuthOptions both = Options("client");
  both.token_file = server_options.token_file;
  auto client = ServiceIdentity::Create(both);
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE(Call((*client)->Dial(address)).ok());
  EXPECT_EQ(server.service->served.load(), 1);
  server.server->Shutdown();
}

}  // namespace
}  // namespace tandem::auth
