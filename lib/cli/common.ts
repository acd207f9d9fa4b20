/** Options and helpers shared by the commands that load a model. */
import type { Argv } from 'yargs';
import { Model, type ComputeDtype } from '../engine/model.js';
import { setThreads } from '../engine/runtime.js';
import { SlmError } from '../errors.js';
import { localModelDir } from '../hub/download.js';

export interface ModelArgs {
  model: string;
  adapter?: string;
  dtype: ComputeDtype;
  device: string;
  threads?: number;
}

export function modelOptions<T>(y: Argv<T>) {
  return y
    .option('model', { type: 'string', demandOption: true, describe: 'Hugging Face model folder (config.json + *.safetensors), or hf:OWNER/NAME from the hub' })
    .option('adapter', { type: 'string', describe: 'PEFT LoRA adapter folder (or hf:OWNER/NAME)' })
    .option('dtype', { choices: ['float32', 'bfloat16', 'float16'] as const, default: 'float32' as const, describe: 'compute dtype' })
    .option('device', { type: 'string', default: 'cpu', describe: 'cpu, cuda or cuda:N' })
    .option('threads', { type: 'number', describe: 'CPU threads for the engine (default: all cores)' });
}

/**
 * Loads --model (with --adapter). `hf:OWNER/NAME` references are downloaded first (lib/hub) and
 * replaced in `a` by their local folders, so the command reads the tokenizer from the same place.
 */
export async function loadModelFromArgs(a: ModelArgs): Promise<Model> {
  if (a.threads !== undefined) setThreads(a.threads);
  a.model = await localModelDir(a.model);
  if (a.adapter) a.adapter = await localModelDir(a.adapter);
  return Model.load(a.model, { dtype: a.dtype, device: a.device, adapter: a.adapter });
}

/** "1,2,3" -> [1, 2, 3] with a clear error for anything else. */
export function parseIds(s: string, what = '--ids'): number[] {
  const parts = String(s)
    .split(/[\s,]+/)
    .filter((x) => x.length);
  const ids = parts.map(Number);
  const bad = parts.findIndex((p, i) => !/^-?\d+$/.test(p) || !Number.isSafeInteger(ids[i]));
  if (!parts.length || bad >= 0)
    throw new SlmError('ARGUMENT_INVALID', `${what} expects comma-separated integer token ids like 1,2,3; found ${JSON.stringify(parts[bad] ?? s)}.`);
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
