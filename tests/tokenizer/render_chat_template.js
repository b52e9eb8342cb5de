// Reference chat renderings for test_chat_template_jinja: @huggingface/jinja renders the official
// template for each conversation: {messages, tools?, enable_thinking?, add_generation_prompt}, the
// keys the template reads (an absent enable_thinking is the template's default).
// usage: node render_chat_template.js NODE_MODULES_DIR TEMPLATE INPUTS_JSON OUTPUT_JSON
// INPUTS_JSON is an array of conversations; OUTPUT_JSON gets the package version and the renderings
// (a string each, or {"error": message} where the engine refused the input).
"use strict";
const fs = require("fs");
const path = require("path");

const [nodeModules, templatePath, inputsPath, outputPath] = process.argv.slice(2);
const packageDir = path.join(nodeModules, "@huggingface", "jinja");
const { Template } = require(packageDir);
const template = new Template(fs.readFileSync(templatePath, "utf8"));

const render = (conversation) => {
  try {
    return template.render({ bos_token: "<bos>", ...conversation });
  } catch (error) {
    return { error: String(error) };
  }
};
const conversations = JSON.parse(fs.readFileSync(inputsPath, "utf8"));
fs.writeFileSync(
  outputPath,
  JSON.stringify({
    version: JSON.parse(fs.readFileSync(path.join(packageDir, "package.json"), "utf8")).version,
    renderings: conversations.map(render),
  }),
);
