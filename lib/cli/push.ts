/**
 * `slm-train push RUN_OR_ADAPTER --repo OWNER/NAME [--private] [--branch B] [--message M] [--dry-run]`:
 * uploads the run's PEFT adapter with a generated model card (config, data, evaluation table) to the
 * hub at HF_ENDPOINT (default https://huggingface.co) with the write token in HF_TOKEN.
 */
import { writeFileSync } from 'node:fs';
import type { CommandModule } from 'yargs';
import { pushAdapter } from '../hub/push.js';
import { print } from './common.js';

interface Args {
  path: string;
  repo: string;
  private?: boolean;
  branch?: string;
  message?: string;
  'dry-run'?: boolean;
  card?: string;
  json?: boolean;
}

export const pushCommand: CommandModule<object, Args> = {
  command: 'push <path>',
  describe:
    'upload an adapter (a run folder, a checkpoint or an adapter folder) with a generated model card README.md to a Hugging Face hub repository',
  builder: (yargs) =>
    yargs
      .positional('path', {
        type: 'string',
        describe: "a run folder written by slm-train train (its adapter/), a checkpoint's adapter/, or a PEFT adapter folder",
      })
      .option('repo', { type: 'string', demandOption: true, describe: 'OWNER/NAME of the model repository (created when missing)' })
      .option('private', { type: 'boolean', describe: 'create the repository private' })
      .option('branch', { type: 'string', describe: 'branch to commit to (default main)' })
      .option('message', { type: 'string', describe: 'commit title' })
      .option('dry-run', { type: 'boolean', describe: 'upload nothing: print the files and the model card' })
      .option('card', { type: 'string', describe: 'also write the model card to this file' })
      .option('json', { type: 'boolean', describe: 'print {"repo", "url", "commit", "files"}' }) as never,
  handler: async (args) => {
    const r = await pushAdapter(String(args.path), {
      repo: args.repo,
      private: args.private,
      branch: args.branch,
      message: args.message,
      dryRun: args['dry-run'],
    });
    if (args.card) writeFileSync(args.card, r.card);
    if (args.json)
      print(
        JSON.stringify({
          repo: r.repo,
          url: r.url,
          commit: r.commit ?? null,
          files: r.files,
          ...(args['dry-run'] ? { card: r.card } : {}),
        }),
      );
    else if (args['dry-run']) print(`would upload to ${r.url}: ${r.files.join(', ')}\n\n${r.card}`);
    else print(`pushed to ${r.url} (commit ${r.commit}): ${r.files.join(', ')}`);
  },
};
