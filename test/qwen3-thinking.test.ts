// Qwen3's hybrid thinking (issue 34): protocol.enable_thinking reaches rollouts, evaluation and SFT,
// and the token sequence trained is the one each turn was sampled on, turn by turn, under Qwen3's own
// hybrid chat template with thinking on and off. The template drops an earlier turn's <think> block
// once a user message follows (verl#2165, prime-rl#1334: trainers that re-render the conversation
// train on a context the model never saw); the runner keeps the sampled tokens, and SFT renders a
// conversation the same way. Expected texts below are written out by hand from the template.
import t from 'tap';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { configFromObject } from '../lib/config/index.js';
import { loadConfig } from '../lib/config/load.js';
import type { GenerateRequest, GenerateResult, TextGenerator } from '../lib/engine/types.js';
import { directProtocol } from '../lib/episodes/direct.js';
import { EpisodeRunner } from '../lib/episodes/runner.js';
import { ChatFormatter, ChatTemplate } from '../lib/model/chat.js';
import { initModel } from '../lib/model/init.js';
import { packagedQwen3Config, qwen3Tokenizer } from '../lib/model/tokenizer.js';
import { episodeRunner, type Agent, type Environment } from '../lib/train/environment.js';
import { trainFromConfig } from '../lib/train/session.js';
import { tokenizeConversation } from '../lib/train/sft/sft-data.js';

const tok = qwen3Tokenizer();
const IM_END = '<|im_end|>';
const hybrid = packagedQwen3Config().chat_template as string;
const formatter = new ChatFormatter(hybrid, { eosToken: IM_END });
const imEnd = tok.encode(IM_END);

t.test('the packaged template is the hybrid-thinking one (enable_thinking, reasoning dropped before the last query)', async (t) => {
  t.match(hybrid, /enable_thinking is defined and enable_thinking is false/);
  t.match(hybrid, /last_query_index/);
});

