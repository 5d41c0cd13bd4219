// The OpenAI API fields of docs/api.md against the bundled model, in both serving modes:
// `tandem serve` (disaggregated: 1 prefill + 1 decode worker) and `tandem serve --aggregated`,
// each also with speculative decoding (n-gram drafts, the bundled draft model). Every request
// runs in every mode; each answer is checked for what the field promises, and the modes must
// give the same bytes (greedy; seeded sampling too). Env: TANDEM_BIN, TANDEM_MODEL_DIR (models/target),
// E2E_LOG_DIR.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { ServeStack, loadOpenAI } from './stack.mjs';

const OpenAI = await loadOpenAI();

const tandem = process.env.TANDEM_BIN;
const model = process.env.TANDEM_MODEL_DIR;
const logDir = process.env.E2E_LOG_DIR ?? fs.mkdtempSync('/tmp/tandem-conformance-');
assert.ok(tandem && fs.existsSync(tandem), `TANDEM_BIN not found: ${tandem}`);
assert.ok(model && fs.existsSync(path.join(model, 'config.json')), `no model at ${model}`);
const modelName = path.basename(model);

// Speculative decoding must not change a byte (docs/speculative.md): the suite also runs with
// the n-gram drafter (disaggregated) and with the bundled draft model beside the target
// (models/draft; aggregated).
const draftDir = path.join(path.dirname(model), 'draft');
assert.ok(fs.existsSync(path.join(draftDir, 'config.json')), `no draft model at ${draftDir}`);
const modes = {
  disaggregated: new ServeStack({ tandem, model, logDir: path.join(logDir, 'disaggregated') }),
  aggregated: new ServeStack({ tandem, model, aggregated: true,
                               logDir: path.join(logDir, 'aggregated') }),
  'speculative-ngram': new ServeStack({ tandem, model,
                                        logDir: path.join(logDir, 'speculative-ngram'),
                                        extraArgs: ['--speculative', 'ngram'] }),
  'speculative-draft': new ServeStack({
    tandem, model, aggregated: true, logDir: path.join(logDir, 'speculative-draft'),
    extraArgs: ['--speculative', `draft:${draftDir}`, '--num-speculative-tokens', '3'] }),
};
const clients = {};

before(async () => {
  await Promise.all(Object.values(modes).map((m) => m.start()));
  for (const [name, m] of Object.entries(modes)) {
    clients[name] = new OpenAI({ baseURL: m.baseURL, apiKey: 'unused', maxRetries: 0,
                                 timeout: 120000 });
  }
});

after(async () => {
  await Promise.all(Object.values(modes).map((m) => m.stop()));
});

// Runs `fn(client, mode)` in every mode; asserts the answers are identical; returns one.
async function inBothModes(fn) {
  const answers = {};
  for (const name of Object.keys(modes)) answers[name] = await fn(clients[name], name);
  const [first, ...rest] = Object.keys(answers);
  for (const name of rest) {
    assert.deepEqual(answers[name], answers[first], `${name} differs from ${first}`);
  }
  return answers[first];
}

const complete = (client, body) =>
  client.completions.create({ model: modelName, temperature: 0, ...body });
const chat = (client, body) =>
  client.chat.completions.create({ model: modelName, temperature: 0, ...body });
const hello = [{ role: 'user', content: 'Hello!' }];

test('min_tokens: EOS cannot end the answer before min_tokens tokens', async () => {
  const plain = await inBothModes(async (c) => {
    const r = await chat(c, { messages: hello, max_tokens: 60 });
    return { text: r.choices[0].message.content, tokens: r.usage.completion_tokens,
             finish: r.choices[0].finish_reason };
  });
  const min = Math.min(plain.tokens + 10, 60);
  const longer = await inBothModes(async (c) => {
    const r = await chat(c, { messages: hello, max_tokens: 60, min_tokens: min });
    return { text: r.choices[0].message.content, tokens: r.usage.completion_tokens };
  });
  assert.ok(longer.tokens >= min, `${longer.tokens} tokens with min_tokens ${min}`);
  if (plain.finish === 'stop') assert.ok(longer.text.startsWith(plain.text.slice(0, 8)));
});

