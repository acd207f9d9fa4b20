// Bad input everywhere (issue 6, item 6): the real CLI process, one row per mistake a user makes —
// missing files, a config for another stage or with the wrong data in a slot, a model folder without
// weights, a corpus row without content, an adapter made for another base model, a port in use, an
// unreachable hub. Each must exit non-zero with `slm-train: error CODE: message`, the message naming
// the file or field at fault, and no stack trace.
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import t from 'tap';
import { writeSafetensors } from '../lib/model/safetensors.js';
import { freePort } from '../lib/distributed/launch.js';
import { runCli, runCliAsync } from './helpers/cli.js';
import { fixture } from './helpers/shared.js';

const dir = t.testdir();
const p = (...x: string[]) => join(dir, ...x);
const tiny = fixture('qwen3', 'tiny-qwen3-f32');
const lora = fixture('qwen3', 'tiny-lora');

const jsonl = (rows: unknown[]) => rows.map((r) => JSON.stringify(r)).join('\n') + '\n';
writeFileSync(
  p('questions.jsonl'),
  jsonl([
    { question: 'who wrote hamlet', answer: 'Shakespeare' },
    { question: 'capital of france', answer: 'Paris' },
  ]),
);
writeFileSync(
  p('sft.jsonl'),
  jsonl([
    {
      messages: [
        { role: 'user', content: 'q' },
        { role: 'assistant', content: '<answer>a</answer>' },
      ],
    },
  ]),
);
writeFileSync(p('corpus.jsonl'), jsonl([{ id: 'p1', title: 'Hamlet', content: 'A play.' }]));
writeFileSync(
  p('corpus-no-content.jsonl'),
  jsonl([
    { id: 'p1', title: 'Hamlet', content: 'A play.' },
    { id: 'p2', title: 'Paris' },
  ]),
);
writeFileSync(p('empty.jsonl'), '\n');
mkdirSync(p('no-weights'));
copyFileSync(join(tiny, 'config.json'), p('no-weights', 'config.json'));

const config = (name: string, body: string) => {
  writeFileSync(p(name), `run:\n  dir: ${p('runs')}\n${body}`);
  return p(name);
};
const model = `model:\n  path: ${tiny}\n`;
const configs = {
  sftNoData: config('sft-no-data.yaml', `stage: sft\n${model}`),
  sftWithQuestions: config('sft-questions.yaml', `stage: sft\n${model}data:\n  sft: ${p('questions.jsonl')}\n`),
  grpoWithSftData: config(
    'grpo-sft-data.yaml',
    `stage: grpo\n${model}data:\n  questions: ${p('sft.jsonl')}\n  corpus: ${p('corpus.jsonl')}\n`,
  ),
  evalStage: config('eval.yaml', `stage: eval\n${model}data:\n  questions: ${p('questions.jsonl')}\n  corpus: ${p('corpus.jsonl')}\n`),
  sft: config('sft.yaml', `stage: sft\n${model}data:\n  sft: ${p('sft.jsonl')}\n`),
  missingQuestions: config(
    'missing-questions.yaml',
    `stage: grpo\n${model}data:\n  questions: ${p('nope.jsonl')}\n  corpus: ${p('corpus.jsonl')}\n`,
  ),
  emptyQuestions: config(
    'empty-questions.yaml',
    `stage: eval\n${model}data:\n  questions: ${p('empty.jsonl')}\n  corpus: ${p('corpus.jsonl')}\n`,
  ),
  unknownKey: config('unknown-key.yaml', `stage: sft\n${model}data:\n  sft: ${p('sft.jsonl')}\noptim:\n  lerning_rate: 0.1\n`),
  badYaml: config('bad.yaml', `stage: sft\nmodel: [unclosed\n`),
  noWeights: config(
    'no-weights.yaml',
    `stage: eval\nmodel:\n  path: ${p('no-weights')}\ndata:\n  questions: ${p('questions.jsonl')}\n  corpus: ${p('corpus.jsonl')}\neval:\n  split: all\n`,
  ),
};

