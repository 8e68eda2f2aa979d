// A minimal JSON writer for `urdma status --json` / `urdma devices --json`: objects, arrays,
// strings (escaped), numbers and booleans, written in order. No parser: the tests parse the
// output with Python's json module, an oracle that shares nothing with this code.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace urdma::tools {

class JsonWriter {
 public:
  explicit JsonWriter(std::ostream& out) : out_(out) {}

  void begin_object(std::string_view key = {}) { open(key, '{'); }
  void end_object() { close('}'); }
  void begin_array(std::string_view key = {}) { open(key, '['); }
  void end_array() { close(']'); }
  void value(std::string_view key, std::string_view v) {
    prefix(key);
    string(v);
  }
  void value(std::string_view key, const char* v) { value(key, std::string_view(v)); }
  void value(std::string_view key, const std::string& v) { value(key, std::string_view(v)); }
  void value(std::string_view key, uint64_t v) {
    prefix(key);
    out_ << v;
  }
  void value(std::string_view key, int64_t v) {
    prefix(key);
    out_ << v;
  }
  void value(std::string_view key, uint32_t v) { value(key, uint64_t{v}); }
  void value(std::string_view key, int v) { value(key, int64_t{v}); }
  void value(std::string_view key, bool v) {
    prefix(key);
    out_ << (v ? "true" : "false");
  }
  void null(std::string_view key) {
    prefix(key);
    out_ << "null";
  }
  void finish() { out_ << '\n'; }

 private:
  void open(std::string_view key, char c) {
    prefix(key);
    out_ << c;
    first_.push_back(true);
  }
  void close(char c) {
    first_.pop_back();
    out_ << c;
  }
  // The comma before every element but the first, and the key inside objects.
  void prefix(std::string_view key) {
    if (!first_.empty()) {
      if (!first_.back()) out_ << ',';
      first_.back() = false;
    }
    if (!key.empty()) {
      string(key);
      out_ << ':';
    }
  }
  void string(std::string_view s) {
    out_ << '"';
    for (const char ch : s) {
      const auto u = static_cast<unsigned char>(ch);
      if (ch == '"' || ch == '\\') {
        out_ << '\\' << ch;
      } else if (u < 0x20) {
        static constexpr char kHex[] = "0123456789abcdef";
        out_ << "\\u00" << kHex[u >> 4] << kHex[u & 15];
      } else {
        out_ << ch;
      }
    }
    out_ << '"';
  }

  std::ostream& out_;
  std::vector<bool> first_;
};

}  // namespace urdma::tools
