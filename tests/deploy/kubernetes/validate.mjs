// Validates rendered Kubernetes objects offline against the API's schemas.
//   node validate.mjs RENDERED_DIR...      every *.yaml in each directory
//   node validate.mjs --self-test DIR      broken copies of DIR's objects must each be rejected
// Core types: the `kubernetes-models` JSON-schema validators (types, formats, required fields,
// enums); ServiceMonitor/PodMonitor: `@kubernetes-models/prometheus-operator` (generated from the
// operator's CRDs). Those validators accept unknown fields, so every field is also looked up in
// the models' type declarations (a misspelt `readinessProbes` fails). InferencePool
// (inference.networking.k8s.io/v1) has no published model: checkInferencePool below encodes the
// CRD's required fields and bounds. An object of any other kind fails: it has no schema here.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import yaml from "js-yaml";

const require = createRequire(import.meta.url);
const modelsRoot = path.dirname(require.resolve("kubernetes-models/package.json"));

// apiVersion/kind -> [package, module path inside it]
function modelPath(apiVersion, kind) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  if (group === "monitoring.coreos.com") {
    return ["@kubernetes-models/prometheus-operator", `monitoring.coreos.com/${version}/${kind}`];
  }
  return ["kubernetes-models", `${group === "" ? "" : group + "/"}${version}/${kind}`];
}

// ---- unknown-field check, from the .d.ts declarations of the models ----
const declCache = new Map();
function declarations(file) {
  if (declCache.has(file)) return declCache.get(file);
  const text = fs.existsSync(file) ? fs.readFileSync(file, "utf8").replace(/\/\*[\s\S]*?\*\//g, "") : "";
  const imports = new Map();
  for (const m of text.matchAll(/import \{ ([^}]+) \} from "([^"]+)";/g)) {
    for (const name of m[1].split(",").map((s) => s.trim().split(" as ").pop())) {
      imports.set(name, m[2]);
    }
  }
  const interfaces = new Map();
  for (const m of text.matchAll(/export interface (\w+)(?: extends [\w, ]+)? \{([\s\S]*?)\n\}/g)) {
    const props = new Map();
    // `"name"?: Type;` on one line; a multi-line type (a map) keeps its name, with no type to follow.
    for (const p of m[2].matchAll(/^\s*"([^"]+)"\??: (.*)$/gm)) {
      props.set(p[1], p[2].endsWith(";") ? p[2].slice(0, -1).trim() : "");
    }
    interfaces.set(m[1], props);
  }
  const result = { imports, interfaces, file };
  declCache.set(file, result);
  return result;
}
function resolveImport(fromFile, spec) {
  if (spec.startsWith(".")) return path.resolve(path.dirname(fromFile), spec.replace(/\.js$/, ".d.ts"));
  const [scope, name, ...rest] = spec.split("/");
  const pkg = spec.startsWith("@") ? `${scope}/${name}` : scope;
  const sub = spec.startsWith("@") ? rest : [name, ...rest];
  const root = path.dirname(require.resolve(`${pkg}/package.json`));
  return path.join(root, ...sub) + ".d.ts";
}
// Finds interface `name` (possibly imported) visible from `file`: [decls, props] or null.
function findInterface(file, name) {
  const d = declarations(file);
  if (d.interfaces.has(name)) return [d, d.interfaces.get(name)];
  if (d.imports.has(name)) {
    const target = resolveImport(file, d.imports.get(name));
    const t = declarations(target);
    for (const [iname, props] of t.interfaces) {
      if (iname === name || iname === "I" + name.replace(/^I/, "")) return [t, props];
    }
    // re-exported under an alias: `export type { IFoo as IIoK8s... }`
    const text = fs.existsSync(target) ? fs.readFileSync(target, "utf8") : "";
    const alias = text.match(new RegExp(`export type \\{ (\\w+) as ${name}\\b`));
    if (alias && t.interfaces.has(alias[1])) return [t, t.interfaces.get(alias[1])];
  }
  return null;
}
function unknownFields(value, file, type, at, out) {
  if (value === null || typeof value !== "object") return;
  let m = type.match(/^Array<(\w+)>$/);
  if (m) {
    if (Array.isArray(value)) value.forEach((v, i) => unknownFields(v, file, m[1], `${at}/${i}`, out));
    return;
  }
  if (!/^\w+$/.test(type) || Array.isArray(value)) return;  // maps, unions, scalars: no field names
  const found = findInterface(file, type);
  if (!found) return;
  const [decl, props] = found;
  for (const [key, v] of Object.entries(value)) {
    if (!props.has(key)) out.push(`${at}/${key}: unknown field (not in ${type})`);
    else unknownFields(v, decl.file, props.get(key), `${at}/${key}`, out);
  }
}

