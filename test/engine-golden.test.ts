// The native engine against independent references: logits and greedy decodes computed in float64
// from the Hugging Face formulas (../shared/fixtures/qwen3/golden.json).
import t from 'tap';
import { Model } from '../lib/engine/model.js';
import { fixture } from './helpers/shared.js';
import { maxAbsDiff, readGolden } from './helpers/golden.js';

const golden = readGolden();

for (const [name, g] of Object.entries(golden.models)) {
  if (g.adapter_dir) continue; // adapters: test/lora-golden (LoRA training core)
  t.test(`${name}: float32 logits within 1e-4 of the float64 reference`, async (t) => {
    const m = await Model.load(fixture('qwen3', g.model_dir), { dtype: 'float32' });
    t.teardown(() => m.dispose());
    for (const c of g.cases) {
      const r = await m.logits(c.input_ids, { attentionMask: c.attention_mask, positionIds: c.position_ids });
      t.same([r.batch, r.seqLen, r.vocab], c.logits_shape, `${c.name}: shape`);
      const { diff, argmaxMismatches } = maxAbsDiff(c, r.data);
      t.ok(diff < 1e-4, `${c.name}: max |diff| ${diff.toExponential(2)} < 1e-4`);
      t.equal(argmaxMismatches, 0, `${c.name}: argmax identical`);
    }
  });

  t.test(`${name}: greedy decode identical to the reference`, async (t) => {
    const m = await Model.load(fixture('qwen3', g.model_dir), { dtype: 'float32' });
    t.teardown(() => m.dispose());
    const r = await m.generate({ prompts: [Int32Array.from(g.greedy.prompt)], maxNewTokens: Number(g.greedy.steps), greedy: true });
    t.same(Array.from(r.tokens[0]), g.greedy.tokens);
    t.equal(r.finishReasons[0], 'length');
  });

  // bfloat16 compute: every matmul input is rounded to 8 significant bits (relative error 2^-9 per
  // rounding), through 2-3 layers of residual sums of O(1) values and a final vocab projection of 64
  // terms; we measured max |diff| ~0.02-0.03 on these fixtures, so 0.08 bounds it with margin while a
  // real bug (wrong RoPE, missing norm) moves logits by O(0.1-1). Argmax may only differ where the
  // reference's own top-1/top-2 margin is below twice that bound: at every other position it must agree.
  t.test(`${name}: bfloat16 compute stays within bf16 rounding of the reference`, async (t) => {
    const m = await Model.load(fixture('qwen3', g.model_dir), { dtype: 'bfloat16' });
    t.teardown(() => m.dispose());
    t.equal(m.info().dtype, 'BFloat16');
    let checked = 0;
    for (const c of g.cases) {
      const r = await m.logits(c.input_ids, { attentionMask: c.attention_mask, positionIds: c.position_ids });
      const { diff, widePositions, wideMismatches } = maxAbsDiff(c, r.data, 0.16);
      t.ok(diff < 0.08, `${c.name}: max |diff| ${diff.toFixed(4)} < 0.08`);
      t.equal(wideMismatches, 0, `${c.name}: argmax identical at the ${widePositions} positions whose reference margin exceeds 0.16`);
      checked += widePositions;
    }
    t.ok(checked > 0, `the argmax check ran (${checked} positions)`);
  });
}

// F16 checkpoints: the f32 fixture rewritten with F16 weights (rounded to 11 significant bits) must
// load, be converted to the compute dtype, and stay within f16 rounding of the reference.
t.test('F16 weights load and compute within f16 rounding of the reference', async (t) => {
  const { readSafetensorsHeader, writeSafetensors } = await import('../lib/model/safetensors.js');
  const { copyFileSync, readFileSync } = await import('node:fs');
  const { join } = await import('node:path');
  const src = fixture('qwen3', 'tiny-qwen3-f32');
  const dir = t.testdir();
  copyFileSync(join(src, 'config.json'), join(dir, 'config.json'));
  const header = readSafetensorsHeader(join(src, 'model.safetensors'));
  const raw = readFileSync(join(src, 'model.safetensors'));
  const dataStart = 8 + Number(raw.readBigUInt64LE(0));
  const toF16 = (x: number): number => {
    // round-to-nearest float32 -> float16 bits (normal range is enough for these weights)
    const f = new Float32Array([x]);
    const u = new Uint32Array(f.buffer)[0];
    const sign = (u >>> 16) & 0x8000;
    const exp = ((u >>> 23) & 0xff) - 127 + 15;
    if (exp <= 0) return sign; // flush tiny values
    const mant = u & 0x7fffff;
    let h = sign | (exp << 10) | (mant >>> 13);
    if (mant & 0x1000 && mant & 0x2fff) h++;
    return h;
  };
  writeSafetensors(
    join(dir, 'model.safetensors'),
    Object.entries(header).map(([name, e]) => ({
      name,
      dtype: 'F16' as const,
      shape: e.shape,
      fill: (out: Uint8Array, off: number) => {
        const n = out.byteLength / 2;
        const f = new Float32Array(
          raw.buffer.slice(
            raw.byteOffset + dataStart + e.data_offsets[0] + off * 4,
            raw.byteOffset + dataStart + e.data_offsets[0] + (off + n) * 4,
          ),
        );
        const o = new Uint16Array(out.buffer, out.byteOffset, n);
        for (let i = 0; i < n; i++) o[i] = toF16(f[i]);
      },
    })),
  );
  const m = await Model.load(dir, { dtype: 'float32' });
  t.teardown(() => m.dispose());
  const g = golden.models['tiny-qwen3-f32'];
  for (const c of g.cases) {
    const r = await m.logits(c.input_ids, { attentionMask: c.attention_mask, positionIds: c.position_ids });
    const { diff } = maxAbsDiff(c, r.data);
    // f16 keeps 11 significant bits (relative 2^-12 per weight); measured max |diff| ~1e-3.
    t.ok(diff < 0.01, `${c.name}: max |diff| ${diff.toExponential(2)} < 0.01 (f16 weights)`);
    t.ok(diff > 1e-7, 'the weights really were rounded');
  }
});
