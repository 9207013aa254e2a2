#include "serve/http_server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "core/error.h"
#include "serve/openai_api.h"
#include "serve/stop_text.h"

namespace locus::serve {
namespace {

using nlohmann::json;

constexpr size_t kMaxBodyBytes = 8 << 20;
// HTTP worker threads: each request holds one while it waits for the engine (or streams), so this
// bounds the requests in the server at once; those past the engine's batch wait in its queue.
constexpr size_t kHttpThreads = 64;

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Invalid UTF-8 cannot reach a body (the tokenizer decodes with U+FFFD), but if it did it would
// be replaced rather than fail the response.
std::string dump(const json& body) { return body.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status(), error_body(e)); }

// Text pieces a streamed request's tokens produce on the worker thread, for the HTTP thread that
// writes them out.
struct StreamChannel {
  std::mutex mu;
  std::condition_variable ready;
  std::deque<std::string> pieces;
  std::atomic<bool> client_gone{false};
};

}  // namespace

struct OpenAiServer::Impl {
  ServedModel model;
  httplib::Server http;
  std::atomic<uint64_t> next_request{0};
  std::string bos_text, eos_text;  // the tokenizer's special tokens as text ("" when none)

  // A validated request, ready for the engine.
  struct Job {
    ApiRequest api;
    std::string id;
    int64_t created = 0;
    runtime::GenerationRequest generation;
  };

  Job prepare(const httplib::Request& req, Endpoint endpoint) {
    Job job;
    job.api = parse_request(req.body, endpoint);
    if (job.api.model != model.id)
      throw ApiError(404, "model \"" + job.api.model + "\" does not exist; this server serves \"" + model.id + "\"",
                     "model");
    const uint64_t n = next_request.fetch_add(1);
    job.id = (endpoint == Endpoint::kCompletions ? "cmpl-" : "chatcmpl-") + std::to_string(n);
    job.created = unix_seconds();
    const runtime::Tokenizer& tok = *model.tokenizer;
    std::vector<int32_t> prompt;
    try {
      prompt = endpoint == Endpoint::kCompletions
                   ? tok.encode(job.api.prompt, tok.bos_id().has_value())
                   : tok.encode(chat_prompt(job.api.messages, bos_text, eos_text), false);
    } catch (const Error& e) {
      throw ApiError(400, std::string("the prompt cannot be tokenized: ") + e.what(), "prompt");
    }
    const int64_t len = static_cast<int64_t>(prompt.size());
    if (len == 0) throw ApiError(400, "the prompt encodes to no tokens", "prompt");
    if (len >= model.max_seq_len)
      throw ApiError(400, str("the prompt is ", len, " tokens; this server's max_seq_len is ", model.max_seq_len,
                              " (prompt + generated tokens)"),
                     endpoint == Endpoint::kCompletions ? "prompt" : "messages");
    const int64_t room = model.max_seq_len - len;
    if (job.api.max_tokens && *job.api.max_tokens > room)
      throw ApiError(400, str("max_tokens = ", *job.api.max_tokens, " does not fit: the prompt is ", len,
                              " tokens and this server's max_seq_len is ", model.max_seq_len),
                     "max_tokens");
    job.generation.prompt = std::move(prompt);
    // Without max_tokens: OpenAI's 16 for completions, the rest of the context for chat.
    job.generation.max_new_tokens =
        job.api.max_tokens.value_or(endpoint == Endpoint::kCompletions ? std::min<int64_t>(16, room) : room);
    job.generation.sampling = job.api.sampling;
    job.generation.ignore_eos = job.api.ignore_eos;
    if (!job.api.seeded) job.generation.sampling.seed = model.seed + n;
    try {
      job.generation.sampling.validate();
    } catch (const Error& e) {
      throw ApiError(400, e.what());
    }
    return job;
  }

  Usage usage(const Job& job, const runtime::GenerationResult& r) const {
    return {static_cast<int64_t>(job.generation.prompt.size()), static_cast<int64_t>(r.tokens.size())};
  }

  void complete(const Job& job, httplib::Response& res) {
    EngineRequest er{job.generation, {}, {}};
    if (!job.api.stop.empty()) {  // watch for a stop string, to end the generation there
      auto text = std::make_shared<ReplyText>(*model.tokenizer, job.api.stop);
      er.on_token = [text](int32_t id) {
        try {
          text->push(id);
        } catch (...) {
        }
      };
      er.cancelled = [text] { return text->stopped(); };
    }
    runtime::GenerationResult r = model.engine->submit(std::move(er)).get();
    const std::string text = model.tokenizer->decode(r.tokens, true);
    const StopCut cut = cut_at_stop(text, job.api.stop);
    const std::string finish = finish_reason(r.finish_reason, cut.stopped);
    const std::string out = text.substr(0, cut.length);
    send_json(res, 200,
              job.api.endpoint == Endpoint::kCompletions
                  ? completion_body(job.id, job.created, model.id, out, finish, usage(job, r))
                  : chat_completion_body(job.id, job.created, model.id, out, finish, usage(job, r)));
  }

