// `tandem model synth`: write a Hugging Face model directory with random weights at real shapes.
#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_join.h"
#include "cli/commands.h"
#include "runtime/model/synth.h"

namespace tandem::cli {

void AddModelCommand(CLI::App& app, int* exit_code) {
  CLI::App* model = app.add_subcommand("model", "Model directory tools");
  model->require_subcommand(1);

  auto options = std::make_shared<SynthOptions>();
  auto shard_mib = std::make_shared<size_t>(0);
  CLI::App* synth = model->add_subcommand(
      "synth", "Write a model directory with random bf16 weights at the shapes of a real model");
  synth
      ->add_option("--like", options->like,
                   "Model shapes to copy: " + absl::StrJoin(SynthModelNames(), ", "))
      ->required()
      ->check(CLI::IsMember(SynthModelNames()));
  synth->add_option("--out", options->out_dir, "Output directory (created if missing)")->required();
  synth->add_option("--seed", options->seed, "Random seed (same seed, same bytes)");
  synth
      ->add_option("--tokenizer", options->tokenizer_path,
                   "tokenizer.json to copy in (vocab_size follows it; tokenizer_config.json "
                   "beside it is copied too). Default: a small built-in byte-level BPE")
      ->check(CLI::ExistingFile);
  synth->add_option("--max-shard-mib", *shard_mib,
                    "Largest safetensors shard in MiB (default 2048; 4 for tiny)");
  synth->callback([options, shard_mib, exit_code] {
    options->max_shard_bytes = *shard_mib << 20;
    const absl::Status status = SynthesizeModel(*options, &std::cerr);
    if (!status.ok()) {
      std::cerr << "tandem model: " << status.message() << "\n";
      *exit_code = 1;
      return;
    }
    std::cerr << "tandem model: wrote " << options->out_dir << "\n";
    *exit_code = 0;
  });
}

}  // namespace tandem::cli
