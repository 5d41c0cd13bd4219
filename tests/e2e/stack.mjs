// Starts a real Tandem stack (prefill, decode, router as separate processes) on free localhost
// ports, and stops it. Every wait has a deadline; on any failure the children are killed.
import { spawn } from 'node:child_process';
import crypto from 'node:crypto';
import net from 'node:net';
import fs from 'node:fs';
import path from 'node:path';

export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

// The official `openai` npm client (v6), or an error saying how to install it.
export async function loadOpenAI() {
  try {
    return (await import('openai')).default;
  } catch (e) {
    throw new Error('the openai npm package is missing: run `npm ci --prefix tests/e2e` ' +
                    '(./quickstart test does)');
  }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export async function waitFor(what, fn, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    try {
      if (await fn()) return;
    } catch (e) {
      last = e;
    }
    await sleep(100);
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${last}` : ''}`);
}

export class Stack {
  constructor({ tandem, model, kvTransfer = 'ucx', blockSize = 16, logDir }) {
    Object.assign(this, { tandem, model, kvTransfer, blockSize, logDir });
    this.children = [];
  }

  spawnRole(name, args) {
    const out = fs.openSync(path.join(this.logDir, `${name}.log`), 'w');
    const child = spawn(this.tandem, args, { stdio: ['ignore', out, out] });
    child.roleName = name;
    child.exited = new Promise((resolve) => child.on('exit', (code, sig) => resolve({ code, sig })));
    this.children.push(child);
    return child;
  }

  async start() {
    fs.mkdirSync(this.logDir, { recursive: true });
    const [prefill, prefillMetrics, decode, decodeMetrics, router] = await Promise.all(
      [0, 1, 2, 3, 4].map(() => freePort()));
    Object.assign(this, { prefillMetrics, decodeMetrics, routerPort: router });
    // The services' shared secret (the workers refuse calls without it), private to this user.
    const tokenFile = path.join(this.logDir, 'service-token');
    fs.writeFileSync(tokenFile, `${crypto.randomBytes(32).toString('hex')}\n`, { mode: 0o600 });
    fs.chmodSync(tokenFile, 0o600);
    const auth = ['--service-token-file', tokenFile];
    const common = ['--model', this.model, '--kv-transfer', this.kvTransfer,
                    '--block-size', String(this.blockSize), ...auth];
    this.spawnRole('prefill', ['prefill', ...common, '--port', String(prefill),
                               '--metrics-port', String(prefillMetrics)]);
    this.spawnRole('decode', ['decode', ...common, '--port', String(decode),
                              '--metrics-port', String(decodeMetrics)]);
    this.spawnRole('router', ['router', '--model', this.model, '--port', String(router),
                              '--host', '127.0.0.1',
                              '--prefill-workers', `127.0.0.1:${prefill}`,
                              '--decode-workers', `127.0.0.1:${decode}`, ...auth]);
    this.baseURL = `http://127.0.0.1:${router}/v1`;
    try {
      await waitFor('router /health 200', async () => {
        for (const c of this.children) {
          if (c.exitCode !== null || c.signalCode !== null) {
            throw new Error(`${c.roleName} exited early; see ${this.logDir}/${c.roleName}.log`);
          }
        }
        const r = await fetch(`http://127.0.0.1:${router}/health`);
        return r.status === 200;
      }, 60000);
    } catch (e) {
      await this.stop();
      throw e;
    }
  }

  async metrics(port) {
    const r = await fetch(`http://127.0.0.1:${port}/metrics`);
    if (r.status !== 200) throw new Error(`metrics on ${port}: HTTP ${r.status}`);
    return r.text();
  }

  // Sum of all samples of `name` (any labels) in a Prometheus text body.
  static metricValue(text, name) {
    let sum = 0;
    let found = false;
    for (const line of text.split('\n')) {
      if (line.startsWith('#')) continue;
      const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/);
      if (m && m[1] === name) {
        sum += Number(m[3]);
        found = true;
      }
    }
    if (!found) throw new Error(`metric ${name} not found`);
    return sum;
  }

  async stop() {
    for (const c of this.children) if (c.exitCode === null) c.kill('SIGTERM');
    const all = Promise.all(this.children.map((c) => c.exited));
    const timedOut = await Promise.race([all.then(() => false), sleep(10000).then(() => true)]);
    if (timedOut) {
      for (const c of this.children) if (c.exitCode === null) c.kill('SIGKILL');
      await all;
      throw new Error('a child did not stop within 10 s of SIGTERM');
    }
  }
}

// `tandem serve` (one process that starts the router and its workers) on a free port, in
// disaggregated mode or with `--aggregated`.
export class ServeStack {
  constructor({ tandem, model, aggregated = false, logDir, extraArgs = [] }) {
    Object.assign(this, { tandem, model, aggregated, logDir, extraArgs });
  }

  async start() {
    fs.mkdirSync(this.logDir, { recursive: true });
    const port = await freePort();
    const name = this.aggregated ? 'serve-aggregated' : 'serve';
    const out = fs.openSync(path.join(this.logDir, `${name}.log`), 'w');
    const args = ['serve', '--model', this.model, '--port', String(port), '--host', '127.0.0.1',
                  ...(this.aggregated ? ['--aggregated'] : []), ...this.extraArgs];
    this.child = spawn(this.tandem, args, { stdio: ['ignore', out, out] });
    this.exited = new Promise((resolve) => this.child.on('exit', (code, sig) => resolve({ code, sig })));
    this.baseURL = `http://127.0.0.1:${port}/v1`;
    try {
      await waitFor(`${name} /health 200`, async () => {
        if (this.child.exitCode !== null || this.child.signalCode !== null) {
          throw new Error(`${name} exited early; see ${this.logDir}/${name}.log`);
        }
        const r = await fetch(`http://127.0.0.1:${port}/health`);
        return r.status === 200;
      }, 120000);
    } catch (e) {
      await this.stop();
      throw e;
    }
  }

  async stop() {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGTERM');
    const timedOut = await Promise.race([this.exited.then(() => false),
                                         sleep(30000).then(() => true)]);
    if (timedOut) {
      this.child.kill('SIGKILL');
      await this.exited;
      throw new Error('tandem serve did not stop within 30 s of SIGTERM');
    }
  }
}
