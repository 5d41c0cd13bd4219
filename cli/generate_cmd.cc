// Temporary registration until the generate command lands (replaced by its owner).
#include <iostream>

#include "cli/commands.h"

namespace tandem::cli {
void AddGenerateCommand(CLI::App& app, int* exit_code) {
  app.add_subcommand("generate", "(not built yet)")->callback([exit_code] {
    std::cerr << "tandem generate: not built yet\n";
    *exit_code = 1;
  });
}
}  // namespace tandem::cli
