// Temporary registration until the tokenize command lands (replaced by its owner).
#include <iostream>

#include "cli/commands.h"

namespace tandem::cli {
void AddTokenizeCommand(CLI::App& app, int* exit_code) {
  app.add_subcommand("tokenize", "(not built yet)")->callback([exit_code] {
    std::cerr << "tandem tokenize: not built yet\n";
    *exit_code = 1;
  });
}
}  // namespace tandem::cli
