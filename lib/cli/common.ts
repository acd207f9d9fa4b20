/** Options and helpers shared by the commands that load a model. */
import type { Argv } from 'yargs';
import { COMPUTE_DTYPES, type ComputeDtype } from '../engine/types.js';
import { loadPolicy, type LoadPolicyOptions, type PartialPolicy, type Policy } from '../engine/policy.js';
import { SlmError } from '../errors.js';

export interface ModelArgs {
  model: string;
  adapter?: string;
  dtype: ComputeDtype;
  device: string;
  threads?: number;
}

export function modelOptions<T>(yargs: Argv<T>) {
  return yargs
    .option('model', {
      type: 'string',
      demandOption: true,
      describe: 'Hugging Face model folder (config.json + *.safetensors), or hf:OWNER/NAME from the hub',
    })
    .option('adapter', { type: 'string', describe: 'PEFT LoRA adapter folder (or hf:OWNER/NAME)' })
    .option('dtype', { choices: COMPUTE_DTYPES, default: 'float32' as const, describe: 'compute dtype' })
    .option('device', { type: 'string', default: 'cpu', describe: 'cpu, cuda or cuda:N' })
    .option('threads', { type: 'number', describe: 'CPU threads for the engine (default: all cores)' });
}

/**
 * Loads --model (with --adapter) through loadPolicy: by default with its tokenizer and chat template
 * (`parts` can leave them out). `hf:OWNER/NAME` references are downloaded first (lib/hub) and
 * replaced in `args` by their local folders.
 */
export async function loadPolicyFromArgs(args: ModelArgs): Promise<Policy>;
export async function loadPolicyFromArgs(args: ModelArgs, parts: Pick<LoadPolicyOptions, 'tokenizer' | 'chat'>): Promise<PartialPolicy>;
export async function loadPolicyFromArgs(
  args: ModelArgs,
  parts: Pick<LoadPolicyOptions, 'tokenizer' | 'chat'> = {},
): Promise<PartialPolicy> {
  const p = await loadPolicy(args.model, {
    dtype: args.dtype,
    device: args.device,
    adapter: args.adapter,
    threads: args.threads,
    ...parts,
  });
  args.model = p.dir;
  if (p.adapter) args.adapter = p.adapter;
  return p;
}

/** "1,2,3" -> [1, 2, 3] with a clear error for anything else. */
export function parseIds(s: string, what = '--ids'): number[] {
  const parts = String(s)
    .split(/[\s,]+/)
    .filter((x) => x.length);
  const ids = parts.map(Number);
  const bad = parts.findIndex((p, i) => !/^-?\d+$/.test(p) || !Number.isSafeInteger(ids[i]));
  if (!parts.length || bad >= 0)
    throw new SlmError(
      'ARGUMENT_INVALID',
      `${what} expects comma-separated integer token ids like 1,2,3; found ${JSON.stringify(parts[bad] ?? s)}.`,
    );
  return ids;
}

export function print(s: string): void {
  process.stdout.write(s.endsWith('\n') ? s : s + '\n');
}

/** Resolves on SIGINT or SIGTERM (a server command runs until then). */
export function untilSignal(): Promise<void> {
  return new Promise((resolve) => {
    process.once('SIGINT', () => resolve());
    process.once('SIGTERM', () => resolve());
  });
}
