/**
 * `slm-train` with no arguments: the embedded demo. The full pipeline (baseline eval -> SFT -> GRPO
 * -> eval on a built-in corpus) needs the trainer; until it lands the demo runs the part that exists:
 * it creates the tiny model, renders built-in questions with the chat template, and generates a
 * batch of rollouts in one native call, reporting what it did and how long each phase took.
 */
import { mkdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { CommandModule } from 'yargs';
import { Model } from '../engine/model.js';
import { ChatFormatter } from '../model/chat.js';
import { initModel } from '../model/init.js';
import { loadTokenizer } from '../model/tokenizer.js';
import { print } from './common.js';

const QUESTIONS = [
  'In which year was the Varnholt Observatory founded?',
  'Who designed the Quillmere Bridge?',
  'What river flows through the town of Ostrava Minor?',
  'Which composer wrote the Sellabrook Cantatas?',
];

export const demoCommand: CommandModule<object, { out?: string }> = {
  command: '$0',
  describe: 'the embedded demo (tiny model, built-in questions)',
  builder: (y) => y.option('out', { type: 'string', describe: 'run folder (default: runs/demo-<time>)' }) as never,
  handler: async (a) => {
    const run = resolve(a.out ?? join('runs', `demo-${new Date().toISOString().replace(/[:.]/g, '-')}`));
    mkdirSync(run, { recursive: true });
    let t = Date.now();
    const { dir, parameters } = initModel({ preset: 'tiny', out: join(run, 'model'), seed: 0 });
    print(`created the tiny model (${(parameters / 1e6).toFixed(1)}M parameters) in ${Date.now() - t} ms: ${dir}`);
    t = Date.now();
    const model = await Model.load(dir);
    const tok = loadTokenizer(dir);
    model.setVocab(tok.tokenBytes());
    const chat = ChatFormatter.forModel(dir);
    const system = 'Answer questions by searching. Write code in <python> tags, the final answer in <answer> tags.';
    const prompts = QUESTIONS.flatMap((q) => [0, 1].map(() => Int32Array.from(tok.encode(chat.prompt([{ role: 'system', content: system }, { role: 'user', content: q }])))));
    print(`loaded the engine and tokenizer in ${Date.now() - t} ms`);
    const temps = prompts.map((_, i) => 0.7 + (0.45 * i) / (prompts.length - 1));
    const g = await model.generate({ prompts, maxNewTokens: 24, temperature: temps, topP: 1, seed: 1, stopTokenIds: tok.stopTokenIds, stopStrings: ['</python>', '</answer>'] });
    const generated = g.tokens.reduce((s, x) => s + x.length, 0);
    print(`generated ${prompts.length} rollouts (${generated} tokens, temperatures 0.70-1.15) in one native call: prefill ${(g.prefillSeconds * 1e3).toFixed(0)} ms, decode ${(g.decodeSeconds * 1e3).toFixed(0)} ms`);
    print(`first rollout (an untrained model writes noise): ${JSON.stringify(tok.decode(g.tokens[0]).slice(0, 120))}`);
    print('');
    print('The full demo (baseline eval -> SFT -> GRPO -> eval, with a results table) arrives with the trainer.');
    print(`run folder: ${run}`);
    model.dispose();
  },
};
