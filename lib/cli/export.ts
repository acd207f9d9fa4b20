/**
 * `slm-train export --merged --model DIR --adapter DIR --out DIR [--out-dtype float32|bfloat16|float16]`:
 * a Hugging Face model folder with the LoRA adapter merged into the base weights (W + scale * B A),
 * config.json (torch_dtype set to the written dtype) and the base's tokenizer, chat template and
 * generation config copied: what vLLM, transformers or llama.cpp's converter load as a plain model.
 */
import { existsSync, readdirSync } from 'node:fs';
import type { CommandModule } from 'yargs';
import { COMPUTE_DTYPES, type ComputeDtype } from '../engine/types.js';
import { SlmError } from '../errors.js';
import { loadPolicyFromArgs, modelOptions, print, type ModelArgs } from './common.js';

interface Args extends ModelArgs {
  merged?: boolean;
  out: string;
  'out-dtype': ComputeDtype;
  force?: boolean;
  json?: boolean;
}

export const exportCommand: CommandModule<object, Args> = {
  command: 'export',
  describe: 'write a Hugging Face model folder with the adapter merged into the base weights (--merged)',
  builder: (yargs) =>
    modelOptions(yargs)
      .option('merged', { type: 'boolean', describe: 'merge --adapter into the base weights (the only export there is; required)' })
      .option('out', {
        type: 'string',
        demandOption: true,
        describe: 'the folder to write (config.json, model.safetensors, tokenizer files)',
      })
      .option('out-dtype', { choices: COMPUTE_DTYPES, default: 'float32' as const, describe: 'dtype of the written weights' })
      .option('force', { type: 'boolean', describe: 'write into --out even if it is not empty' })
      .option('json', { type: 'boolean', describe: 'print {"out", "files", "adapter", "dtype"}' })
      .check((a) => {
        if (!a.merged)
          throw new SlmError(
            'ARGUMENT_INVALID',
            'export writes a merged model: pass --merged (an adapter folder is already a PEFT export; `slm-train push` publishes one).',
          );
        if (!a.adapter)
          throw new SlmError(
            'ARGUMENT_INVALID',
            'export --merged needs --adapter DIR (a PEFT LoRA folder, or hf:OWNER/NAME) to merge into --model.',
          );
        return true;
      }) as never,
  handler: async (args) => {
    const out = String(args.out);
    if (existsSync(out) && readdirSync(out).length && !args.force)
      throw new SlmError(
        'ARGUMENT_INVALID',
        `--out ${out} is not empty; choose an empty or new folder, or pass --force to overwrite the files there.`,
      );
    const { model: m } = await loadPolicyFromArgs(args, { tokenizer: false, chat: false });
    try {
      await m.exportMerged(out, args['out-dtype']);
    } finally {
      m.dispose();
    }
    const files = readdirSync(out).sort();
    if (args.json) print(JSON.stringify({ out, files, adapter: args.adapter, dtype: args['out-dtype'] }));
    else print(`merged ${args.adapter} into ${args.model}: ${out} (${files.join(', ')}; ${args['out-dtype']})`);
  },
};
