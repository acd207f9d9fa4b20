/** `slm-train logits --model DIR [--adapter DIR] --ids 1,2,3 --json` */
import type { CommandModule } from 'yargs';
import { loadPolicyFromArgs, modelOptions, parseIds, print, type ModelArgs } from './common.js';

interface Args extends ModelArgs {
  ids: string;
  json?: boolean;
  top?: number;
}

export const logitsCommand: CommandModule<object, Args> = {
  command: 'logits',
  describe: 'print the float32 logits of every input position',
  builder: (y) =>
    modelOptions(y)
      .option('ids', { type: 'string', demandOption: true, describe: 'comma-separated token ids' })
      .option('json', { type: 'boolean', describe: 'print {"logits": [[...], ...]}: one row of vocab-size logits per position' })
      .option('top', { type: 'number', default: 5, describe: 'without --json: the top tokens to show per position' }) as never,
  handler: async (args) => {
    const ids = parseIds(args.ids);
    const { model: m } = await loadPolicyFromArgs(args, { tokenizer: false });
    try {
      const r = await m.logits([ids]);
      const rows: Float32Array[] = [];
      for (let t = 0; t < r.seqLen; t++) rows.push(r.data.subarray(t * r.vocab, (t + 1) * r.vocab));
      if (args.json) {
        // JSON.stringify of a number prints the shortest string that reads back as the same double;
        // float32 values widened to double read back exactly.
        print(`{"logits": [${rows.map((row) => `[${Array.from(row).join(', ')}]`).join(', ')}]}`);
      } else {
        rows.forEach((row, t) => {
          const top = Array.from(row.keys())
            .sort((x, y) => row[y] - row[x])
            .slice(0, args.top ?? 5)
            .map((i) => `${i}:${row[i].toFixed(4)}`);
          print(`position ${t} (id ${ids[t]}): ${top.join('  ')}`);
        });
      }
    } finally {
      m.dispose();
    }
  },
};
