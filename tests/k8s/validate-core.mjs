// Validates core Kubernetes objects (Job, Service, ConfigMap, Secret, Deployment,
// StatefulSet, ...) in YAML files, offline, the way the API server would:
//   1. the kubernetes-models class of the object's apiVersion/kind checks it against the
//      official OpenAPI schema of Kubernetes (required fields, types, enums, formats such as
//      quantities);
//   2. unknown fields are errors (as kubectl's default strict field validation makes them):
//      every key is looked up in the property list of its type, read from the type
//      declarations (.d.ts) that kubernetes-models generates from the same schema.
// Usage: node validate-core.mjs FILE.yaml...   Exit 0 when every document is valid; 1 with
// one line per error otherwise. Documents of kinds outside the Kubernetes API are errors.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import * as yaml from 'js-yaml';

const require = createRequire(import.meta.url);
const modelsDir = path.dirname(require.resolve('kubernetes-models/package.json'));
const nodeModules = path.dirname(modelsDir);

// --- strict field check from the generated type declarations -----------------------------

const interfaces = new Map();  // .d.ts path -> {props: Map(name -> type text), imports}

function parseDeclarations(file) {
  if (interfaces.has(file)) return interfaces.get(file);
  const text = fs.readFileSync(file, 'utf8');
  const imports = new Map();
  for (const m of text.matchAll(/^import \{ (\w+) \} from "([^"]+)";$/gm)) imports.set(m[1], m[2]);
  const lines = text.split('\n');
  const start = lines.findIndex((l) => /^export interface \w+( extends [\w, ]+)? \{$/.test(l));
  let props = null;
  if (start >= 0) {
    props = new Map();
    for (let i = start + 1; i < lines.length && lines[i] !== '}'; i++) {
      const m = /^ {4}"([^"]+)"\??: (.*)$/.exec(lines[i]);
      if (!m) continue;
      let type = m[2];
      if (type === '{') {  // a map: {\n [key: string]: T;\n }
        const inner = /^\s+\[key: string\]: (.*);$/.exec(lines[i + 1] ?? '');
        type = inner ? `Map<${inner[1]}>` : 'unknown';
        while (i < lines.length && !/^ {4}\};?$/.test(lines[i])) i++;
      } else {
        type = type.replace(/;$/, '');
      }
      props.set(m[1], type);
    }
  }
  const parsed = { props, imports, dir: path.dirname(file) };
  interfaces.set(file, parsed);
  return parsed;
}

function declarationFile(fromDir, importPath) {
  const base = importPath.startsWith('.') ? path.resolve(fromDir, importPath)
                                          : path.join(nodeModules, importPath);
  return `${base}.d.ts`;
}

// Checks `value` against the type written `type` in the declarations of `decl`.
function checkType(value, type, decl, where, errors) {
  if (value === null || value === undefined) return;
  let m;
  if ((m = /^Array<(.+)>$/.exec(type))) {
    if (Array.isArray(value)) value.forEach((v, i) => checkType(v, m[1], decl, `${where}/${i}`, errors));
    return;
  }
  if ((m = /^Map<(.+)>$/.exec(type))) {
    if (value && typeof value === 'object') {
      for (const [k, v] of Object.entries(value)) checkType(v, m[1], decl, `${where}/${k}`, errors);
    }
    return;
  }
  const importPath = decl.imports.get(type);
  if (!importPath) return;  // a primitive, a union of literals, or an alias
  checkObject(value, parseDeclarations(declarationFile(decl.dir, importPath)), where, errors);
}

function checkObject(value, decl, where, errors) {
  if (!decl.props || !value || typeof value !== 'object' || Array.isArray(value)) return;
  for (const [key, v] of Object.entries(value)) {
    const type = decl.props.get(key);
    if (type === undefined) {
      errors.push(`${where || '/'} unknown field "${key}"`);
      continue;
    }
    checkType(v, type, decl, `${where}/${key}`, errors);
  }
}

// --- per document ----------------------------------------------------------------------

async function validate(doc) {
  const apiVersion = doc?.apiVersion, kind = doc?.kind;
  if (typeof apiVersion !== 'string' || typeof kind !== 'string') {
    return ['/ apiVersion and kind are required'];
  }
  const groupDir = path.join(modelsDir, ...apiVersion.split('/'));
  const dts = path.join(groupDir, `${kind}.d.ts`);
  if (!/^[A-Z]\w*$/.test(kind) || !fs.existsSync(dts)) {
    return [`/ ${apiVersion}/${kind} is not a kind of the Kubernetes API (kubernetes-models)`];
  }
  const module = await import(`kubernetes-models/${apiVersion}/${kind}`);
  const errors = [];
  try {
    new module[kind](doc).validate();
  } catch (e) {
    errors.push(...String(e.message).split(', ').map((s) => s.replace(/^data/, '')));
  }
  checkObject(doc, parseDeclarations(dts), '', errors);
  return errors;
}

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error('usage: node validate-core.mjs FILE.yaml...');
  process.exit(2);
}
let bad = 0;
for (const f of files) {
  for (const doc of yaml.loadAll(fs.readFileSync(f, 'utf8'))) {
    if (doc === null || doc === undefined) continue;
    const name = `${doc?.kind}/${doc?.metadata?.name}`;
    const errors = await validate(doc);
    if (errors.length === 0) {
      console.log(`${f}: ${name} OK`);
    } else {
      bad++;
      for (const e of errors) console.log(`${f}: ${name} ${e}`);
    }
  }
}
process.exit(bad ? 1 : 0);
