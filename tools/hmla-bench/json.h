// hmla-bench: a tiny JSON writer (streaming, pretty-printed) and a tiny JSON reader (whole document
// into a tree), enough for the result files and the anchor file. No dependency.
//
// Writer: non-finite doubles are written as null (JSON has no NaN/inf).
// Reader: RFC 8259 values; \uXXXX escapes outside ASCII are kept as UTF-8; numbers become double.
#pragma once

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace hmla_bench {

// ------------------------------------------------------------------------------------- writer
class JsonWriter {
 public:
  explicit JsonWriter(std::ostream& out) : out_(out) {}

  JsonWriter& begin_object() { open('{'); return *this; }
  JsonWriter& end_object() { close('}'); return *this; }
  JsonWriter& begin_array() { open('['); return *this; }
  JsonWriter& end_array() { close(']'); return *this; }

  JsonWriter& key(const std::string& k) {
    separate();
    write_string(k);
    out_ << ": ";
    after_key_ = true;
    return *this;
  }

  JsonWriter& value(const std::string& s) { separate(); write_string(s); return *this; }
  JsonWriter& value(const char* s) {
    if (s == nullptr) return null();
    return value(std::string(s));
  }
  JsonWriter& value(bool b) { separate(); out_ << (b ? "true" : "false"); return *this; }
  JsonWriter& value(int v) { return value((long long)v); }
  JsonWriter& value(long v) { return value((long long)v); }
  JsonWriter& value(long long v) { separate(); out_ << v; return *this; }
  JsonWriter& value(unsigned v) { return value((unsigned long long)v); }
  JsonWriter& value(unsigned long v) { return value((unsigned long long)v); }
  JsonWriter& value(unsigned long long v) { separate(); out_ << v; return *this; }
  JsonWriter& value(double v) {
    separate();
    if (!std::isfinite(v)) {
      out_ << "null";
    } else {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.10g", v);
      out_ << buf;
    }
    return *this;
  }
  JsonWriter& null() { separate(); out_ << "null"; return *this; }

  // key + value in one call
  template <typename T>
  JsonWriter& kv(const std::string& k, const T& v) { key(k); return value(v); }
  JsonWriter& kv_null(const std::string& k) { key(k); return null(); }
  // a double that is written as null when `present` is false
  JsonWriter& kv_opt(const std::string& k, bool present, double v) {
    key(k);
    return present ? value(v) : null();
  }

 private:
  struct Level {
    bool first = true;
  };

  void newline_indent() {
    out_ << '\n';
    for (size_t i = 0; i < stack_.size(); ++i) out_ << "  ";
  }

  // Emits the comma/newline/indent before a new element (not after a key).
  void separate() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!stack_.empty()) {
      if (!stack_.back().first) out_ << ',';
      stack_.back().first = false;
      newline_indent();
    }
  }

  void open(char c) {
    separate();
    out_ << c;
    stack_.push_back(Level{});
  }

  void close(char c) {
    if (stack_.empty()) throw std::logic_error("JsonWriter: close without open");
    bool empty = stack_.back().first;
    stack_.pop_back();
    if (!empty) newline_indent();
    out_ << c;
    if (stack_.empty()) out_ << '\n';
  }

  void write_string(const std::string& s) {
    out_ << '"';
    for (unsigned char c : s) {
      switch (c) {
        case '"': out_ << "\\\""; break;
        case '\\': out_ << "\\\\"; break;
        case '\n': out_ << "\\n"; break;
        case '\r': out_ << "\\r"; break;
        case '\t': out_ << "\\t"; break;
        case '\b': out_ << "\\b"; break;
        case '\f': out_ << "\\f"; break;
        default:
          if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", (unsigned)c);
            out_ << buf;
          } else {
            out_ << (char)c;
          }
      }
    }
    out_ << '"';
  }

  std::ostream& out_;
  std::vector<Level> stack_;
  bool after_key_ = false;
};

// ------------------------------------------------------------------------------------- reader
class JsonValue {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  bool as_bool() const { return bool_; }
  double as_number() const { return number_; }
  const std::string& as_string() const { return string_; }
  const std::vector<JsonValue>& as_array() const { return array_; }
  const std::map<std::string, JsonValue>& as_object() const { return object_; }

  // Member lookup; nullptr when this is not an object or has no such key.
  const JsonValue* get(const std::string& k) const {
    if (type_ != Type::kObject) return nullptr;
    auto it = object_.find(k);
    return it == object_.end() ? nullptr : &it->second;
  }

  static JsonValue parse(const std::string& text) {
    Parser p{text, 0};
    p.skip_ws();
    JsonValue v = p.parse_value(0);
    p.skip_ws();
    if (p.pos != text.size()) p.fail("trailing characters after the document");
    return v;
  }

 private:
  struct Parser {
    const std::string& s;
    size_t pos;

