/** The training config: schema, loading with overrides, and the options it gives the trainers. */
export { CONFIG_SCHEMA, ALIASES, PATH_KEYS, STAGES } from './schema.js';
export type * from './types.js';
export {
  applyOverrides,
  configFromObject,
  configToYaml,
  expectedOf,
  loadConfig,
  missingFiles,
  parseOverrides,
  readConfigFile,
  runDir,
  suggestKey,
  validateConfig,
  writeResolvedConfig,
  type LoadOptions,
  type Override,
} from './load.js';
export { groupAdvantageOptions, ppoAdvantageOptions, scheduleSpec } from './algorithm.js';
