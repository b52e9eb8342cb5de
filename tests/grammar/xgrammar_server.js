// xgrammar (@mlc-ai/web-xgrammar, WebAssembly) as the oracle of test_grammar: one node process
// answers commands, one JSON object a line on stdin, one JSON object a line on stdout.
//   {"op":"vocab","file":F,"vocab_size":N,"stop":[ids]}  F: a JSON list of token strings
//                                                        (tokenizer.json's, byte_fallback)
//   {"op":"compile","schema":S}   compileJSONSchema(S, anyWhitespace=false, indent=-1,
//                                 separators [",", ":"], strictMode=false) and a fresh matcher
//   {"op":"mask"}                 {"mask": base64 of the bitmask's 32-bit little-endian words}
//   {"op":"accept","token":T}     {"accepted": bool, "terminated": bool}
// Errors answer {"error": message}.
//   node xgrammar_server.js NODE_MODULES
"use strict";
const fs = require("fs");
const path = require("path");
const readline = require("readline");

// The package is a UMD bundle under "type": "module"; load it as the CommonJS it is.
const file = path.join(process.argv[2], "@mlc-ai", "web-xgrammar", "lib", "index.js");
const mod = { exports: {} };
new Function("exports", "require", "module", "__filename", "__dirname", fs.readFileSync(file, "utf8"))(
  mod.exports, require, mod, file, path.dirname(file));
const xg = mod.exports;

let tokenizerInfo = null, compiler = null, matcher = null, stop = [];

async function handle(cmd) {
  switch (cmd.op) {
    case "vocab": {
      const vocab = JSON.parse(fs.readFileSync(cmd.file, "utf8"));
      stop = cmd.stop;
      tokenizerInfo = await xg.TokenizerInfo.createTokenizerInfo(vocab, "byte_fallback", false, cmd.vocab_size, cmd.stop);
      compiler = await xg.GrammarCompiler.createGrammarCompiler(tokenizerInfo);
      return { ok: true };
    }
    case "compile": {
      const compiled = await compiler.compileJSONSchema(cmd.schema, false, -1, [",", ":"], false);
      matcher = await xg.GrammarMatcher.createGrammarMatcher(compiled, stop);
      return { ok: true };
    }
    case "mask": {
      const mask = await matcher.getNextTokenBitmask();
      return { mask: Buffer.from(mask.buffer, mask.byteOffset, mask.byteLength).toString("base64") };
    }
    case "accept": {
      const accepted = matcher.acceptToken(cmd.token);
      return { accepted, terminated: matcher.isTerminated() };
    }
    default:
      return { error: "unknown op " + cmd.op };
  }
}

const lines = readline.createInterface({ input: process.stdin });
let queue = Promise.resolve();
lines.on("line", (line) => {
  queue = queue.then(async () => {
    let reply;
    try {
      reply = await handle(JSON.parse(line));
    } catch (e) {
      reply = { error: String(e && e.message ? e.message : e) };
    }
    process.stdout.write(JSON.stringify(reply) + "\n");
  });
});
// The WebAssembly runtime keeps node alive; end with stdin.
lines.on("close", () => queue.then(() => process.exit(0)));
