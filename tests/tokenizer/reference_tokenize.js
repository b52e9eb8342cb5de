// Reference token ids for test_tokenizer_gemma: runs @lenml/tokenizers (a port of
// transformers.js' tokenizers) on the same tokenizer.json our C++ loads.
// usage: node reference_tokenize.js NODE_MODULES_DIR TOKENIZER_JSON TOKENIZER_CONFIG_JSON INPUTS_JSON OUTPUT_JSON
// INPUTS_JSON is an array of strings; OUTPUT_JSON gets, per input, the ids without special
// tokens added and their decoded text, plus facts about the implementation that the test checks.
"use strict";
const fs = require("fs");
const path = require("path");

const [nodeModules, tokenizerPath, configPath, inputsPath, outputPath] = process.argv.slice(2);
const lenml = path.join(nodeModules, "@lenml", "tokenizers");
const { TokenizerLoader } = require(lenml);
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(tokenizerPath, "utf8")),
  tokenizerConfig: JSON.parse(fs.readFileSync(configPath, "utf8")),
});

const inputs = JSON.parse(fs.readFileSync(inputsPath, "utf8"));
const results = inputs.map((text) => {
  const ids = tokenizer.encode(text, { add_special_tokens: false });
  // lenml's decode rejects an empty id list; the text of no tokens is "".
  const decoded = ids.length === 0 ? "" : tokenizer.decode(ids, { skip_special_tokens: false });
  return { ids, decoded };
});

fs.writeFileSync(
  outputPath,
  JSON.stringify({
    implementation: {
      package: "@lenml/tokenizers",
      version: require(path.join(lenml, "package.json")).version,
      tokenizer_class: tokenizer.constructor.name,
      // What encode() gives with its default add_special_tokens = true (the post-processor's <bos>).
      default_ids_of_hello: tokenizer.encode("Hello"),
    },
    results,
  })
);
