// The OpenAI-compatible HTTP server (`locus serve`): POST /v1/completions and
// /v1/chat/completions (whole responses, or server-sent events with "stream": true),
// GET /v1/models and GET /health. Requests run on a BatchingEngine, so concurrent requests share
// batches. Every bad request gets an OpenAI-style JSON error naming what was wrong, and the
// server keeps serving the others.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "runtime/tokenizer.h"
#include "serve/batching_engine.h"

namespace locus::serve {

struct ServedModel {
  std::string id;                                  // the model name clients pass (and /v1/models lists)
  const runtime::Tokenizer* tokenizer = nullptr;
  BatchingEngine* engine = nullptr;
  int64_t max_seq_len = 4096;                      // prompt + generated tokens per request
  uint64_t seed = 0;                               // requests without a seed get seed + their number
  std::FILE* log = nullptr;                        // one line per request (null: none)
};

class OpenAiServer {
 public:
  explicit OpenAiServer(ServedModel model);
  ~OpenAiServer();
  OpenAiServer(const OpenAiServer&) = delete;
  OpenAiServer& operator=(const OpenAiServer&) = delete;

  // Binds host:port (port 0: any free port) and returns the port; an Error names the address
  // when that fails.
  int bind(const std::string& host, int port);
  // Serves on the bound socket until stop() (from another thread or a signal handler's thread).
  void serve();
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace locus::serve
