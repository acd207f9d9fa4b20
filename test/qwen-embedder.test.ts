// Qwen3 checkpoints as embedders (issue 3, item 3): the native last-token hidden state is the one
// the model's head reads (checked against the float64 golden logits of ../shared/fixtures through
// the tied embedding), pooling takes each row's own last token whatever the batch's padding, vectors
// are unit length, queries carry the instruction, and an index built with the embedder saves, loads
// (re-loading the model the manifest names) and searches.
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { Model } from '../lib/engine/model.js';
import { readSafetensorsHeader } from '../lib/model/safetensors.js';
import { initModel } from '../lib/model/init.js';
import { Corpus } from '../lib/retrieval/corpus.js';
import { SearchIndex, embedderFor } from '../lib/retrieval/index.js';
import { QwenEmbedder, DEFAULT_TASK } from '../lib/retrieval/qwen-embedder.js';
import { syntheticCorpus } from '../lib/retrieval/synthetic.js';
import { readGolden } from './helpers/golden.js';
import { fixture } from './helpers/shared.js';

t.test('the last hidden state times the tied embedding gives the golden logits of the last position', async (t) => {
  const dir = fixture('qwen3', 'tiny-qwen3-f32');
  const file = join(dir, 'model.safetensors');
  const h = readSafetensorsHeader(file);
  const e = h['model.embed_tokens.weight'];
  const raw = readFileSync(file);
  const start = 8 + Number(raw.readBigUInt64LE(0));
  const E = new Float32Array(raw.buffer.slice(raw.byteOffset + start + e.data_offsets[0], raw.byteOffset + start + e.data_offsets[1]));
  const [V, H] = e.shape;
  const m = await Model.load(dir);
  t.teardown(() => m.dispose());
  let checked = 0;
  for (const c of readGolden().models['tiny-qwen3-f32'].cases) {
    const rows = c.input_ids.filter((_, b) => c.attention_mask[b].every((x) => x === 1) && c.position_ids[b].every((p, i) => p === i));
    const idx = c.input_ids
      .map((_, b) => b)
      .filter((b) => c.attention_mask[b].every((x) => x === 1) && c.position_ids[b].every((p, i) => p === i));
    if (!rows.length) continue;
    const hs = await m.lastHidden(rows);
    idx.forEach((b, j) => {
      const want = c.logits[b]![c.input_ids[b].length - 1]!;
      let worst = 0;
      for (let v = 0; v < V; v++) {
        let s = 0;
        for (let k = 0; k < H; k++) s += hs[j][k] * E[v * H + k];
        worst = Math.max(worst, Math.abs(s - want[v]));
      }
      t.ok(worst < 1e-4, `${c.name} row ${b}: max |h.E - golden| = ${worst.toExponential(2)}`);
      checked++;
    });
  }
  t.ok(checked >= 2, `${checked} golden rows checked`);
  // Pooling takes each row's last real token: a row embedded alone and beside a longer one agree.
  const a = [5, 6, 7];
  const b = [9, 10, 11, 12, 13, 14, 15];
  const [alone] = await m.lastHidden([a]);
  const [mixed] = await m.lastHidden([a, b]);
  t.ok(
    alone.every((x, i) => Math.abs(x - mixed[i]) < 1e-5),
    'padding in the batch changes nothing',
  );
  await t.rejects(m.lastHidden([[]]), { code: 'ARGUMENT_INVALID' });
});

t.test('QwenEmbedder: unit vectors, the query instruction, an index that saves and loads', async (t) => {
  const root = t.testdir();
  const modelDir = join(root, 'emb');
  initModel({ preset: 'tiny', out: modelDir, seed: 3 });
  const emb = await QwenEmbedder.load(modelDir, { batch: 3 });
  t.teardown(() => emb.dispose());
  t.equal(emb.name, `qwen3:${modelDir}`);
  t.equal(emb.dim, 64);
  t.equal(emb.queryText('who?'), `Instruct: ${DEFAULT_TASK}\nQuery:who?`);
  const texts = ['The town lies on the river.', 'Copper is mined there.', 'A fair every spring.', 'x', 'The town lies on the river.'];
  const v = await emb.embed(texts, 'document');
  for (const x of v) t.ok(Math.abs(Math.hypot(...x) - 1) < 1e-5, 'unit length');
  t.ok(
    v[0].every((x, i) => Math.abs(x - v[4][i]) < 1e-5),
    'the same text, the same vector (to rounding), whatever its batch',
  );
  const [q] = await emb.embed([texts[0]], 'query');
  t.notSame(Array.from(q), Array.from(v[0]), 'queries are embedded with the instruction');

  const gen = syntheticCorpus({ pages: 8, seed: 2 });
  const idx = await SearchIndex.build(new Corpus(gen.pages), { kind: 'dense', embedder: emb });
  const hits = await idx.searchPages(gen.questions[0].question, 5);
  t.equal(hits.length, 5);
  const out = join(root, 'index');
  idx.save(out);
  t.match(JSON.parse(readFileSync(join(out, 'manifest.json'), 'utf8')).embedder, { name: `qwen3:${modelDir}`, dim: 64 });
  const back = await SearchIndex.load(out);
  t.same(await back.searchPages(gen.questions[0].question, 5), hits, 'the loaded index re-loads the model and answers the same');
  await t.rejects(SearchIndex.load(out, { embedder: await embedderFor('hashing') }), {
    code: 'INDEX_INVALID',
    message: /built with the embedder qwen3:.*but hashing-256/,
  });
  writeFileSync(join(root, 'not-a-model'), '');
  await t.rejects(embedderFor(join(root, 'nothing')), { code: 'MODEL_NOT_FOUND' });
});