test('logit_bias: +100 on one token makes greedy pick it every time', async () => {
  const base = await inBothModes(async (c) => {
    const r = await complete(c, { prompt: 'The weather today', max_tokens: 1, logprobs: 1 });
    return r.choices[0].logprobs.tokens[0];
  });
  const biased = await inBothModes(async (c) => {
    const r = await complete(c, { prompt: 'The weather today', max_tokens: 4, logprobs: 1,
                                  logit_bias: { 1000: 100 } });
    return r.choices[0].logprobs.tokens;
  });
  assert.equal(new Set(biased).size, 1, `tokens ${JSON.stringify(biased)}`);
  assert.notEqual(biased[0], base);
  await inBothModes(async (c) => {
    await assert.rejects(complete(c, { prompt: 'x', logit_bias: { 1000: 101 } }),
                         (e) => e.status === 400 && e.error?.param === 'logit_bias');
    return true;
  });
});

test('allowed_token_ids: only those tokens are sampled, also with temperature', async () => {
  const tokens = await inBothModes(async (c) => {
    const r = await complete(c, { prompt: 'Once upon a time', max_tokens: 8, logprobs: 0,
                                  temperature: 1, seed: 7, allowed_token_ids: [1000, 2000] });
    return r.choices[0].logprobs.tokens;
  });
  const one = await inBothModes(async (c) => {
    const r = await complete(c, { prompt: 'x', max_tokens: 1, logprobs: 0,
                                  allowed_token_ids: [1000] });
    return r.choices[0].logprobs.tokens[0];
  });
  const two = await inBothModes(async (c) => {
    const r = await complete(c, { prompt: 'x', max_tokens: 1, logprobs: 0,
                                  allowed_token_ids: [2000] });
    return r.choices[0].logprobs.tokens[0];
  });
  for (const t of tokens) assert.ok(t === one || t === two, `${JSON.stringify(t)} not allowed`);
});

test('stop strings: include_stop_str_in_output keeps the match', async () => {
  const full = await inBothModes(async (c) =>
    (await complete(c, { prompt: 'Once upon a time', max_tokens: 24 })).choices[0].text);
  assert.ok(full.length > 8, `short text ${JSON.stringify(full)}`);
  const stop = full.slice(4, 7);
  const at = full.indexOf(stop);
  const [dropped, kept] = await inBothModes(async (c) => {
    const a = await complete(c, { prompt: 'Once upon a time', max_tokens: 24, stop });
    const b = await complete(c, { prompt: 'Once upon a time', max_tokens: 24, stop,
                                  include_stop_str_in_output: true });
    return [a.choices[0], b.choices[0]];
  });
  assert.equal(dropped.text, full.slice(0, at));
  assert.equal(kept.text, full.slice(0, at + stop.length));
  assert.equal(dropped.finish_reason, 'stop');
  assert.equal(kept.finish_reason, 'stop');
});

test('batched prompts: one choice per prompt, each equal to its own request', async () => {
  const prompts = ['Hello', 'The capital of France is', 'Once upon a time'];
  const batched = await inBothModes(async (c) => {
    const r = await complete(c, { prompt: prompts, max_tokens: 6 });
    return { texts: r.choices.map((ch) => [ch.index, ch.text]), usage: r.usage.prompt_tokens };
  });
  let promptTokens = 0;
  for (let i = 0; i < prompts.length; ++i) {
    const one = await complete(clients.disaggregated, { prompt: prompts[i], max_tokens: 6 });
    assert.deepEqual(batched.texts[i], [i, one.choices[0].text]);
    promptTokens += one.usage.prompt_tokens;
  }
  assert.equal(batched.usage, promptTokens);
});