    [[noreturn]] void fail(const std::string& what) const {
      size_t line = 1;
      for (size_t i = 0; i < pos && i < s.size(); ++i) line += (s[i] == '\n');
      throw std::runtime_error("JSON parse error at line " + std::to_string(line) + ": " + what);
    }
    void skip_ws() {
      while (pos < s.size() && (s[pos] == ' ' || s[pos] == '\n' || s[pos] == '\r' || s[pos] == '\t'))
        ++pos;
    }
    bool consume(const char* lit) {
      size_t n = std::char_traits<char>::length(lit);
      if (s.compare(pos, n, lit) == 0) {
        pos += n;
        return true;
      }
      return false;
    }
    JsonValue parse_value(int depth) {
      if (depth > 256) fail("nesting too deep");
      if (pos >= s.size()) fail("unexpected end of input");
      JsonValue v;
      char c = s[pos];
      if (c == '{') {
        v.type_ = Type::kObject;
        ++pos;
        skip_ws();
        if (pos < s.size() && s[pos] == '}') { ++pos; return v; }
        for (;;) {
          skip_ws();
          if (pos >= s.size() || s[pos] != '"') fail("expected a string key");
          std::string k = parse_string();
          skip_ws();
          if (pos >= s.size() || s[pos] != ':') fail("expected ':'");
          ++pos;
          skip_ws();
          v.object_[k] = parse_value(depth + 1);
          skip_ws();
          if (pos < s.size() && s[pos] == ',') { ++pos; continue; }
          if (pos < s.size() && s[pos] == '}') { ++pos; return v; }
          fail("expected ',' or '}'");
        }
      }
      if (c == '[') {
        v.type_ = Type::kArray;
        ++pos;
        skip_ws();
        if (pos < s.size() && s[pos] == ']') { ++pos; return v; }
        for (;;) {
          skip_ws();
          v.array_.push_back(parse_value(depth + 1));
          skip_ws();
          if (pos < s.size() && s[pos] == ',') { ++pos; continue; }
          if (pos < s.size() && s[pos] == ']') { ++pos; return v; }
          fail("expected ',' or ']'");
        }
      }
      if (c == '"') {
        v.type_ = Type::kString;
        v.string_ = parse_string();
        return v;
      }
      if (consume("true")) { v.type_ = Type::kBool; v.bool_ = true; return v; }
      if (consume("false")) { v.type_ = Type::kBool; v.bool_ = false; return v; }
      if (consume("null")) { v.type_ = Type::kNull; return v; }
      if (c == '-' || (c >= '0' && c <= '9')) {
        size_t start = pos;
        if (s[pos] == '-') ++pos;
        while (pos < s.size() && (std::isdigit((unsigned char)s[pos]) || s[pos] == '.' || s[pos] == 'e' ||
                                  s[pos] == 'E' || s[pos] == '+' || s[pos] == '-'))
          ++pos;
        std::string num = s.substr(start, pos - start);
        char* end = nullptr;
        double d = std::strtod(num.c_str(), &end);
        if (end == nullptr || *end != '\0' || num == "-") fail("bad number '" + num + "'");
        v.type_ = Type::kNumber;
        v.number_ = d;
        return v;
      }
      fail(std::string("unexpected character '") + c + "'");
    }
    static void append_utf8(std::string& out, uint32_t cp) {
      if (cp < 0x80) {
        out += (char)cp;
      } else if (cp < 0x800) {
        out += (char)(0xc0 | (cp >> 6));
        out += (char)(0x80 | (cp & 0x3f));
      } else if (cp < 0x10000) {
        out += (char)(0xe0 | (cp >> 12));
        out += (char)(0x80 | ((cp >> 6) & 0x3f));
        out += (char)(0x80 | (cp & 0x3f));
      } else {
        out += (char)(0xf0 | (cp >> 18));
        out += (char)(0x80 | ((cp >> 12) & 0x3f));
        out += (char)(0x80 | ((cp >> 6) & 0x3f));
        out += (char)(0x80 | (cp & 0x3f));
      }
    }
    uint32_t parse_hex4() {
      if (pos + 4 > s.size()) fail("short \\u escape");
      uint32_t cp = 0;
      for (int i = 0; i < 4; ++i) {
        char h = s[pos++];
        cp <<= 4;
        if (h >= '0' && h <= '9') cp |= (uint32_t)(h - '0');
        else if (h >= 'a' && h <= 'f') cp |= (uint32_t)(h - 'a' + 10);
        else if (h >= 'A' && h <= 'F') cp |= (uint32_t)(h - 'A' + 10);
        else fail("bad \\u escape");
      }
      return cp;
    }
    std::string parse_string() {
      ++pos;  // opening quote
      std::string out;
      while (pos < s.size()) {
        char c = s[pos++];
        if (c == '"') return out;
        if (c != '\\') {
          out += c;
          continue;
        }
        if (pos >= s.size()) break;
        char e = s[pos++];
        switch (e) {
          case '"': out += '"'; break;
          case '\\': out += '\\'; break;
          case '/': out += '/'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'n': out += '\n'; break;
          case 'r': out += '\r'; break;
          case 't': out += '\t'; break;
          case 'u': {
            uint32_t cp = parse_hex4();
            if (cp >= 0xd800 && cp < 0xdc00 && pos + 6 <= s.size() && s[pos] == '\\' && s[pos + 1] == 'u') {
              pos += 2;
              uint32_t lo = parse_hex4();
              cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            append_utf8(out, cp);
            break;
          }
          default: fail("bad escape");
        }
      }
      fail("unterminated string");
    }
  };

  Type type_ = Type::kNull;
  bool bool_ = false;
  double number_ = 0;
  std::string string_;
  std::vector<JsonValue> array_;
  std::map<std::string, JsonValue> object_;
};

}  // namespace hmla_bench
