/**
 * The command line: a thin yargs shell, one file per command (lib/cli/<command>.ts). Every failure
 * is printed as `slm-train: error CODE: message` with a non-zero exit code; the stack trace only
 * with --verbose.
 */
import yargs, { type Argv, type CommandModule } from 'yargs';
import { hideBin } from 'yargs/helpers';
import { SlmError, isSlmError } from '../errors.js';
import { commands } from './commands.js';
import { packageVersion } from './version.js';

export async function main(argv: string[] = hideBin(process.argv)): Promise<void> {
  const verbose = argv.includes('--verbose');
  try {
    let cli: Argv = yargs(argv)
      .scriptName('slm-train')
      .usage('$0 [command] [options]\n\nWith no command: the embedded demo (tiny model, built-in corpus, baseline -> SFT -> GRPO -> eval).')
      .option('verbose', { type: 'boolean', describe: 'print stack traces of errors', global: true })
      .strict()
      .recommendCommands()
      .help()
      .version(packageVersion())
      .fail((msg, err) => {
        if (err) throw err;
        throw new SlmError('ARGUMENT_INVALID', `${msg}. Run \`slm-train --help\` for the commands and options.`);
      });
    for (const c of commands) cli = cli.command(c as CommandModule);
    await cli.parseAsync();
  } catch (e) {
    report(e, verbose);
    process.exitCode = isSlmError(e) ? 2 : 1;
  }
}

export function report(e: unknown, verbose: boolean): void {
  if (isSlmError(e)) {
    process.stderr.write(`slm-train: error ${e.code}: ${e.message}\n`);
    if (verbose && e.stack) process.stderr.write(e.stack + '\n');
  } else {
    const err = e instanceof Error ? e : new Error(String(e));
    process.stderr.write(`slm-train: internal error: ${err.message}\n`);
    process.stderr.write(verbose && err.stack ? err.stack + '\n' : 'Run again with --verbose for the stack trace, and please report it.\n');
  }
}
