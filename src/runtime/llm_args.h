// LlmArgs: the one typed configuration of a Locus run (model, backend, batch/sequence limits,
// KV-cache budget, locality domains, CUDA graphs, ...). It is filled from a YAML or JSON file
// and/or CLI flags (see llm_args_cli.h); every field, its key, type, default and help text live in
// one table (llm_args.cpp), so the file loader, the CLI flags, dump_defaults() and the docs
// (docs/llm_args.md) cannot drift apart.
//
// File keys are the field names; the locality fields sit in a nested map:
//   model: /models/tiny
//   backend: cuda
//   enable_locality_domains: true
//   locality_domains:
//     emulate: 2
//     allowed_ops: [bf16_linear, nvfp4_moe]
// Unknown keys and values of the wrong type are Errors naming the key and the expected type.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "locality/policy.h"

namespace locus::runtime {

struct LocalityDomainArgs {
  // Emulated domain count (DESIGN.md 1): split one device into N domains. Unset: the driver's
  // topology (the env var LOCUS_FAKE_LOCALITY_DOMAINS still overrides both).
  std::optional<int> emulate;
  // Partitions per op; 0 = as many as the topology has domains.
  int num_partitions = 0;
  // Op kinds that may be partitioned (locality::op_kind_name spelling).
  std::vector<std::string> allowed_ops = {"bf16_linear", "nvfp4_linear", "bf16_bmm", "bf16_moe", "nvfp4_moe"};
  // Module-name patterns that stay unpartitioned (core/module_pattern.h: fnmatch on the name and its dotted prefixes).
  std::vector<std::string> exclude_modules = {"*shared_experts*", "*.mlp.gate", "lm_head"};
};

struct LlmArgs {
  std::string model;                  // Hugging Face model directory (required to run)
  std::string tokenizer;              // directory or tokenizer.json; "" = the model directory
  std::string backend = "cpu";        // "cpu" | "cuda"
  int device = 0;                     // CUDA device index (cuda backend)
  std::string dtype = "bf16";         // activation / unquantized weight dtype: "bf16" (only one now)
  int max_batch_size = 8;             // concurrent sequences
  int max_seq_len = 4096;             // prompt + generated tokens per sequence
  int64_t kv_cache_budget_bytes = 0;  // 0 = use kv_cache_memory_fraction
  double kv_cache_memory_fraction = 0.9;  // of the memory free after weights (when budget is 0)
  bool enable_locality_domains = false;
  LocalityDomainArgs locality_domains;
  bool cuda_graphs = false;           // capture decode steps in CUDA graphs (cuda backend)
  bool decode_lookahead = false;      // with cuda_graphs: launch greedy steps from the device's tokens
  uint64_t seed = 0;                  // sampling seed
  int num_threads = 0;                // CPU worker threads; 0 = hardware concurrency
  int tensor_parallel_size = 1;       // GPUs per model replica
  bool weight_sharing = false;        // share weights across processes (IPC handles)
  bool fused_allreduce = false;       // fused all-reduce + norm kernels across TP ranks
  bool gms_weight_loading = false;    // GPU-memory-service style weight loading (external pool)
  std::string log_level = "info";     // "error" | "warn" | "info" | "debug"
};

// Parses a YAML or JSON document (JSON is YAML 1.2, so one parser reads both). `source` names the
// file in error messages. Keys absent from the document keep their defaults (or `base`'s values).
LlmArgs llm_args_from_yaml_string(const std::string& text, const std::string& source = "<string>",
                                  const LlmArgs& base = {});
// Reads a .yaml/.yml/.json file; Error naming the path when it cannot be read.
LlmArgs load_llm_args_file(const std::string& path, const LlmArgs& base = {});

// Sets one field from its string form, as a CLI flag gives it: key is the dotted file key
// ("max_seq_len", "locality_domains.emulate"); lists are comma separated; bools accept
// true/false/1/0/yes/no/on/off. Error naming the key and the expected type on a bad value,
// or naming the key when it is unknown.
void set_llm_arg(LlmArgs& args, const std::string& key, const std::string& value);
// A field's value as YAML text ("4096", "\"cpu\"", "null", "[\"a\", \"b\"]"); Error when the key is unknown.
std::string get_llm_arg(const LlmArgs& args, const std::string& key);

// Every field with its value, as YAML, in table order (nested locality_domains map).
// dump_defaults() == dump_llm_args(LlmArgs{}); tests/data/llm_args_golden.yaml holds it.
std::string dump_llm_args(const LlmArgs& args);
std::string dump_defaults();

// One row of the field table, for CLI flags and documentation.
struct LlmArgField {
  std::string key;        // dotted file key: "locality_domains.emulate"
  std::string flag;       // CLI flag: "--locality-domains-emulate"
  std::string type;       // "string", "int", "int64", "uint64", "float", "bool", "optional int", "list of string"
  std::string help;
};
const std::vector<LlmArgField>& llm_arg_fields();

// What a backend can do; validate() checks the args against it.
struct BackendCapabilities {
  std::string name;              // "cpu", "cuda"
  bool built = true;             // compiled into this binary
  bool has_ld_ops = false;       // implements partitioned (locality-domain) ops
  bool supports_cuda_graphs = false;
};
// The backends this build knows: cpu always, cuda (built = LOCUS_WITH_CUDA).
const std::vector<BackendCapabilities>& known_backends();
// Capabilities of a backend by name; Error naming the backend and the known ones when unknown.
const BackendCapabilities& backend_capabilities(const std::string& name);

// Checks values and combinations. Each Error names the offending option(s); incompatible pairs
// name BOTH, e.g. "enable_locality_domains=true is incompatible with weight_sharing=true ...".
// Checks: LD with weight_sharing / fused_allreduce / gms_weight_loading; LD with a backend whose
// capabilities have no LD ops; unbuilt backend; max_seq_len, max_batch_size, tensor_parallel_size
// >= 1; kv budget >= 0, fraction in (0, 1]; emulate >= 1; num_partitions >= 0 (and <= emulate
// when both are set); allowed_ops names known; dtype/log_level known; cuda_graphs needs a backend
// that supports graphs.
void validate(const LlmArgs& args, const BackendCapabilities& backend);
void validate(const LlmArgs& args);  // with backend_capabilities(args.backend)

// The locality policy the planner consumes (enabled, num_partitions, allowed_ops, excludes).
locality::LocalityDomainPolicy to_locality_policy(const LlmArgs& args);

}  // namespace locus::runtime
