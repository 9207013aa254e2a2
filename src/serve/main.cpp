// `locus` entry point: dispatches to the registered subcommands (see cli/command.h).
#include <algorithm>
#include <iostream>
#include <map>

#include "serve/cli/command.h"
#include "core/error.h"

namespace locus::cli {
std::vector<CommandSpec>& command_registry() {
  static std::vector<CommandSpec> registry;
  return registry;
}
}  // namespace locus::cli

int main(int argc, char** argv) {
  CLI::App app{"Locus: DeepSeek-family LLM inference with locality-domain execution"};
  app.require_subcommand(1);
  auto& registry = locus::cli::command_registry();
  std::sort(registry.begin(), registry.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::map<CLI::App*, std::function<int()>> runners;
  for (auto& spec : registry) {
    CLI::App* sub = app.add_subcommand(spec.name, spec.help);
    runners[sub] = spec.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, run] : runners) {
      if (sub->parsed()) return run();
    }
  } catch (const locus::Error& e) {
    std::cerr << "locus: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "locus: unexpected error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
