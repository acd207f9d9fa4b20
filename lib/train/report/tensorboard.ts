/**
 * TensorBoard event files, written by hand: `tensorboard --logdir RUN/tb` reads them.
 *
 * A file is a sequence of TFRecords — uint64 length (LE), masked CRC32C of those 8 bytes, the data,
 * masked CRC32C of the data — each holding a serialized `tensorflow.Event` protobuf:
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5;
 *             SessionLog session_log = 6; }
 *   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
 *   SessionLog { SessionStatus status = 1; }  (START = 1)
 * The first event carries file_version "brain.Event:2". A resumed run writes a SessionLog START at
 * the step it resumes from, which tells TensorBoard to drop the older file's points from that step
 * on (the steps the killed run logged past its checkpoint).
 *
 * Why hand-written: the format needs a CRC32C (a 256-entry table) and four protobuf field kinds;
 * the npm options are either native CRC32C builds or a whole protobuf runtime with .proto files,
 * heavier than the 60 lines here.
 */
import { closeSync, existsSync, mkdirSync, openSync, writeSync } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';

const CRC32C_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0x82f63b78 ^ (c >>> 1) : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();

/** CRC-32C (Castagnoli), as TFRecord uses. crc32c("123456789") = 0xe3069283. */
export function crc32c(buf: Uint8Array): number {
  let c = 0xffffffff;
  for (let i = 0; i < buf.length; i++) c = CRC32C_TABLE[(c ^ buf[i]) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

/** TFRecord's masked CRC: rotate right by 15 and add 0xa282ead8. */
export function maskedCrc32c(buf: Uint8Array): number {
  const c = crc32c(buf);
  return (((c >>> 15) | (c << 17)) + 0xa282ead8) >>> 0;
}

// --- a minimal protobuf encoder ------------------------------------------------------------

function varint(v: number | bigint): number[] {
  let x = BigInt.asUintN(64, BigInt(v));
  const out: number[] = [];
  while (x >= 0x80n) {
    out.push(Number(x & 0x7fn) | 0x80);
    x >>= 7n;
  }
  out.push(Number(x));
  return out;
}

const key = (field: number, wire: number) => varint((field << 3) | wire);

function lenField(field: number, bytes: Uint8Array | number[]): number[] {
  return [...key(field, 2), ...varint(bytes.length), ...bytes];
}

function doubleField(field: number, v: number): number[] {
  const b = Buffer.alloc(8);
  b.writeDoubleLE(v);
  return [...key(field, 1), ...b];
}

function floatField(field: number, v: number): number[] {
  const b = Buffer.alloc(4);
  b.writeFloatLE(v);
  return [...key(field, 5), ...b];
}

export interface TbEvent {
  wallTime: number;
  step: number;
  fileVersion?: string;
  scalars?: Array<{ tag: string; value: number }>;
  sessionStart?: boolean;
}

/** One Event message, serialized. */
export function encodeEvent(event: TbEvent): Buffer {
  const out: number[] = [...doubleField(1, event.wallTime), ...key(2, 0), ...varint(Math.trunc(event.step))];
  if (event.fileVersion !== undefined) out.push(...lenField(3, Buffer.from(event.fileVersion, 'utf8')));
  if (event.scalars?.length) {
    const summary = event.scalars.flatMap((s) => lenField(1, [...lenField(1, Buffer.from(s.tag, 'utf8')), ...floatField(2, s.value)]));
    out.push(...lenField(5, summary));
  }
  if (event.sessionStart) out.push(...lenField(6, [...key(1, 0), ...varint(1)]));
  return Buffer.from(out);
}

/** One TFRecord around `data`. */
function tfRecord(data: Uint8Array): Buffer {
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(data.length));
  const head = Buffer.alloc(4);
  head.writeUInt32LE(maskedCrc32c(len));
  const tail = Buffer.alloc(4);
  tail.writeUInt32LE(maskedCrc32c(data));
  return Buffer.concat([len, head, data, tail]);
}

/** Appends events to `dir/events.out.tfevents.<unix seconds>.<host>` (a new file per writer). */
export class EventWriter {
  readonly file: string;
  private fd: number | null;

  constructor(dir: string, now = Date.now()) {
    mkdirSync(dir, { recursive: true });
    const base = join(dir, `events.out.tfevents.${Math.floor(now / 1000)}.${hostname()}`);
    let file = base;
    for (let i = 1; existsSync(file); i++) file = `${base}.${i}`;
    this.file = file;
    this.fd = openSync(file, 'a');
    this.write({ wallTime: now / 1000, step: 0, fileVersion: 'brain.Event:2' });
  }

  write(e: TbEvent): void {
    if (this.fd === null) return;
    writeSync(this.fd, tfRecord(encodeEvent(e)));
  }

  /** Every finite number of `values` as a scalar at `step`. */
  scalars(step: number, values: Record<string, number>, wallTime = Date.now() / 1000): void {
    const scalars = Object.entries(values)
      .filter(([, v]) => typeof v === 'number' && Number.isFinite(v))
      .map(([tag, value]) => ({ tag, value }));
    if (scalars.length) this.write({ wallTime, step, scalars });
  }

  close(): void {
    if (this.fd !== null) closeSync(this.fd);
    this.fd = null;
  }
}
