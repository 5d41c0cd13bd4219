// `tandem drafter`: the speculative-decoding drafter service (tandem.v1.Drafter,
// speculative/drafter_service.h) for decode workers started with `--speculative remote:ADDR`.
//   tandem drafter --drafter ngram|draft:DIR --port P [--host H] [--model TARGET_DIR]
//       [--device cpu|cuda|cuda:N] [--max-sequences N]
//       (--service-token-file F | --tls-ca CA --tls-cert C --tls-key K | --insecure-services)
// --model names the target the drafts are for: its vocabulary bounds the tokens accepted and a
// draft model must share it. Prints "tandem drafter: serving on HOST:PORT" once it serves;
// SIGINT/SIGTERM stop it (in-flight calls are answered UNAVAILABLE; workers decode without
// drafts meanwhile). Exit status: 0 ok, 1 runtime error, 2 usage error.
#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "cli/access_flags.h"
#include "cli/commands.h"
#include "runtime/model/model_config.h"
#include "runtime/server/grpc_server.h"
#include "runtime/server/worker_main.h"
#include "speculative/drafter_service.h"
#include "speculative/registry.h"

namespace tandem::cli {
namespace {

struct DrafterFlags {
  std::string drafter = "ngram";
  std::string host = "127.0.0.1";
  int port = 0;
  std::string model_dir;
  std::string device = "cpu";
  int max_sequences = 4096;
  ServiceAuthFlags service_auth;
  std::string log_format = "text";
};

int RunDrafter(const DrafterFlags& flags) {
  const std::string prefix = "tandem drafter: ";
  server::BlockTerminationSignals();
  ApplyLogFormat(flags.log_format);
  auto identity = MakeServiceIdentity(flags.service_auth);
  if (!identity.ok()) {
    std::cerr << prefix << identity.status().message() << "\n";
    return 2;
  }
  speculative::DrafterContext context;
  context.device = flags.device;
  if (!flags.model_dir.empty()) {
    absl::StatusOr<ModelConfig> target = LoadModelConfig(flags.model_dir);
    if (!target.ok()) {
      std::cerr << prefix << "--model: " << target.status().message() << "\n";
      return 2;
    }
    context.target_vocab_size = target->vocab_size;
  }
  if (flags.drafter.rfind("remote:", 0) == 0) {
    std::cerr << prefix << "--drafter: a drafter service cannot forward to another\n";
    return 2;
  }
  absl::StatusOr<std::unique_ptr<speculative::Drafter>> drafter =
      speculative::CreateDrafter(flags.drafter, context);
  if (!drafter.ok()) {
    std::cerr << prefix << drafter.status().message() << "\n";
    return drafter.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  speculative::DrafterServiceOptions options;
  options.vocab_size = context.target_vocab_size;
  options.max_sequences = flags.max_sequences;
  speculative::DrafterService service(*std::move(drafter), *identity, options);
  absl::StatusOr<server::GrpcServer> grpc =
      server::StartGrpcServer(flags.host, flags.port, {&service}, {"tandem.v1.Drafter"}, *identity);
  if (!grpc.ok()) {
    std::cerr << prefix << grpc.status().message() << "\n";
    return 1;
  }
  std::cerr << prefix << flags.drafter << ", service authentication: " << (*identity)->mode()
            << "\n";
  std::cout << prefix << "serving on " << flags.host << ":" << grpc->port << std::endl;
  const int signal = server::WaitForTerminationSignal();
  std::cerr << prefix << "signal " << signal << ", stopping\n";
  service.Shutdown();
  grpc->Shutdown(absl::Seconds(1));
  const speculative::DrafterServiceStats s = service.stats();
  std::cerr << prefix << s.calls << " calls, " << s.batches << " batches, " << s.sequences
            << " sequences, " << s.resyncs << " resyncs, " << s.rejected << " rejected\n";
  return 0;
}

}  // namespace

void AddDrafterCommand(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<DrafterFlags>();
  CLI::App* cmd = app.add_subcommand(
      "drafter", "Serve speculative-decoding drafts to decode workers (tandem.v1.Drafter gRPC)");
  cmd->add_option("--drafter", flags->drafter, "ngram or draft:DIR (docs/speculative.md)")
      ->capture_default_str();
  cmd->add_option("--host", flags->host, "Address to bind")->capture_default_str();
  cmd->add_option("--port", flags->port, "Port (0: a free one, printed)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--model", flags->model_dir,
                  "The target model the drafts are for (its vocabulary is checked)");
  cmd->add_option("--device", flags->device, "cpu, cuda or cuda:N (a draft model's)")
      ->capture_default_str();
  cmd->add_option("--max-sequences", flags->max_sequences,
                  "Sequences whose tokens are kept (least recently used evicted)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  AddServiceAuthFlags(cmd, &flags->service_auth);
  AddLogFormatFlag(cmd, &flags->log_format);
  cmd->callback([flags, exit_code] { *exit_code = RunDrafter(*flags); });
}

}  // namespace tandem::cli
