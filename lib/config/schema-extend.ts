/** How the RL algorithms add themselves to the config schema (lib/train/rl/registry.ts calls extendSchema). */
import { SlmError } from '../errors.js';
import { CONFIG_SCHEMA } from './schema.js';
import { section, type Schema } from './schema-kit.js';

let version = 0;

/** Changes whenever extendSchema does (lib/config/load.ts recompiles its validator then). */
export function schemaVersion(): number {
  return version;
}

/**
 * Adds an RL algorithm to the schema (lib/train/rl/registry.ts calls it for each one it holds): its
 * name to the `stage` and `algorithm.kind` enums, its keys to the `algorithm` section, its own section
 * at the top level. A key or section that is already there is refused: two algorithms cannot own one.
 */
export function extendSchema(name: string, opts: { algorithmKeys?: Record<string, Schema>; section?: Record<string, Schema> }): void {
  const top = CONFIG_SCHEMA.properties as Record<string, Schema>;
  const stage = top.stage.enum as string[];
  if (stage.includes(name)) throw new SlmError('ARGUMENT_INVALID', `extendSchema: stage ${name} is already in the schema.`);
  stage.splice(stage.length - 1, 0, name); // before 'eval'
  const algorithm = top.algorithm.properties as Record<string, Schema>;
  const kinds = algorithm.kind.enum as Array<string | null>;
  kinds.splice(kinds.length - 2, 0, name); // before 'sft' and null
  for (const [k, v] of Object.entries(opts.algorithmKeys ?? {})) {
    if (k in algorithm)
      throw new SlmError(
        'ARGUMENT_INVALID',
        `extendSchema: algorithm.${k} of ${name} is already in the schema (another algorithm, or the keys every algorithm shares, owns it); name the key after the algorithm.`,
      );
    algorithm[k] = v;
  }
  if (opts.section) {
    if (name in top) throw new SlmError('ARGUMENT_INVALID', `extendSchema: a section ${name} is already in the schema.`);
    top[name] = section(opts.section);
  }
  version++;
}
