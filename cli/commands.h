#pragma once
// Subcommands of the `tandem` binary. Each Add*Command registers its CLI11 subcommand on `app`;
// when the subcommand runs, its exit status is stored in `*exit_code` (0 ok, 1 runtime error,
// 2 usage error). Errors are printed once to stderr as "tandem <cmd>: <message>".

#include "CLI/CLI.hpp"

namespace tandem::cli {

void AddGenerateCommand(CLI::App& app, int* exit_code);
void AddTokenizeCommand(CLI::App& app, int* exit_code);
void AddModelCommand(CLI::App& app, int* exit_code);  // `tandem model synth`
void AddBenchCommand(CLI::App& app, int* exit_code);  // OpenAI-compatible load generator
void AddPrefillCommand(CLI::App& app, int* exit_code);
void AddDecodeCommand(CLI::App& app, int* exit_code);
void AddRouterCommand(CLI::App& app, int* exit_code);
void AddServeCommand(CLI::App& app, int* exit_code);     // router + workers as local processes
void AddProfileCommand(CLI::App& app, int* exit_code);   // a device's profile for `tandem plan`
void AddPlanCommand(CLI::App& app, int* exit_code);      // prefill:decode ratio from profiles
void AddDrafterCommand(CLI::App& app, int* exit_code);   // speculative drafts for decode workers
void AddMlpShardCommand(CLI::App& app, int* exit_code);  // MLP layers for attention workers

}  // namespace tandem::cli
