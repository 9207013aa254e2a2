// The OpenAI-compatible server end to end on the tiny model (CPU backend): real HTTP requests
// through cpp-httplib's client against a server on a free local port.
#include "serve/http_server.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <future>
#include <thread>

#include <nlohmann/json.hpp>

#include "models/model_test_util.h"
#include "runtime/generation_stack.h"

namespace locus::testing {
namespace {

using nlohmann::json;

class ServerFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    runtime::LlmArgs args = tiny_args(tiny_model_dir(false), 0);
    args.max_batch_size = 4;
    runtime::ModelLoaderOptions lo;
    lo.progress = false;
    lo.log = nullptr;
    stack_ = runtime::GenerationStack::load(args, lo, "serve");
    engine_ = std::make_unique<serve::BatchingEngine>(*stack_->model.model, *stack_->kv, stack_->eos_ids, args.max_batch_size);
    serve::ServedModel m;
    m.id = "tiny";
    m.tokenizer = &stack_->tokenizer;
    m.engine = engine_.get();
    m.max_seq_len = args.max_seq_len;
    server_ = std::make_unique<serve::OpenAiServer>(m);
    port_ = server_->bind("127.0.0.1", 0);
    thread_ = std::thread([this] { server_->serve(); });
  }
  void TearDown() override {
    server_->stop();
    thread_.join();
  }
  // POST `body` to `path`; the status and the body (parsed when JSON).
  std::pair<int, std::string> post(const std::string& path, const std::string& body) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    auto r = c.Post(path.c_str(), body, "application/json");
    if (!r) return {-1, "no response"};
    return {r->status, r->body};
  }
  // What the generator produces for `prompt` alone, greedy, decoded as the server decodes. Only
  // while no request runs: the engine's worker is the generator's only other user.
  std::string direct_greedy(const std::string& prompt, int64_t n) {
    runtime::GenerationRequest g{stack_->tokenizer.encode(prompt, stack_->tokenizer.bos_id().has_value()), n, {}};
    return stack_->tokenizer.decode(stack_->generator->generate({g})[0].tokens, true);
  }

  std::unique_ptr<runtime::GenerationStack> stack_;
  std::unique_ptr<serve::BatchingEngine> engine_;
  std::unique_ptr<serve::OpenAiServer> server_;
  std::thread thread_;
  int port_ = 0;
};

TEST_F(ServerFixture, CompletionMatchesTheGeneratorAndReportsUsage) {
  auto [status, body] = post("/v1/completions", R"({"model": "tiny", "prompt": "Locality", "max_tokens": 6, "temperature": 0})");
  ASSERT_EQ(status, 200) << body;
  const json j = json::parse(body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_EQ(j["usage"]["completion_tokens"].get<int>() <= 6, true);
  EXPECT_EQ(j["usage"]["prompt_tokens"], static_cast<int>(stack_->tokenizer.encode("Locality", true).size()));
  EXPECT_EQ(j["choices"][0]["text"], direct_greedy("Locality", 6));
}

TEST_F(ServerFixture, StreamedChatGivesTheSameTextAsTheWholeResponse) {
  const std::string req = R"({"model": "tiny", "messages": [{"role": "user", "content": "abc"}], "max_tokens": 8,
                              "temperature": 0.8, "seed": 5)";
  auto [s1, whole] = post("/v1/chat/completions", req + "}");
  ASSERT_EQ(s1, 200) << whole;
  auto [s2, events] = post("/v1/chat/completions", req + R"(, "stream": true, "stream_options": {"include_usage": true}})");
  ASSERT_EQ(s2, 200) << events;
  std::string text, finish;
  int usage_tokens = -1;
  bool done = false;
  size_t at = 0;
  while ((at = events.find("data: ", at)) != std::string::npos) {
    const size_t end = events.find("\n\n", at);
    ASSERT_NE(end, std::string::npos);
    const std::string data = events.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    const json chunk = json::parse(data);
    ASSERT_EQ(chunk["object"], "chat.completion.chunk");
    const json& choice = chunk["choices"][0];
    if (choice["delta"].contains("content")) text += choice["delta"]["content"].get<std::string>();
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
    if (chunk.contains("usage")) usage_tokens = chunk["usage"]["completion_tokens"];
  }
  EXPECT_TRUE(done);
  const json w = json::parse(whole);
  EXPECT_EQ(text, w["choices"][0]["message"]["content"]);
  EXPECT_EQ(finish, w["choices"][0]["finish_reason"]);
  EXPECT_EQ(usage_tokens, w["usage"]["completion_tokens"]);
}
// ignore_eos (the benchmark clients' extension): every completion runs to max_tokens, past any
// eos the tiny model picks (the generator's tests pin the mechanism with a chosen eos).
TEST_F(ServerFixture, IgnoreEosRunsToMaxTokens) {
  for (const char* p : {"a", "DeepSeek", "xyz", "the GPU"}) {
    auto [status, body] = post("/v1/completions", json{{"model", "tiny"}, {"prompt", p}, {"max_tokens", 24},
                                                       {"temperature", 0}, {"ignore_eos", true}}.dump());
    ASSERT_EQ(status, 200) << body;
    const json j = json::parse(body);
    EXPECT_EQ(j["usage"]["completion_tokens"], 24) << body;
    EXPECT_EQ(j["choices"][0]["finish_reason"], "length") << body;
  }
}