test('continue_final_message and chat_template_kwargs', async () => {
  const messages = [{ role: 'user', content: 'Tell me a story.' },
                    { role: 'assistant', content: 'Once upon a time' }];
  const [continued, closed] = await inBothModes(async (c) => {
    const a = await chat(c, { messages, max_tokens: 8, add_generation_prompt: false,
                              continue_final_message: true });
    const b = await chat(c, { messages, max_tokens: 8 });
    return [a.choices[0].message.content, b.choices[0].message.content];
  });
  assert.notEqual(continued, closed);
  await inBothModes(async (c) => {
    const r = await chat(c, { messages: hello, max_tokens: 2,
                              chat_template_kwargs: { date_string: '01 Jan 2025' } });
    assert.equal(r.choices.length, 1);
    await assert.rejects(chat(c, { messages, continue_final_message: true }),
                         (e) => e.status === 400 && e.error?.param === 'continue_final_message');
    return true;
  });
});

test('guided_choice and guided_regex: every output is a match, also sampled, in both modes',
     async () => {
  const choices = ['positive', 'negative', 'neutral'];
  const picked = await inBothModes(async (c) => {
    const r = await complete(c, { prompt: 'The review was great. Sentiment:', max_tokens: 20,
                                  n: 3, temperature: 1, seed: 11, guided_choice: choices });
    return r.choices.map((ch) => [ch.text, ch.finish_reason]);
  });
  for (const [text, finish] of picked) {
    assert.ok(choices.includes(text), `${JSON.stringify(text)} is not a choice`);
    assert.equal(finish, 'stop');
  }
  const pattern = '[0-9]{3}-[0-9]{4}';
  const phones = await inBothModes(async (c) => {
    const r = await chat(c, { messages: [{ role: 'user', content: 'A phone number, please.' }],
                              max_tokens: 20, n: 2, temperature: 0.8, seed: 3,
                              structured_outputs: { regex: pattern } });
    return r.choices.map((ch) => ch.message.content);
  });
  for (const text of phones) assert.match(text, new RegExp(`^${pattern}$`));
  // Streamed, the deltas join to a match too.
  const stream = await chat(clients.disaggregated, {
    messages: [{ role: 'user', content: 'Pick one.' }], max_tokens: 20, stream: true,
    guided_regex: '(red|green|blue)!' });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  assert.match(text, /^(red|green|blue)!$/);
  await inBothModes(async (c) => {
    await assert.rejects(complete(c, { prompt: 'x', guided_regex: '(?=a)b' }),
                         (e) => e.status === 400 && e.error?.param === 'guided_regex');
    return true;
  });
});

test('guided_grammar: GBNF outputs are sentences of the grammar, sampled, in both modes',
     async () => {
  // Arithmetic with nested parentheses (recursive; every output parses).
  const grammar = [
    'root ::= expr',
    'expr ::= term (("+" | "-") term)*',
    'term ::= num | "(" expr ")"',
    'num ::= [1-9] [0-9]{0,2}',
  ].join('\n');
  const outputs = await inBothModes(async (c) => {
    const r = await complete(c, { prompt: 'Arithmetic:', max_tokens: 40, n: 4, temperature: 1,
                                  seed: 21, guided_grammar: grammar });
    const s = await chat(c, { messages: hello, max_tokens: 40, temperature: 0,
                              structured_outputs: { grammar } });
    return [...r.choices.map((ch) => [ch.text, ch.finish_reason]),
            [s.choices[0].message.content, s.choices[0].finish_reason]];
  });
  // An independent recognizer of the same language.
  const parse = (t) => {
    let i = 0;
    const num = () => { const m = /^[1-9][0-9]{0,2}/.exec(t.slice(i)); if (!m) return false;
                        i += m[0].length; return true; };
    const term = () => { if (t[i] === '(') { i++; if (!expr() || t[i] !== ')') return false;
                                             i++; return true; } return num(); };
    const expr = () => { if (!term()) return false;
                         while (t[i] === '+' || t[i] === '-') { i++; if (!term()) return false; }
                         return true; };
    return expr() && i === t.length;
  };
  for (const [text, finish] of outputs) {
    if (finish === 'stop') assert.ok(parse(text), `${JSON.stringify(text)} is not in the grammar`);
    else assert.equal(finish, 'length');
  }
  // Recursion is not bounded: with '(' pushed to the top, the output opens 30 levels deep and
  // is still a prefix of a sentence (a depth-bounded automaton would have to close by now).
  const deep = await inBothModes(async (c, name) => {
    const root = modes[name].baseURL.replace(/\/v1$/, '');
    const tok = await (await fetch(`${root}/tokenize`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: '(', add_special_tokens: false }) })).json();
    assert.equal(tok.tokens.length, 1);
    const r = await complete(c, { prompt: 'Nest:', max_tokens: 30, guided_grammar:
      'root ::= "(" root ")" | "x"', logit_bias: { [tok.tokens[0]]: 100 } });
    return [r.choices[0].text, r.choices[0].finish_reason];
  });
  assert.deepEqual(deep, ['('.repeat(30), 'length']);
  await inBothModes(async (c) => {
    await assert.rejects(complete(c, { prompt: 'x', guided_grammar: 'root ::= root "a" | "b"' }),
                         (e) => e.status === 400 && /left-recursive/.test(e.error?.message));
    await assert.rejects(complete(c, { prompt: 'x', guided_grammar: 'root ::= missing' }),
                         (e) => e.status === 400 && e.error?.param === 'guided_grammar' &&
                                /'missing' is not defined/.test(e.error?.message));
    return true;
  });
});

