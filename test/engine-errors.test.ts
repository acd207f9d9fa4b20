// Bad input to the engine: each case has its own error code and a message that says what was
// expected and what was found; none of them crashes the process.
import t, { type Test } from 'tap';
import { copyFileSync, readFileSync, writeFileSync, truncateSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { Model } from '../lib/engine/model.js';
import { native } from '../lib/engine/runtime.js';
import { writeSafetensors } from '../lib/model/safetensors.js';
import { nativeConfig, readModelConfig } from '../lib/model/config.js';
import { resolveWeightFiles } from '../lib/model/weights.js';
import { fixture } from './helpers/shared.js';

const f32 = fixture('qwen3', 'tiny-qwen3-f32');
const sharded = fixture('qwen3', 'tiny-qwen3-bf16-sharded');

function copyModel(t: Test, from: string, files: string[]): string {
  const dir = t.testdir();
  for (const f of files) copyFileSync(join(from, f), join(dir, f));
  return dir;
}

async function expectCode(t: Test, p: Promise<unknown>, code: string, pattern: RegExp) {
  await t.rejects(p, { code, name: 'SlmError' }, `code ${code}`);
  try {
    await p;
  } catch (e) {
    t.match((e as Error).message, pattern, `message: ${(e as Error).message.slice(0, 160)}`);
  }
}

t.test('missing folder -> MODEL_NOT_FOUND', async (t) => {
  await expectCode(t, Model.load('/nonexistent/model'), 'MODEL_NOT_FOUND', /does not exist.*init-model/s);
});

t.test('folder without weights -> WEIGHTS_MISSING', async (t) => {
  const dir = copyModel(t, f32, ['config.json']);
  await expectCode(t, Model.load(dir), 'WEIGHTS_MISSING', /model\.safetensors/);
});

t.test('missing shard -> WEIGHTS_SHARD_MISSING naming the shard', async (t) => {
  const dir = copyModel(t, sharded, ['config.json', 'model.safetensors.index.json', 'model-00001-of-00002.safetensors']);
  await expectCode(t, Model.load(dir), 'WEIGHTS_SHARD_MISSING', /model-00002-of-00002\.safetensors/);
});

t.test('truncated safetensors -> WEIGHTS_CORRUPT naming the tensor', async (t) => {
  const dir = copyModel(t, f32, ['config.json', 'model.safetensors']);
  const p = join(dir, 'model.safetensors');
  truncateSync(p, statSync(p).size - 1000);
  await expectCode(t, Model.load(dir), 'WEIGHTS_CORRUPT', /tensor '.+' ends at byte .* truncated/);
  truncateSync(p, 4);
  await expectCode(t, Model.load(dir), 'WEIGHTS_CORRUPT', /too short/);
});

t.test('garbage header -> WEIGHTS_CORRUPT', async (t) => {
  const dir = copyModel(t, f32, ['config.json']);
  const buf = Buffer.alloc(64);
  buf.writeBigUInt64LE(20n);
  buf.write('{not json at all!!!}', 8);
  writeFileSync(join(dir, 'model.safetensors'), buf);
  await expectCode(t, Model.load(dir), 'WEIGHTS_CORRUPT', /not valid JSON/);
});

t.test('wrong shape -> WEIGHTS_MISMATCH naming the tensor and both shapes', async (t) => {
  const dir = copyModel(t, f32, ['model.safetensors']);
  const cfg = JSON.parse(readFileSync(join(f32, 'config.json'), 'utf8'));
  cfg.intermediate_size = 128;
  writeFileSync(join(dir, 'config.json'), JSON.stringify(cfg));
  await expectCode(t, Model.load(dir), 'WEIGHTS_MISMATCH', /model\.layers\.0\.mlp\.gate_proj\.weight.*\[160, 64\].*\[128, 64\]/);
});

t.test('fewer layers in config than in the weights -> WEIGHTS_UNUSED', async (t) => {
  const dir = copyModel(t, f32, ['model.safetensors']);
  const cfg = JSON.parse(readFileSync(join(f32, 'config.json'), 'utf8'));
  cfg.num_hidden_layers = 1;
  writeFileSync(join(dir, 'config.json'), JSON.stringify(cfg));
  await expectCode(t, Model.load(dir), 'WEIGHTS_UNUSED', /model\.layers\.1\./);
});

t.test('untied config over tied weights -> WEIGHTS_MISSING lm_head', async (t) => {
  const dir = copyModel(t, f32, ['model.safetensors']);
  const cfg = JSON.parse(readFileSync(join(f32, 'config.json'), 'utf8'));
  cfg.tie_word_embeddings = false;
  writeFileSync(join(dir, 'config.json'), JSON.stringify(cfg));
  await expectCode(t, Model.load(dir), 'WEIGHTS_MISSING', /lm_head\.weight/);
});

t.test('unknown dtype -> DTYPE_UNSUPPORTED', async (t) => {
  const dir = copyModel(t, f32, ['config.json']);
  writeSafetensors(join(dir, 'model.safetensors'), [{ name: 'model.norm.weight', dtype: 'F32', shape: [64], fill: () => {} }]);
  // Rewrite the header's dtype to one the engine does not read (same byte length keeps offsets valid).
  const p = join(dir, 'model.safetensors');
  const b = readFileSync(p);
  const s = b.toString('latin1').replace('"F32"', '"F8"  ');
  writeFileSync(p, Buffer.from(s, 'latin1'));
  await expectCode(t, Model.load(dir), 'DTYPE_UNSUPPORTED', /F8.*expected one of F32, F16, BF16/);
});

t.test('model_type other than qwen3 / qwen2 / llama -> MODEL_TYPE_UNSUPPORTED listing what is supported', async (t) => {
  const dir = copyModel(t, f32, ['model.safetensors']);
  const cfg = JSON.parse(readFileSync(join(f32, 'config.json'), 'utf8'));
  cfg.model_type = 'gpt2';
  writeFileSync(join(dir, 'config.json'), JSON.stringify(cfg));
  await expectCode(t, Model.load(dir), 'MODEL_TYPE_UNSUPPORTED', /"gpt2".*supported: qwen3, qwen2, llama\..*Qwen\/Qwen2\.5-3B-Instruct/);
});

t.test('unsupported or incomplete rope_scaling, sliding-window attention -> MODEL_CONFIG_INVALID saying what is supported', async (t) => {
  const dir = copyModel(t, f32, ['model.safetensors']);
  const cfg = JSON.parse(readFileSync(join(f32, 'config.json'), 'utf8'));
  const write = (c: object) => writeFileSync(join(dir, 'config.json'), JSON.stringify({ ...cfg, ...c }));
  write({ rope_scaling: { rope_type: 'yarn', factor: 4, original_max_position_embeddings: 32768 } });
  await expectCode(
    t,
    Model.load(dir),
    'MODEL_CONFIG_INVALID',
    /rope_scaling type "yarn" is not supported; supported: none, default, llama3\..*remove rope_scaling/,
  );
  write({ rope_scaling: { type: 'dynamic', factor: 2 } });
  await expectCode(t, Model.load(dir), 'MODEL_CONFIG_INVALID', /"dynamic" is not supported/);
  write({ rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4 } });
  await expectCode(
    t,
    Model.load(dir),
    'MODEL_CONFIG_INVALID',
    /llama3 rope_scaling needs a positive number "original_max_position_embeddings".*found nothing/,
  );
  write({
    rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 4, high_freq_factor: 1, original_max_position_embeddings: 32 },
  });
  await expectCode(t, Model.load(dir), 'MODEL_CONFIG_INVALID', /high_freq_factor > low_freq_factor/);
  write({ use_sliding_window: true, sliding_window: 4096 });
  await expectCode(t, Model.load(dir), 'MODEL_CONFIG_INVALID', /use_sliding_window.*full attention only/);
  const logitsWith = async (c: object) => {
    write(c);
    const m = await Model.load(dir);
    try {
      return Array.from((await m.logits([[1, 2, 3, 4, 5, 6, 7, 8]])).data);
    } finally {
      m.dispose();
    }
  };
  const plain = await logitsWith({});
  t.same(await logitsWith({ rope_scaling: { rope_type: 'default' } }), plain, 'rope_type "default" is the unscaled RoPE: the same logits');
  t.notSame(await logitsWith({ rope_theta: cfg.rope_theta * 4 }), plain, 'while another RoPE base changes them (the comparison can fail)');
});

