#include "grammar/json_schema.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"
#include "util/error.h"

namespace g4::grammar {
namespace {

using Json = nlohmann::ordered_json;
using Sequence = GrammarBuilder::Sequence;

const std::set<std::string, std::less<>> kAnnotations = {"title",   "description", "default",    "examples", "$schema",
                                                         "$id",     "$comment",    "deprecated", "readOnly", "writeOnly"};
const std::set<std::string, std::less<>> kStringKeywords = {"minLength", "maxLength"};
const std::set<std::string, std::less<>> kArrayKeywords = {"items", "minItems", "maxItems"};
const std::set<std::string, std::less<>> kObjectKeywords = {"properties", "required", "additionalProperties"};
const std::set<std::string, std::less<>> kOtherKeywords = {"type",  "enum",  "const", "anyOf",
                                                           "oneOf", "$ref", "$defs", "definitions"};

// How picojson (xgrammar's JSON library) writes a value: integers in decimal, other numbers with
// "%.f" when integral and below 2^53, else "%.17g"; strings escaping '"', '\\', '/', \b \f \n \r \t
// and other control characters (and DEL) as \u00xx; objects in their given order, no spaces.
void serialize(const Json& value, std::string& out) {
  switch (value.type()) {
    case Json::value_t::null: out += "null"; break;
    case Json::value_t::boolean: out += value.get<bool>() ? "true" : "false"; break;
    case Json::value_t::number_integer: out += std::to_string(value.get<int64_t>()); break;
    case Json::value_t::number_unsigned: {
      const uint64_t u = value.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) {
        out += std::to_string(u);
        break;
      }
      [[fallthrough]];
    }
    case Json::value_t::number_float: {
      const double d = value.get<double>();
      G4_CHECK(std::isfinite(d), "JSON Schema: a non-finite number in enum/const");
      double whole;
      char buf[64];
      std::snprintf(buf, sizeof buf, std::fabs(d) < 9007199254740992.0 && std::modf(d, &whole) == 0 ? "%.f" : "%.17g",
                    d);
      out += buf;
      break;
    }
    case Json::value_t::string: {
      out += '"';
      for (char c : value.get_ref<const std::string&>()) {
        const auto u = static_cast<unsigned char>(c);
        switch (c) {
          case '"': out += "\\\""; break;
          case '\\': out += "\\\\"; break;
          case '/': out += "\\/"; break;
          case '\b': out += "\\b"; break;
          case '\f': out += "\\f"; break;
          case '\n': out += "\\n"; break;
          case '\r': out += "\\r"; break;
          case '\t': out += "\\t"; break;
          default:
            if (u < 0x20 || u == 0x7f) {
              char buf[8];
              std::snprintf(buf, sizeof buf, "\\u%04x", u);
              out += buf;
            } else {
              out += c;
            }
        }
      }
      out += '"';
      break;
    }
    case Json::value_t::array: {
      out += '[';
      bool first = true;
      for (const Json& item : value) {
        if (!first) out += ',';
        first = false;
        serialize(item, out);
      }
      out += ']';
      break;
    }
    case Json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, item] : value.items()) {
        if (!first) out += ',';
        first = false;
        serialize(Json(key), out);
        out += ':';
        serialize(item, out);
      }
      out += '}';
      break;
    }
    default: G4_CHECK(false, "JSON Schema: an enum/const value of an unexpected JSON type");
  }
}

bool value_has_type(const Json& value, std::string_view type) {
  if (type == "string") return value.is_string();
  if (type == "integer") return value.is_number_integer() || value.is_number_unsigned();
  if (type == "number") return value.is_number();
  if (type == "boolean") return value.is_boolean();
  if (type == "null") return value.is_null();
  if (type == "array") return value.is_array();
  if (type == "object") return value.is_object();
  return false;
}

bool is_identifier(std::string_view name) {
  const auto letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  if (name.empty() || !letter(name[0])) return false;
  for (char c : name)
    if (!letter(c) && !(c >= '0' && c <= '9')) return false;
  return true;
}