test('JSON Schema outputs: every output parses and validates, sampled, streamed, in both modes',
     async () => {
  const schema = {
    type: 'object',
    properties: {
      name: { type: 'string', minLength: 1, maxLength: 8 },
      age: { type: 'integer', minimum: 0, maximum: 120 },
      tags: { type: 'array', items: { enum: ['a', 'b'] }, maxItems: 2 },
    },
    required: ['name', 'age'],
    additionalProperties: false,
  };
  // What the schema says, checked by hand (check.py checks the compiler against jsonschema).
  const validate = (text) => {
    const v = JSON.parse(text);
    assert.deepEqual(Object.keys(v).slice(0, 2), ['name', 'age'], text);
    assert.ok(Object.keys(v).every((k) => k in schema.properties), text);
    assert.ok(typeof v.name === 'string' && [...v.name].length >= 1 && [...v.name].length <= 8,
              text);
    assert.ok(Number.isInteger(v.age) && v.age >= 0 && v.age <= 120, text);
    if ('tags' in v) {
      assert.ok(Array.isArray(v.tags) && v.tags.length <= 2 &&
                v.tags.every((t) => t === 'a' || t === 'b'), text);
    }
    return v;
  };
  const rf = { type: 'json_schema', json_schema: { name: 'person', schema, strict: true } };
  const outputs = await inBothModes(async (c) => {
    const r = await chat(c, { messages: [{ role: 'user', content: 'A person, as JSON.' }],
                              max_tokens: 200, n: 3, temperature: 1, seed: 5,
                              response_format: rf });
    const g = await complete(c, { prompt: 'Person:', max_tokens: 200, temperature: 0,
                                  guided_json: schema });
    return [...r.choices.map((ch) => [ch.message.content, ch.finish_reason]),
            [g.choices[0].text, g.choices[0].finish_reason]];
  });
  for (const [text, finish] of outputs) {
    assert.equal(finish, 'stop', text);
    validate(text);
  }
  const stream = await chat(clients.disaggregated, {
    messages: [{ role: 'user', content: 'JSON.' }], max_tokens: 200, stream: true, temperature: 0.7,
    seed: 9, structured_outputs: { json: schema } });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  validate(text);
  // json_object: an object, whenever the output is complete.
  const objects = await inBothModes(async (c) => {
    const r = await chat(c, { messages: hello, max_tokens: 64, n: 2, temperature: 1, seed: 2,
                              response_format: { type: 'json_object' } });
    return r.choices.map((ch) => [ch.message.content, ch.finish_reason]);
  });
  for (const [t, finish] of objects) {
    if (finish === 'stop') assert.equal(typeof JSON.parse(t), 'object', t);
    else assert.ok(t.startsWith('{'), t);
  }
  await inBothModes(async (c) => {
    await assert.rejects(
      chat(c, { messages: hello, guided_json: { type: 'string', pattern: '^a' } }),
      (e) => e.status === 400 && e.error?.param === 'guided_json' &&
             e.error?.code === 'unsupported_parameter' && /'pattern'/.test(e.error?.message));
    return true;
  });
});

