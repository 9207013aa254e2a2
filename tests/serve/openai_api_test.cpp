#include "serve/openai_api.h"

#include <gtest/gtest.h>

#include "serve/stop_text.h"

namespace locus::serve {
namespace {

// The ApiError a body raises: its parameter and message, for the checks below.
ApiError error_of(const std::string& body, Endpoint e = Endpoint::kCompletions) {
  try {
    parse_request(body, e);
  } catch (const ApiError& err) {
    return err;
  }
  ADD_FAILURE() << "no error for " << body;
  return ApiError(0, "");
}

TEST(OpenAiApi, ParsesACompletionRequestWithOpenAiDefaults) {
  const ApiRequest r = parse_request(R"({"model": "m", "prompt": "hi", "user": "x", "n": 1})", Endpoint::kCompletions);
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt, "hi");
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_EQ(r.sampling.temperature, 1.0);
  EXPECT_EQ(r.sampling.top_p, 1.0);
  EXPECT_FALSE(r.seeded);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.ignore_eos);

  const ApiRequest s = parse_request(
      R"({"model": "m", "prompt": ["one"], "max_tokens": 7, "temperature": 0, "top_p": 0.5, "top_k": 3,
          "seed": 42, "stream": true, "stream_options": {"include_usage": true}, "stop": ["a", "bc"],
          "ignore_eos": true})",
      Endpoint::kCompletions);
  EXPECT_EQ(s.prompt, "one");
  EXPECT_EQ(*s.max_tokens, 7);
  EXPECT_EQ(s.sampling.temperature, 0.0);
  EXPECT_EQ(s.sampling.top_p, 0.5);
  EXPECT_EQ(s.sampling.top_k, 3);
  EXPECT_EQ(s.sampling.seed, 42u);
  EXPECT_TRUE(s.seeded && s.stream && s.include_usage);
  EXPECT_EQ(s.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_TRUE(s.ignore_eos);
}

TEST(OpenAiApi, ParsesChatMessagesWithTextParts) {
  const ApiRequest r = parse_request(
      R"({"model": "m", "messages": [{"role": "developer", "content": "be brief"},
          {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
          "max_completion_tokens": 3})",
      Endpoint::kChatCompletions);
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(*r.max_tokens, 3);
}

TEST(OpenAiApi, EveryBadFieldIsNamed) {
  struct Case {
    const char* body;
    Endpoint endpoint;
    const char* param;
    const char* says;
  };
  const Case cases[] = {
      {R"({"model": "m"})", Endpoint::kCompletions, "prompt", "prompt is required"},
      {R"({"prompt": "x"})", Endpoint::kCompletions, "model", "model is required"},
      {R"({"model": "m", "prompt": 5})", Endpoint::kCompletions, "prompt", "must be a string"},
      {R"({"model": "m", "prompt": ["a", "b"]})", Endpoint::kCompletions, "prompt", "one prompt per request"},
      {R"({"model": "m", "prompt": "x", "max_tokens": 0})", Endpoint::kCompletions, "max_tokens", ">= 1"},
      {R"({"model": "m", "prompt": "x", "max_tokens": 2.5})", Endpoint::kCompletions, "max_tokens", "integer"},
      {R"({"model": "m", "prompt": "x", "temperature": 3})", Endpoint::kCompletions, "temperature", "[0, 2]"},
      {R"({"model": "m", "prompt": "x", "top_p": 0})", Endpoint::kCompletions, "top_p", "(0, 1]"},
      {R"({"model": "m", "prompt": "x", "seed": "s"})", Endpoint::kCompletions, "seed", "integer"},
      {R"({"model": "m", "prompt": "x", "stream": 1})", Endpoint::kCompletions, "stream", "boolean"},
      {R"({"model": "m", "prompt": "x", "ignore_eos": "yes"})", Endpoint::kCompletions, "ignore_eos", "boolean"},
      {R"({"model": "m", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]})", Endpoint::kCompletions, "stop", "at most 4"},
      {R"({"model": "m", "prompt": "x", "stop": [""]})", Endpoint::kCompletions, "stop", "empty"},
      {R"({"model": "m", "prompt": "x", "n": 2})", Endpoint::kCompletions, "n", "not supported"},
      {R"({"model": "m", "prompt": "x", "logprobs": 2})", Endpoint::kCompletions, "logprobs", "not supported"},
      {R"({"model": "m", "prompt": "x", "presence_penalty": 0.5})", Endpoint::kCompletions, "presence_penalty", "not supported"},
      {R"({"model": "m", "messages": []})", Endpoint::kChatCompletions, "messages", "non-empty"},
      {R"({"model": "m", "messages": [{"content": "x"}]})", Endpoint::kChatCompletions, "messages[0].role", "required"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}]})",
       Endpoint::kChatCompletions, "messages[1].role", "\"robot\""},
      {R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", Endpoint::kChatCompletions,
       "messages[0].content[0]", "text"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": []})", Endpoint::kChatCompletions,
       "tools", "not supported"},
  };
  for (const Case& c : cases) {
    const ApiError e = error_of(c.body, c.endpoint);
    EXPECT_EQ(e.status(), 400) << c.body;
    EXPECT_EQ(e.param(), c.param) << c.body;
    EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << c.body << " -> " << e.what();
  }
  EXPECT_NE(std::string(error_of("{oops").what()).find("not valid JSON"), std::string::npos);
  EXPECT_NE(std::string(error_of("[1]").what()).find("must be a JSON object"), std::string::npos);
}

