#include "serve/openai_api.h"

#include <cmath>

#include "core/error.h"

namespace locus::serve {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& message) { throw ApiError(400, message, param); }

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "a number";
  }
}

// body[key] when present and not null.
const json* field(const json& body, const char* key) {
  auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

int64_t integer(const json& v, const std::string& param, int64_t lo) {
  if (!v.is_number_integer() && !(v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()))
    bad(param, param + " must be an integer, got " + type_name(v) + " " + v.dump());
  const double d = v.get<double>();
  if (d < static_cast<double>(lo)) bad(param, str(param, " must be >= ", lo, ", got ", v.dump()));
  return v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(d);
}

double number(const json& v, const std::string& param, double lo, double hi, bool lo_open = false) {
  if (!v.is_number()) bad(param, param + " must be a number, got " + type_name(v) + " " + v.dump());
  const double d = v.get<double>();
  if (!(lo_open ? d > lo : d >= lo) || d > hi)
    bad(param, str(param, " must be in ", lo_open ? "(" : "[", lo, ", ", hi, "], got ", v.dump()));
  return d;
}

bool boolean(const json& v, const std::string& param) {
  if (!v.is_boolean()) bad(param, param + " must be a boolean, got " + type_name(v) + " " + v.dump());
  return v.get<bool>();
}

std::string text(const json& v, const std::string& param) {
  if (!v.is_string()) bad(param, param + " must be a string, got " + type_name(v));
  return v.get<std::string>();
}

// Options Locus does not implement: accepted only at their neutral values.
void reject_unsupported(const json& body) {
  auto unsupported = [](const std::string& param, const std::string& why) {
    throw ApiError(400, param + " is not supported by Locus (" + why + ")", param);
  };
  if (const json* n = field(body, "n"); n && !(n->is_number_integer() && n->get<int64_t>() == 1))
    unsupported("n", "one choice per request");
  if (const json* b = field(body, "best_of"); b && !(b->is_number_integer() && b->get<int64_t>() == 1))
    unsupported("best_of", "one choice per request");
  if (const json* l = field(body, "logprobs"); l && !(l->is_boolean() && !l->get<bool>())) unsupported("logprobs", "no log probabilities");
  if (field(body, "top_logprobs")) unsupported("top_logprobs", "no log probabilities");
  if (const json* e = field(body, "echo"); e && !(e->is_boolean() && !e->get<bool>())) unsupported("echo", "the prompt is not echoed");
  if (const json* s = field(body, "suffix"); s && !(s->is_string() && s->get<std::string>().empty())) unsupported("suffix", "no insertion");
  for (const char* k : {"tools", "functions", "tool_choice", "function_call"})
    if (field(body, k)) unsupported(k, "no tool calls");
  for (const char* k : {"presence_penalty", "frequency_penalty"})
    if (const json* p = field(body, k); p && !(p->is_number() && p->get<double>() == 0.0)) unsupported(k, "no penalties");
  if (const json* lb = field(body, "logit_bias"); lb && !(lb->is_object() && lb->empty())) unsupported("logit_bias", "no logit bias");
  if (const json* rf = field(body, "response_format")) {
    const json* t = rf->is_object() ? field(*rf, "type") : nullptr;
    if (!t || !t->is_string() || t->get<std::string>() != "text") unsupported("response_format", "text only");
  }
}

std::string message_content(const json& v, const std::string& param) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) bad(param, param + " must be a string or an array of text parts, got " + type_name(v));
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string part = param + "[" + std::to_string(i) + "]";
    const json& p = v[i];
    const json* type = p.is_object() ? field(p, "type") : nullptr;
    if (!type || !type->is_string() || type->get<std::string>() != "text")
      bad(part, part + ": only parts of type \"text\" are supported");
    const json* t = field(p, "text");
    if (!t) bad(part + ".text", part + ".text is required");
    out += text(*t, part + ".text");
  }
  return out;
}

std::vector<ChatMessage> messages(const json& v) {
  if (!v.is_array() || v.empty()) bad("messages", "messages must be a non-empty array of messages");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!v[i].is_object()) bad(at, at + " must be an object, got " + type_name(v[i]));
    const json* role = field(v[i], "role");
    if (!role) bad(at + ".role", at + ".role is required");
    ChatMessage m;
    m.role = text(*role, at + ".role");
    if (m.role == "developer") m.role = "system";
    if (m.role != "system" && m.role != "user" && m.role != "assistant")
      bad(at + ".role", at + ".role must be system, developer, user or assistant, got \"" + m.role + "\"");
    const json* content = field(v[i], "content");
    if (!content) bad(at + ".content", at + ".content is required");
    m.content = message_content(*content, at + ".content");
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<std::string> stop_strings(const json& v) {
  std::vector<std::string> out;
  if (v.is_string()) out.push_back(v.get<std::string>());
  else if (v.is_array())
    for (size_t i = 0; i < v.size(); ++i) out.push_back(text(v[i], "stop[" + std::to_string(i) + "]"));
  else bad("stop", std::string("stop must be a string or an array of strings, got ") + type_name(v));
  if (out.size() > 4) bad("stop", str("stop takes at most 4 strings, got ", out.size()));
  for (const auto& s : out)
    if (s.empty()) bad("stop", "stop strings must not be empty");
  return out;
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

}  // namespace

