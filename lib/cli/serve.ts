/** `slm-train serve --model DIR [--adapter DIR] --port N`: an OpenAI-compatible server (lib/serve). */
import { basename } from 'node:path';
import type { CommandModule } from 'yargs';
import { maxBodyBytes } from '../serve/http.js';
import { DEFAULT_MAX_TOKENS, DEFAULT_MAX_TOKENS_LIMIT } from '../serve/request.js';
import { OpenAIServer } from '../serve/server.js';
import { hubRepoName } from '../hub/download.js';
import { loadPolicyFromArgs, modelOptions, print, untilSignal, type ModelArgs } from './common.js';
import { progressLog } from '../util/progress.js';
import { SlmError } from '../errors.js';
import { native, serverAllocatorEnv } from '../engine/runtime.js';

interface Args extends ModelArgs {
  port: number;
  host: string;
  name?: string;
  'max-batch': number;
  'max-concurrent-calls': number;
  'prefill-chunk': number;
  'max-model-len'?: number;
  'max-body-mb': number;
  'max-tokens-default': number;
  'max-tokens-limit': number;
}

export const serveCommand: CommandModule<object, Args> = {
  command: 'serve',
  describe:
    'serve the model (with an adapter) as OpenAI-compatible /v1/chat/completions and /v1/completions (streaming, n, logprobs, tools), batching concurrent requests; Prometheus /metrics',
  builder: (yargs) =>
    modelOptions(yargs)
      .option('port', { type: 'number', default: 8000, describe: 'port (0 = any free port)' })
      .option('host', { type: 'string', default: '127.0.0.1', describe: 'address to listen on' })
      .option('name', { type: 'string', describe: 'model name in responses (default: the folder name)' })
      .option('max-batch', {
        type: 'number',
        default: 32,
        describe: 'rows decoding at once in a session (also the largest n); more wait for a row to end',
      })
      .option('max-concurrent-calls', {
        type: 'number',
        default: 2,
        describe:
          'decode sessions run at once: rows with other top-k, stops, log-probs or adapter than the running session start one beside it',
      })
      .option('prefill-chunk', {
        type: 'number',
        default: 512,
        describe: 'prompt positions per prefill forward, between two decode steps of the running rows (0: a prompt at once)',
      })
      .option('max-tokens-default', { type: 'number', default: DEFAULT_MAX_TOKENS, describe: 'max_tokens of a request that names none' })
      .option('max-tokens-limit', {
        type: 'number',
        default: DEFAULT_MAX_TOKENS_LIMIT,
        describe: 'the largest max_tokens a request may ask; larger is a 400 (code max_tokens_over_limit)',
      })
      .option('max-body-mb', { type: 'number', default: 32, describe: 'the largest request body in MiB; a larger one is a 413' })
      .option('max-model-len', {
        type: 'number',
        describe: "the longest prompt + max_tokens a request may ask for (default: the model's max_position_embeddings); longer is a 400",
      }) as never,
  handler: async (args) => {
    serverAllocatorEnv(process.env); // before the addon loads
    args.name ??= hubRepoName(args.model) ?? basename(args.model);
    const bodyLimit = maxBodyBytes(args['max-body-mb']);
    const defaultMaxTokens = args['max-tokens-default'];
    const maxTokensLimit = args['max-tokens-limit'];
    if (!(Number.isInteger(maxTokensLimit) && maxTokensLimit >= 1))
      throw new SlmError('ARGUMENT_INVALID', `--max-tokens-limit must be a whole number of tokens, at least 1, found ${maxTokensLimit}.`);
    if (!(Number.isInteger(defaultMaxTokens) && defaultMaxTokens >= 1 && defaultMaxTokens <= maxTokensLimit))
      throw new SlmError(
        'ARGUMENT_INVALID',
        `--max-tokens-default must be a whole number of tokens from 1 to --max-tokens-limit (${maxTokensLimit}), found ${defaultMaxTokens}.`,
      );
    const { model, tokenizer, formatter } = await loadPolicyFromArgs(args);
    const maxLen = args['max-model-len'];
    if (maxLen !== undefined && !(Number.isInteger(maxLen) && maxLen >= 2 && maxLen <= model.config.max_position_embeddings))
      throw new SlmError(
        'ARGUMENT_INVALID',
        `--max-model-len must be an integer from 2 to the model's max_position_embeddings (${model.config.max_position_embeddings}), found ${maxLen}.`,
      );
    for (const [k, min] of [
      ['max-concurrent-calls', 1],
      ['prefill-chunk', 0],
    ] as const)
      if (!(Number.isInteger(args[k]) && args[k] >= min))
        throw new SlmError('ARGUMENT_INVALID', `--${k} must be a whole number, at least ${min}, found ${args[k]}.`);
    const server = new OpenAIServer({
      model,
      tokenizer,
      formatter,
      name: args.name,
      port: args.port,
      host: args.host,
      maxBatch: args['max-batch'],
      maxConcurrentCalls: args['max-concurrent-calls'],
      prefillChunk: args['prefill-chunk'],
      maxBodyBytes: bodyLimit,
      maxModelLen: maxLen,
      defaultMaxTokens,
      maxTokensLimit,
      adapter: args.adapter,
      log: progressLog(process.stderr, '[slm-train] '),
    });
    const port = await server.listen();
    print(
      `serving ${args.name}${args.adapter ? ` + ${args.adapter}` : ''} on http://${args.host}:${port}/v1 (chat/completions, completions, models; /metrics); CPU tensors: ${native().version().cpuCache}`,
    );
    await untilSignal();
    // Closing the connections cancels every request's rows: queued rows leave the queue, a running
    // call ends at its next decode step or prefill chunk. With --prefill-chunk 0 a prefill is one
    // native step that nothing interrupts (up to --max-model-len tokens: minutes on a CPU), so after a
    // bounded wait the process exits without it rather than stay resident until it ends.
    await server.close();
    const grace = SHUTDOWN_GRACE_MS;
    const idle = await Promise.race([server.idle().then(() => true), new Promise<boolean>((r) => setTimeout(r, grace, false).unref())]);
    model.dispose();
    if (!idle) {
      process.stderr.write(
        `[slm-train] serve: a generate call (a prefill in one forward, which cannot be interrupted) was still running ${grace / 1000} s after the signal; exiting without waiting for it\n`,
      );
      // process.exit would wait on the native call (its static destructors join the engine's
      // threads): end by the signal's default action instead, as a process killed by SIGTERM.
      process.removeAllListeners('SIGTERM');
      process.kill(process.pid, 'SIGTERM');
    }
  },
};

/** How long `serve` waits for a running generate call after SIGINT/SIGTERM before it exits anyway. */
export const SHUTDOWN_GRACE_MS = 5000;