/** Plays scripted turns (whole, stopping where the engine would), recording every prompt it was given. */
class Recorder implements TextGenerator {
  prompts: number[][] = [];
  outputs: number[][] = [];
  #turn = 0;
  constructor(readonly turns: string[]) {}
  async generate(req: GenerateRequest): Promise<GenerateResult> {
    const all = tok.encode(this.turns[this.#turn++]);
    const out: number[] = [];
    let finish: 'stop_token' | 'stop_string' | 'length' = 'length';
    for (const id of all) {
      out.push(id);
      if (req.stopTokenIds?.includes(id)) {
        finish = 'stop_token';
        break;
      }
      if (req.stopStrings?.some((s) => tok.decode(out).endsWith(s))) {
        finish = 'stop_string';
        break;
      }
    }
    this.prompts.push(Array.from(req.prompts[0]));
    this.outputs.push(out);
    return { tokens: [Int32Array.from(out)], logprobs: [Float32Array.from(out, () => -0.5)], finishReasons: [finish] };
  }
}

const Q = 'What is the capital of France?';
const NOTE = 'No answer found. Give the answer between <answer> and </answer>.';
const PROMPT = `Answer from what you know. Question: ${Q}`;

for (const thinking of [true, false] as const)
  for (const envRole of ['user', 'tool'] as const)
    t.test(
      `thinking ${thinking ? 'on' : 'off'}, replies as ${envRole} messages: trained = sampled on, turn by turn; SFT of the episode = the episode`,
      async (t) => {
        // With thinking off the template writes the empty think block into each generation prompt; the
        // model's turns carry none.
        const turns = thinking
          ? [
              `<think>\nLet me recall the capital.\n</think>\n\nI am not sure yet.${IM_END}`,
              '<think>\nIt is Paris.\n</think>\n\n<answer> Paris </answer>',
            ]
          : [`I am not sure yet.${IM_END}`, '<answer> Paris </answer>'];
        const gen = new Recorder(turns);
        const runner = new EpisodeRunner({
          generator: gen,
          tokenizer: tok,
          formatter,
          protocol: directProtocol({ instruction: () => PROMPT, envRole }),
          maxTurns: 2,
          maxNewTokens: 64,
          maxTotalTokens: 1024,
          enableThinking: thinking,
        });
        const ep = (await runner.run([{ question: Q, temperature: 1 }])).episodes[0];
        t.equal(ep.answer, 'Paris');
        // The Qwen3 hybrid template's text, written out: the generation prompt (with the empty think
        // block when thinking is off) and the text between the turns.
        const head = thinking ? '' : '<think>\n\n</think>\n\n';
        const ctx1 = `<|im_start|>user\n${PROMPT}<|im_end|>\n<|im_start|>assistant\n${head}`;
        const reply =
          envRole === 'user'
            ? `<|im_start|>user\n${NOTE}<|im_end|>\n`
            : `<|im_start|>user\n<tool_response>\n${NOTE}\n</tool_response><|im_end|>\n`;
        const between = `\n${reply}<|im_start|>assistant\n${head}`;
        const expected = [...tok.encode(ctx1), ...gen.outputs[0], ...tok.encode(between), ...gen.outputs[1]];
        t.same(Array.from(ep.ids), expected, "the sequence: prompt, turn 1 as sampled, the template's text between, turn 2 as sampled");
        t.equal(tok.decode(Array.from(ep.ids)), ctx1 + turns[0] + between + turns[1]);
        // Turn by turn: what the generator was given is exactly the trained sequence before the turn,
        // and the loss mask covers exactly the sampled tokens.
        const start2 = tok.encode(ctx1).length + gen.outputs[0].length + tok.encode(between).length;
        t.same(gen.prompts[0], Array.from(ep.ids.slice(0, tok.encode(ctx1).length)), 'turn 1 was sampled on the sequence before it');
        t.same(
          gen.prompts[1],
          Array.from(ep.ids.slice(0, start2)),
          "turn 2 was sampled on the sequence before it, turn 1's <think> included",
        );
        const mask = Array.from(ep.lossMask);
        t.same(
          mask,
          expected.map((_, k) =>
            Number((k >= tok.encode(ctx1).length && k < tok.encode(ctx1).length + gen.outputs[0].length) || k >= start2),
          ),
          'the loss mask: exactly the sampled tokens',
        );
        // What the template renders for the same conversation whole differs where it drops the
        // earlier <think> block (a user message follows it): training on that render would condition
        // turn 2 on a context it was not sampled on.
        const canonical = new ChatTemplate(hybrid).render(ep.messages, { enableThinking: thinking });
        if (thinking && envRole === 'user')
          t.notOk(canonical.includes('Let me recall'), "the template's own render drops turn 1's thinking (the sequence keeps it)");
        // SFT on the episode's conversation (as trajectories.jsonl records it) trains on the same
        // tokens with the same mask, plus the end-of-turn token after the answer (the rollout stopped at
        // </answer>, the stop string; SFT teaches the turn's end).
        const sft = tokenizeConversation(ep.messages, formatter, tok, 0, { enableThinking: thinking });
        t.same(sft.ids, [...expected, ...imEnd], 'SFT ids = the episode, then <|im_end|>');
        t.same(sft.mask, [...mask, 1], "SFT mask = the episode's loss mask, and the end of the turn");
      },
    );

t.test('enable_thinking unset: a conversation the template cannot render as extensions is built as a rollout (not refused)', async (t) => {
  const messages = [
    { role: 'user' as const, content: PROMPT },
    { role: 'assistant' as const, content: '<think>\nLet me recall the capital.\n</think>\n\nI am not sure yet.' },
    { role: 'user' as const, content: NOTE },
    { role: 'assistant' as const, content: '<think>\nIt is Paris.\n</think>\n\n<answer> Paris </answer>' },
  ];
  const text = `<|im_start|>user\n${PROMPT}<|im_end|>\n<|im_start|>assistant\n${messages[1].content}${IM_END}\n<|im_start|>user\n${NOTE}<|im_end|>\n<|im_start|>assistant\n${messages[3].content}${IM_END}`;
  const sft = tokenizeConversation(messages, formatter, tok);
  t.equal(tok.decode(sft.ids), text, "both turns as written, the first one's thinking kept");
  t.equal(
    tok.decode(sft.ids.filter((_, k) => sft.mask[k])),
    `${messages[1].content}${IM_END}${messages[3].content}${IM_END}`,
    'trained: the two turns and their ends',
  );
});

t.test('protocol.enable_thinking reaches the runner (rollouts and evaluation) and SFT', async (t) => {
  const base = { stage: 'grpo', model: { path: '/m' }, data: { questions: '/q', corpus: '/c' } };
  t.equal(configFromObject(base).protocol.enable_thinking, null, 'default: not passed');
  t.throws(() => configFromObject({ ...base, protocol: { enable_thinking: 'no' } }), { code: 'CONFIG_INVALID' });
  const agent = { model: {} as never, tokenizer: tok, formatter } as unknown as Agent;
  const env = { protocol: directProtocol(), describe: '', close: async () => {} } as unknown as Environment;
  for (const v of [true, false]) {
    const cfg = configFromObject({ ...base, protocol: { enable_thinking: v } });
    t.equal(episodeRunner(cfg, agent, env, { seed: 0 }).options.enableThinking, v, `rollouts: ${v}`);
    t.equal(episodeRunner(cfg, agent, env, { seed: 0, eval: true }).options.enableThinking, v, `evaluation: ${v}`);
  }
  t.notOk('enableThinking' in episodeRunner(configFromObject(base), agent, env, { seed: 0 }).options, 'null: not passed');

  // SFT on a tiny model (its template: the packaged hybrid one): the metrics' sequence length and
  // trained tokens are those of tokenizeConversation with the configured enable_thinking.
  const root = t.testdir();
  const model = initModel({ preset: 'tiny', out: join(root, 'model') }).dir;
  const conv = [
    { role: 'user', content: PROMPT },
    { role: 'assistant', content: 'I am not sure yet.' },
    { role: 'user', content: NOTE },
    { role: 'assistant', content: '<answer> Paris </answer>' },
  ];
  writeFileSync(join(root, 'sft.jsonl'), JSON.stringify({ messages: conv }) + '\n');
  const fmt = ChatFormatter.forModel(model);
  const lengths: number[] = [];
  for (const v of [null, false] as const) {
    const file = join(root, `sft-${v}.yaml`);
    writeFileSync(
      file,
      `stage: sft\nmodel: { path: ${model} }\ndata: { sft: sft.jsonl }\nprotocol: { enable_thinking: ${v}, max_context: 512 }\nlora: { r: 2, alpha: 4 }\ntrain: { steps: 1, batch_size: 1, checkpoint_every: 0 }\nrun: { dir: ${join(root, 'runs')}, name: sft-${v} }\n`,
    );
    const r = await trainFromConfig(loadConfig(file));
    const row = readFileSync(join(r.dir, 'metrics.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l))[0];
    const ex = tokenizeConversation(conv as never, fmt, tok, 0, v === null ? {} : { enableThinking: v });
    t.equal(row.sequence_tokens_mean, ex.ids.length, `enable_thinking ${v}: ${ex.ids.length} tokens in the sequence`);
    t.equal(row.tokens_trained, ex.mask.filter(Boolean).length, `enable_thinking ${v}: trained tokens`);
    lengths.push(ex.ids.length);
  }
  t.ok(lengths[1] > lengths[0], `the setting changes what SFT trains on (${lengths[0]} vs ${lengths[1]} tokens)`);
  const off = tokenizeConversation(conv as never, fmt, tok, 0, { enableThinking: false });
  t.equal(
    (tok.decode(off.ids).match(/<think>\n\n<\/think>\n\n/g) ?? []).length,
    2,
    'off: the empty think block in both generation prompts',
  );
});