t.test('config.json of another architecture than the weights -> the tensor that does not fit is named', async (t) => {
  const dir = copyModel(t, f32, ['model.safetensors']);
  const cfg = JSON.parse(readFileSync(join(f32, 'config.json'), 'utf8'));
  writeFileSync(join(dir, 'config.json'), JSON.stringify({ ...cfg, model_type: 'qwen2' }));
  await expectCode(t, Model.load(dir), 'WEIGHTS_MISSING', /'model\.layers\.0\.self_attn\.q_proj\.bias'/);
  writeFileSync(join(dir, 'config.json'), JSON.stringify({ ...cfg, model_type: 'llama' }));
  await expectCode(t, Model.load(dir), 'WEIGHTS_UNUSED', /llama model does not use: .*q_norm.*wrong model_type/);
});

t.test('the native side rejects architectures and RoPE types it does not implement, whatever the caller passes', async (t) => {
  const files = resolveWeightFiles(f32);
  const config = nativeConfig(readModelConfig(f32));
  await expectCode(
    t,
    native().loadModel({ files, config: { ...config, model_type: 'gpt2' }, dtype: 'float32', device: 'cpu' }),
    'MODEL_TYPE_UNSUPPORTED',
    /'gpt2'.*supported: qwen3, qwen2, llama/,
  );
  await expectCode(
    t,
    native().loadModel({ files, config: { ...config, rope_type: 'yarn' }, dtype: 'float32', device: 'cpu' }),
    'MODEL_CONFIG_INVALID',
    /'yarn'.*supported: default, llama3/,
  );
  await expectCode(
    t,
    native().loadModel({
      files,
      config: {
        ...config,
        rope_type: 'llama3',
        rope_factor: 8,
        rope_low_freq_factor: 4,
        rope_high_freq_factor: 1,
        rope_original_max_position_embeddings: 32,
      },
      dtype: 'float32',
      device: 'cpu',
    }),
    'MODEL_CONFIG_INVALID',
    /low_freq_factor < high_freq_factor/,
  );
});

