// The baseline of the router-overhead benchmark (bench/serving/router_overhead.sh): sequential
// Decode.Generate calls straight to one decode worker, the way the router makes them, with random
// prompts of --prompt-tokens token ids and greedy --max-tokens, timing each call from the request
// to its final message. Prints the median, mean and p90 in milliseconds.
//
//   decode_direct_bench --decode HOST:PORT --service-token-file F [--requests 300]
//                       [--prompt-tokens 64] [--max-tokens 1] [--vocab 8192] [--seed 1]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "runtime/auth/service_identity.h"
#include "tandem/v1/decode.grpc.pb.h"

int main(int argc, char** argv) {
  CLI::App app("Sequential Decode.Generate calls straight to a decode worker");
  std::string address, token_file;
  int requests = 300, prompt_tokens = 64, max_tokens = 1, vocab = 8192;
  uint64_t seed = 1;
  app.add_option("--decode", address, "Decode worker host:port")->required();
  app.add_option("--service-token-file", token_file, "The deployment's service token")->required();
  app.add_option("--requests", requests)->check(CLI::PositiveNumber);
  app.add_option("--prompt-tokens", prompt_tokens)->check(CLI::PositiveNumber);
  app.add_option("--max-tokens", max_tokens)->check(CLI::PositiveNumber);
  app.add_option("--vocab", vocab, "Prompt ids are drawn from [3, vocab)")
      ->check(CLI::Range(4, 1 << 30));
  app.add_option("--seed", seed);
  CLI11_PARSE(app, argc, argv);

  tandem::auth::ServiceAuthOptions auth;
  auth.token_file = token_file;
  auto identity = tandem::auth::ServiceIdentity::Create(auth);
  if (!identity.ok()) {
    std::fprintf(stderr, "decode_direct_bench: %s\n",
                 std::string(identity.status().message()).c_str());
    return 2;
  }
  auto stub = tandem::v1::Decode::NewStub((*identity)->Dial(address));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> id(3, vocab - 1);
  std::vector<double> ms;
  ms.reserve(requests);
  int failed = 0;
  for (int i = 0; i < requests; ++i) {
    tandem::v1::GenerateRequest request;
    request.set_request_id(absl::StrCat("direct-", seed, "-", i));
    for (int t = 0; t < prompt_tokens; ++t) request.add_prompt_token_ids(id(rng));
    request.mutable_sampling()->set_temperature(0);
    request.mutable_sampling()->set_max_tokens(max_tokens);
    request.mutable_sampling()->set_ignore_eos(true);
    request.mutable_sampling()->set_top_p(1);
    request.mutable_sampling()->set_repetition_penalty(1);
    request.mutable_sampling()->set_logprobs(-1);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    const auto start = std::chrono::steady_clock::now();
    auto reader = stub->Generate(&context, request);
    tandem::v1::GenerateResponse response;
    std::string finish;
    while (reader->Read(&response)) {
      if (!response.finish_reason().empty()) finish = response.finish_reason();
    }
    const grpc::Status status = reader->Finish();
    const double elapsed =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (!status.ok() || finish != "length") {
      ++failed;
      if (failed <= 3) {
        std::fprintf(stderr, "request %d: %s (finish '%s')\n", i, status.error_message().c_str(),
                     finish.c_str());
      }
      continue;
    }
    ms.push_back(elapsed);
  }
  if (ms.empty()) return 1;
  std::sort(ms.begin(), ms.end());
  double sum = 0;
  for (double v : ms) sum += v;
  std::printf("direct requests %zu failed %d median %.3f ms mean %.3f ms p90 %.3f ms\n", ms.size(),
              failed, ms[ms.size() / 2], sum / ms.size(), ms[ms.size() * 9 / 10]);
  return failed == 0 ? 0 : 1;
}
