// TensorBoard event files (lib/train/report/tensorboard.ts, RunFolder.logMetrics): read back by an
// independent decoder in Python (struct, its own CRC-32C, protobuf wire format parsed by hand), which
// checks every record's framing and both masked CRCs and returns the events.
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { RunFolder, tbScalars } from '../lib/train/run.js';
import { crc32c, encodeEvent, EventWriter, maskedCrc32c } from '../lib/train/report/tensorboard.js';

const DECODER = `
import json, struct, sys

def table():
    t = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t
T = table()

def crc32c(b):
    c = 0xFFFFFFFF
    for x in b:
        c = T[(c ^ x) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF

def masked(b):
    c = crc32c(b)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

assert crc32c(b"123456789") == 0xE3069283

def varint(b, i):
    shift = v = 0
    while True:
        x = b[i]; i += 1
        v |= (x & 0x7F) << shift; shift += 7
        if not x & 0x80:
            return v, i

def fields(b):
    i, out = 0, []
    while i < len(b):
        k, i = varint(b, i)
        f, w = k >> 3, k & 7
        if w == 0:
            v, i = varint(b, i)
        elif w == 1:
            v = b[i:i + 8]; i += 8
        elif w == 5:
            v = b[i:i + 4]; i += 4
        elif w == 2:
            n, i = varint(b, i); v = b[i:i + n]; i += n
        else:
            raise ValueError("wire type %d" % w)
        out.append((f, w, v))
    return out

events = []
data = open(sys.argv[1], "rb").read()
i = 0
while i < len(data):
    header = data[i:i + 8]
    (n,) = struct.unpack("<Q", header)
    (hc,) = struct.unpack("<I", data[i + 8:i + 12])
    if hc != masked(header):
        print(json.dumps({"error": "length crc mismatch at %d" % i})); sys.exit(0)
    body = data[i + 12:i + 12 + n]
    (dc,) = struct.unpack("<I", data[i + 12 + n:i + 16 + n])
    if dc != masked(body):
        print(json.dumps({"error": "data crc mismatch at %d" % i})); sys.exit(0)
    i += 16 + n
    ev = {"values": []}
    for f, w, v in fields(body):
        if f == 1 and w == 1: ev["wall_time"] = struct.unpack("<d", v)[0]
        elif f == 2 and w == 0: ev["step"] = v
        elif f == 3 and w == 2: ev["file_version"] = v.decode()
        elif f == 5 and w == 2:
            for sf, sw, sv in fields(v):
                assert sf == 1 and sw == 2
                val = {}
                for vf, vw, vv in fields(sv):
                    if vf == 1 and vw == 2: val["tag"] = vv.decode()
                    elif vf == 2 and vw == 5: val["simple_value"] = struct.unpack("<f", vv)[0]
                ev["values"].append(val)
        elif f == 6 and w == 2:
            ev["session_status"] = dict((sf, sv) for sf, sw, sv in fields(v) if sw == 0).get(1)
    events.append(ev)
print(json.dumps({"events": events}))
`;

/** A python3 that runs: Debian's first (it is what CI installs), then the one on PATH. */
function python(): string | undefined {
  for (const p of ['/usr/bin/python3', 'python3'])
    if (spawnSync(p, ['-c', 'import struct, json'], { encoding: 'utf8' }).status === 0) return p;
  return undefined;
}

