// The official `openai` npm client against a g4 serve started by test_serve_clients.cpp
// (docs/DESIGN.md §8). Two modes:
//   conformance: chat and text completions, whole and streamed (with the usage chunk), a tool-call
//     round trip, seed reproducibility, several choices (n), logprobs, and every error status with OpenAI's error body;
//     prints a transcript, exits 1 at the first failed check.
//   load: CLIENTS concurrent streaming clients send REQUESTS requests in total with random
//     parameters, some hanging up mid-stream; every request that is not abandoned must succeed.
//     Prints a JSON summary; exits 1 when any request failed.
// usage: node openai_client.js NODE_MODULES BASE_URL API_KEY conformance
//        node openai_client.js NODE_MODULES BASE_URL API_KEY load CLIENTS REQUESTS SEED
"use strict";
const assert = require("node:assert/strict");
const path = require("path");

const [nodeModules, baseURL, apiKey, mode, ...rest] = process.argv.slice(2);
const { OpenAI } = require(path.join(nodeModules, "openai"));
const client = (key = apiKey) => new OpenAI({ baseURL: baseURL + "/v1", apiKey: key, maxRetries: 0, timeout: 120000 });
const model = "g4-demo";
const user = (content) => [{ role: "user", content }];

const tools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "The current weather in a city",
      parameters: {
        type: "object",
        properties: { city: { type: "string", description: "The city" } },
        required: ["city"],
      },
    },
  },
];

async function streamedChat(params) {
  const stream = await client().chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let content = "", finish = null, usage = null, role = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    if (chunk.choices.length === 0) continue;
    const choice = chunk.choices[0];
    if (choice.delta.role) role = choice.delta.role;
    content += choice.delta.content ?? "";
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  return { content, finish, usage, role };
}

async function expectError(promise, status, check) {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof OpenAI.APIError, `expected an APIError, got ${error}`);
    assert.equal(error.status, status, error.message);
    assert.equal(typeof error.error?.message, "string", "an OpenAI error body: {error: {message, type, param, code}}");
    assert.ok("type" in error.error && "param" in error.error && "code" in error.error);
    if (check) check(error);
    return error;
  }
  assert.fail(`expected HTTP ${status}`);
}