  // Server-sent events: one chunk per text piece, a last chunk with the finish reason, [DONE].
  void stream(const Job& job, httplib::Response& res) {
    auto channel = std::make_shared<StreamChannel>();
    auto text = std::make_shared<ReplyText>(*model.tokenizer, job.api.stop);
    EngineRequest er{job.generation,
                     [channel, text](int32_t id) {
                       // On the worker thread: must not throw (it would fail the whole batch).
                       try {
                         std::string piece = text->push(id);
                         if (piece.empty()) return;
                         std::lock_guard<std::mutex> lock(channel->mu);
                         channel->pieces.push_back(std::move(piece));
                       } catch (...) {
                         return;
                       }
                       channel->ready.notify_one();
                     },
                     // A stop string ends the generation, and so does a client that went away.
                     [channel, text] { return text->stopped() || channel->client_gone.load(); }};
    std::shared_future<runtime::GenerationResult> done = model.engine->submit(std::move(er)).share();
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [this, job, channel, text, done](size_t, httplib::DataSink& sink) {
          auto event = [&](const json& body) {
            const std::string line = "data: " + dump(body) + "\n\n";
            return sink.write(line.data(), line.size());
          };
          bool first = true;
          auto send_piece = [&](const std::string& piece) {
            const bool ok = event(stream_chunk(job.api.endpoint, job.id, job.created, model.id, piece, "", nullptr, first));
            first = false;
            return ok;
          };
          while (true) {
            std::deque<std::string> pieces;
            bool finished = false;
            {
              std::unique_lock<std::mutex> lock(channel->mu);
              channel->ready.wait_for(lock, std::chrono::milliseconds(20), [&] { return !channel->pieces.empty(); });
              pieces.swap(channel->pieces);
              finished = pieces.empty() && done.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
            }
            for (const auto& p : pieces)
              if (!send_piece(p)) {  // the client went away: its generation ends at the next step
                channel->client_gone = true;
                return false;
              }
            if (!finished) continue;
            try {
              const runtime::GenerationResult& r = done.get();
              // The worker is done with the reply's text: finish it here.
              const std::string rest = text->finish();
              if (!rest.empty() && !send_piece(rest)) {
                channel->client_gone = true;
                return false;
              }
              const Usage u = usage(job, r);
              event(stream_chunk(job.api.endpoint, job.id, job.created, model.id, "",
                                 finish_reason(r.finish_reason, text->stopped()), job.api.include_usage ? &u : nullptr,
                                 first));
            } catch (const std::exception& e) {
              event(error_body(ApiError(500, std::string("generation failed: ") + e.what(), "", "server_error")));
            }
            const std::string end = "data: [DONE]\n\n";
            sink.write(end.data(), end.size());
            sink.done();
            return true;
          }
        });
  }

  void handle(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
    try {
      const Job job = prepare(req, endpoint);
      if (job.api.stream) stream(job, res);
      else complete(job, res);
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const std::exception& e) {
      send_error(res, ApiError(500, std::string("generation failed: ") + e.what(), "", "server_error"));
    }
  }

  void routes() {
    http.new_task_queue = [] { return new httplib::ThreadPool(kHttpThreads); };
    if (std::FILE* log = model.log)
      http.set_logger([log](const httplib::Request& q, const httplib::Response& r) {
        std::fprintf(log, "locus: %s %s %s -> %d\n", q.remote_addr.c_str(), q.method.c_str(), q.path.c_str(), r.status);
        std::fflush(log);
      });
    http.set_payload_max_length(kMaxBodyBytes);
    http.Post("/v1/completions",
              [this](const httplib::Request& q, httplib::Response& r) { handle(q, r, Endpoint::kCompletions); });
    http.Post("/v1/chat/completions",
              [this](const httplib::Request& q, httplib::Response& r) { handle(q, r, Endpoint::kChatCompletions); });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& r) {
      send_json(r, 200,
                {{"object", "list"},
                 {"data", json::array({{{"id", model.id}, {"object", "model"}, {"created", 0}, {"owned_by", "locus"}}})}});
    });
    http.Get("/health", [](const httplib::Request&, httplib::Response& r) { send_json(r, 200, {{"status", "ok"}}); });
    // Unknown paths, wrong methods, oversized bodies: a JSON error instead of an empty page.
    http.set_error_handler([](const httplib::Request& q, httplib::Response& r) {
      if (!r.body.empty()) return;
      const std::string what = r.status == 404   ? "no route " + q.method + " " + q.path
                               : r.status == 413 ? str("the request body exceeds ", kMaxBodyBytes, " bytes")
                                                 : "HTTP error " + std::to_string(r.status) + " for " + q.method + " " + q.path;
      send_json(r, r.status, error_body(ApiError(r.status, what)));
    });
    http.set_exception_handler([](const httplib::Request&, httplib::Response& r, std::exception_ptr ep) {
      std::string what = "internal error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      send_error(r, ApiError(500, what, "", "server_error"));
    });
  }
};

OpenAiServer::OpenAiServer(ServedModel model) : impl_(std::make_unique<Impl>()) {
  LOCUS_CHECK(model.tokenizer && model.engine, "OpenAiServer: a tokenizer and an engine are required");
  LOCUS_CHECK(model.max_seq_len >= 2, "OpenAiServer: max_seq_len must be >= 2, got ", model.max_seq_len);
  impl_->model = std::move(model);
  const runtime::Tokenizer& tok = *impl_->model.tokenizer;
  if (auto b = tok.bos_id()) impl_->bos_text = tok.id_to_token(*b);
  if (auto e = tok.eos_id()) impl_->eos_text = tok.id_to_token(*e);
  impl_->routes();
}

OpenAiServer::~OpenAiServer() { stop(); }

int OpenAiServer::bind(const std::string& host, int port) {
  const int bound = port == 0 ? impl_->http.bind_to_any_port(host) : (impl_->http.bind_to_port(host, port) ? port : -1);
  LOCUS_CHECK(bound > 0, "serve: cannot listen on ", host, ":", port, " (address in use, or not an address of this machine)");
  return bound;
}

void OpenAiServer::serve() { impl_->http.listen_after_bind(); }

void OpenAiServer::stop() { impl_->http.stop(); }

}  // namespace locus::serve
