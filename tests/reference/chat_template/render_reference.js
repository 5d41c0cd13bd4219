// Independent reference for tandem's chat templates: renders each case with @huggingface/jinja
// (the Jinja implementation of transformers.js), passing the variables that transformers'
// apply_chat_template passes (messages, add_generation_prompt, tools = null, documents = null,
// bos_token / eos_token when set) plus the case's extra variables.
//
// usage: node render_reference.js <cases.json> <results.json>
//   cases.json:   [{"model": "<dir under models/>", "messages": [...],
//                   "add_generation_prompt": bool, "variables": {...}}]
//   results.json: [{"text": "..."} | {"error": "..."}] in the same order
"use strict";
const fs = require("fs");
const path = require("path");
const { Template } = require("@huggingface/jinja");

function specialToken(value) {
  if (value === null || value === undefined) return undefined;
  if (typeof value === "string") return value;
  return value.content;
}

const [casesPath, resultsPath] = process.argv.slice(2);
const cases = JSON.parse(fs.readFileSync(casesPath, "utf8"));
const templates = new Map();
const results = cases.map((c) => {
  try {
    if (!templates.has(c.model)) {
      const configPath = path.join(__dirname, "models", c.model, "tokenizer_config.json");
      const config = JSON.parse(fs.readFileSync(configPath, "utf8"));
      templates.set(c.model, { template: new Template(config.chat_template), config });
    }
    const { template, config } = templates.get(c.model);
    const vars = {
      messages: c.messages,
      add_generation_prompt: c.add_generation_prompt,
      tools: null,
      documents: null,
    };
    const bos = specialToken(config.bos_token);
    const eos = specialToken(config.eos_token);
    if (bos) vars.bos_token = bos;
    if (eos) vars.eos_token = eos;
    Object.assign(vars, c.variables || {});
    return { text: template.render(vars) };
  } catch (e) {
    return { error: String(e && e.message ? e.message : e) };
  }
});
fs.writeFileSync(resultsPath, JSON.stringify(results));
