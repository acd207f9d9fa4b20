/** `slm-train generate --model DIR [--adapter DIR] (--prompt TEXT | --ids 1,2,3) [--max-new-tokens N] [--greedy] [--json]` */
import type { CommandModule } from 'yargs';
import { SlmError } from '../errors.js';
import { loadPolicyFromArgs, modelOptions, parseIds, print, type ModelArgs } from './common.js';

interface Args extends ModelArgs {
  prompt?: string;
  ids?: string;
  raw?: boolean;
  system?: string;
  'max-new-tokens': number;
  greedy?: boolean;
  temperature: number;
  'top-p': number;
  'top-k': number;
  seed: number;
  json?: boolean;
}

export const generateCommand: CommandModule<object, Args> = {
  command: 'generate',
  describe: 'sample or greedily decode from a model',
  builder: (yargs) =>
    modelOptions(yargs)
      .option('prompt', { type: 'string', describe: "text; rendered as a user turn with the model's chat template unless --raw" })
      .option('ids', { type: 'string', describe: 'comma-separated prompt token ids (instead of --prompt)' })
      .option('raw', { type: 'boolean', describe: 'encode --prompt as is, without the chat template' })
      .option('system', { type: 'string', describe: 'a system message for the chat template' })
      .option('max-new-tokens', { type: 'number', default: 128 })
      .option('greedy', { type: 'boolean', describe: 'argmax decoding' })
      .option('temperature', { type: 'number', default: 0.7 })
      .option('top-p', { type: 'number', default: 0.8 })
      .option('top-k', { type: 'number', default: 20 })
      .option('seed', { type: 'number', default: 0 })
      .option('json', { type: 'boolean', describe: 'print {"ids", "text", "logprobs", "finish_reason"}' })
      .check((a) => {
        if ((a.prompt === undefined) === (a.ids === undefined))
          throw new SlmError('ARGUMENT_INVALID', 'give exactly one of --prompt TEXT or --ids 1,2,3.');
        return true;
      }) as never,
  handler: async (args) => {
    // Token ids need no tokenizer; text does (the folder's, or the packaged Qwen3 one), and a
    // chat-rendered prompt its chat template.
    const needTokenizer = args.prompt !== undefined || !args.json;
    const {
      model: m,
      tokenizer: tok,
      formatter: chat,
    } = await loadPolicyFromArgs(args, { tokenizer: needTokenizer, chat: args.prompt !== undefined && !args.raw });
    try {
      let prompt: number[];
      if (args.ids !== undefined) prompt = parseIds(args.ids);
      else if (args.raw) prompt = tok!.encode(args.prompt!);
      else {
        const messages = [
          ...(args.system ? [{ role: 'system' as const, content: args.system }] : []),
          { role: 'user' as const, content: args.prompt! },
        ];
        prompt = tok!.encode(chat!.prompt(messages));
      }
      const r = await m.generate({
        prompts: [Int32Array.from(prompt)],
        maxNewTokens: args['max-new-tokens'],
        greedy: args.greedy,
        temperature: args.temperature,
        topP: args['top-p'],
        topK: args['top-k'],
        seed: args.seed,
        stopTokenIds: tok?.stopTokenIds ?? [],
      });
      const ids = Array.from(r.tokens[0]);
      const text = tok ? tok.decode(ids, { skipSpecialTokens: true }) : undefined;
      if (args.json) print(JSON.stringify({ ids, text, logprobs: Array.from(r.logprobs[0]), finish_reason: r.finishReasons[0] }));
      else print(text ?? ids.join(','));
    } finally {
      m.dispose();
    }
  },
};