// A PEFT adapter made for a 32-wide model (q_proj, 2 layers, r 8); the fixture model is 64 wide with
// 4 heads x 32 = 128 query features, so every lora_A is [8, 32] where [8, 64] is needed.
mkdirSync(p('narrow-lora'));
writeFileSync(
  p('narrow-lora', 'adapter_config.json'),
  JSON.stringify({
    peft_type: 'LORA',
    base_model_name_or_path: 'someone/narrow-qwen3',
    r: 8,
    lora_alpha: 16,
    target_modules: ['q_proj'],
    bias: 'none',
  }),
);
writeSafetensors(
  p('narrow-lora', 'adapter_model.safetensors'),
  [0, 1].flatMap((l) => [
    { name: `base_model.model.model.layers.${l}.self_attn.q_proj.lora_A.weight`, dtype: 'F32' as const, shape: [8, 32], fill: () => {} },
    { name: `base_model.model.model.layers.${l}.self_attn.q_proj.lora_B.weight`, dtype: 'F32' as const, shape: [128, 8], fill: () => {} },
  ]),
);

let blocker: Server;
let busyPort = 0;
let closedPort = 0;
t.before(async () => {
  blocker = createServer();
  await new Promise<void>((r) => blocker.listen(0, '127.0.0.1', () => r()));
  busyPort = (blocker.address() as AddressInfo).port;
  closedPort = await freePort();
});
t.teardown(() => new Promise<void>((r) => blocker.close(() => r())));

interface Case {
  what: string;
  args: () => string[];
  code: string;
  /** What the message must name (the file, field, tensor, port...). */
  names: RegExp | (() => RegExp);
  env?: () => Record<string, string>;
}