ApiRequest parse_request(const std::string& body, Endpoint endpoint) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw ApiError(400, std::string("the request body must be a JSON object, got ") + type_name(j));
  reject_unsupported(j);
  ApiRequest r;
  r.endpoint = endpoint;
  const json* model = field(j, "model");
  if (!model) bad("model", "model is required");
  r.model = text(*model, "model");
  if (endpoint == Endpoint::kCompletions) {
    const json* p = field(j, "prompt");
    if (!p) bad("prompt", "prompt is required");
    if (p->is_array()) {
      if (p->size() != 1) bad("prompt", str("prompt: one prompt per request (got an array of ", p->size(), ")"));
      r.prompt = text((*p)[0], "prompt[0]");
    } else {
      r.prompt = text(*p, "prompt");
    }
  } else {
    const json* m = field(j, "messages");
    if (!m) bad("messages", "messages is required");
    r.messages = messages(*m);
  }
  r.sampling.temperature = 1.0;  // OpenAI's defaults
  r.sampling.top_p = 1.0;
  for (const char* k : {"max_tokens", "max_completion_tokens"})
    if (const json* v = field(j, k)) r.max_tokens = integer(*v, k, 1);
  if (const json* v = field(j, "temperature")) r.sampling.temperature = number(*v, "temperature", 0.0, 2.0);
  if (const json* v = field(j, "top_p")) r.sampling.top_p = number(*v, "top_p", 0.0, 1.0, true);
  if (const json* v = field(j, "top_k")) r.sampling.top_k = integer(*v, "top_k", 0);
  if (const json* v = field(j, "seed")) {
    if (!v->is_number_integer()) bad("seed", std::string("seed must be an integer, got ") + type_name(*v) + " " + v->dump());
    r.sampling.seed = v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
    r.seeded = true;
  }
  if (const json* v = field(j, "stream")) r.stream = boolean(*v, "stream");
  if (const json* v = field(j, "stream_options")) {
    if (!v->is_object()) bad("stream_options", std::string("stream_options must be an object, got ") + type_name(*v));
    if (const json* u = field(*v, "include_usage")) r.include_usage = boolean(*u, "stream_options.include_usage");
  }
  if (const json* v = field(j, "stop")) r.stop = stop_strings(*v);
  if (const json* v = field(j, "ignore_eos")) r.ignore_eos = boolean(*v, "ignore_eos");
  return r;
}

std::string chat_prompt(const std::vector<ChatMessage>& messages, const std::string& bos, const std::string& eos) {
  std::string system;
  for (const auto& m : messages)
    if (m.role == "system") system += (system.empty() ? "" : "\n\n") + m.content;
  std::string out = bos + system;
  for (const auto& m : messages) {
    if (m.role == "user") out += "<｜User｜>" + m.content;
    else if (m.role == "assistant") out += "<｜Assistant｜>" + m.content + eos;
  }
  return out + "<｜Assistant｜>";
}

StopCut cut_at_stop(const std::string& text, const std::vector<std::string>& stop) {
  size_t cut = std::string::npos;
  for (const auto& s : stop) cut = std::min(cut, text.find(s));
  return cut == std::string::npos ? StopCut{text.size(), false} : StopCut{cut, true};
}

std::string finish_reason(const std::string& generator_reason, bool stopped_by_string) {
  return stopped_by_string || generator_reason == "eos" ? "stop" : "length";
}

nlohmann::json completion_body(const std::string& id, int64_t created, const std::string& model,
                               const std::string& text, const std::string& finish, const Usage& usage) {
  return {{"id", id},
          {"object", "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({{{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", finish}}})},
          {"usage", usage_json(usage)}};
}

nlohmann::json chat_completion_body(const std::string& id, int64_t created, const std::string& model,
                                    const std::string& text, const std::string& finish, const Usage& usage) {
  return {{"id", id},
          {"object", "chat.completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({{{"index", 0},
                                    {"message", {{"role", "assistant"}, {"content", text}}},
                                    {"logprobs", nullptr},
                                    {"finish_reason", finish}}})},
          {"usage", usage_json(usage)}};
}

nlohmann::json stream_chunk(Endpoint endpoint, const std::string& id, int64_t created, const std::string& model,
                            const std::string& text, const std::string& finish, const Usage* usage, bool first) {
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish.empty() ? json(nullptr) : json(finish)}};
  if (endpoint == Endpoint::kCompletions) {
    choice["text"] = text;
  } else {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || finish.empty()) delta["content"] = text;
    choice["delta"] = delta;
  }
  json out = {{"id", id},
              {"object", endpoint == Endpoint::kCompletions ? "text_completion" : "chat.completion.chunk"},
              {"created", created},
              {"model", model},
              {"choices", json::array({choice})}};
  if (usage) out["usage"] = usage_json(*usage);
  return out;
}

nlohmann::json error_body(const ApiError& e) {
  return {{"error",
           {{"message", e.what()},
            {"type", e.type()},
            {"param", e.param().empty() ? json(nullptr) : json(e.param())},
            {"code", nullptr}}}};
}

}  // namespace locus::serve
