/** The training config: schema, loading with overrides, and the options it gives the trainers. */
export { CONFIG_SCHEMA, PATH_KEYS } from './schema.js';
export { ALIASES } from './aliases.js';
export { STAGES } from '../train/rl/registry.js';
export type * from './types.js';
export {
  configFromObject,
  configToYaml,
  loadConfig,
  missingFiles,
  readConfigFile,
  runDir,
  validateConfig,
  writeResolvedConfig,
  type LoadOptions,
} from './load.js';
export { applyOverrides, parseOverrides, type Override } from './overrides.js';
export { expectedOf, suggestKey } from './problems.js';
export { groupAdvantageOptions } from '../train/rl/grpo.js';
export { ppoAdvantageOptions } from '../train/rl/ppo.js';
export { scheduleSpec } from '../train/schedule.js';
