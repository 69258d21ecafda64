// Module resolve hook registered by resolve-here.mjs: a bare specifier ('ajv', 'js-yaml')
// that cannot be found from the importing file is resolved from this folder's node_modules.
const here = new URL('./package.json', import.meta.url).href;

export async function resolve(specifier, context, nextResolve) {
  try {
    return await nextResolve(specifier, context);
  } catch (error) {
    const bare = !/^(\.|\/|[a-zA-Z][a-zA-Z0-9+.-]*:)/.test(specifier);
    if (!bare || error?.code !== 'ERR_MODULE_NOT_FOUND') throw error;
    return nextResolve(specifier, { ...context, parentURL: here });
  }
}
