// Qwen3, Qwen2/2.5 and Llama 3.x through the one native decoder block, against an independent float64
// reference (test/reference/forward.py, written from the Hugging Face modeling files): tiny random
// checkpoints of each family (biases and norm weights drawn at random so that a mishandled bias or
// norm shows), logits within 1e-4, batched greedy decoding, LoRA gradients, a few training steps,
// PEFT save -> load, merged export; and Llama 3's RoPE scaling, whose effect is checked to be real.
import t, { type Test } from 'tap';
import { copyFileSync, readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { Model } from '../lib/engine/model.js';
import { initModel } from '../lib/model/init.js';
import type { LoraSpec } from '../lib/engine/adapter.js';
import { readSafetensorsHeader } from '../lib/model/safetensors.js';
import { NO_TORCH_PYTHON, compareLogits, runReference, torchPython, type RefCase } from './helpers/reference.js';
import { needs } from './helpers/shared.js';

const python = torchPython();
const skip = needs(python ? false : NO_TORCH_PYTHON, t);
const V = 300;
const PROJECTIONS: LoraSpec['targets'] = ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'];

// Llama 3.2's scaling with the context shrunk so that the tiny model's 16 frequencies fall in all
// three bands: head_dim 32 and theta 1e4 give wavelengths 2*pi*10^(i/4) = 6.3, 11.2, 19.9, 35.3, ...;
// with original_max_position_embeddings 32, low/high_freq_factor 1/4, wavelengths below 8 are kept,
// 8..32 interpolated, above 32 divided by the factor.
const LLAMA3_SCALING = {
  rope_type: 'llama3',
  factor: 8.0,
  low_freq_factor: 1.0,
  high_freq_factor: 4.0,
  original_max_position_embeddings: 32,
};

const FAMILIES = [
  { name: 'qwen2.5', modelType: 'qwen2', what: 'q/k/v biases, untied head', overrides: { tie_word_embeddings: false } },
  {
    name: 'llama3.2',
    modelType: 'llama',
    what: 'llama3 RoPE scaling, tied head',
    overrides: { rope_theta: 10000.0, max_position_embeddings: 256, rope_scaling: LLAMA3_SCALING },
  },
  {
    name: 'llama-biased',
    modelType: 'llama',
    what: 'attention_bias and mlp_bias, untied head',
    overrides: { attention_bias: true, mlp_bias: true, tie_word_embeddings: false },
  },
  { name: 'qwen3', modelType: 'qwen3', what: 'q/k norms, tied head', overrides: {} },
];

const ids = (n: number, k: number) => Array.from({ length: n }, (_, i) => (i * 37 + k * 101 + 11) % V);
const CASES: Record<string, RefCase> = {
  // Row 1 is left-padded by 4 (padding positions get 1, as HF's cumsum - 1 masked_fill(1) does).
  batch2_left_padded: {
    input_ids: [ids(10, 1), [0, 0, 0, 0, ...ids(6, 2)]],
    attention_mask: [Array(10).fill(1), [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]],
    position_ids: [Array.from({ length: 10 }, (_, i) => i), [1, 1, 1, 1, 0, 1, 2, 3, 4, 5]],
  },
  // Positions far beyond the original context, where the rescaled low frequencies matter most.
  position_offset_120: {
    input_ids: [ids(8, 3)],
    attention_mask: [Array(8).fill(1)],
    position_ids: [Array.from({ length: 8 }, (_, i) => 120 + i)],
  },
};
const PROMPTS = [ids(7, 4), ids(3, 5)];
const STEPS = 8;
const SEQ = ids(12, 6);
const SEQ_MASK = SEQ.map((_, i) => (i >= 5 ? 1 : 0));

function makeModel(dir: string, modelType: string, overrides: Record<string, unknown>, seed: number) {
  initModel({
    preset: 'tiny',
    modelType,
    out: dir,
    seed,
    overrides: { vocab_size: V, initializer_range: 0.2, ...overrides },
    embedStd: 0.5,
    biasStd: 0.1,
    normStd: 0.1,
  });
}

async function engineLogits(m: Model, c: RefCase) {
  return m.logits(c.input_ids, { attentionMask: c.attention_mask, positionIds: c.position_ids });
}

function maxDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let d = 0;
  for (let i = 0; i < a.length; i++) d = Math.max(d, Math.abs(a[i] - b[i]));
  return d;
}

