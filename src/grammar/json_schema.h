// JSON Schema → Grammar: the language xgrammar's JSON Schema converter builds for the same schema with
// anyWhitespace=false, separators (",", ":") and strictMode=false, byte for byte (docs/DESIGN.md §4,
// "Constrained decoding"): compact JSON, properties in schema order, free whitespace nowhere.
//
// The subset: type (a name or a list), properties, required, additionalProperties (absent, true,
// false or a schema), enum, const, items, minItems, maxItems, minLength, maxLength, anyOf, oneOf
// (as anyOf), $ref to "#" or "#/…" within the schema ($defs, definitions; recursion allowed), and
// the annotations title, description, default, examples, $schema, $id, $comment, deprecated,
// readOnly, writeOnly. Every other keyword (pattern, format, minimum, maximum, multipleOf,
// prefixItems, allOf, not, if, …) throws Error(kUnsupported) naming it; a malformed schema throws
// Error(kInvalidArgument).
#pragma once
#include <cstdint>
#include <memory>
#include <string_view>

#include "grammar/grammar.h"

namespace g4::grammar {

// How the values a schema admits are written: JSON (xgrammar's language, above), or Gemma 4's
// tool-call syntax (tool_call_grammar.h: bare keys, strings between <|"|>, None).
enum class ValueSyntax { kJson, kGemma4 };

// Converts JSON Schema documents into rules of one GrammarBuilder, so that several schemas (a tool
// set's parameters) make one grammar and share its basic rules (strings, numbers, any value).
// Errors as json_schema_grammar's.
class SchemaConverter {
 public:
  SchemaConverter(GrammarBuilder& builder, ValueSyntax syntax);
  ~SchemaConverter();

  // The rule of the values `schema_json` admits; its $refs resolve within it.
  int32_t value_rule(std::string_view schema_json);
  // The rule of the objects `schema_json` admits, for a schema of objects only: "type" "object",
  // or "properties" without a "type"; one of annotations only (or true) admits any object. Another
  // "type" is Error(kInvalidArgument); other keywords without a "type", Error(kUnsupported).
  int32_t object_rule(std::string_view schema_json);

 private:
  class Rules;
  std::unique_ptr<Rules> rules_;
};

// The grammar of the JSON values `schema_json` (a JSON Schema document) admits.
Grammar json_schema_grammar(std::string_view schema_json);

// response_format {"type": "json_object"}: any JSON object (the schema {"type": "object"}).
Grammar json_object_grammar();

}  // namespace g4::grammar
