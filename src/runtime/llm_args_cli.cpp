#include "runtime/llm_args_cli.h"

#include "core/error.h"

namespace locus::runtime {

LlmArgsCli::LlmArgsCli(CLI::App& app, LlmArgs defaults) : defaults_(std::move(defaults)) {
  app.add_option("--config", config_path_, "YAML or JSON file of LlmArgs fields (docs/llm_args.md); flags override it");
  for (const LlmArgField& f : llm_arg_fields()) {
    const std::string shown = get_llm_arg(defaults_, f.key);
    CLI::Option* opt = nullptr;
    if (f.type == "bool") {
      bool& slot = bools_[f.key];
      slot = shown == "true";
      opt = app.add_flag(f.flag + ",!--no-" + f.flag.substr(2), slot, f.help + " [default: " + shown + "]");
    } else {
      std::string& slot = values_[f.key];
      std::string hint = f.type == "list of string" ? " (comma separated)" : "";
      opt = app.add_option(f.flag, slot, f.help + hint + " [default: " + shown + "]");
      opt->type_name(f.type == "string"           ? "TEXT"
                     : f.type == "float"          ? "FLOAT"
                     : f.type == "optional int"   ? "INT|null"
                     : f.type == "list of string" ? "LIST"
                                                  : (f.type == "uint64" ? "UINT" : "INT"));
    }
    options_[f.key] = opt;
  }
}

LlmArgs LlmArgsCli::resolve(bool validate_args) const {
  LlmArgs a = defaults_;
  if (!config_path_.empty()) a = load_llm_args_file(config_path_, a);
  for (const LlmArgField& f : llm_arg_fields()) {
    const CLI::Option* opt = options_.at(f.key);
    if (opt->count() == 0) continue;
    if (f.type == "bool") {
      set_llm_arg(a, f.key, bools_.at(f.key) ? "true" : "false");
    } else {
      try {
        set_llm_arg(a, f.key, values_.at(f.key));
      } catch (const Error& e) {
        LOCUS_THROW("flag ", f.flag, ": ", e.what());
      }
    }
  }
  if (validate_args) validate(a);
  return a;
}

}  // namespace locus::runtime