for (const [fi, fam] of FAMILIES.entries()) {
  t.test(`${fam.name} (${fam.modelType}: ${fam.what})`, { skip }, async (t) => {
    const root = t.testdir();
    const dir = join(root, 'model');
    makeModel(dir, fam.modelType, fam.overrides, 10 + fi);
    const header = readSafetensorsHeader(join(dir, 'model.safetensors'));
    const cfg = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8'));
    t.equal(cfg.model_type, fam.modelType);
    // The checkpoint has the family's tensors (so the engine really runs that variant of the block).
    const hasQBias = 'model.layers.0.self_attn.q_proj.bias' in header,
      hasQNorm = 'model.layers.0.self_attn.q_norm.weight' in header;
    t.equal(hasQBias, fam.modelType === 'qwen2' || cfg.attention_bias === true, 'q_proj bias as the architecture has it');
    t.equal(
      'model.layers.0.self_attn.o_proj.bias' in header,
      cfg.attention_bias === true && fam.modelType !== 'qwen2',
      'o_proj bias as the architecture has it',
    );
    t.equal('model.layers.0.mlp.up_proj.bias' in header, cfg.mlp_bias === true, 'MLP bias as the architecture has it');
    t.equal(hasQNorm, fam.modelType === 'qwen3', 'q/k norm as the architecture has it');
    t.equal('lm_head.weight' in header, cfg.tie_word_embeddings !== true, 'separate lm_head only when untied');

    const ref = runReference(python!, {
      model_dir: dir,
      cases: Object.values(CASES),
      greedy: PROMPTS.map((p) => ({ prompt: p, steps: STEPS })),
    });
    const m = await Model.load(dir);
    t.teardown(() => m.dispose());

    await t.test('float32 logits within 1e-4 of the float64 reference', async (t) => {
      for (const [i, [name, c]] of Object.entries(CASES).entries()) {
        const r = await engineLogits(m, c);
        const { diff, argmaxMismatches, positions } = compareLogits(ref.cases[i].logits, r.data, V);
        t.ok(positions > 0);
        t.ok(diff < 1e-4, `${name}: max |diff| ${diff.toExponential(2)} < 1e-4`);
        t.equal(argmaxMismatches, 0, `${name}: argmax identical`);
      }
    });

    await t.test('batched greedy decoding (left-padded prompts) equals the reference argmax step by step', async (t) => {
      const g = await m.generate({ prompts: PROMPTS.map((p) => Int32Array.from(p)), maxNewTokens: STEPS, greedy: true });
      PROMPTS.forEach((_, i) => {
        // A near-tie in the reference would make the comparison depend on rounding: the checkpoints are
        // chosen so that every step has a clear winner.
        t.ok(
          Math.min(...ref.greedy[i].margins) > 1e-3,
          `prompt ${i}: reference top-1/top-2 margins ${Math.min(...ref.greedy[i].margins).toExponential(2)} > 1e-3`,
        );
        t.same(Array.from(g.tokens[i]), ref.greedy[i].tokens, `prompt ${i}: ${ref.greedy[i].tokens.join(' ')}`);
      });
      t.ok(new Set(ref.greedy.flatMap((x) => x.tokens)).size > 2, 'the decodes are not a constant token');
    });

    await t.test(
      'LoRA on every projection: gradients match float64 autograd, training lowers the loss, PEFT save -> load, merged export',
      async (t) => {
        m.attachLora({ r: 4, alpha: 8, dropout: 0, rslora: false, targets: PROJECTIONS }, 3);
        t.teardown(() => m.detachLora());
        // B = 0 would make every lora_A gradient zero: give B values so that both get gradients.
        for (const [name, v] of Object.entries(m.trainable()))
          if (name.endsWith('lora_B.weight'))
            m.setTrainable(
              name,
              v.map((_, i) => Math.sin(i + name.length) * 0.05),
            );
        const start = join(root, 'adapter-start');
        await m.saveAdapter(start);
        const names = Object.keys(readSafetensorsHeader(join(start, 'adapter_model.safetensors')));
        t.equal(names.length, 2 * 2 * PROJECTIONS.length, 'A and B for 7 projections in 2 layers');
        t.ok(
          names.includes('base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight') &&
            names.includes('base_model.model.model.layers.0.mlp.down_proj.lora_B.weight'),
          'PEFT tensor names',
        );

        const st = await m.trainStep({ sequences: [SEQ], masks: [SEQ_MASK] }, { loss: 'sft', lr: 0, maxGradNorm: 0, update: false });
        const grads = m.trainable({ grad: true });
        const rg = runReference(python!, { model_dir: dir, adapter_dir: start, sft_grad: { ids: SEQ, mask: SEQ_MASK } }).sft_grad!;
        t.ok(Math.abs(st.loss - rg.loss) < 1e-5, `SFT loss ${st.loss.toFixed(6)} vs reference ${rg.loss.toFixed(6)}`);
        let worst = 0,
          scale = 0;
        t.same(Object.keys(grads).sort(), Object.keys(rg.grads).sort(), 'a gradient for every LoRA tensor');
        for (const [k, g] of Object.entries(rg.grads)) {
          worst = Math.max(worst, maxDiff(grads[k], g));
          scale = Math.max(scale, ...g.map(Math.abs));
        }
        t.ok(scale > 1e-3, `the gradients are not vanishing (max |g| ${scale.toExponential(2)})`);
        t.ok(worst < 1e-4 * scale, `max |grad - reference| ${worst.toExponential(2)} < 1e-4 * max |g|`);

        let first = NaN,
          last = NaN;
        for (let i = 0; i < 5; i++) {
          const s = await m.trainStep({ sequences: [SEQ], masks: [SEQ_MASK] }, { loss: 'sft', lr: 1e-2, maxGradNorm: 1 });
          if (i === 0) first = s.loss;
          last = s.loss;
        }
        t.ok(last < first - 0.05, `5 SFT steps lower the loss: ${first.toFixed(4)} -> ${last.toFixed(4)}`);

        const trained = join(root, 'adapter-trained');
        await m.saveAdapter(trained);
        const probe = CASES.batch2_left_padded;
        const mine = await engineLogits(m, probe);
        const m2 = await Model.load(dir, { adapter: trained });
        t.teardown(() => m2.dispose());
        t.equal(maxDiff(mine.data, (await engineLogits(m2, probe)).data), 0, 'identical logits after PEFT save -> load');
        const rt = runReference(python!, { model_dir: dir, adapter_dir: trained, cases: [probe] });
        const { diff } = compareLogits(rt.cases[0].logits, mine.data, V);
        t.ok(diff < 1e-4, `trained adapter vs the float64 reference: max |diff| ${diff.toExponential(2)} < 1e-4`);
        const base = await engineLogits(await loadBare(t, dir), probe);
        t.ok(maxDiff(mine.data, base.data) > 1e-2, 'the adapter changes the output');

        const merged = join(root, 'merged');
        await m.exportMerged(merged);
        const mm = await Model.load(merged);
        t.teardown(() => mm.dispose());
        t.ok(
          maxDiff(mine.data, (await engineLogits(mm, probe)).data) < 1e-4,
          'the merged export (biases included) computes what base + adapter compute',
        );
      },
    );
  });
}

