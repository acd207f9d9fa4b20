/** `slm-train report RUN_DIR [--out FILE]`: (re)writes the run's self-contained HTML report. */
import type { CommandModule } from 'yargs';
import { writeReport } from '../train/report/report.js';
import { print } from './common.js';

interface Args {
  run: string;
  out?: string;
  json?: boolean;
}

export const reportCommand: CommandModule<object, Args> = {
  command: 'report <run>',
  describe: 'write the HTML report of a run folder (curves of metrics.jsonl, evaluations, sampled trajectories) to RUN/report.html',
  builder: (y) =>
    y
      .positional('run', { type: 'string', describe: 'a run folder (run.dir/run.name) written by slm-train train' })
      .option('out', { type: 'string', describe: 'output file (default: RUN/report.html)' })
      .option('json', { type: 'boolean', describe: 'print {"report": PATH}' }) as never,
  handler: async (a) => {
    const out = await writeReport(String(a.run), { out: a.out });
    print(a.json ? JSON.stringify({ report: out }) : `report: ${out}`);
  },
};
