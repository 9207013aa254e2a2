// `locus serve --model DIR [--host H] [--port P] [--served-model-name NAME] [every LlmArgs flag]`:
// loads the model and serves the OpenAI-compatible API (serve/http_server.h) until SIGINT or
// SIGTERM. Concurrent requests share batches of up to max_batch_size sequences.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include "runtime/generation_stack.h"
#include "runtime/llm_args_cli.h"
#include "serve/batching_engine.h"
#include "serve/cli/command.h"
#include "serve/http_server.h"

namespace {

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string served_model_name;  // "" = the model directory's name
  bool quiet = false;
};

int run_serve(const locus::runtime::LlmArgsCli& cli, const ServeOptions& o) {
  using namespace locus;
  LOCUS_CHECK(o.port >= 0 && o.port <= 65535, "serve: --port must be in 0..65535, got ", o.port);
  // SIGINT / SIGTERM are taken by one thread (sigwait) that stops the server; blocked here
  // before any other thread starts, so that they inherit the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  runtime::LlmArgs args = cli.resolve();
  runtime::ModelLoaderOptions lo;
  lo.progress = !o.quiet;
  lo.log = o.quiet ? nullptr : stderr;
  auto stack = runtime::GenerationStack::load(args, lo, "serve");
  serve::BatchingEngine engine(*stack->model.model, *stack->kv, stack->eos_ids, args.max_batch_size,
                               stack->graphs.get(), args.decode_lookahead);
  serve::ServedModel model;
  model.id = !o.served_model_name.empty() ? o.served_model_name
                                          : std::filesystem::path(args.model).lexically_normal().filename().string();
  if (model.id.empty()) model.id = std::filesystem::path(args.model).lexically_normal().parent_path().filename().string();
  model.tokenizer = &stack->tokenizer;
  model.engine = &engine;
  model.max_seq_len = args.max_seq_len;
  model.seed = args.seed;
  model.log = o.quiet ? nullptr : stderr;
  serve::OpenAiServer server(model);
  const int port = server.bind(o.host, o.port);
  std::fprintf(stderr, "locus: serving \"%s\" on http://%s:%d (POST /v1/completions, /v1/chat/completions; GET /v1/models, /health)\n",
               model.id.c_str(), o.host.c_str(), port);
  std::thread([&server, stop_signals] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    std::fprintf(stderr, "locus: signal %d, stopping the server\n", sig);
    server.stop();
  }).detach();
  server.serve();
  return 0;
}

}  // namespace

LOCUS_REGISTER_COMMAND("serve", "serve a DeepSeek-V3 model over an OpenAI-compatible HTTP API", [](CLI::App& app) {
  auto cli = std::make_shared<locus::runtime::LlmArgsCli>(app);
  auto o = std::make_shared<ServeOptions>();
  app.add_option("--host", o->host, "address to listen on")->capture_default_str();
  app.add_option("--port", o->port, "port to listen on (0: any free port, printed at start)")->capture_default_str();
  app.add_option("--served-model-name", o->served_model_name,
                 "the model name clients pass (default: the model directory's name)");
  app.add_flag("--quiet", o->quiet, "no progress bar, load notes or request log");
  return [=] { return run_serve(*cli, *o); };
});