TEST(OpenAiApi, ChatPromptFollowsTheDeepSeekV3Format) {
  const std::vector<ChatMessage> m = {
      {"system", "S1"}, {"user", "U1"}, {"assistant", "A1"}, {"system", "S2"}, {"user", "U2"}};
  EXPECT_EQ(chat_prompt(m, "<B>", "<E>"), "<B>S1\n\nS2<｜User｜>U1<｜Assistant｜>A1<E><｜User｜>U2<｜Assistant｜>");
  EXPECT_EQ(chat_prompt({{"user", "x"}}, "", ""), "<｜User｜>x<｜Assistant｜>");
}

TEST(OpenAiApi, StopStringsCutTheTextAndStreamTheSame) {
  const std::vector<std::string> stop = {"END", "xy"};
  const std::string text = "abc xEND tail";
  const StopCut cut = cut_at_stop(text, stop);
  EXPECT_TRUE(cut.stopped);
  EXPECT_EQ(text.substr(0, cut.length), "abc x");
  EXPECT_FALSE(cut_at_stop("abc", stop).stopped);
  EXPECT_EQ(finish_reason("length", true), "stop");
  EXPECT_EQ(finish_reason("eos", false), "stop");
  EXPECT_EQ(finish_reason("length", false), "length");

  // Streamed one byte at a time, or in uneven pieces, the sent text is the cut text, and nothing
  // that could start a stop string goes out early ("x" waits until "xE" shows it is not "xy").
  for (size_t step : {1, 2, 3, 5}) {
    StopText st(stop);
    std::string sent;
    for (size_t i = 0; i < text.size(); i += step) {
      const std::string out = st.push(text.substr(i, step));
      sent += out;
      EXPECT_EQ(text.substr(0, sent.size()), sent);
    }
    sent += st.finish();
    EXPECT_EQ(sent, "abc x") << "step " << step;
    EXPECT_TRUE(st.stopped());
  }
  StopText held(stop);
  EXPECT_EQ(held.push("ab x"), "ab ");  // "x" may start "xy"
  EXPECT_EQ(held.push("z"), "xz");
  EXPECT_EQ(held.push("E"), "");        // may start "END"
  EXPECT_EQ(held.finish(), "E");        // the generation ended first: nothing matched
  EXPECT_FALSE(held.stopped());
}

TEST(OpenAiApi, ResponseBodiesHaveTheOpenAiShape) {
  const Usage u{4, 2};
  const auto c = completion_body("cmpl-1", 5, "m", "hi", "stop", u);
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], "hi");
  EXPECT_EQ(c["usage"]["total_tokens"], 6);
  const auto ch = chat_completion_body("chatcmpl-1", 5, "m", "hi", "length", u);
  EXPECT_EQ(ch["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(ch["choices"][0]["finish_reason"], "length");
  const auto first = stream_chunk(Endpoint::kChatCompletions, "x", 5, "m", "a", "", nullptr, true);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(first.contains("usage"));
  const auto last = stream_chunk(Endpoint::kCompletions, "x", 5, "m", "", "stop", &u, false);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(last["usage"]["completion_tokens"], 2);
  const auto err = error_body(ApiError(400, "bad", "top_p"));
  EXPECT_EQ(err["error"]["param"], "top_p");
  EXPECT_EQ(err["error"]["type"], "invalid_request_error");
}

}  // namespace
}  // namespace locus::serve