test('tool calling: forced calls parse and validate, stream the same, and round-trip', async () => {
  const tools = [
    { type: 'function', function: { name: 'get_weather', description: 'Current weather',
      parameters: { type: 'object', properties: {
        city: { type: 'string', enum: ['Paris', 'Tokyo', 'Lima'] },
        days: { type: 'integer', minimum: 1, maximum: 7 } },
        required: ['city', 'days'], additionalProperties: false } } },
    { type: 'function', function: { name: 'get_time', parameters: { type: 'object',
      properties: { zone: { type: 'string', maxLength: 12 } }, required: ['zone'],
      additionalProperties: false } } },
  ];
  const validArgs = (name, text) => {
    const a = JSON.parse(text);
    if (name === 'get_weather') {
      assert.deepEqual(Object.keys(a), ['city', 'days'], text);
      assert.ok(['Paris', 'Tokyo', 'Lima'].includes(a.city), text);
      assert.ok(Number.isInteger(a.days) && a.days >= 1 && a.days <= 7, text);
    } else {
      assert.equal(name, 'get_time');
      assert.deepEqual(Object.keys(a), ['zone'], text);
      assert.ok([...a.zone].length <= 12, text);
    }
    return a;
  };
  const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const named = { type: 'function', function: { name: 'get_weather' } };
  const answers = await inBothModes(async (c) => {
    const one = await chat(c, { messages: ask, tools, tool_choice: named, max_tokens: 100,
                                n: 3, temperature: 1, seed: 11 });
    const req = await chat(c, { messages: ask, tools, tool_choice: 'required', max_tokens: 200,
                                n: 2, temperature: 1, seed: 3 });
    const strip = (r) => r.choices.map((ch) => ({
      content: ch.message.content, finish: ch.finish_reason,
      calls: (ch.message.tool_calls ?? []).map((t) => {
        assert.match(t.id, /^call_[A-Za-z0-9]{24}$/);
        assert.equal(t.type, 'function');
        return [t.function.name, t.function.arguments];
      }) }));
    // The message as a client appends it to the history (ids are random: pinned to compare).
    const m = one.choices[0].message;
    const message = { ...m, tool_calls: m.tool_calls.map((t) => ({ ...t, id: 'call_pinned' })) };
    return { one: strip(one), req: strip(req), message };
  });
  for (const ch of answers.one) {
    assert.equal(ch.finish, 'stop');
    assert.equal(ch.content, null);
    assert.equal(ch.calls.length, 1);
    assert.equal(ch.calls[0][0], 'get_weather');
    validArgs(...ch.calls[0]);
  }
  for (const ch of answers.req) {
    if (ch.finish === 'length') continue;  // a list cut short is content, checked below
    assert.equal(ch.finish, 'tool_calls');
    assert.ok(ch.calls.length >= 1);
    for (const call of ch.calls) validArgs(...call);
  }
  // Streamed (the SDK's own accumulation): the same calls as the non-streamed answer.
  const stream = await chat(clients.disaggregated, { messages: ask, tools, tool_choice: named,
    max_tokens: 100, n: 3, temperature: 1, seed: 11, stream: true });
  const streamed = {};
  for await (const chunk of stream) {
    for (const ch of chunk.choices) {
      for (const t of ch.delta?.tool_calls ?? []) {
        const acc = (streamed[ch.index] ??= {});
        if (t.id) acc.name = t.function.name;
        acc.arguments = (acc.arguments ?? '') + (t.function?.arguments ?? '');
      }
    }
  }
  assert.deepEqual(Object.keys(streamed).sort().map((i) => [streamed[i].name, streamed[i].arguments]),
                   answers.one.map((ch) => ch.calls[0]));
  // The assistant's message and a tool result go back into the history.
  const followUp = await inBothModes(async (c) => {
    const r = await chat(c, { tools, tool_choice: 'none', max_tokens: 8, messages: [
      ...ask, answers.message,
      { role: 'tool', tool_call_id: answers.message.tool_calls[0].id, content: '21 C, sunny' }] });
    return r.choices[0].finish_reason;
  });
  assert.ok(['stop', 'length'].includes(followUp));
  // auto needs a parser, and the bundled ChatML template shows no tool-call format.
  await inBothModes(async (c) => {
    await assert.rejects(chat(c, { messages: ask, tools }),
      (e) => e.status === 400 && e.error?.param === 'tool_choice' &&
             /--tool-call-parser/.test(e.error?.message));
    return true;
  });
});

