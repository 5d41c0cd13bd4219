// Temporary registration until the model command lands (replaced by its owner).
#include <iostream>

#include "cli/commands.h"

namespace tandem::cli {
void AddModelCommand(CLI::App& app, int* exit_code) {
  app.add_subcommand("model", "(not built yet)")->callback([exit_code] {
    std::cerr << "tandem model: not built yet\n";
    *exit_code = 1;
  });
}
}  // namespace tandem::cli