// Concurrent requests all complete, each with its own prompt. (Their tokens depend on which
// requests shared their steps, so they are not compared with solo runs here; BatchingEngine's
// tests pin the batching itself.)
TEST_F(ServerFixture, ConcurrentRequestsAllComplete) {
  const std::vector<std::string> prompts = {"a", "DeepSeek", "xyz", "the GPU", "q", "locality domains"};
  std::vector<std::future<std::pair<int, std::string>>> replies;
  for (const auto& p : prompts)
    replies.push_back(std::async(std::launch::async, [this, p] {
      return post("/v1/completions", json{{"model", "tiny"}, {"prompt", p}, {"max_tokens", 5}, {"temperature", 0}}.dump());
    }));
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto [status, body] = replies[i].get();
    ASSERT_EQ(status, 200) << body;
    const json j = json::parse(body);
    EXPECT_EQ(j["usage"]["prompt_tokens"], static_cast<int>(stack_->tokenizer.encode(prompts[i], true).size()));
    const int n = j["usage"]["completion_tokens"];
    EXPECT_TRUE(n >= 1 && n <= 5) << body;
    if (n < 5) EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << body;  // an eos ended it
  }
}

TEST_F(ServerFixture, BadRequestsGetNamedErrorsAndTheServerKeepsServing) {
  struct Case {
    std::string path, body;
    int status;
    std::string param;
  };
  const std::vector<Case> cases = {
      {"/v1/completions", "{not json", 400, ""},
      {"/v1/completions", R"({"model": "tiny", "prompt": "x", "top_p": 7})", 400, "top_p"},
      {"/v1/completions", R"({"model": "other", "prompt": "x"})", 404, "model"},
      {"/v1/completions", R"({"model": "tiny", "prompt": "x", "max_tokens": 100000})", 400, "max_tokens"},
      {"/v1/completions", R"({"model": "tiny", "prompt": "x", "stream": true, "n": 3})", 400, "n"},
      {"/v1/chat/completions", R"({"model": "tiny", "messages": [{"role": "user"}]})", 400, "messages[0].content"},
      {"/v1/nothing", "{}", 404, ""},
      {"/v1/completions", "{\"model\": \"tiny\", \"prompt\": \"\xff\xfe\"}", 400, ""},  // not UTF-8
  };
  for (const Case& c : cases) {
    auto [status, body] = post(c.path, c.body);
    EXPECT_EQ(status, c.status) << c.body << " -> " << body;
    const json e = json::parse(body);
    ASSERT_TRUE(e.contains("error")) << body;
    EXPECT_FALSE(e["error"]["message"].get<std::string>().empty());
    EXPECT_EQ(e["error"]["param"].is_null() ? "" : e["error"]["param"].get<std::string>(), c.param) << body;
  }
  // A body over 8 MB: a 413 with a JSON error, unless the server's early close reaches the client
  // while it is still sending (then there is no response at all); either way the server goes on.
  auto [big_status, big_body] = post("/v1/completions", std::string(9 << 20, ' '));
  EXPECT_TRUE(big_status == 413 || big_status == -1) << big_status << " " << big_body;
  if (big_status == 413) EXPECT_TRUE(json::parse(big_body).contains("error")) << big_body;
  auto [status, body] = post("/v1/completions", R"({"model": "tiny", "prompt": "still here", "max_tokens": 2})");
  EXPECT_EQ(status, 200) << body;
  httplib::Client c("127.0.0.1", port_);
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "tiny");
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST_F(ServerFixture, StopStringsEndTheText) {
  // A prompt whose greedy text has a few bytes: the random tiny model may end a prompt's text at
  // once (its end-of-sequence token can win the first step), and which prompt does depends on the
  // last bits of the machine's libm.
  std::string prompt, full;
  for (const char* p : {"abc", "Locality", "DeepSeek", "the weights of a layer", "x"}) {
    auto [s0, b0] = post("/v1/completions", json{{"model", "tiny"}, {"prompt", p}, {"max_tokens", 12},
                                                 {"temperature", 0}}.dump());
    ASSERT_EQ(s0, 200) << b0;
    prompt = p;
    full = json::parse(b0)["choices"][0]["text"];
    if (full.size() >= 3) break;
  }
  ASSERT_GE(full.size(), 3u) << "no prompt gave 3 bytes of text; the last, '" << prompt << "', gave '" << full << "'";
  // A whole character the text is known to contain (not its first): the first ASCII one after
  // the start, else the second character.
  size_t at = 1;
  while (at < full.size() && static_cast<unsigned char>(full[at]) >= 0x80) ++at;
  if (at == full.size())
    for (at = 1; (static_cast<unsigned char>(full[at]) & 0xC0) == 0x80;) ++at;
  size_t len = 1;
  while (at + len < full.size() && (static_cast<unsigned char>(full[at + len]) & 0xC0) == 0x80) ++len;
  const std::string stop = full.substr(at, len);
  auto [s1, b1] = post("/v1/completions", json{{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 12},
                                               {"temperature", 0}, {"stop", stop}}.dump());
  ASSERT_EQ(s1, 200) << b1;
  const json j = json::parse(b1);
  EXPECT_EQ(j["choices"][0]["text"], full.substr(0, full.find(stop)));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
}

}  // namespace
}  // namespace locus::testing
