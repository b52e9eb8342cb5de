// Reference chat renderings for test_chat_template_jinja: @huggingface/jinja renders the official
// template for each conversation, once with the template's default (enable_thinking undefined)
// and once with enable_thinking=false.
// usage: node render_chat_template.js NODE_MODULES_DIR TEMPLATE INPUTS_JSON OUTPUT_JSON
// INPUTS_JSON is an array of message arrays; OUTPUT_JSON gets the package version and the renderings.
"use strict";
const fs = require("fs");
const path = require("path");

const [nodeModules, templatePath, inputsPath, outputPath] = process.argv.slice(2);
const packageDir = path.join(nodeModules, "@huggingface", "jinja");
const { Template } = require(packageDir);
const template = new Template(fs.readFileSync(templatePath, "utf8"));

const conversations = JSON.parse(fs.readFileSync(inputsPath, "utf8"));
const render = (messages, extra) =>
  template.render({ messages, bos_token: "<bos>", add_generation_prompt: true, ...extra });
fs.writeFileSync(
  outputPath,
  JSON.stringify({
    version: JSON.parse(fs.readFileSync(path.join(packageDir, "package.json"), "utf8")).version,
    template_default: conversations.map((messages) => render(messages, {})),
    thinking_off: conversations.map((messages) => render(messages, { enable_thinking: false })),
  }),
);