const cases: Case[] = [
  // Missing files
  {
    what: 'a config file that does not exist',
    args: () => ['train', '--config', p('nope.yaml')],
    code: 'FILE_NOT_FOUND',
    names: /config file .*nope\.yaml does not exist/,
  },
  {
    what: 'a questions file that does not exist',
    args: () => ['train', '--config', configs.missingQuestions],
    code: 'FILE_NOT_FOUND',
    names: /data\.questions: .*nope\.jsonl/,
  },
  {
    what: 'a corpus file that does not exist',
    args: () => ['search', '--corpus', p('nope.jsonl'), 'hamlet'],
    code: 'FILE_NOT_FOUND',
    names: /corpus file .*nope\.jsonl/,
  },
  {
    what: 'a model folder that does not exist',
    args: () => ['logits', '--model', p('no-model'), '--ids', '1,2', '--json'],
    code: 'MODEL_NOT_FOUND',
    names: /no-model/,
  },
  {
    what: 'an adapter folder that does not exist',
    args: () => ['logits', '--model', tiny, '--adapter', p('no-adapter'), '--ids', '1,2'],
    code: 'ADAPTER_NOT_FOUND',
    names: /no-adapter/,
  },
  {
    what: 'a program file that does not exist',
    args: () => ['exec', '--corpus', p('corpus.jsonl'), '--file', p('nope.py')],
    code: 'FILE_NOT_FOUND',
    names: /nope\.py/,
  },
  // Configs that do not fit the command or the stage
  {
    what: 'an SFT config without data.sft',
    args: () => ['train', '--config', configs.sftNoData],
    code: 'CONFIG_INVALID',
    names: /data\.sft: missing; the sft stage needs chat-format JSONL/,
  },
  {
    what: 'question rows given as SFT data',
    args: () => ['train', '--config', configs.sftWithQuestions],
    code: 'DATA_INVALID',
    names: /questions\.jsonl: row 1 has no "messages" list.*rows \{question, answer\}.*data\.questions/,
  },
  {
    what: 'SFT conversations given as GRPO questions',
    args: () => ['train', '--config', configs.grpoWithSftData],
    code: 'DATA_INVALID',
    names: /sft\.jsonl: row 1 needs a non-empty string "question".*\{messages\}.*data\.sft/,
  },
  {
    what: 'an eval config given to train',
    args: () => ['train', '--config', configs.evalStage],
    code: 'CONFIG_INVALID',
    names: /stage: eval has nothing to train.*slm-train eval/,
  },
  {
    what: 'an SFT config given to eval (no questions)',
    args: () => ['eval', '--config', configs.sft],
    code: 'CONFIG_INVALID',
    names: /data\.questions.*stage sft/,
  },
  {
    what: 'a questions file without rows',
    args: () => ['eval', '--config', configs.emptyQuestions],
    code: 'DATA_INVALID',
    names: /empty\.jsonl has no question rows/,
  },
  {
    what: 'a misspelt config key',
    args: () => ['train', '--config', configs.unknownKey],
    code: 'CONFIG_UNKNOWN_KEY',
    names: /optim\.lerning_rate.*learning_rate|lr/,
  },
  {
    what: 'a config that is not YAML',
    args: () => ['train', '--config', configs.badYaml],
    code: 'CONFIG_INVALID',
    names: /bad\.yaml:\d+:\d+/,
  },
  // Models, adapters, corpora
  {
    what: 'a model folder without weights',
    args: () => ['logits', '--model', p('no-weights'), '--ids', '1,2', '--json'],
    code: 'WEIGHTS_MISSING',
    names: /no-weights has no weights: expected model\.safetensors/,
  },
  {
    what: 'a config whose model has no weights',
    args: () => ['eval', '--config', configs.noWeights],
    code: 'WEIGHTS_MISSING',
    names: /no-weights/,
  },
  {
    what: 'a corpus row without content',
    args: () => ['search', '--corpus', p('corpus-no-content.jsonl'), 'paris'],
    code: 'CORPUS_INVALID',
    names: /corpus-no-content\.jsonl: row 2 needs a string "content"/,
  },
  {
    what: 'an adapter made for a narrower model',
    args: () => ['logits', '--model', tiny, '--adapter', p('narrow-lora'), '--ids', '1,2'],
    code: 'ADAPTER_MISMATCH',
    names:
      /narrow-lora does not fit the model .*tiny-qwen3-f32: 2 of 4 LoRA tensors have other shapes \(e\.g\. base_model\.model\.model\.layers\.0\.self_attn\.q_proj\.lora_A\.weight \[8, 32\], this model needs \[8, 64\] \(r=8, in_features = hidden_size 64\)\).*base_model_name_or_path "someone\/narrow-qwen3"/,
  },
  {
    what: 'an adapter made for a model with fewer layers',
    args: () => ['logits', '--model', fixture('qwen3', 'tiny-qwen3-bf16-sharded'), '--adapter', lora, '--ids', '1,2'],
    code: 'ADAPTER_MISMATCH',
    names: /\d+ of \d+ LoRA tensors are missing \(.*layers\.2\..*the adapter covers 2 layers, this model has 3.*"tiny-qwen3-f32"/,
  },
  // Servers and the network
  {
    what: 'a port in use',
    args: () => ['serve', '--model', tiny, '--port', String(busyPort)],
    code: 'PORT_IN_USE',
    names: () => new RegExp(`port ${busyPort} is already in use`),
  },
  {
    what: 'a hub that cannot be reached',
    args: () => ['search', '--corpus', 'hf:someone/corpus', 'hamlet'],
    env: () => ({ HF_ENDPOINT: `http://127.0.0.1:${closedPort}`, HF_HUB_CACHE: p('hub-cache') }),
    code: 'HUB_UNREACHABLE',
    names: () => new RegExp(`hf:someone/corpus: .*could not reach the hub at http://127\\.0\\.0\\.1:${closedPort} \\(ECONNREFUSED`),
  },
];

t.test('every bad input: non-zero exit, its code, a message naming the culprit, no stack trace', async (t) => {
  for (const c of cases) {
    const r = await runCliAsync(c.args(), { env: c.env?.(), timeout: 120_000 });
    t.not(r.code, 0, `${c.what}: non-zero exit`);
    t.match(
      r.stderr,
      new RegExp(`^slm-train: error ${c.code}: `, 'm'),
      `${c.what}: ${c.code} (got: ${r.stderr.trim().split('\n').at(-1)})`,
    );
    t.match(r.stderr, typeof c.names === 'function' ? c.names() : c.names, `${c.what}: names the culprit`);
    t.notMatch(r.stderr, /^\s+at /m, `${c.what}: no stack trace`);
  }
});

t.test('--verbose adds the stack trace (so its absence above is a choice, not an accident)', async (t) => {
  const r = runCli(['logits', '--model', p('no-weights'), '--ids', '1', '--verbose']);
  t.equal(r.code, 2);
  t.match(r.stderr, /^\s+at /m);
});

// The adapter's shapes are read from its header; make sure the fixture really is the 64-wide one.
t.equal(JSON.parse(readFileSync(join(lora, 'adapter_config.json'), 'utf8')).base_model_name_or_path, 'tiny-qwen3-f32');