const checks = {
  async chat() {
    const params = { model, messages: user("Tell me a fortune about computers."), max_tokens: 12, temperature: 0 };
    const whole = await client().chat.completions.create(params);
    assert.equal(whole.object, "chat.completion");
    assert.equal(whole.model, model);
    const message = whole.choices[0].message;
    assert.equal(message.role, "assistant");
    assert.ok(message.content.length > 0);
    assert.ok(["stop", "length"].includes(whole.choices[0].finish_reason));
    assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens);
    const streamed = await streamedChat(params);
    assert.equal(streamed.role, "assistant");
    assert.equal(streamed.content, message.content, "streamed = whole");
    assert.equal(streamed.finish, whole.choices[0].finish_reason);
    assert.deepEqual(streamed.usage, whole.usage, "the usage chunk");
    return `chat: ${JSON.stringify(message.content)} (${whole.choices[0].finish_reason}); streamed the same`;
  },

  async completions() {
    const params = { model, prompt: "Once upon a time", max_tokens: 10, temperature: 0 };
    const whole = await client().completions.create(params);
    assert.equal(whole.object, "text_completion");
    const stream = await client().completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
    let text = "", usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices) text += choice.text;
    }
    assert.equal(text, whole.choices[0].text);
    assert.deepEqual(usage, whole.usage);
    return `completions: ${JSON.stringify(whole.choices[0].text)}; streamed the same`;
  },

  // call → tool result → answer. The demo model is not trained for tools: when it does not call
  // the tool itself, the assistant turn that holds the call is written here (the parser's side is
  // tested in test_output_parser and test_serve).
  async toolRoundTrip() {
    const question = user("What is the weather in Paris? Use the tool.");
    const first = await client().chat.completions.create({ model, messages: question, tools, max_tokens: 16, temperature: 0 });
    const reply = first.choices[0];
    let call = reply.message.tool_calls?.[0];
    if (call) {
      assert.equal(reply.finish_reason, "tool_calls");
      JSON.parse(call.function.arguments);
    } else {
      call = { id: "call_weather_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } };
    }
    const messages = [
      ...question,
      { role: "assistant", content: null, tool_calls: [call] },
      { role: "tool", tool_call_id: call.id, content: JSON.stringify({ temperature: 21, sky: "clear" }) },
    ];
    const answer = await client().chat.completions.create({ model, messages, tools, max_tokens: 12, temperature: 0 });
    assert.equal(answer.choices[0].message.role, "assistant");
    assert.ok(["stop", "length", "tool_calls"].includes(answer.choices[0].finish_reason));
    const streamed = await streamedChat({ model, messages, tools, max_tokens: 12, temperature: 0 });
    assert.equal(streamed.content, answer.choices[0].message.content ?? "");
    const none = await client().chat.completions.create({ model, messages, tools, tool_choice: "none", max_tokens: 4 });
    assert.equal(none.object, "chat.completion");
    return `tool round trip: the model ${reply.message.tool_calls ? "called" : "did not call"} get_weather; ` +
      `answer after the result: ${JSON.stringify(answer.choices[0].message.content)}`;
  },

  async seeds() {
    const ask = (seed) =>
      client()
        .chat.completions.create({ model, messages: user("Tell me a story."), max_tokens: 16, temperature: 1.0, seed })
        .then((r) => r.choices[0].message.content);
    const a = await ask(42), b = await ask(42);
    assert.equal(a, b, "the same seed, the same text");
    const others = await Promise.all([1, 2, 3, 4].map(ask));
    assert.ok(others.some((text) => text !== a), "different seeds, different texts");
    return `seeds: 42 twice → ${JSON.stringify(a)}; seeds 1-4 differ`;
  },

  // n: 3 samples of one prompt, whole and streamed (each chunk names its choice), reproducible.
  async choices() {
    const params = { model, messages: user("Tell me a story."), max_tokens: 12, temperature: 1.0, seed: 42, n: 3 };
    const whole = await client().chat.completions.create(params);
    assert.deepEqual(whole.choices.map((c) => c.index), [0, 1, 2]);
    const texts = whole.choices.map((c) => c.message.content);
    const single = await client().chat.completions.create({ ...params, n: 1 });
    assert.equal(texts[0], single.choices[0].message.content, "choice 0 is the reply of n = 1");
    assert.equal(whole.usage.prompt_tokens, single.usage.prompt_tokens, "the prompt counted once");
    assert.ok(new Set(texts).size > 1, "the choices sampled alike");
    const again = await client().chat.completions.create(params);
    assert.deepEqual(again.choices.map((c) => c.message.content), texts, "the same seed, the same choices");
    const stream = await client().chat.completions.create({ ...params, stream: true });
    const streamed = ["", "", ""];
    for await (const chunk of stream) for (const c of chunk.choices) streamed[c.index] += c.delta.content ?? "";
    assert.deepEqual(streamed, texts, "streamed = whole, choice by choice");
    return `choices: n = 3 → ${JSON.stringify(texts)}; streamed the same`;
  },

  async logprobs() {
    const r = await client().chat.completions.create({
      model, messages: user("Hello"), max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 2,
    });
    const content = r.choices[0].logprobs.content;
    assert.equal(content.length, r.usage.completion_tokens);
    for (const t of content) {
      assert.ok(t.logprob <= 0);
      assert.equal(t.top_logprobs.length, 2);
      assert.equal(t.token, t.top_logprobs[0].token, "greedy draws the most likely token");
    }
    return `logprobs: ${content.map((t) => `${JSON.stringify(t.token)} ${t.logprob.toFixed(3)}`).join(", ")}`;
  },

  async errors() {
    const lines = [];
    const note = (e) => lines.push(`${e.status} ${e.error.code ?? e.error.type}: ${e.error.message}`);
    note(await expectError(client("wrong-key").chat.completions.create({ model, messages: user("hi") }), 401,
      (e) => assert.equal(e.error.code, "invalid_api_key")));
    note(await expectError(client().chat.completions.create({ model: "gpt-9", messages: user("hi") }), 404,
      (e) => assert.equal(e.error.code, "model_not_found")));
    note(await expectError(client().chat.completions.create({ model, messages: user("hi"), n: 0 }), 400,
      (e) => assert.equal(e.error.param, "n")));
    note(await expectError(client().chat.completions.create({ model, messages: user("hi"), temperature: 9 }), 400,
      (e) => assert.equal(e.error.param, "temperature")));
    note(await expectError(client().chat.completions.create({ model, messages: user("word ".repeat(3000)) }), 400,
      (e) => assert.equal(e.error.code, "context_length_exceeded")));
    note(await expectError(client().chat.completions.create({ model, messages: user("x".repeat(200000)) }), 413,
      (e) => assert.equal(e.error.code, "request_too_large")));
    // More requests at once than sessions and queue places: some are answered 429 with Retry-After.
    const results = await Promise.allSettled(
      Array.from({ length: 24 }, () => client().completions.create({ model, prompt: "The sea", max_tokens: 48, temperature: 0 })));
    const busy = results.filter((r) => r.status === "rejected");
    assert.ok(busy.length > 0, "a full queue answers 429");
    for (const r of busy) {
      assert.equal(r.reason.status, 429, String(r.reason));
      assert.equal(r.reason.headers.get("retry-after"), "1");
      assert.equal(r.reason.error.code, "server_busy");
    }
    note(busy[0].reason);
    return `errors:\n  ${lines.join("\n  ")}`;
  },
};