t.test('invalid config.json -> MODEL_CONFIG_INVALID', async (t) => {
  const dir = copyModel(t, f32, ['model.safetensors']);
  writeFileSync(join(dir, 'config.json'), '{"model_type": "qwen3", "hidden_size": -4}');
  await expectCode(t, Model.load(dir), 'MODEL_CONFIG_INVALID', /positive integer/);
  writeFileSync(join(dir, 'config.json'), '{oops');
  await expectCode(t, Model.load(dir), 'MODEL_CONFIG_INVALID', /not valid JSON/);
});

t.test('ids outside the vocabulary -> TOKEN_OUT_OF_RANGE (JS check and native check)', async (t) => {
  const m = await Model.load(f32);
  t.teardown(() => m.dispose());
  await expectCode(t, m.logits([[1, 2, 512]]), 'TOKEN_OUT_OF_RANGE', /512.*\[0, 512\)/);
  await expectCode(t, m.generate({ prompts: [Int32Array.from([-1])], maxNewTokens: 2 }), 'TOKEN_OUT_OF_RANGE', /-1/);
  // The native layer checks too, for callers that bypass the wrapper.
  const handle = (m as unknown as { handle: { logits: (r: unknown) => Promise<unknown> } }).handle;
  await expectCode(t, handle.logits({ ids: Int32Array.from([5, 9999]), batch: 1, seqLen: 2 }), 'TOKEN_OUT_OF_RANGE', /9999/);
  // And the model still works afterwards.
  const ok = await m.logits([[1, 2, 3]]);
  t.equal(ok.data.length, 3 * 512);
});

t.test('a disposed model says so', async (t) => {
  const m = await Model.load(f32);
  m.dispose();
  t.throws(() => m.info(), { code: 'HANDLE_DISPOSED' });
});

const hasCuda = native().version().cuda;
t.test('cuda on a CPU-only libtorch -> DEVICE_UNAVAILABLE', { skip: hasCuda ? 'this libtorch has CUDA' : false }, async (t) => {
  await expectCode(t, Model.load(f32, { device: 'cuda' }), 'DEVICE_UNAVAILABLE', /no CUDA support/);
});
