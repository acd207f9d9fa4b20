// The native model handle's lifecycle: a change of the model while an async call uses it is refused
// with MODEL_BUSY (instead of racing it), concurrent readers are fine, V8 is told about the native
// memory the handle holds (V8's external memory) and Dispose gives all of it back.
import t from 'tap';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Model } from '../lib/engine/model.js';
import { native } from '../lib/engine/runtime.js';
import { initModel } from '../lib/model/init.js';
import type { NativeModel } from '../lib/binding/types.js';

const dir = mkdtempSync(join(tmpdir(), 'slm-handle-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
initModel({ preset: 'tiny', out: dir, seed: 5 });
const lora = {
  r: 4,
  alpha: 8,
  dropout: 0,
  rslora: false,
  targets: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'],
} as const;
const ids = [5, 17, 42, 9, 88, 3, 61, 27];
const mask = ids.map((_, i) => (i >= 2 ? 1 : 0));
const gen = (m: Model) => m.generate({ prompts: [Int32Array.from(ids)], maxNewTokens: 8, temperature: 1, seed: 1 });

t.test('MODEL_BUSY: no adapter change or train step while a generate runs; readers share', async (t) => {
  const m = await Model.load(dir);
  t.teardown(() => m.dispose());
  m.attachLora({ ...lora, targets: [...lora.targets] }, 1);
  const adapterDir = mkdtempSync(join(tmpdir(), 'slm-handle-adapter-'));
  t.teardown(() => rmSync(adapterDir, { recursive: true, force: true }));
  await m.saveAdapter(adapterDir);

  const running = gen(m);
  t.throws(() => m.attachLora({ ...lora, targets: [...lora.targets] }, 2), { code: 'MODEL_BUSY' }, 'attachLora');
  t.throws(() => m.detachLora(), { code: 'MODEL_BUSY' }, 'detachLora');
  t.throws(() => m.attachValueHead(1), { code: 'MODEL_BUSY' }, 'attachValueHead');
  t.throws(() => m.setReferenceAdapter(), { code: 'MODEL_BUSY' }, 'setReferenceAdapter');
  await t.rejects(m.loadAdapter(adapterDir), { code: 'MODEL_BUSY' }, 'loading an adapter');
  await t.rejects(m.trainStep({ sequences: [ids], masks: [mask] }, { loss: 'sft', lr: 1e-3 }), { code: 'MODEL_BUSY' }, 'a train step');
  // Readers run side by side.
  const [a, b, lp] = await Promise.all([running, gen(m), m.sequenceLogprobs([ids])]);
  t.same(Array.from(b.tokens[0]), Array.from(a.tokens[0]), 'two generates at once (same seed, same tokens)');
  t.equal(lp[0].length, ids.length);
  // Once they have finished, changes are allowed again.
  m.attachLora({ ...lora, targets: [...lora.targets] }, 2);
  await m.loadAdapter(adapterDir);

  // A train step running: no reader, no other writer.
  const before = m.trainable();
  const name = Object.keys(before)[0];
  const step = m.trainStep({ sequences: [ids], masks: [mask] }, { loss: 'sft', lr: 1e-3 });
  await t.rejects(gen(m), { code: 'MODEL_BUSY' }, 'generate during a train step');
  await t.rejects(m.sequenceLogprobs([ids]), { code: 'MODEL_BUSY' }, 'a forward pass during a train step');
  t.throws(() => m.trainable(), { code: 'MODEL_BUSY' }, 'reading the trainable tensors during a train step');
  t.throws(() => m.setTrainable(name, before[name]), { code: 'MODEL_BUSY' }, 'setTrainable');
  await t.rejects(
    m.trainStep({ sequences: [ids], masks: [mask] }, { loss: 'sft', lr: 1e-3 }),
    { code: 'MODEL_BUSY' },
    'a second train step',
  );
  const st = await step;
  t.ok(Number.isFinite(st.loss), 'the running step finished');
  await gen(m);
});

t.test('episode KV caches are in the count: stored by generate, freed by release, a limit and dispose', async (t) => {
  const ext = () => native().externalMemory();
  const slack = 1 << 20;
  const m = await Model.load(dir);
  const params = m.info().parameterBytes;
  const e0 = ext();
  // 16 rows of 150-token prompts: ~2.4 MB of KV cache at 1 KB a token (2 layers x 2 KV heads x 32 x K,V x float32).
  const keys = Array.from({ length: 16 }, (_, i) => `k${i}`);
  const prompts = keys.map((_, i) => Int32Array.from({ length: 150 }, (_, j) => (i * 37 + j * 11) % 200));
  await m.generate({ prompts, maxNewTokens: 8, greedy: true, cacheKeys: keys });
  const cached = m.cacheStats().bytes;
  t.ok(cached > 2 * slack, `the caches hold ${cached} bytes (more than the slack, else the test proves nothing)`);
  t.equal(m.info().nativeBytes, params + cached, 'after generate: the weights + the stored caches');
  t.ok(Math.abs(ext() - e0 - cached) < slack, `V8 was told (${ext() - e0} vs ${cached})`);
  m.releaseCaches(keys.slice(0, 8));
  const left = m.cacheStats().bytes;
  t.ok(left > 0 && left < cached);
  t.equal(m.info().nativeBytes, params + left, 'release: one cache less');
  m.setCacheLimit(0);
  t.equal(m.cacheStats().bytes, 0);
  t.equal(m.info().nativeBytes, params, 'a limit of 0 evicts the rest');
  t.ok(Math.abs(ext() - e0) < slack, `V8 was told (${ext() - e0})`);
  m.setCacheLimit(64 << 20);
  await m.generate({ prompts, maxNewTokens: 8, greedy: true, cacheKeys: keys });
  t.ok(Math.abs(ext() - e0 - m.cacheStats().bytes) < slack, 'stored again');
  m.dispose();
  t.ok(Math.abs(ext() - e0 + params) < slack, `dispose gives back the weights and the caches (${ext() - e0 + params})`);
});

t.test(
  'V8 is told about the native memory; dispose gives back the model, adapter, reference, value head and optimizer state',
  async (t) => {
    const ext = () => native().externalMemory(); // V8's count (ArrayBuffers move it too: 1 MB of slack)
    const slack = 1 << 20;
    const e0 = ext();
    const m = await Model.load(dir);
    const params = m.info().parameterBytes;
    t.equal(m.info().nativeBytes, params, 'loaded: the weights');
    t.ok(Math.abs(ext() - e0 - params) < slack, `V8 was told (${ext() - e0} vs ${params})`);
    m.attachLora({ ...lora, targets: [...lora.targets] }, 1);
    const lb = Object.values(m.trainable()).reduce((a, v) => a + v.byteLength, 0);
    t.equal(m.info().nativeBytes, params + lb, 'attached: + the adapter');
    m.setReferenceAdapter();
    m.attachValueHead(1);
    const vh = (m.config.hidden_size + 1) * 4;
    t.equal(m.info().nativeBytes, params + 2 * lb + vh, 'reference adapter and value head: + both');
    await m.trainStep({ sequences: [ids], masks: [mask] }, { loss: 'sft', lr: 1e-3 });
    const held = m.info().nativeBytes;
    t.equal(held, params + 2 * lb + vh + 2 * lb, 'after a step: + AdamW moments of every tensor with a gradient (the LoRA ones in SFT)');
    const before = ext();
    t.ok(before - e0 > held - slack, `V8 counts it all (${before - e0} vs ${held})`);
    m.dispose();
    t.ok(Math.abs(before - ext() - held) < slack, `dispose subtracts everything (${before - ext()} vs ${held})`);
    t.ok(Math.abs(ext() - e0) < slack, `back where it started (${ext() - e0})`);
    t.throws(() => m.info(), { code: 'HANDLE_DISPOSED' });
  },
);

t.test('one native class per concept: the model, its adapter set, value head and optimizer share one state', async (t) => {
  const classes = native() as unknown as Record<string, new (...args: unknown[]) => unknown>;
  for (const name of ['NativeModel', 'NativeAdapterSet', 'NativeValueHead', 'NativeOptimizer'])
    t.throws(() => new classes[name](), { code: 'ARGUMENT_INVALID', message: /use loadModel/ }, `${name} is made only by loadModel`);
  const m = await Model.load(dir);
  const h = (m as unknown as { handle: NativeModel }).handle;
  const { adapters, valueHead, optimizer } = h;
  t.ok(
    h instanceof classes.NativeModel &&
      adapters instanceof classes.NativeAdapterSet &&
      valueHead instanceof classes.NativeValueHead &&
      optimizer instanceof classes.NativeOptimizer,
    'four classes',
  );
  t.throws(() => ((h as { adapters: unknown }).adapters = null), TypeError, 'the parts are read-only properties');
  adapters.attach({ ...lora, targets: [...lora.targets], seed: 1 });
  valueHead.attach(2);
  t.ok('value_head.bias' in adapters.trainable(), "the adapter set's trainable tensors include the value head's");
  const lb = Object.values(adapters.trainable()).reduce((a, v) => a + v.byteLength, 0);
  t.equal(h.info().nativeBytes, m.info().parameterBytes + lb, "the model's count includes what its parts attached");
  const running = h.generate({
    ids: Int32Array.from(ids),
    lengths: Int32Array.of(ids.length),
    maxNewTokens: 4,
    temperature: Float32Array.of(1),
  });
  t.throws(() => valueHead.attachCritic(), { code: 'MODEL_BUSY' }, "a part sees the model's running call");
  t.throws(
    () => optimizer.trainStep({ ids: Int32Array.from(ids), lengths: Int32Array.of(ids.length), mask: Uint8Array.from(mask), loss: 'sft' }),
    { code: 'MODEL_BUSY' },
    '... and so does the optimizer',
  );
  await running;
  const st = await optimizer.trainStep({
    ids: Int32Array.from(ids),
    lengths: Int32Array.of(ids.length),
    mask: Uint8Array.from(mask),
    loss: 'sft',
    lr: 1e-3,
  });
  t.equal(st.step, 1, 'the optimizer steps the adapter attached through the adapter set');
  m.dispose();
  t.throws(() => adapters.trainable(), { code: 'HANDLE_DISPOSED' }, 'disposing the model disposes its adapter set');
  t.throws(() => valueHead.hasCritic(), { code: 'HANDLE_DISPOSED' }, '... its value head');
  t.throws(() => optimizer.gradients(), { code: 'HANDLE_DISPOSED' }, '... and its optimizer');
});
