/**
 * `slm-train` with no arguments: the embedded demo (lib/demo/pipeline.ts). A fictional corpus, a
 * tiny model with its own tokenizer, expert trajectories from a scripted expert, then baseline eval
 * -> SFT -> eval -> GRPO -> eval, and a table of the three evaluations.
 */
import { join, resolve } from 'node:path';
import type { CommandModule } from 'yargs';
import { runDemo, type DemoOptions } from '../demo/pipeline.js';
import { progressLog } from '../util/progress.js';
import { print } from './common.js';

export interface Args {
  out?: string;
  pages?: number;
  'sft-examples'?: number;
  'sft-epochs'?: number;
  'grpo-steps'?: number;
  seed?: number;
  compare?: boolean;
  'pass-k'?: number;
}

/** The demo's options from its command line (every flag reaches runDemo). */
export function demoOptions(a: Args, out: string): DemoOptions {
  return {
    out,
    pages: a.pages,
    sftExamples: a['sft-examples'],
    sftEpochs: a['sft-epochs'],
    grpoSteps: a['grpo-steps'],
    seed: a.seed,
    compare: a.compare,
    passK: a['pass-k'],
  };
}

export const demoCommand: CommandModule<object, Args> = {
  command: '$0',
  describe: 'the embedded demo: tiny model, fictional corpus, baseline -> SFT -> GRPO, results table',
  builder: (yargs) =>
    yargs
      .option('out', { type: 'string', describe: 'run folder (default: runs/demo-<time>)' })
      .option('pages', { type: 'number', describe: 'pages of the generated corpus (5 questions each; default 150)' })
      .option('sft-examples', {
        type: 'number',
        describe: 'expert trajectories SFT trains on, from the training questions in demonstrated phrasings (default 300)',
      })
      .option('sft-epochs', { type: 'number', describe: 'SFT epochs over the expert trajectories' })
      .option('grpo-steps', { type: 'number', describe: 'GRPO steps' })
      .option('seed', { type: 'number', describe: 'seed of the corpus, the model and the training (default 0)' })
      .option('compare', {
        type: 'boolean',
        describe:
          'also train SFT for longer (SFT + GRPO wall time) and RFT with as many sampled episodes as GRPO, and measure pass@k of every row',
      })
      .option('pass-k', {
        type: 'number',
        describe: 'pass@k of every evaluation, k episodes per question at the rollout settings (default 8 with --compare, else off)',
      }) as never,
  handler: async (args) => {
    const out = resolve(args.out ?? join('runs', `demo-${new Date().toISOString().replace(/[:.]/g, '-')}`));
    const t0 = performance.now();
    const log = progressLog(process.stderr, () => `[demo ${((performance.now() - t0) / 1e3).toFixed(0).padStart(4)} s] `);
    const r = await runDemo({ ...demoOptions(args, out), log, progress: { stream: process.stderr } });
    print('');
    print(r.table);
    print('');
    print(r.kindTable);
    print('');
    print(
      `Evaluated on the ${r.stages[0].summary.questions} held-out questions (greedy); accuracy = exact match after Search-R1 normalisation. Demonstrated phrasings: the ones the expert's trajectories use; undemonstrated: phrasings SFT never saw, which GRPO met only as questions with an outcome reward.`,
    );
    print(`Total ${((performance.now() - t0) / 1e3).toFixed(0)} s. Run folder: ${r.dir} (report.md, configs/, runs/, data/, model/)`);
  },
};
