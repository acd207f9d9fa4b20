// Weights placed on the CPU at load (native/core/cpu_weights.h, CpuWeightArena): every weight that is
// copied — converted to another dtype, or, where the kernel gives huge pages to advised memory (THP
// "always" or "madvise"), copied in its checkpoint's own dtype out of the file's memory map (4 KiB
// page-cache pages) — goes into one mapping sized for all of them (each at a 64-byte boundary), whose
// whole 2 MiB pages are advised as transparent huge pages (the tail is not: no huge page partly
// unused); with THP "never" weights in their own dtype stay in the map. Checked through
// /proc/self/smaps, where a region advised with MADV_HUGEPAGE carries the flag `hg` whether or not the
// kernel then gives it huge pages, against the sizes in the checkpoint's header, and by the values:
// the converted model gives the same logits, bit for bit, as a bfloat16 checkpoint of the same weights
// used as stored, and as one that also stores a copy of the tied head (checked, not placed).
import { existsSync, mkdtempSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { Model } from '../lib/engine/model.js';
import { initModel } from '../lib/model/init.js';
import { readSafetensorsHeader, writeSafetensors, type StDtype } from '../lib/model/safetensors.js';

const HUGE = 2 << 20;

/** Bytes of this process's mappings advised as huge pages (VmFlags `hg`), by start address. */
function advised(): Map<string, number> {
  const out = new Map<string, number>();
  let start = '',
    size = 0;
  for (const line of readFileSync('/proc/self/smaps', 'utf8').split('\n')) {
    const head = /^([0-9a-f]+)-([0-9a-f]+) /.exec(line);
    if (head) {
      start = head[1];
      size = Number(BigInt(`0x${head[2]}`) - BigInt(`0x${head[1]}`));
    } else if (line.startsWith('VmFlags:') && /\bhg\b/.test(line)) out.set(start, size);
  }
  return out;
}
const added = (before: Map<string, number>, after: Map<string, number>) => [...after].filter(([k]) => !before.has(k)).map(([, v]) => v);

/** The arena a checkpoint's tensors need in bfloat16: each tensor's bytes rounded up to 64, summed (header only). */
function arenaBytes(file: string, skip: string[] = []): number {
  let total = 0;
  for (const [name, e] of Object.entries(readSafetensorsHeader(file)))
    if (!skip.includes(name)) total += Math.ceil((e.shape.reduce((a, b) => a * b, 1) * 2) / 64) * 64;
  return total;
}

/** A copy of a bfloat16 checkpoint folder with `extra` tensors (name -> an existing tensor's name) added. */
function withCopies(src: string, out: string, extra: Record<string, string>): void {
  mkdirSync(out);
  for (const f of ['config.json', 'generation_config.json'])
    if (existsSync(join(src, f))) writeFileSync(join(out, f), readFileSync(join(src, f)));
  const file = join(src, 'model.safetensors');
  const bytes = readFileSync(file);
  const start = 8 + Number(bytes.readBigUInt64LE(0));
  const header = readSafetensorsHeader(file);
  const spec = (name: string, from: string) => {
    const e = header[from];
    return {
      name,
      dtype: e.dtype as StDtype,
      shape: e.shape,
      fill: (o: Uint8Array, el: number) =>
        o.set(bytes.subarray(start + e.data_offsets[0] + el * 2, start + e.data_offsets[0] + el * 2 + o.length)),
    };
  };
  writeSafetensors(join(out, 'model.safetensors'), [
    ...Object.keys(header).map((n) => spec(n, n)),
    ...Object.entries(extra).map(([n, from]) => spec(n, from)),
  ]);
}

t.test(
  "a model's copied weights share one mapping whose whole 2 MiB pages are advised as huge pages where the kernel gives them",
  {
    skip:
      process.platform !== 'linux'
        ? 'Linux only (/proc/self/smaps)'
        : !existsSync('/sys/kernel/mm/transparent_hugepage/enabled') &&
          'this kernel has no transparent huge pages (madvise refuses the advice)',
  },
  async (t) => {
    const dir = mkdtempSync(join(tmpdir(), 'slm-huge-'));
    t.teardown(() => rmSync(dir, { recursive: true, force: true }));
    const f32 = join(dir, 'f32'),
      bf16 = join(dir, 'bf16'),
      tiedCopy = join(dir, 'bf16-head-copy');
    // Projections of 256 KiB each, 3 MiB in all: one mapping for every weight has more whole 2 MiB
    // pages than the embedding alone, which is all that per-tensor placement advised.
    const overrides = { intermediate_size: 2048, num_hidden_layers: 4 };
    initModel({ preset: 'tiny', out: f32, seed: 5, overrides });
    initModel({ preset: 'tiny', out: bf16, seed: 5, dtype: 'bfloat16', overrides });
    withCopies(bf16, tiedCopy, { 'lm_head.weight': 'model.embed_tokens.weight' });

    const need = arenaBytes(join(f32, 'model.safetensors'));
    const whole = Math.floor(need / HUGE) * HUGE;
    const header = readSafetensorsHeader(join(f32, 'model.safetensors'));
    const embed = header['model.embed_tokens.weight'].shape;
    const embedBytes = embed[0] * embed[1] * 2;
    t.ok(
      whole > Math.floor(embedBytes / HUGE) * HUGE && need % HUGE !== 0,
      `the weights need ${need} bytes in bfloat16: more whole 2 MiB pages than the embedding's ${embedBytes} alone, and a tail`,
    );

    const s0 = advised();
    const converted = await Model.load(f32, { dtype: 'bfloat16' });
    const s1 = advised();
    t.same(
      added(s0, s1),
      [whole],
      `a float32 checkpoint converted to bfloat16: one new advised region, the ${whole / HUGE} whole 2 MiB pages of the ${need} bytes every weight needs (not one per tensor; the tail not advised)`,
    );

    const asStored = await Model.load(bf16, { dtype: 'bfloat16' });
    const s2 = advised();
    const thp = readFileSync('/sys/kernel/mm/transparent_hugepage/enabled', 'utf8');
    const copied = /\[(always|madvise)\]/.test(thp);
    if (copied)
      t.same(added(s1, s2), [whole], `THP ${thp.trim()}: a bfloat16 checkpoint used in bfloat16 is copied into the same kind of mapping`);
    else t.same(added(s1, s2), [], `THP ${thp.trim()}: a bfloat16 checkpoint used in bfloat16 stays in the memory map`);

    // A tied checkpoint that also stores the head: its copy is checked and dropped, never placed.
    t.equal(arenaBytes(join(tiedCopy, 'model.safetensors'), ['lm_head.weight']), need, 'the copy adds only the lm_head tensor');
    const tied = await Model.load(tiedCopy, { dtype: 'bfloat16' });
    const s3 = advised();
    t.same(added(s2, s3), copied ? [whole] : [], 'the stored copy of the tied head takes no room: the mapping is the same size');

    const rows = [[9, 17, 400, 3021, 77, 150000, 12, 5]];
    const a = await converted.logits(rows),
      b = await asStored.logits(rows),
      c = await tied.logits(rows);
    t.equal(a.data.length, rows[0].length * converted.config.vocab_size, 'a logit per position and vocabulary entry');
    t.ok(
      a.data.every((v, i) => Object.is(v, b.data[i]) && Object.is(v, c.data[i])),
      'the converted model, the bfloat16 checkpoint and the one with a stored head give the same logits, bit for bit',
    );
    for (const m of [converted, asStored, tied]) m.dispose();
    const s4 = advised();
    t.same(added(s4, s3).length, copied ? 3 : 1, 'disposing the models unmaps their weight mappings (each is held only by its tensors)');
  },
);