// Refuses what Gemma 4's tool syntax cannot carry: a string holding its delimiter <|"|>, an object
// key that is no identifier (keys are bare).
void require_gemma4_writable(const Json& value, const std::string& where) {
  if (value.is_string())
    G4_REQUIRE(kUnsupported, value.get_ref<const std::string&>().find(kGemma4Quote) == std::string::npos,
               "JSON Schema: an enum/const string holding " + std::string(kGemma4Quote) + " (at " + where +
                   ") cannot be written in Gemma 4's tool syntax");
  if (value.is_object())
    for (const auto& [key, item] : value.items()) {
      G4_REQUIRE(kUnsupported, is_identifier(key),
                 "JSON Schema: enum/const object key '" + key + "' (at " + where +
                     ") is no identifier, which Gemma 4's tool syntax writes bare");
      require_gemma4_writable(item, where);
    }
  if (value.is_array())
    for (const Json& item : value) require_gemma4_writable(item, where);
}

// Gemma 4's chat template writes an object's keys sorted case-insensitively (ASCII); so do its
// grammars, so that the template's rendering of a call is in the language.
bool gemma4_key_order(const std::string& a, const std::string& b) {
  return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; };
    return lower(x) < lower(y);
  });
}

Json parse_schema(std::string_view schema_json) {
  try {
    return Json::parse(schema_json);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::kInvalidArgument, std::string("JSON Schema: not JSON: ") + e.what());
  }
}

}  // namespace

class SchemaConverter::Rules {
 public:
  Rules(GrammarBuilder& builder, ValueSyntax syntax) : builder_(builder), syntax_(syntax) {}

  // The rule of a schema document: `root` is what its $refs resolve in.
  int32_t document(const Json& root) {
    root_ = &root;
    refs_.clear();
    const int32_t rule = convert(root, "#");
    root_ = nullptr;
    return rule;
  }

  int32_t object_document(const Json& root) {
    if (root.is_object()) {
      bool constrains = false;
      for (const auto& [key, value] : root.items())
        constrains = constrains || !(kAnnotations.count(key) || key == "$defs" || key == "definitions");
      if (!constrains) return object();
      if (const auto type = root.find("type"); type != root.end()) {
        G4_CHECK(*type == "object" || *type == Json::array({"object"}),
                 "JSON Schema: the schema admits values other than objects (its \"type\" is " + type->dump() + ")");
      } else {
        G4_REQUIRE(kUnsupported, root.contains("properties"),
                   "JSON Schema: a schema of objects needs \"type\": \"object\" or \"properties\"");
      }
    } else if (root.is_boolean() && root.get<bool>()) {
      return object();
    }
    return document(root);
  }

  // The rule of one schema; `where` is its JSON pointer, for messages.
  int32_t convert(const Json& schema, const std::string& where) {
    if (schema.is_boolean()) {
      G4_REQUIRE(kUnsupported, schema.get<bool>(), "JSON Schema: the schema false (no value allowed) at " + where);
      return any();
    }
    G4_CHECK(schema.is_object(), "JSON Schema: the schema at " + where + " is neither an object nor a boolean");
    std::set<std::string, std::less<>> present;
    for (const auto& [key, value] : schema.items()) {
      if (kAnnotations.count(key)) continue;
      if (!kOtherKeywords.count(key) && !kStringKeywords.count(key) && !kArrayKeywords.count(key) &&
          !kObjectKeywords.count(key))
        throw Error(ErrorKind::kUnsupported, "JSON Schema keyword '" + key + "' (at " + where + ") is not supported");
      present.insert(key);
    }
    present.erase("$defs");
    present.erase("definitions");
    for (const char* defs : {"$defs", "definitions"})
      if (schema.contains(defs)) G4_CHECK(schema[defs].is_object(), "JSON Schema: " + where + "/" + defs + " is not an object");

    if (present.count("$ref")) {
      G4_REQUIRE(kUnsupported, present.size() == 1,
                 "JSON Schema: $ref beside other keywords (at " + where + ") is not supported");
      return reference(schema["$ref"], where);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!present.count(key)) continue;
      G4_REQUIRE(kUnsupported, present.size() == 1,
                 std::string("JSON Schema: ") + key + " beside other keywords (at " + where + ") is not supported");
      const Json& options = schema[key];
      G4_CHECK(options.is_array() && !options.empty(), "JSON Schema: " + where + "/" + key + " is not a non-empty array");
      const int32_t rule = builder_.add_rule();
      for (size_t i = 0; i < options.size(); ++i)
        builder_.add_alternative(rule, {builder_.ref(convert(options[i], where + "/" + key + "/" + std::to_string(i)))});
      return rule;
    }

