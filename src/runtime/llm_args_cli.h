// LlmArgs as CLI11 options, so `generate`, `plan`, `serve` and `bench` share one definition:
//   LlmArgsCli cli(app);            // adds --config FILE and one flag per LlmArgs field
//   app.parse(argc, argv);          // (the subcommand's own options may be added beside them)
//   LlmArgs args = cli.resolve();   // file (if --config) overlaid with the flags given, validated
// Flags are the dotted keys with '.' and '_' turned into '-': --max-seq-len,
// --locality-domains-emulate; bools are flags (--cuda-graphs, --no-cuda-graphs,
// --enable-locality-domains=false); lists are comma separated.
#pragma once
#include <CLI/CLI.hpp>
#include <map>
#include <string>

#include "runtime/llm_args.h"

namespace locus::runtime {

class LlmArgsCli {
 public:
  // `defaults` are what the flags start from (a command may change e.g. the default backend).
  explicit LlmArgsCli(CLI::App& app, LlmArgs defaults = {});
  LlmArgsCli(const LlmArgsCli&) = delete;
  LlmArgsCli& operator=(const LlmArgsCli&) = delete;

  // After parsing: defaults < --config file < flags. Runs validate() unless validate_args is false.
  LlmArgs resolve(bool validate_args = true) const;
  const std::string& config_path() const { return config_path_; }

 private:
  LlmArgs defaults_;
  std::string config_path_;
  std::map<std::string, std::string> values_;  // key -> string value (non-bool fields)
  std::map<std::string, bool> bools_;          // key -> bool value (bool fields)
  std::map<std::string, CLI::Option*> options_;
};

}  // namespace locus::runtime
