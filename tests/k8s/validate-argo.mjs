// Validates Argo Workflow manifests (YAML or JSON files), offline, against the Workflow
// schema that @kubernetes-models/argo-workflows generates from Argo's own Go types (the
// same OpenAPI definitions as Argo's CRDs): required fields, types, enums.
// Usage: node validate-argo.mjs FILE...   Exit 0 when every document is a valid Workflow;
// 1 with one line per error otherwise.
import fs from 'node:fs';
import * as yaml from 'js-yaml';
import { Workflow } from '@kubernetes-models/argo-workflows/argoproj.io/v1alpha1/Workflow';

let failed = false;
for (const file of process.argv.slice(2)) {
  for (const doc of yaml.loadAll(fs.readFileSync(file, 'utf8'))) {
    if (!doc) continue;
    if (doc.apiVersion !== 'argoproj.io/v1alpha1' || doc.kind !== 'Workflow') {
      console.log(`${file}: not an Argo Workflow (${doc.apiVersion} ${doc.kind})`);
      failed = true;
      continue;
    }
    try {
      new Workflow(doc).validate();
    } catch (e) {
      failed = true;
      for (const err of e.errors ?? [{ instancePath: '', message: e.message }]) {
        console.log(`${file}: ${err.instancePath || '/'} ${err.message}`);
      }
    }
  }
}
process.exit(failed ? 1 : 0);
