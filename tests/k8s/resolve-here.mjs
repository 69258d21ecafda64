// Lets a script outside this folder (../shared/k8s/crdvalidate.mjs) import the npm packages
// installed here. ES modules resolve bare imports from the importing file's folder only
// (NODE_PATH and the working directory do not count), so this registers a resolve hook that
// retries a failed bare import from this folder.
// Use: node --import <this folder>/resolve-here.mjs script.mjs ARGS...
import { register } from 'node:module';

register('./resolve-hooks.mjs', import.meta.url);