async function loadBare(t: Test, dir: string): Promise<Model> {
  const m = await Model.load(dir);
  t.teardown(() => m.dispose());
  return m;
}

t.test(
  'llama3 RoPE scaling is applied: the same weights without it give other logits, each matching its own reference',
  { skip },
  async (t) => {
    const root = t.testdir();
    const scaled = join(root, 'scaled'),
      plain = join(root, 'plain');
    makeModel(scaled, 'llama', { rope_theta: 10000.0, max_position_embeddings: 256, rope_scaling: LLAMA3_SCALING }, 21);
    mkdirSync(plain);
    copyFileSync(join(scaled, 'model.safetensors'), join(plain, 'model.safetensors'));
    const cfg = JSON.parse(readFileSync(join(scaled, 'config.json'), 'utf8'));
    writeFileSync(join(plain, 'config.json'), JSON.stringify({ ...cfg, rope_scaling: null }));
    const c = CASES.position_offset_120;
    const rs = runReference(python!, { model_dir: scaled, cases: [c] }).cases[0].logits;
    const rp = runReference(python!, { model_dir: plain, cases: [c] }).cases[0].logits;
    const refGap = maxDiff(
      rs[0].flatMap((r) => r!),
      rp[0].flatMap((r) => r!),
    );
    t.ok(refGap > 1e-2, `the reference's scaled and unscaled logits differ by ${refGap.toFixed(4)} (> 1e-2, i.e. 100x the tolerance)`);
    for (const [dir, ref, what] of [
      [scaled, rs, 'scaled'],
      [plain, rp, 'unscaled'],
    ] as const) {
      const m = await Model.load(dir);
      t.teardown(() => m.dispose());
      const { diff } = compareLogits(ref, (await engineLogits(m, c)).data, V);
      t.ok(diff < 1e-4, `${what}: engine within ${diff.toExponential(2)} of its reference`);
    }
  },
);