// ---- InferencePool (inference.networking.k8s.io/v1) ----
function checkInferencePool(o) {
  const e = [];
  const spec = o.spec;
  const known = (obj, keys, at) => {
    for (const k of Object.keys(obj ?? {})) if (!keys.includes(k)) e.push(`${at}/${k}: unknown field`);
  };
  const port = (p, at) => {
    if (!Number.isInteger(p?.number) || p.number < 1 || p.number > 65535) e.push(`${at}/number: must be an integer 1..65535`);
    known(p, ["number"], at);
  };
  if (typeof spec !== "object" || spec === null) return ["/spec: required"];
  known(spec, ["selector", "targetPorts", "endpointPickerRef", "appProtocol"], "/spec");
  const labels = spec.selector?.matchLabels;
  if (typeof labels !== "object" || labels === null || Object.keys(labels).length === 0) e.push("/spec/selector/matchLabels: required, non-empty");
  else for (const [k, v] of Object.entries(labels)) if (typeof v !== "string" || v.length > 63) e.push(`/spec/selector/matchLabels/${k}: must be a label value`);
  known(spec.selector, ["matchLabels"], "/spec/selector");
  if (!Array.isArray(spec.targetPorts) || spec.targetPorts.length < 1 || spec.targetPorts.length > 8) e.push("/spec/targetPorts: required, 1..8 ports");
  else spec.targetPorts.forEach((p, i) => port(p, `/spec/targetPorts/${i}`));
  const epp = spec.endpointPickerRef;
  if (typeof epp !== "object" || epp === null) e.push("/spec/endpointPickerRef: required");
  else {
    known(epp, ["group", "kind", "name", "port", "failureMode"], "/spec/endpointPickerRef");
    if (typeof epp.name !== "string" || epp.name.length < 1 || epp.name.length > 253) e.push("/spec/endpointPickerRef/name: required");
    if ((epp.kind ?? "Service") === "Service" && epp.port === undefined) e.push("/spec/endpointPickerRef/port: required for a Service");
    if (epp.port !== undefined) port(epp.port, "/spec/endpointPickerRef/port");
    if (epp.failureMode !== undefined && !["FailOpen", "FailClose"].includes(epp.failureMode)) e.push("/spec/endpointPickerRef/failureMode: FailOpen or FailClose");
  }
  return e;
}

async function validateObject(o) {
  if (o?.apiVersion === "inference.networking.k8s.io/v1" && o.kind === "InferencePool") {
    return checkInferencePool(o);
  }
  const [pkg, sub] = modelPath(o.apiVersion, o.kind);
  let mod;
  try {
    mod = await import(`${pkg}/${sub}`);
  } catch {
    return [`no schema for ${o.apiVersion} ${o.kind}`];
  }
  const Model = mod[o.kind];
  const errors = [];
  try {
    new Model(o).validate();
  } catch (err) {
    errors.push(String(err.message ?? err));
  }
  const pkgRoot = path.dirname(require.resolve(`${pkg}/package.json`));
  const dts = path.join(pkgRoot, sub + ".d.ts");
  unknownFields(o, dts, `I${o.kind}`, "", errors);
  return errors;
}

