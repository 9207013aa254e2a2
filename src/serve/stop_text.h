// The text of a streamed completion with stop strings: pieces come in as tokens are decoded;
// what may be sent goes out. Text that could still become the start of a stop string is held back
// until it cannot; once a stop string appears, the text ends just before it and later pieces are
// dropped. The concatenation of everything push() and finish() return is the text cut at the
// first stop string (cut_at_stop of openai_api.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/tokenizer.h"

namespace locus::serve {

class StopText {
 public:
  explicit StopText(std::vector<std::string> stop) : stop_(std::move(stop)) {}
  std::string push(const std::string& piece);  // what may be sent now
  std::string finish();                        // what was held back (nothing after a stop)
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stop_;
  std::string text_;  // everything pushed so far (up to the stop)
  size_t sent_ = 0;
  bool stopped_ = false;
};

// A reply's text as its tokens arrive: decoded piece by piece (StreamingDecoder, whole UTF-8
// characters only) and cut at the stop strings (StopText).
class ReplyText {
 public:
  ReplyText(const runtime::Tokenizer& tok, std::vector<std::string> stop) : decoder_(tok), text_(std::move(stop)) {}
  std::string push(int32_t id) { return text_.push(decoder_.push(id)); }  // what may be sent now
  std::string finish() { return text_.push(decoder_.flush()) + text_.finish(); }  // the rest
  bool stopped() const { return text_.stopped(); }

 private:
  runtime::StreamingDecoder decoder_;
  StopText text_;
};

}  // namespace locus::serve