    std::vector<std::string> types;
    if (present.count("type")) {
      const Json& type = schema["type"];
      if (type.is_string()) {
        types.push_back(type.get<std::string>());
      } else {
        G4_CHECK(type.is_array() && !type.empty(), "JSON Schema: " + where + "/type is neither a string nor a non-empty list");
        for (const Json& t : type) {
          G4_CHECK(t.is_string(), "JSON Schema: " + where + "/type lists a non-string");
          types.push_back(t.get<std::string>());
        }
      }
      for (const std::string& t : types)
        G4_CHECK(t == "string" || t == "integer" || t == "number" || t == "boolean" || t == "null" || t == "array" ||
                     t == "object",
                 "JSON Schema: unknown type '" + t + "' at " + where);
    }

    if (present.count("enum") || present.count("const")) {
      G4_REQUIRE(kUnsupported, !(present.count("enum") && present.count("const")),
                 "JSON Schema: enum beside const (at " + where + ") is not supported");
      for (const std::string& key : present)
        G4_REQUIRE(kUnsupported, key == "enum" || key == "const" || key == "type",
                   "JSON Schema: '" + key + "' beside enum/const (at " + where + ") is not supported");
      std::vector<const Json*> values;
      if (present.count("const")) {
        values.push_back(&schema["const"]);
      } else {
        G4_CHECK(schema["enum"].is_array() && !schema["enum"].empty(),
                 "JSON Schema: " + where + "/enum is not a non-empty array");
        for (const Json& v : schema["enum"]) values.push_back(&v);
      }
      const int32_t rule = builder_.add_rule();
      for (const Json* v : values) {
        if (!types.empty()) {
          bool ok = false;
          for (const std::string& t : types) ok = ok || value_has_type(*v, t);
          G4_CHECK(ok, "JSON Schema: an enum/const value at " + where + " is not of the schema's type");
        }
        std::string text;
        if (syntax_ == ValueSyntax::kGemma4) {
          // As the chat template writes it: keys bare and sorted, numbers as Python prints them, None.
          require_gemma4_writable(*v, where);
          text = format_gemma4_value(*v, /*quote_keys=*/false);
        } else {
          serialize(*v, text);
        }
        builder_.add_alternative(rule, builder_.literal(text));
      }
      return rule;
    }

