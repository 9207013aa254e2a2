// `locus logits --model DIR (--ids 1,2,3 | --prompt TEXT)... --out FILE [every LlmArgs flag]`:
// runs each prompt as its own sequence (positions from 0) and writes the fp32 logits of every
// prompt position to FILE (runtime/generator_logits_file.h), for the Hugging Face parity script
// (tools/parity/hf_parity.py). Prints one line per prompt: its length and the argmax of its last row.
#include <cstdio>
#include <iostream>
#include <memory>

#include "runtime/generator_logits_file.h"
#include "runtime/kv_cache.h"
#include "runtime/llm_args_cli.h"
#include "runtime/model_loader.h"
#include "runtime/sampler.h"
#include "runtime/tokenizer.h"
#include "serve/cli/command.h"

namespace {

struct LogitsOptions {
  std::vector<std::string> ids;      // comma separated token ids, one entry per prompt
  std::vector<std::string> prompts;  // text prompts (tokenized, no bos)
  std::string out;
  bool quiet = false;
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    const std::string item = s.substr(i, j - i);
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    LOCUS_CHECK(used == item.size() && !item.empty() && v >= 0 && v <= INT32_MAX, "--ids: \"", item,
                "\" is not a token id (expected comma separated non-negative integers, got \"", s, "\")");
    out.push_back(static_cast<int32_t>(v));
    i = j + 1;
  }
  return out;
}

int run_logits(const locus::runtime::LlmArgsCli& cli, const LogitsOptions& o) {
  using namespace locus;
  using namespace locus::runtime;
  LlmArgs args = cli.resolve();
  LOCUS_CHECK(!args.model.empty(), "logits: --model DIR is required");
  LOCUS_CHECK(!o.ids.empty() || !o.prompts.empty(), "logits: give at least one --ids or --prompt");
  std::vector<std::vector<int32_t>> seqs;
  for (const auto& s : o.ids) seqs.push_back(parse_ids(s));
  if (!o.prompts.empty()) {
    Tokenizer tok = Tokenizer::from_path(args.tokenizer.empty() ? args.model : args.tokenizer);
    for (const auto& p : o.prompts) {
      seqs.push_back(tok.encode(p));
      LOCUS_CHECK(!seqs.back().empty(), "logits: prompt \"", p, "\" encodes to no tokens");
    }
  }
  ModelLoaderOptions lo;
  lo.progress = !o.quiet;
  lo.log = o.quiet ? nullptr : stderr;
  LoadedModel lm = ModelLoader(args, lo).load();
  KvCacheManager kv(lm.config, lm.device, resolve_kv_budget(args, lm.device), 1, args.max_seq_len);
  std::vector<Tensor> records;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t id = kv.acquire(static_cast<int64_t>(seqs[i].size()));
    try {
      Tensor logits = lm.model->forward({{seqs[i], &kv.cache(id)}}, /*all_logits=*/true);
      records.push_back(logits);
      const int64_t V = logits.size(1), T = logits.size(0);
      std::cout << "prompt " << i << ": " << T << " tokens, last-token argmax "
                << argmax(logits.data<float>() + (T - 1) * V, V) << "\n";
    } catch (...) {
      kv.release(id);
      throw;
    }
    kv.release(id);
  }
  write_logits_file(o.out, records);
  if (!o.quiet) std::fprintf(stderr, "locus: wrote logits of %zu prompts to %s\n", records.size(), o.out.c_str());
  return 0;
}

}  // namespace

LOCUS_REGISTER_COMMAND("logits", "write the fp32 logits of every prompt position to a file (parity checks)",
                       [](CLI::App& app) {
                         auto cli = std::make_shared<locus::runtime::LlmArgsCli>(app);
                         auto o = std::make_shared<LogitsOptions>();
                         app.add_option("--ids", o->ids, "comma separated token ids of one prompt; repeatable");
                         app.add_option("--prompt", o->prompts, "prompt text (tokenized without bos); repeatable");
                         app.add_option("--out", o->out, "output file (LOCUSLGT format)")->required();
                         app.add_flag("--quiet", o->quiet, "no progress bar or load notes");
                         return [=] { return run_logits(*cli, *o); };
                       });
