// Subcommands of the `locus` executable register themselves here, one file each under
// src/serve/cli/, so adding a command needs no edit of main.cpp.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace locus::cli {

// setup() declares the subcommand's options on `app` and returns the function that runs it
// (its return value is the process exit code).
using CommandSetup = std::function<std::function<int()>(CLI::App& app)>;

struct CommandSpec {
  std::string name;
  std::string help;
  CommandSetup setup;
};

std::vector<CommandSpec>& command_registry();

struct CommandRegistrar {
  CommandRegistrar(std::string name, std::string help, CommandSetup setup) {
    command_registry().push_back({std::move(name), std::move(help), std::move(setup)});
  }
};

}  // namespace locus::cli

#define LOCUS_CONCAT_INNER(a, b) a##b
#define LOCUS_CONCAT(a, b) LOCUS_CONCAT_INNER(a, b)
// LOCUS_REGISTER_COMMAND("plan", "print the locality plan", [](CLI::App& app) { ...; return run; });
#define LOCUS_REGISTER_COMMAND(name, help, setup) \
  static ::locus::cli::CommandRegistrar LOCUS_CONCAT(locus_command_, __LINE__)(name, help, setup)
