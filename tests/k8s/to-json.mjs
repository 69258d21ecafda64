// Prints the documents of a YAML stream as one JSON array (how a YAML 1.2 reader such as
// kubectl's sees them), so tests can compare the emitted YAML with the objects it came from.
// Usage: node to-json.mjs FILE.yaml
import fs from 'node:fs';
import * as yaml from 'js-yaml';

const docs = yaml.loadAll(fs.readFileSync(process.argv[2], 'utf8')).filter((d) => d != null);
process.stdout.write(JSON.stringify(docs));
