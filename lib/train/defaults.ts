/**
 * The trainers' defaults are the config schema's (lib/config/schema.ts): an option a library caller
 * leaves out takes the value a config file would get, so the schema is the one place defaults live.
 */
import { CONFIG_SCHEMA } from '../config/schema.js';
import { SlmError } from '../errors.js';

type Schema = { properties?: Record<string, Schema>; default?: unknown };

/** The schema's default of `section.key` (e.g. algorithm.value_clip); a key without one is a programming error. */
export function schemaDefault(section: string, key: string): unknown {
  const s = (CONFIG_SCHEMA as Schema).properties?.[section]?.properties?.[key];
  if (!s || !('default' in s)) throw new SlmError('ARGUMENT_INVALID', `the config schema has no default for ${section}.${key}; expected a key with a default.`);
  return s.default;
}
