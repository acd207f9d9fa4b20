// Weights placed on the CPU at load (native/core/cpu_weights.cc, cpu_place_weight): one of 2 MiB or more goes
// into memory whose whole 2 MiB pages are advised as transparent huge pages (the tail is not: no huge
// page partly unused), written once — converted to another dtype, or, where the kernel gives huge pages
// to advised memory (THP "always" or "madvise"), copied in its checkpoint's own dtype out of the file's
// memory map (4 KiB page-cache pages); with THP "never" such weights stay in the map. Checked through
// /proc/self/smaps, where a region advised with MADV_HUGEPAGE carries the flag `hg` whether or not the
// kernel then gives it huge pages, and by the values: the converted model gives the same logits, bit
// for bit, as a bfloat16 checkpoint of the same weights used as stored.
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { Model } from '../lib/engine/model.js';
import { initModel } from '../lib/model/init.js';

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

t.test(
  'a weight of 2 MiB or more, converted or used as stored, is advised as huge pages where the kernel gives them',
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
      bf16 = join(dir, 'bf16');
    initModel({ preset: 'tiny', out: f32, seed: 5 });
    initModel({ preset: 'tiny', out: bf16, seed: 5, dtype: 'bfloat16' });

    const s0 = advised();
    const converted = await Model.load(f32, { dtype: 'bfloat16' });
    const s1 = advised();
    const cfg = converted.config;
    const embedBytes = cfg.vocab_size * cfg.hidden_size * 2; // the tied embedding / head, in bfloat16
    t.ok(
      embedBytes >= HUGE && embedBytes % HUGE !== 0,
      `the tiny preset's embedding is ${embedBytes} bytes in bfloat16 (over 2 MiB, with a tail past its last whole 2 MiB)`,
    );
    const grew = added(s0, s1);
    const whole = Math.floor(embedBytes / HUGE) * HUGE;
    t.ok(
      grew.includes(whole),
      `the converted embedding's ${whole / HUGE} whole 2 MiB pages form a region advised as huge pages (new advised regions: ${grew.join(', ') || 'none'} bytes)`,
    );
    t.ok(
      grew.every((b) => b % HUGE === 0),
      'every new advised region is whole 2 MiB pages: the tail past the last one is not advised',
    );

    const asStored = await Model.load(bf16, { dtype: 'bfloat16' });
    const s2 = advised();
    const thp = readFileSync('/sys/kernel/mm/transparent_hugepage/enabled', 'utf8');
    if (/\[(always|madvise)\]/.test(thp))
      t.same(
        added(s1, s2),
        [whole],
        `THP ${thp.trim()}: a bfloat16 checkpoint used in bfloat16 has its embedding copied into advised huge pages too (and nothing smaller)`,
      );
    else t.same(added(s1, s2), [], `THP ${thp.trim()}: a bfloat16 checkpoint used in bfloat16 stays in the memory map`);

    const rows = [[9, 17, 400, 3021, 77, 150000, 12, 5]];
    const a = await converted.logits(rows),
      b = await asStored.logits(rows);
    t.equal(a.data.length, rows[0].length * cfg.vocab_size, 'a logit per position and vocabulary entry');
    t.ok(
      a.data.every((v, i) => Object.is(v, b.data[i])),
      'the converted model and the bfloat16 checkpoint give the same logits, bit for bit',
    );
  },
);