function decode(py: string, file: string) {
  const r = spawnSync(py, ['-c', DECODER, file], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(r.stderr);
  return JSON.parse(r.stdout) as {
    error?: string;
    events?: Array<{
      wall_time: number;
      step: number;
      file_version?: string;
      values: Array<{ tag: string; simple_value: number }>;
      session_status?: number;
    }>;
  };
}

t.test('crc32c: the standard check value and the TFRecord mask', async (t) => {
  t.equal(crc32c(Buffer.from('123456789')), 0xe3069283);
  t.equal(crc32c(Buffer.alloc(0)), 0);
  const c = crc32c(Buffer.from('abc'));
  t.equal(maskedCrc32c(Buffer.from('abc')), (((c >>> 15) | (c << 17)) + 0xa282ead8) >>> 0);
  // Event{wall_time: 1.5, step: 300, file_version: "x"} by hand: 0x09 + double, 0x10 + varint(300) = ac 02, 0x1a 01 'x'
  t.same(
    [...encodeEvent({ wallTime: 1.5, step: 300, fileVersion: 'x' })],
    [0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f, 0x10, 0xac, 0x02, 0x1a, 0x01, 0x78],
  );
});

t.test('metrics rows become TensorBoard scalars that an independent reader decodes', async (t) => {
  const py = python();
  t.ok(py, 'a python3 runs (tried /usr/bin/python3, then python3 on PATH)');
  if (!py) return;
  const dir = t.testdir();
  const run = new RunFolder(dir);
  const t0 = Date.now() / 1000;
  run.logMetrics({
    stage: 'grpo',
    step: 1,
    reward_mean: 0.25,
    'reward/f1': 0.5,
    loss: -0.125,
    kl: NaN,
    accuracy: undefined,
    skip_reasons: ['x'],
    time_train_s: 2,
  });
  run.logMetrics({ stage: 'grpo', step: 2, reward_mean: 0.75, 'reward/f1': 1, loss: 0.0625, time_train_s: 3 });
  run.logMetrics({ step: 2, kind: 'eval', eval_accuracy: 0.5, eval_f1: 0.625 });
  run.tensorboard().write({ wallTime: t0, step: 2, sessionStart: true });
  run.close();
  const files = readdirSync(join(dir, 'tb'));
  t.equal(files.length, 1);
  t.match(files[0], /^events\.out\.tfevents\.\d{10}\.[\w.-]+$/, 'the name TensorBoard looks for');
  const r = decode(py, join(dir, 'tb', files[0]));
  t.notOk(r.error, 'every record is framed right and both CRCs match');
  const ev = r.events!;
  t.equal(ev.length, 5);
  t.match(ev[0], { step: 0, file_version: 'brain.Event:2', values: [] }, 'file_version first');
  t.ok(
    ev.every((e) => Math.abs(e.wall_time - t0) < 60),
    'wall times are unix seconds',
  );
  const vals = (e: (typeof ev)[0]) => Object.fromEntries(e.values.map((v) => [v.tag, v.simple_value]));
  t.equal(ev[1].step, 1);
  t.same(
    vals(ev[1]),
    { 'train/reward_mean': 0.25, 'train/reward/f1': 0.5, 'train/loss': -0.125, 'train/time_train_s': 2 },
    "finite numbers only, NaN and non-numbers left out; a step's under train/",
  );
  t.equal(ev[2].step, 2);
  t.same(vals(ev[2]), { 'train/reward_mean': 0.75, 'train/reward/f1': 1, 'train/loss': 0.0625, 'train/time_train_s': 3 });
  t.same(vals(ev[3]), { 'eval/accuracy': 0.5, 'eval/f1': 0.625 }, 'evaluation rows under eval/');
  t.match(ev[4], { step: 2, session_status: 1, values: [] }, 'SessionLog START (what a resumed run writes)');
  t.match(
    run.readMetrics()[0],
    { step: 1, reward_mean: 0.25, 'reward/f1': 0.5, loss: -0.125 },
    'metrics.jsonl keeps the plain keys (the report and older tools read them)',
  );

  // The reader does check: a flipped bit in a value breaks the data CRC.
  const bytes = readFileSync(join(dir, 'tb', files[0]));
  bytes[bytes.length - 10] ^= 0x01;
  const bad = join(dir, 'bad.tfevents');
  writeFileSync(bad, bytes);
  t.match(decode(py, bad).error, /data crc mismatch/);
});

t.test('a second writer in the same second gets its own file; large steps encode as varints', async (t) => {
  const py = python();
  t.ok(py, 'a python3 runs');
  if (!py) return;
  const dir = t.testdir();
  const now = Date.now();
  const a = new EventWriter(dir, now);
  const b = new EventWriter(dir, now);
  t.not(a.file, b.file);
  b.scalars(2 ** 40 + 3, { x: 1.5, y: Infinity });
  a.close();
  b.close();
  const ev = decode(py, b.file).events!;
  t.equal(ev[1].step, 2 ** 40 + 3);
  t.same(ev[1].values, [{ tag: 'x', simple_value: 1.5 }]);
  t.same(tbScalars({ step: 3, kind: 'eval', eval_em: 0.5, label: 'x' }), { 'eval/em': 0.5 });
  t.same(
    tbScalars({ step: 3, loss: 1.5, lr: 1e-4, epoch: 0 }),
    { 'train/loss': 1.5, 'train/lr': 1e-4, 'train/epoch': 0 },
    "TRL's grouping: train/ and eval/",
  );
});

t.test('log.report_to without tensorboard: no event file; the other trackers get the same grouped scalars', async (t) => {
  const dir = t.testdir();
  const run = new RunFolder(dir);
  run.tensorboardEnabled = false;
  const got: Array<[number, Record<string, number>]> = [];
  let status = '';
  run.trackers = [{ name: 'probe', log: (step, scalars) => void got.push([step, scalars]), finish: async (s) => void (status = s) }];
  run.logMetrics({ step: 1, loss: 2.5, kind: 'train' });
  run.logMetrics({ step: 1, kind: 'eval', eval_accuracy: 0.25 });
  await run.finishTracking('FINISHED');
  run.close();
  t.notOk(existsSync(join(dir, 'tb')), 'no tb/ folder');
  t.same(got, [
    [1, { 'train/loss': 2.5 }],
    [1, { 'eval/accuracy': 0.25 }],
  ]);
  t.equal(status, 'FINISHED');
  t.same(run.trackers, [], 'finished trackers are dropped');
});
