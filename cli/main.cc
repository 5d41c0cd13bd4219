// `tandem`: one binary, one subcommand per role or tool (see docs/architecture.md).
#include <iostream>

#include "CLI/CLI.hpp"
#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"Tandem: disaggregated LLM inference serving runtime", "tandem"};
  app.require_subcommand(1);
  int exit_code = 0;
  tandem::cli::AddGenerateCommand(app, &exit_code);
  tandem::cli::AddTokenizeCommand(app, &exit_code);
  tandem::cli::AddModelCommand(app, &exit_code);
  tandem::cli::AddBenchCommand(app, &exit_code);
  tandem::cli::AddPrefillCommand(app, &exit_code);
  tandem::cli::AddDecodeCommand(app, &exit_code);
  tandem::cli::AddRouterCommand(app, &exit_code);
  tandem::cli::AddServeCommand(app, &exit_code);
  tandem::cli::AddProfileCommand(app, &exit_code);
  tandem::cli::AddDrafterCommand(app, &exit_code);
  tandem::cli::AddMlpShardCommand(app, &exit_code);
  tandem::cli::AddPlanCommand(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return exit_code;
}