function loadDir(dir) {
  const objects = [];
  for (const f of fs.readdirSync(dir).filter((f) => f.endsWith(".yaml")).sort()) {
    for (const o of yaml.loadAll(fs.readFileSync(path.join(dir, f), "utf8"))) {
      if (o) objects.push([f, o]);
    }
  }
  return objects;
}

// Broken copies, each of which validation must reject.
function breakages(objects) {
  const find = (kind, name) => structuredClone(objects.find(([, o]) => o.kind === kind && (!name || o.metadata.name === name))[1]);
  const cases = [];
  let o = find("Deployment", "tandem-decode");
  o.spec.template.spec.containers[0].ports[0].containerPort = "grpc";
  cases.push(["a port number as a string", o]);
  o = find("Deployment", "tandem-router");
  o.spec.template.spec.containers[0].readinessProbes = o.spec.template.spec.containers[0].readinessProbe;
  cases.push(["a misspelt field (readinessProbes)", o]);
  o = find("Deployment", "tandem-prefill");
  delete o.spec.selector;
  cases.push(["a Deployment without its selector", o]);
  o = find("HorizontalPodAutoscaler", "tandem-decode");
  delete o.spec.metrics[0].external.metric;
  cases.push(["an HPA external metric without its name", o]);
  o = find("HorizontalPodAutoscaler", "tandem-prefill");
  o.spec.metrics[1].external.target.averageUtilisation = 80;
  cases.push(["a misspelt HPA target field (averageUtilisation)", o]);
  o = find("PodMonitor");
  o.spec.podMetricsEndpoints[0].interval = 10;
  cases.push(["a PodMonitor interval as a number", o]);
  o = find("ServiceMonitor");
  o.spec.endpoints[0].scrapeIntervall = "10s";
  cases.push(["a misspelt ServiceMonitor field (scrapeIntervall)", o]);
  o = find("Service", "tandem-decode");
  o.spec.clusterIp = "None";
  cases.push(["a misspelt Service field (clusterIp)", o]);
  o = find("InferencePool");
  delete o.spec.targetPorts;
  cases.push(["an InferencePool without targetPorts", o]);
  o = find("InferencePool");
  o.spec.endpointPickerRef.portNumber = 9002;
  cases.push(["an InferencePool field of a pre-v1 draft (portNumber)", o]);
  cases.push(["an unknown kind", { apiVersion: "example.com/v1", kind: "Widget", metadata: { name: "w" } }]);
  return cases;
}

async function main() {
  const argv = process.argv.slice(2);
  const selfTest = argv[0] === "--self-test";
  const dirs = selfTest ? argv.slice(1) : argv;
  if (dirs.length === 0) {
    console.error("usage: node validate.mjs [--self-test] RENDERED_DIR...");
    process.exit(2);
  }
  const objects = dirs.flatMap(loadDir);
  if (objects.length === 0) {
    console.error("FAIL: no objects to validate");
    process.exit(1);
  }
  let failed = false;
  if (!selfTest) {
    for (const [file, o] of objects) {
      const errors = await validateObject(o);
      const name = `${file}: ${o.apiVersion} ${o.kind}/${o.metadata?.name}`;
      if (errors.length) {
        failed = true;
        for (const e of errors) console.error(`FAIL ${name}: ${e}`);
      }
    }
    console.log(`${failed ? "FAIL" : "ok"}: ${objects.length} objects from ${dirs.length} director${dirs.length === 1 ? "y" : "ies"}`);
  } else {
    for (const [desc, o] of breakages(objects)) {
      const errors = await validateObject(o);
      if (errors.length) console.log(`ok rejected ${desc}: ${errors[0].slice(0, 160)}`);
      else {
        failed = true;
        console.error(`FAIL accepted ${desc}`);
      }
    }
  }
  process.exit(failed ? 1 : 0);
}

await main();
