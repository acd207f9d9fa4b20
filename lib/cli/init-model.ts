/** `slm-train init-model --preset tiny|small [--model-type qwen3|qwen2|llama] --out DIR` */
import type { CommandModule } from 'yargs';
import { PRESETS, STORAGE_DTYPES, initModel } from '../model/init.js';
import { SUPPORTED_MODEL_TYPES } from '../model/config.js';
import { print } from './common.js';

interface Args {
  preset: string;
  modelType: string;
  out: string;
  seed: number;
  dtype: (typeof STORAGE_DTYPES)[number];
}

export const initModelCommand: CommandModule<object, Args> = {
  command: 'init-model',
  describe: 'write a randomly initialised checkpoint (Qwen3, Qwen2/2.5 or Llama 3 architecture) in Hugging Face layout',
  builder: (yargs) =>
    yargs
      .option('preset', {
        choices: Object.keys(PRESETS),
        demandOption: true,
        describe: Object.entries(PRESETS)
          .map(([k, p]) => `${k}: ${p.description}`)
          .join('; '),
      })
      .option('model-type', { choices: SUPPORTED_MODEL_TYPES, default: 'qwen3', describe: 'the architecture (config.json model_type)' })
      .option('out', { type: 'string', demandOption: true, describe: 'output folder' })
      .option('seed', { type: 'number', default: 0 })
      .option('dtype', { choices: STORAGE_DTYPES, default: 'float32' as const, describe: 'storage dtype of the weights' }) as never,
  handler: async (a) => {
    const r = initModel({ preset: a.preset, modelType: a.modelType, out: a.out, seed: a.seed, dtype: a.dtype });
    print(`wrote ${a.preset} ${a.modelType} model (${(r.parameters / 1e6).toFixed(1)}M parameters) to ${r.dir}`);
  },
};
