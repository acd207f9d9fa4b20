/**
 * The RL algorithms slm-train knows, by name. Each is one file exporting an AlgorithmDefinition
 * (lib/train/rl/algorithm.ts); listing it here (or calling `registerAlgorithm`) is all it takes for
 * `stage: NAME` to validate, take its keys, and run. The config's `stage` and `algorithm.kind` enums,
 * its algorithm keys and sections, the validation of lib/config/load.ts and the dispatch of
 * lib/train/stages.ts all read this registry.
 */
import { extendSchema } from '../../config/schema-extend.js';
import { SlmError } from '../../errors.js';
import type { AlgorithmDefinition } from './algorithm.js';
import { grpo } from './grpo.js';
import { ppoDefinition } from './ppo.js';
import { rft } from './rft.js';
import { rloo } from './rloo.js';

const registry = new Map<string, AlgorithmDefinition>();

/** The stages that are not RL algorithms: SFT (lib/train/sft) and evaluation. */
const OTHER_STAGES = new Set(['sft', 'eval']);

/**
 * Adds an algorithm: its name becomes a stage and an algorithm.kind, its keys join the config schema.
 * A name that is taken, or a key another algorithm owns, is refused.
 */
export function registerAlgorithm(def: AlgorithmDefinition): void {
  if (!/^[a-z][a-z0-9_]*$/.test(def.name))
    throw new SlmError(
      'ARGUMENT_INVALID',
      `registerAlgorithm: an algorithm's name is its stage: lower-case letters, digits and _, starting with a letter; found ${JSON.stringify(def.name)}.`,
    );
  if (registry.has(def.name) || OTHER_STAGES.has(def.name))
    throw new SlmError('ARGUMENT_INVALID', `registerAlgorithm: ${def.name} is already a stage; give the algorithm another name.`);
  extendSchema(def.name, def);
  registry.set(def.name, def);
}

/** The algorithm of a stage or algorithm.kind, or undefined (sft, eval). */
export function algorithmOf(name: string): AlgorithmDefinition | undefined {
  return registry.get(name);
}

/** Every registered algorithm, in registration order. */
export function algorithms(): AlgorithmDefinition[] {
  return [...registry.values()];
}

/** What `slm-train train` can run: sft, the algorithms, eval. */
export function stageNames(): string[] {
  return ['sft', ...registry.keys(), 'eval'];
}

for (const def of [grpo, ppoDefinition, rloo, rft]) registerAlgorithm(def);

/** The stages of the built-in algorithms (the schema's `stage` enum before any registerAlgorithm). */
export const STAGES: readonly string[] = Object.freeze(stageNames());