test('prompt_logprobs and echo with logprobs score the prompt as sampling scores tokens', async () => {
  const text = 'The weather today';
  const answers = await inBothModes(async (c, name) => {
    const root = modes[name].baseURL.replace(/\/v1$/, '');
    const tok = await (await fetch(`${root}/tokenize`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: text }) })).json();
    const ids = tok.tokens;
    const gen = await complete(c, { prompt: ids, max_tokens: 1, logprobs: 1 });
    // The prompt plus any token: its last entry is scored where `gen` sampled.
    const scored = await complete(c, { prompt: [...ids, ids[0]], max_tokens: 1,
                                       prompt_logprobs: 1, echo: true, logprobs: 1 });
    return { ids, gen: gen.choices[0].logprobs, pl: scored.choices[0].prompt_logprobs,
             echo: scored.choices[0].logprobs, cached: scored.usage.prompt_tokens_details };
  });
  const { ids, gen, pl, echo } = answers;
  assert.equal(pl.length, ids.length + 1);
  assert.equal(pl[0], null);
  assert.equal(echo.token_logprobs[0], null);
  assert.equal(echo.top_logprobs[0], null);
  const prompt = [...ids, ids[0]];
  for (let i = 1; i < prompt.length; ++i) {
    const own = pl[i][String(prompt[i])];
    assert.ok(own, `position ${i}: the prompt token ${prompt[i]} is scored`);
    assert.ok(Number.isInteger(own.rank) && own.rank >= 1);
    assert.ok(own.logprob <= 0);
    // echo's entry for the same token is the same score.
    assert.equal(echo.tokens[i], own.decoded_token);
    assert.ok(Math.abs(echo.token_logprobs[i] - own.logprob) < 1e-6);
    const best = Object.values(pl[i]).find((t) => t.rank === 1);
    assert.ok(best, `position ${i} lists its most likely token`);
    assert.ok(best.logprob >= own.logprob);
  }
  // At the last prompt position, the most likely token is what greedy sampling drew, with the
  // logprob sampling reported (a prefill row against a decode step: within float error).
  const last = Object.values(pl[ids.length]).find((t) => t.rank === 1);
  assert.equal(last.decoded_token, gen.tokens[0]);
  assert.ok(Math.abs(last.logprob - gen.token_logprobs[0]) < 1e-3,
            `${last.logprob} vs ${gen.token_logprobs[0]}`);
  // Streamed prompt_logprobs are refused, as in vLLM.
  await inBothModes(async (c) => {
    await assert.rejects(complete(c, { prompt: text, prompt_logprobs: 1, stream: true }),
      (e) => e.status === 400 && e.error?.param === 'prompt_logprobs');
    return true;
  });
});

test('an unknown or unsupported field is a 400 naming it, never ignored', async () => {
  await inBothModes(async (_, name) => {
    const post = (body) => fetch(`${modes[name].baseURL}/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: modelName, messages: hello, ...body }),
    });
    const unknown = await post({ temprature: 0 });
    assert.equal(unknown.status, 400);
    const u = await unknown.json();
    assert.equal(u.error.param, 'temprature');
    assert.equal(u.error.code, 'unknown_parameter');
    const unsupported = await post({ use_beam_search: true });
    assert.equal(unsupported.status, 400);
    const g = await unsupported.json();
    assert.equal(g.error.param, 'use_beam_search');
    assert.equal(g.error.code, 'unsupported_parameter');
    return [u.error.code, g.error.code];
  });
});
