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
#include <string_view>

#include "grammar/grammar.h"

namespace g4::grammar {

// The grammar of the JSON values `schema_json` (a JSON Schema document) admits.
Grammar json_schema_grammar(std::string_view schema_json);

// response_format {"type": "json_object"}: any JSON object (the schema {"type": "object"}).
Grammar json_object_grammar();

}  // namespace g4::grammar
