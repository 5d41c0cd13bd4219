// End to end: the official `openai` npm client (v6) against real Tandem processes (router,
// 1 prefill worker, 1 decode worker, KV over UCX). Env: TANDEM_BIN (the tandem binary),
// TANDEM_MODEL_DIR (a model directory), E2E_LOG_DIR (where the children's logs go).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { Stack, waitFor, loadOpenAI } from './stack.mjs';

const OpenAI = await loadOpenAI();

const tandem = process.env.TANDEM_BIN;
const model = process.env.TANDEM_MODEL_DIR;
const logDir = process.env.E2E_LOG_DIR ?? fs.mkdtempSync('/tmp/tandem-e2e-');
assert.ok(tandem && fs.existsSync(tandem), `TANDEM_BIN not found: ${tandem}`);
assert.ok(model && fs.existsSync(path.join(model, 'config.json')), `no model at ${model}`);
const config = JSON.parse(fs.readFileSync(path.join(model, 'config.json'), 'utf8'));
const modelName = path.basename(model);
const blockSize = 16;

const stack = new Stack({ tandem, model, blockSize, logDir });
let client;

before(async () => {
  await stack.start();
  client = new OpenAI({ baseURL: stack.baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
});

after(async () => {
  await stack.stop();
});

function generateOffline(prompt, maxTokens) {
  const out = execFileSync(tandem, ['generate', '--model', model, '--prompt', prompt,
                                    '--max-tokens', String(maxTokens), '--ignore-eos', '--json'],
                           { encoding: 'utf8', timeout: 60000 });
  return JSON.parse(out);
}

function tokenizeCount(args) {
  const out = execFileSync(tandem, ['tokenize', '--model', model, '--json', ...args],
                           { encoding: 'utf8', timeout: 60000 });
  return JSON.parse(out.trim().split('\n').pop()).ids.length;
}

// Bytes of KV for `promptTokens` tokens at block granularity (f32 K and V for every layer).
function kvBytes(promptTokens) {
  const headDim = config.head_dim ?? config.hidden_size / config.num_attention_heads;
  const kvHeads = config.num_key_value_heads ?? config.num_attention_heads;
  const blocks = Math.ceil(promptTokens / blockSize);
  return blocks * 2 * config.num_hidden_layers * blockSize * kvHeads * headDim * 4;
}

test('GET /v1/models lists the served model', async () => {
  const models = await client.models.list();
  assert.ok(models.data.some((m) => m.id === modelName), JSON.stringify(models.data));
});

test('greedy completion over HTTP equals `tandem generate`', async () => {
  for (const prompt of ['The quick brown fox', 'Once upon a time, in a land far away,', 'x']) {
    const offline = generateOffline(prompt, 24);
    const res = await client.completions.create({
      model: modelName, prompt, max_tokens: 24, temperature: 0, ignore_eos: true,
    });
    assert.equal(res.object, 'text_completion');
    assert.equal(res.choices.length, 1);
    assert.equal(res.choices[0].text, offline.text, `prompt ${JSON.stringify(prompt)}`);
    assert.equal(res.choices[0].finish_reason, 'length');
    assert.equal(res.usage.completion_tokens, offline.token_ids.length);
    assert.equal(res.usage.prompt_tokens, tokenizeCount(['--add-special-tokens', prompt]));
    assert.equal(res.usage.total_tokens, res.usage.prompt_tokens + res.usage.completion_tokens);
  }
});

test('chat completion applies the chat template and reports usage', async () => {
  const messages = [
    { role: 'system', content: 'You are terse.' },
    { role: 'user', content: 'Say hello.' },
  ];
  const file = path.join(logDir, 'chat.json');
  fs.writeFileSync(file, JSON.stringify(messages));
  const res = await client.chat.completions.create({
    model: modelName, messages, max_tokens: 12, temperature: 0, ignore_eos: true,
  });
  assert.equal(res.object, 'chat.completion');
  assert.equal(res.choices[0].message.role, 'assistant');
  assert.equal(typeof res.choices[0].message.content, 'string');
  assert.equal(res.usage.completion_tokens, 12);
  assert.equal(res.usage.prompt_tokens, tokenizeCount(['--chat', file]));
});

test('streamed completion and chat equal the non-streamed ones, with usage and [DONE]', async () => {
  const prompt = 'Streaming works when';
  const full = await client.completions.create({
    model: modelName, prompt, max_tokens: 20, temperature: 0, ignore_eos: true,
  });
  const stream = await client.completions.create({
    model: modelName, prompt, max_tokens: 20, temperature: 0, ignore_eos: true, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '';
  let usage = null;
  let finish = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(text, full.choices[0].text);
  assert.equal(finish, 'length');
  assert.deepEqual(usage, full.usage);

  const messages = [{ role: 'user', content: 'Tell me a story.' }];
  const chatFull = await client.chat.completions.create({
    model: modelName, messages, max_tokens: 16, temperature: 0, ignore_eos: true,
  });
  const chatStream = await client.chat.completions.create({
    model: modelName, messages, max_tokens: 16, temperature: 0, ignore_eos: true, stream: true,
    stream_options: { include_usage: true },
  });
  let content = '';
  let chatUsage = null;
  for await (const chunk of chatStream) {
    if (chunk.usage) chatUsage = chunk.usage;
    for (const c of chunk.choices) content += c.delta?.content ?? '';
  }
  assert.equal(content, chatFull.choices[0].message.content);
  assert.equal(chatUsage.completion_tokens, 16);
});

test('64 concurrent streaming requests all complete', async () => {
  const runs = Array.from({ length: 64 }, async (_, i) => {
    const stream = await client.completions.create({
      model: modelName, prompt: `Request number ${i} says`, max_tokens: 16, temperature: 0,
      ignore_eos: true, stream: true, stream_options: { include_usage: true },
    });
    let usage = null;
    let finish = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) if (c.finish_reason) finish = c.finish_reason;
    }
    return { usage, finish };
  });
  const results = await Promise.all(runs);
  for (const r of results) {
    assert.equal(r.finish, 'length');
    assert.equal(r.usage.completion_tokens, 16);
  }
});

test('the KV really moves: transfer bytes equal the prompt KV size', async () => {
  const prompt = 'A unique prompt about transfer accounting, number 7301, with some extra words';
  const before = Stack.metricValue(await stack.metrics(stack.prefillMetrics),
                                   'tandem_kv_transfer_bytes_total');
  const res = await client.completions.create({
    model: modelName, prompt, max_tokens: 4, temperature: 0, ignore_eos: true,
  });
  const afterText = await stack.metrics(stack.prefillMetrics);
  const sent = Stack.metricValue(afterText, 'tandem_kv_transfer_bytes_total') - before;
  assert.equal(sent, kvBytes(res.usage.prompt_tokens),
               `prompt of ${res.usage.prompt_tokens} tokens`);
});

test('a client disconnect mid-stream frees the sequence', async () => {
  const decodeMetrics = async () => stack.metrics(stack.decodeMetrics);
  const genBefore = Stack.metricValue(await decodeMetrics(), 'tandem_generation_tokens_total');
  const maxTokens = 6000;
  const controller = new AbortController();
  const stream = await client.completions.create({
    model: modelName, prompt: 'This stream will be cut short', max_tokens: maxTokens,
    temperature: 0, ignore_eos: true, stream: true,
  }, { signal: controller.signal });
  let chunks = 0;
  try {
    for await (const chunk of stream) {
      if (++chunks === 3) controller.abort();
    }
  } catch (e) {
    assert.ok(controller.signal.aborted, `unexpected error: ${e}`);
  }
  await waitFor('decode KV blocks back to 0 and no request running', async () => {
    const m = await decodeMetrics();
    return Stack.metricValue(m, 'tandem_kv_blocks_used') === 0 &&
           Stack.metricValue(m, 'tandem_requests_running') === 0;
  }, 15000);
  const generated = Stack.metricValue(await decodeMetrics(), 'tandem_generation_tokens_total') -
                    genBefore;
  assert.ok(generated < maxTokens, `generated ${generated} tokens: the stream was not cancelled`);
});

test('bad input is a 400 with an OpenAI error body and the server keeps serving', async () => {
  await assert.rejects(
    client.completions.create({ model: modelName, prompt: 'hi', max_tokens: 4, temperature: 7 }),
    (e) => e.status === 400 && e.error?.type === 'invalid_request_error' &&
           e.error?.param === 'temperature');
  await assert.rejects(
    client.completions.create({ model: 'no-such-model', prompt: 'hi', max_tokens: 4 }),
    (e) => e.status === 400 || e.status === 404);
  const ok = await client.completions.create({ model: modelName, prompt: 'hi', max_tokens: 2 });
  assert.equal(ok.choices.length, 1);
});