    if (types.empty()) {
      if (present.count("properties")) {
        types.push_back("object");
      } else {
        for (const std::string& key : present)
          throw Error(ErrorKind::kUnsupported,
                      "JSON Schema: '" + key + "' without a \"type\" (at " + where + ") is not supported");
        return any();
      }
    }
    for (const std::string& key : present) {
      bool applies = key == "type";
      for (const std::string& t : types)
        applies = applies || (t == "string" && kStringKeywords.count(key)) || (t == "array" && kArrayKeywords.count(key)) ||
                  (t == "object" && kObjectKeywords.count(key));
      G4_REQUIRE(kUnsupported, applies,
                 "JSON Schema: '" + key + "' does not apply to the type at " + where + " (not supported)");
    }
    if (types.size() == 1) return convert_type(schema, types[0], present, where);
    const int32_t rule = builder_.add_rule();
    for (const std::string& t : types) builder_.add_alternative(rule, {builder_.ref(convert_type(schema, t, present, where))});
    return rule;
  }

 private:
  using Keys = std::set<std::string, std::less<>>;

  static bool has_any(const Keys& present, const Keys& keys) {
    for (const std::string& key : keys)
      if (present.count(key)) return true;
    return false;
  }

  static std::optional<int64_t> count(const Json& schema, const char* key, const std::string& where) {
    if (!schema.contains(key)) return std::nullopt;
    const Json& v = schema[key];
    G4_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0),
             "JSON Schema: " + where + "/" + key + " is not a non-negative integer");
    const int64_t n = v.get<int64_t>();
    G4_REQUIRE(kUnsupported, n <= 4096, "JSON Schema: " + where + "/" + key + " above 4096 is not supported");
    return n;
  }

  int32_t convert_type(const Json& schema, const std::string& type, const Keys& present, const std::string& where) {
    if (type == "integer") return integer();
    if (type == "number") return number();
    if (type == "boolean") return boolean();
    if (type == "null") return null();
    if (type == "string") {
      if (!has_any(present, kStringKeywords)) return string();
      const int64_t min = count(schema, "minLength", where).value_or(0);
      const int64_t max = count(schema, "maxLength", where).value_or(-1);
      G4_CHECK(max < 0 || min <= max, "JSON Schema: minLength above maxLength at " + where);
      const int32_t rule = builder_.add_rule();
      Sequence s = quote();
      s.push_back(builder_.ref(builder_.repeat({builder_.ref(length_char())}, min, max)));
      const Sequence close = quote();
      s.insert(s.end(), close.begin(), close.end());
      builder_.add_alternative(rule, std::move(s));
      return rule;
    }
    if (type == "array") {
      if (!has_any(present, kArrayKeywords)) return array();
      const int32_t item = schema.contains("items") ? convert(schema["items"], where + "/items") : any();
      const int64_t min = count(schema, "minItems", where).value_or(0);
      const int64_t max = count(schema, "maxItems", where).value_or(-1);
      G4_CHECK(max < 0 || min <= max, "JSON Schema: minItems above maxItems at " + where);
      const int32_t rule = builder_.add_rule();
      if (min == 0) builder_.add_alternative(rule, builder_.literal("[]"));
      if (max != 0) {
        const int32_t more =
            builder_.repeat({builder_.byte(','), builder_.ref(item)}, min > 0 ? min - 1 : 0, max < 0 ? -1 : max - 1);
        builder_.add_alternative(rule, {builder_.byte('['), builder_.ref(item), builder_.ref(more), builder_.byte(']')});
      }
      return rule;
    }
    // object
    if (!has_any(present, kObjectKeywords)) return object();
    std::vector<std::pair<std::string, int32_t>> properties;
    if (schema.contains("properties")) {
      G4_CHECK(schema["properties"].is_object(), "JSON Schema: " + where + "/properties is not an object");
      for (const auto& [name, sub] : schema["properties"].items()) {
        if (syntax_ == ValueSyntax::kGemma4) {
          G4_REQUIRE(kUnsupported, is_identifier(name),
                     "JSON Schema: property name '" + name + "' (at " + where +
                         ") is no identifier [A-Za-z_][A-Za-z0-9_]*, which Gemma 4's tool syntax writes bare");
        } else {
          for (char c : name)
            G4_REQUIRE(kUnsupported, static_cast<unsigned char>(c) >= 0x20 && c != '"' && c != '\\' && c != 0x7f,
                       "JSON Schema: a property name that needs escaping (at " + where + ") is not supported");
        }
        properties.emplace_back(name, convert(sub, where + "/properties/" + name));
      }
      if (syntax_ == ValueSyntax::kGemma4)
        std::stable_sort(properties.begin(), properties.end(),
                         [](const auto& a, const auto& b) { return gemma4_key_order(a.first, b.first); });
    }
    std::set<std::string> required;
    if (schema.contains("required")) {
      G4_CHECK(schema["required"].is_array(), "JSON Schema: " + where + "/required is not an array");
      for (const Json& name : schema["required"]) {
        G4_CHECK(name.is_string(), "JSON Schema: " + where + "/required lists a non-string");
        bool known = false;
        for (const auto& p : properties) known = known || p.first == name.get<std::string>();
        G4_REQUIRE(kUnsupported, known,
                   "JSON Schema: required property '" + name.get<std::string>() + "' not in properties (at " + where +
                       ") is not supported");
        required.insert(name.get<std::string>());
      }
    }
    std::optional<int32_t> additional = any();
    if (schema.contains("additionalProperties")) {
      const Json& a = schema["additionalProperties"];
      if (a.is_boolean() && !a.get<bool>()) {
        additional.reset();
      } else {
        additional = convert(a, where + "/additionalProperties");
      }
    }
    const auto pair = [&](const std::string& name, int32_t value) {
      Sequence s = builder_.literal(syntax_ == ValueSyntax::kGemma4 ? name + ":" : "\"" + name + "\":");
      s.push_back(builder_.ref(value));
      return s;
    };
    Sequence extra_pair;  // key ":" value
    std::optional<int32_t> extras;  // ("," extra_pair)*
    if (additional) {
      extra_pair = {builder_.ref(key()), builder_.byte(':'), builder_.ref(*additional)};
      Sequence comma_pair = {builder_.byte(',')};
      comma_pair.insert(comma_pair.end(), extra_pair.begin(), extra_pair.end());
      extras = builder_.repeat(comma_pair, 0, -1);
    }
    const size_t n = properties.size();
    // rest[i]: what may follow once properties 0..i are settled (present or absent).
    std::vector<int32_t> rest(n);
    for (size_t k = n; k-- > 0;) {
      rest[k] = builder_.add_rule();
      if (k == n - 1) {
        builder_.add_alternative(rest[k], extras ? Sequence{builder_.ref(*extras)} : Sequence{});
        continue;
      }
      Sequence next = {builder_.byte(',')};
      const Sequence p = pair(properties[k + 1].first, properties[k + 1].second);
      next.insert(next.end(), p.begin(), p.end());
      next.push_back(builder_.ref(rest[k + 1]));
      builder_.add_alternative(rest[k], std::move(next));
      if (!required.count(properties[k + 1].first)) builder_.add_alternative(rest[k], {builder_.ref(rest[k + 1])});
    }
    const int32_t rule = builder_.add_rule();
    for (size_t i = 0; i < n; ++i) {
      Sequence s = {builder_.byte('{')};
      const Sequence p = pair(properties[i].first, properties[i].second);
      s.insert(s.end(), p.begin(), p.end());
      s.push_back(builder_.ref(rest[i]));
      s.push_back(builder_.byte('}'));
      builder_.add_alternative(rule, std::move(s));
      if (required.count(properties[i].first)) break;
    }
    if (required.empty()) {
      builder_.add_alternative(rule, builder_.literal("{}"));
      if (additional) {
        Sequence s = {builder_.byte('{')};
        s.insert(s.end(), extra_pair.begin(), extra_pair.end());
        s.push_back(builder_.ref(*extras));
        s.push_back(builder_.byte('}'));
        builder_.add_alternative(rule, std::move(s));
      }
    }
    return rule;
  }

  int32_t reference(const Json& ref, const std::string& where) {
    G4_CHECK(ref.is_string(), "JSON Schema: " + where + "/$ref is not a string");
    const std::string path = ref.get<std::string>();
    if (auto it = refs_.find(path); it != refs_.end()) return it->second;
    G4_REQUIRE(kUnsupported, path == "#" || path.rfind("#/", 0) == 0,
               "JSON Schema: $ref '" + path + "' (at " + where + ") outside the schema is not supported");
    const Json* target = root_;
    if (path != "#") {
      Json::json_pointer pointer;
      try {
        pointer = Json::json_pointer(path.substr(1));
      } catch (const nlohmann::json::exception&) {
        G4_CHECK(false, "JSON Schema: $ref '" + path + "' at " + where + " is not a JSON pointer");
      }
      G4_CHECK(root_->contains(pointer), "JSON Schema: $ref '" + path + "' at " + where + " names nothing in the schema");
      target = &root_->at(pointer);
    }
    const int32_t rule = builder_.add_rule();
    refs_[path] = rule;
    builder_.add_alternative(rule, {builder_.ref(convert(*target, path))});
    return rule;
  }

  // A rule for each of xgrammar's basic_* rules, made when first used.
  int32_t cached(int32_t& slot, void (Rules::*fill)(int32_t)) {
    if (slot < 0) {
      slot = builder_.add_rule();
      (this->*fill)(slot);
    }
    return slot;
  }

  Element digits_1_9() {
    ByteSet s;
    s.add_range('1', '9');
    return builder_.bytes(s);
  }
  Element digit() {
    ByteSet s;
    s.add_range('0', '9');
    return builder_.bytes(s);
  }
  int32_t digits_star() { return cached(digits_star_, &Rules::fill_digits_star); }
  void fill_digits_star(int32_t rule) { builder_.add_alternative(rule, {builder_.ref(builder_.repeat({digit()}, 0, -1))}); }

  // UTF-8 sequences of two to four bytes as xgrammar's character classes read them: a lead byte
  // 110xxxxx, 1110xxxx or 11110xxx and that many continuation bytes 10xxxxxx; each followed by
  // `then`.
  void add_multibyte(int32_t rule, const Sequence& then = {}) {
    ByteSet cont;
    cont.add_range(0x80, 0xBF);
    const std::pair<uint8_t, uint8_t> leads[] = {{0xC0, 0xDF}, {0xE0, 0xEF}, {0xF0, 0xF7}};
    for (int n = 1; n <= 3; ++n) {
      ByteSet lead;
      lead.add_range(leads[n - 1].first, leads[n - 1].second);
      Sequence s = {builder_.bytes(lead)};
      for (int i = 0; i < n; ++i) s.push_back(builder_.bytes(cont));
      s.insert(s.end(), then.begin(), then.end());
      builder_.add_alternative(rule, std::move(s));
    }
  }

  static void remove(ByteSet& set, uint8_t b) { set.words[b >> 6] &= ~(uint64_t{1} << (b & 63)); }

  // basic_string's character: [^\0-\x1f\"\\\r\n].
  int32_t string_char() { return cached(string_char_, &Rules::fill_string_char); }
  void fill_string_char(int32_t rule) {
    ByteSet ascii;
    ascii.add_range(0x20, 0x7F);
    remove(ascii, '"');
    remove(ascii, '\\');
    builder_.add_alternative(rule, {builder_.bytes(ascii)});
    add_multibyte(rule);
  }
  // The character of a string with minLength/maxLength. JSON: [^"\\\r\n] (no escapes, control
  // characters other than CR and LF allowed: xgrammar's language, kept as is). Gemma 4: any but
  // '<', so that counting characters needs no watch for the closing <|"|>.
  int32_t length_char() { return cached(length_char_, &Rules::fill_length_char); }
  void fill_length_char(int32_t rule) {
    ByteSet ascii;
    ascii.add_range(0x00, 0x7F);
    const std::string_view excluded = syntax_ == ValueSyntax::kGemma4 ? std::string_view("<") : "\"\\\r\n";
    for (char c : excluded) remove(ascii, static_cast<uint8_t>(c));
    builder_.add_alternative(rule, {builder_.bytes(ascii)});
    add_multibyte(rule);
  }

  // A string's opening or closing delimiter.
  Sequence quote() {
    return syntax_ == ValueSyntax::kGemma4 ? builder_.literal(kGemma4Quote) : Sequence{builder_.byte('"')};
  }

  int32_t string() {
    return cached(string_, syntax_ == ValueSyntax::kGemma4 ? &Rules::fill_gemma4_string : &Rules::fill_string);
  }
  // <|"|> content <|"|>, the content any UTF-8 text without <|"|>: after the opening delimiter, a
  // matcher of the delimiter whose state k is how many of its bytes end the text so far. Only its
  // first byte is '<', so a byte that breaks a partial match restarts at state 1 if it is '<', else 0.
  void fill_gemma4_string(int32_t rule) {
    constexpr std::string_view delimiter = kGemma4Quote;
    std::array<int32_t, delimiter.size()> state;
    for (int32_t& s : state) s = builder_.add_rule();
    for (size_t k = 0; k < delimiter.size(); ++k) {
      ByteSet other;
      other.add_range(0x00, 0x7F);
      remove(other, '<');
      remove(other, static_cast<uint8_t>(delimiter[k]));
      builder_.add_alternative(state[k], {builder_.bytes(other), builder_.ref(state[0])});
      add_multibyte(state[k], {builder_.ref(state[0])});
      if (k > 0) builder_.add_alternative(state[k], {builder_.byte('<'), builder_.ref(state[1])});
      Sequence next = {builder_.byte(static_cast<uint8_t>(delimiter[k]))};
      if (k + 1 < delimiter.size()) next.push_back(builder_.ref(state[k + 1]));
      builder_.add_alternative(state[k], std::move(next));
    }
    Sequence s = builder_.literal(delimiter);
    s.push_back(builder_.ref(state[0]));
    builder_.add_alternative(rule, std::move(s));
  }
  void fill_string(int32_t rule) {
    // sub ::= '"' | char sub | '\\' escape sub
    const int32_t sub = builder_.add_rule();
    builder_.add_alternative(sub, {builder_.byte('"')});
    builder_.add_alternative(sub, {builder_.ref(string_char()), builder_.ref(sub)});
    const int32_t escape = builder_.add_rule();
    ByteSet simple;
    for (uint8_t c : {'"', '\\', '/', 'b', 'f', 'n', 'r', 't'}) simple.add(c);
    builder_.add_alternative(escape, {builder_.bytes(simple)});
    ByteSet hex;
    hex.add_range('0', '9');
    hex.add_range('a', 'f');
    hex.add_range('A', 'F');
    const Element h = builder_.bytes(hex);
    builder_.add_alternative(escape, {builder_.byte('u'), h, h, h, h});
    builder_.add_alternative(sub, {builder_.byte('\\'), builder_.ref(escape), builder_.ref(sub)});
    builder_.add_alternative(rule, {builder_.byte('"'), builder_.ref(sub)});
  }

  int32_t integer() { return cached(integer_, &Rules::fill_integer); }
  void fill_integer(int32_t rule) {
    builder_.add_alternative(rule, {builder_.byte('0')});
    builder_.add_alternative(rule, {builder_.byte('-'), digits_1_9(), builder_.ref(digits_star())});
    builder_.add_alternative(rule, {digits_1_9(), builder_.ref(digits_star())});
  }

  int32_t number() { return cached(number_, &Rules::fill_number); }
  void fill_number(int32_t rule) {
    const int32_t whole = builder_.add_rule();  // "0" | [1-9] [0-9]*
    builder_.add_alternative(whole, {builder_.byte('0')});
    builder_.add_alternative(whole, {digits_1_9(), builder_.ref(digits_star())});
    const int32_t fraction = builder_.add_rule();  // ("." [0-9]+)?
    builder_.add_alternative(fraction, {});
    builder_.add_alternative(fraction, {builder_.byte('.'), digit(), builder_.ref(digits_star())});
    const int32_t exponent = builder_.add_rule();  // ([eE] [+-]? [0-9]+)?
    builder_.add_alternative(exponent, {});
    ByteSet e, sign;
    e.add('e');
    e.add('E');
    sign.add('+');
    sign.add('-');
    builder_.add_alternative(exponent, {builder_.bytes(e), digit(), builder_.ref(digits_star())});
    builder_.add_alternative(exponent, {builder_.bytes(e), builder_.bytes(sign), digit(), builder_.ref(digits_star())});
    builder_.add_alternative(rule, {builder_.ref(whole), builder_.ref(fraction), builder_.ref(exponent)});
    builder_.add_alternative(rule, {builder_.byte('-'), builder_.ref(whole), builder_.ref(fraction), builder_.ref(exponent)});
  }

  int32_t boolean() { return cached(boolean_, &Rules::fill_boolean); }
  void fill_boolean(int32_t rule) {
    builder_.add_alternative(rule, builder_.literal("true"));
    builder_.add_alternative(rule, builder_.literal("false"));
  }
  // Gemma 4's chat template writes null as Python prints None.
  int32_t null() { return cached(null_, &Rules::fill_null); }
  void fill_null(int32_t rule) {
    builder_.add_alternative(rule, builder_.literal(syntax_ == ValueSyntax::kGemma4 ? "None" : "null"));
  }

  // An object's key: a JSON string, or in Gemma 4's syntax a bare identifier.
  int32_t key() {
    return syntax_ == ValueSyntax::kGemma4 ? cached(identifier_, &Rules::fill_identifier) : string();
  }
  void fill_identifier(int32_t rule) {
    ByteSet first;
    first.add_range('a', 'z');
    first.add_range('A', 'Z');
    first.add('_');
    ByteSet rest = first;
    rest.add_range('0', '9');
    builder_.add_alternative(rule, {builder_.bytes(first), builder_.ref(builder_.repeat({builder_.bytes(rest)}, 0, -1))});
  }

  // Members of basic_array and basic_object: xgrammar's built-in rules separate them with ", "
  // whatever the schema's separators are; Gemma 4's template with ",".
  Sequence separator() {
    return syntax_ == ValueSyntax::kGemma4 ? Sequence{builder_.byte(',')} : builder_.literal(", ");
  }
  int32_t array() { return cached(array_, &Rules::fill_array); }
  void fill_array(int32_t rule) {
    builder_.add_alternative(rule, builder_.literal("[]"));
    Sequence item = separator();
    item.push_back(builder_.ref(any()));
    const int32_t more = builder_.repeat(item, 0, -1);
    builder_.add_alternative(rule, {builder_.byte('['), builder_.ref(any()), builder_.ref(more), builder_.byte(']')});
  }
  int32_t object() { return cached(object_, &Rules::fill_object); }
  void fill_object(int32_t rule) {
    builder_.add_alternative(rule, builder_.literal("{}"));
    Sequence member = separator();
    member.insert(member.end(), {builder_.ref(key()), builder_.byte(':'), builder_.ref(any())});
    const int32_t more = builder_.repeat(member, 0, -1);
    builder_.add_alternative(rule, {builder_.byte('{'), builder_.ref(key()), builder_.byte(':'), builder_.ref(any()),
                                    builder_.ref(more), builder_.byte('}')});
  }
  int32_t any() { return cached(any_, &Rules::fill_any); }
  void fill_any(int32_t rule) {
    for (int32_t r : {number(), string(), boolean(), null(), array(), object()}) builder_.add_alternative(rule, {builder_.ref(r)});
  }

  GrammarBuilder& builder_;
  const ValueSyntax syntax_;
  const Json* root_ = nullptr;
  std::map<std::string, int32_t> refs_;
  int32_t digits_star_ = -1, string_char_ = -1, length_char_ = -1, string_ = -1, integer_ = -1, number_ = -1,
          boolean_ = -1, null_ = -1, identifier_ = -1, array_ = -1, object_ = -1, any_ = -1;
};

SchemaConverter::SchemaConverter(GrammarBuilder& builder, ValueSyntax syntax)
    : rules_(std::make_unique<Rules>(builder, syntax)) {}

SchemaConverter::~SchemaConverter() = default;

int32_t SchemaConverter::value_rule(std::string_view schema_json) {
  const Json schema = parse_schema(schema_json);
  return rules_->document(schema);
}

int32_t SchemaConverter::object_rule(std::string_view schema_json) {
  const Json schema = parse_schema(schema_json);
  return rules_->object_document(schema);
}

Grammar json_schema_grammar(std::string_view schema_json) {
  GrammarBuilder builder;
  const int32_t root = SchemaConverter(builder, ValueSyntax::kJson).value_rule(schema_json);
  return builder.build(root);
}

Grammar json_object_grammar() { return json_schema_grammar(R"({"type":"object"})"); }

}  // namespace g4::grammar