async function conformance() {
  for (const [name, check] of Object.entries(checks)) {
    try {
      console.log(await check());
    } catch (error) {
      console.error(`FAILED ${name}: ${error.stack ?? error}`);
      process.exit(1);
    }
  }
}

// A small deterministic generator, so every run sends the same requests.
function random(seed) {
  let state = BigInt(seed) & 0xffffffffffffffffn;
  return () => {
    state = (state * 6364136223846793005n + 1442695040888963407n) & 0xffffffffffffffffn;
    return Number(state >> 33n) / 2 ** 31;
  };
}

async function load(clients, total, seed) {
  const next = random(seed);
  const pick = (list) => list[Math.floor(next() * list.length)];
  const prompts = ["Tell me a fortune.", "The sea", "Once upon a time", "Write a poem about rain.", "héllo wörld 日本語"];
  let issued = 0;
  const summary = { requests: 0, completed: 0, abandoned: 0, failures: 0, errors: [] };
  async function one() {
    const chat = next() < 0.6;
    const params = {
      model, stream: true, max_tokens: 1 + Math.floor(next() * 8),
      temperature: pick([0, 0.5, 1.0, 1.3]), top_p: pick([1, 0.9, 0.5]), seed: Math.floor(next() * 1e9),
      ...(next() < 0.3 ? { stop: [pick(["e", " the", "\n", "zz"])] } : {}),
      ...(next() < 0.5 ? { stream_options: { include_usage: true } } : {}),
    };
    if (chat && next() < 0.2) Object.assign(params, { logprobs: true, top_logprobs: 3 });
    if (chat && next() < 0.2) params.tools = tools;
    const hangUpAfter = next() < 0.2 ? Math.floor(next() * 3) : -1;  // chunks before hanging up
    const controller = new AbortController();
    summary.requests++;
    try {
      const stream = chat
        ? await client().chat.completions.create({ ...params, messages: user(pick(prompts)) }, { signal: controller.signal })
        : await client().completions.create({ ...params, prompt: pick(prompts) }, { signal: controller.signal });
      let chunks = 0, finish = null;
      for await (const chunk of stream) {
        if (chunks++ === hangUpAfter) {
          controller.abort();
          break;
        }
        for (const choice of chunk.choices) finish = choice.finish_reason ?? finish;
      }
      if (controller.signal.aborted) {
        summary.abandoned++;
        return;
      }
      if (!finish) throw new Error("the stream ended without a finish_reason");
      summary.completed++;
    } catch (error) {
      if (controller.signal.aborted) {
        summary.abandoned++;
        return;
      }
      summary.failures++;
      if (summary.errors.length < 5) summary.errors.push(String(error));
    }
  }
  async function worker() {
    while (issued < total) {
      issued++;
      await one();
    }
  }
  await Promise.all(Array.from({ length: clients }, worker));
  console.log(JSON.stringify(summary));
  if (summary.failures > 0 || summary.requests !== total) process.exit(1);
}

if (mode === "conformance") conformance();
else if (mode === "load") load(Number(rest[0]), Number(rest[1]), Number(rest[2]));
else {
  console.error(`unknown mode ${mode}`);
  process.exit(2);
}
