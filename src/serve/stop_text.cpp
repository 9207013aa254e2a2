#include "serve/stop_text.h"

#include <algorithm>

#include "serve/openai_api.h"

namespace locus::serve {

std::string StopText::push(const std::string& piece) {
  if (stopped_) return "";
  text_ += piece;
  const StopCut cut = cut_at_stop(text_, stop_);
  if (cut.stopped) {
    stopped_ = true;
    text_.resize(cut.length);
    return finish();
  }
  // Hold back the longest tail of the text that is a proper prefix of a stop string.
  size_t hold = 0;
  for (const auto& s : stop_)
    for (size_t n = std::min(s.size() - 1, text_.size()); n > hold; --n)
      if (text_.compare(text_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  const size_t end = std::max(sent_, text_.size() - hold);
  std::string out = text_.substr(sent_, end - sent_);
  sent_ = end;
  return out;
}

std::string StopText::finish() {
  std::string out = text_.substr(sent_);
  sent_ = text_.size();
  return out;
}

}  // namespace locus::serve
