"""Serving smoke test for a GPU host, against a running `tandem serve --device cuda`.

  python3 tests/gpu/serve_cuda_smoke.py URL MODEL_NAME TANDEM_BIN MODEL_DIR

Checks a greedy completion (200), a streamed chat completion that ends in [DONE], a bad request
(400 with an OpenAI error body), the router's KV-transfer metrics, and that the greedy HTTP text
equals `TANDEM_BIN generate --model MODEL_DIR --device cuda` for the same prompt. Prints
"SERVE E2E OK" (exit 0) or "SERVE E2E FAILED" (exit 1). Run by bench/engine/run_h200.sh: the GPU
host has no node for tests/e2e.
"""
import json
import subprocess
import sys
import urllib.error
import urllib.request

PROMPT = "The meaning of life is"
MAX_TOKENS = 24


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def main():
    base, model, tandem, model_dir = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3], sys.argv[4]
    ok = True

    status, body = post(base, "/v1/completions",
                        {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                         "temperature": 0})
    print("completion:", status, body[:300])
    ok &= status == 200
    http_text = json.loads(body)["choices"][0]["text"] if status == 200 else None

    status, body = post(base, "/v1/chat/completions",
                        {"model": model, "stream": True, "max_tokens": 16, "temperature": 0.8,
                         "top_p": 0.9, "seed": 7,
                         "messages": [{"role": "user", "content": "Tell me about Debian."}]})
    events = [line for line in body.splitlines() if line.startswith("data: ")]
    print("chat stream:", status, len(events), "events, last:", events[-1] if events else None)
    ok &= status == 200 and bool(events) and events[-1] == "data: [DONE]"

    status, body = post(base, "/v1/completions", {"model": model, "prompt": "x", "max_tokens": -3})
    print("bad request:", status, body[:200])
    ok &= status == 400 and "error" in json.loads(body)

    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        metrics = r.read().decode()
    transfers = [line for line in metrics.splitlines()
                 if "transfer" in line and not line.startswith("#") and "_bucket" not in line]
    print("\n".join(transfers))

    gen = subprocess.run([tandem, "generate", "--model", model_dir, "--device", "cuda", "--prompt",
                          PROMPT, "--max-tokens", str(MAX_TOKENS), "--json"],
                         capture_output=True, text=True, timeout=120)
    gen_text = None
    if gen.returncode == 0:
        gen_text = json.loads(gen.stdout.strip().splitlines()[-1])["text"]
    print("generate --device cuda:", repr(gen_text))
    print("http (greedy):         ", repr(http_text))
    ok &= gen_text is not None and gen_text == http_text

    print("SERVE E2E", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
