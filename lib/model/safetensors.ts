/**
 * safetensors in TypeScript, for the files slm-train writes itself (init-model, tests): a streaming
 * writer and a header reader. Loading weights for compute is the native engine's job (mmap; on the CPU large weights are then copied into huge pages, native/core/cpu_weights.h).
 */
import { closeSync, openSync, readSync, renameSync, writeSync, fstatSync } from 'node:fs';
import { SlmError } from '../errors.js';

export type StDtype = 'F32' | 'F16' | 'BF16' | 'I32' | 'I64' | 'U8';
const SIZE: Record<StDtype, number> = { F32: 4, F16: 2, BF16: 2, I32: 4, I64: 8, U8: 1 };

export interface TensorSpec {
  name: string;
  dtype: StDtype;
  shape: number[];
  /** Fills the tensor's bytes chunk by chunk: called with (buffer view, element offset). */
  fill: (out: Uint8Array, elementOffset: number) => void;
}

export interface HeaderEntry {
  dtype: string;
  shape: number[];
  data_offsets: [number, number];
}

function numel(shape: number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

/** Writes tensors in the given order; the file appears atomically (written to .tmp, then renamed). */
export function writeSafetensors(path: string, tensors: TensorSpec[], metadata: Record<string, string> = {}): void {
  const header: Record<string, unknown> = {};
  if (Object.keys(metadata).length) header.__metadata__ = metadata;
  let off = 0;
  for (const t of tensors) {
    const n = numel(t.shape) * SIZE[t.dtype];
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [off, off + n] };
    off += n;
  }
  let json = JSON.stringify(header);
  while ((json.length + 8) % 8 !== 0) json += ' ';
  const hbytes = Buffer.from(json, 'utf8');
  const tmp = `${path}.tmp`;
  const fd = openSync(tmp, 'w');
  try {
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(hbytes.length));
    writeSync(fd, len);
    writeSync(fd, hbytes);
    const CHUNK = 1 << 22; // elements per chunk
    for (const t of tensors) {
      const total = numel(t.shape);
      for (let e = 0; e < total; e += CHUNK) {
        const n = Math.min(CHUNK, total - e);
        const buf = new Uint8Array(n * SIZE[t.dtype]);
        t.fill(buf, e);
        writeSync(fd, buf);
      }
    }
  } finally {
    closeSync(fd);
  }
  renameSync(tmp, path);
}

/** Reads only the JSON header of a safetensors file. */
export function readSafetensorsHeader(path: string): Record<string, HeaderEntry> {
  const fd = openSync(path, 'r');
  try {
    const size = fstatSync(fd).size;
    const len = Buffer.alloc(8);
    if (size < 8 || readSync(fd, len, 0, 8, 0) !== 8)
      throw new SlmError('WEIGHTS_CORRUPT', `${path} is too short to be a safetensors file.`);
    const n = Number(len.readBigUInt64LE());
    if (n > size - 8) throw new SlmError('WEIGHTS_CORRUPT', `${path}: header length ${n} exceeds the file size ${size}.`);
    const h = Buffer.alloc(n);
    readSync(fd, h, 0, n, 8);
    const parsed = JSON.parse(h.toString('utf8'));
    delete parsed.__metadata__;
    return parsed;
  } finally {
    closeSync(fd);
  }
}

/** float32 -> bfloat16 bits with round-to-nearest-even (as torch does). */
export function f32ToBf16Bits(x: number, scratch = new Float32Array(1)): number {
  scratch[0] = x;
  const u = new Uint32Array(scratch.buffer)[0];
  if ((u & 0x7fffffff) > 0x7f800000) return 0x7fc0; // NaN
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}
