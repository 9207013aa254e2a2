// The OpenAI-compatible HTTP API's wire format: parsing and validating the bodies of
// POST /v1/completions and /v1/chat/completions into ApiRequest (every bad field is an ApiError
// naming it), the DeepSeek-V3 chat prompt, and the response, stream-chunk and error bodies.
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/sampler.h"

namespace locus::serve {

// An error the client caused (or one the server reports as JSON): HTTP status, OpenAI error
// type and the offending parameter ("" when none).
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "", std::string type = "invalid_request_error")
      : std::runtime_error(message), status_(status), param_(std::move(param)), type_(std::move(type)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& type() const { return type_; }

 private:
  int status_;
  std::string param_, type_;
};

enum class Endpoint { kCompletions, kChatCompletions };

struct ChatMessage {
  std::string role;  // system, user or assistant
  std::string content;
};

struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  std::string prompt;                 // completions
  std::vector<ChatMessage> messages;  // chat completions
  std::optional<int64_t> max_tokens;  // unset: 16 for completions, the rest of the context for chat
  runtime::SamplingParams sampling;   // OpenAI defaults: temperature 1, top_p 1
  bool seeded = false;                // the request gave a seed
  bool stream = false;
  bool include_usage = false;         // stream_options.include_usage
  std::vector<std::string> stop;      // up to 4 strings that end the text (not included)
  bool ignore_eos = false;            // run to max_tokens past end-of-sequence tokens (an extension
                                      // other engines share, for benchmark clients)
};

// The request body `body` for `endpoint`. Throws ApiError(400) naming the field for invalid JSON,
// a missing or mistyped field, a value out of range or an option Locus does not support (n > 1,
// logprobs, tools, ...). Fields Locus does not use and that change nothing (user, metadata, ...)
// are accepted and ignored.
ApiRequest parse_request(const std::string& body, Endpoint endpoint);

// The DeepSeek-V3 chat format: bos, the system messages joined by blank lines, then
// "<｜User｜>" + content for user turns and "<｜Assistant｜>" + content + eos for assistant
// turns, ending with "<｜Assistant｜>" for the reply. `bos` / `eos` are the tokenizer's special
// token texts ("" when it has none).
std::string chat_prompt(const std::vector<ChatMessage>& messages, const std::string& bos, const std::string& eos);

// The text before the first occurrence of any stop string, and whether one occurred.
struct StopCut {
  size_t length;
  bool stopped;
};
StopCut cut_at_stop(const std::string& text, const std::vector<std::string>& stop);

// Token counts of a response.
struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0;
};

// OpenAI's finish_reason for a generator's ("eos" -> "stop", "length" -> "length"; a generation
// cancelled at a stop string -> "stop").
std::string finish_reason(const std::string& generator_reason, bool stopped_by_string);

// Whole response bodies.
nlohmann::json completion_body(const std::string& id, int64_t created, const std::string& model,
                               const std::string& text, const std::string& finish, const Usage& usage);
nlohmann::json chat_completion_body(const std::string& id, int64_t created, const std::string& model,
                                    const std::string& text, const std::string& finish, const Usage& usage);
// One server-sent-event chunk of a streamed response: a text piece (finish empty), or the last
// chunk with its finish reason (and usage when asked for, else null).
nlohmann::json stream_chunk(Endpoint endpoint, const std::string& id, int64_t created, const std::string& model,
                            const std::string& text, const std::string& finish, const Usage* usage, bool first);
nlohmann::json error_body(const ApiError& e);

}  // namespace locus::serve
