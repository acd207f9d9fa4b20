/**
 * The wire protocol between the host and a Python sandbox worker (python/sandbox_runner.py): frames on
 * the worker's stdin/stdout, each a 4-byte big-endian length + MessagePack (msgpackr, plain maps).
 */
import { Packr } from 'msgpackr';

const packr = new Packr({ moreTypes: true, useRecords: false, encodeUndefinedAsNil: true, int64AsType: 'number' });
const MAX_FRAME = 64 * 1024 * 1024;

export type Msg = Record<string, unknown>;

/** Splits a byte stream into length-prefixed frames. */
export class FrameDecoder {
  private chunks: Buffer[] = [];
  private length = 0;
  constructor(private onFrame: (payload: Buffer) => void) {}
  push(chunk: Buffer): void {
    this.chunks.push(chunk);
    this.length += chunk.length;
    for (;;) {
      if (this.length < 4) return;
      if (this.chunks[0].length < 4) this.chunks = [Buffer.concat(this.chunks)];
      const n = this.chunks[0].readUInt32BE(0);
      if (n > MAX_FRAME) throw new Error(`frame of ${n} bytes exceeds the ${MAX_FRAME}-byte limit`);
      if (this.length < 4 + n) return;
      const all = this.chunks.length === 1 ? this.chunks[0] : Buffer.concat(this.chunks);
      this.onFrame(all.subarray(4, 4 + n));
      const rest = all.subarray(4 + n);
      this.chunks = rest.length ? [rest] : [];
      this.length = rest.length;
    }
  }
}

/** One frame's payload, decoded. */
export function decodeFrame(payload: Buffer): Msg {
  return packr.unpack(payload) as Msg;
}

/** A message as one frame (length + payload). */
export function encodeFrame(msg: Msg): Buffer {
  const body = packr.pack(msg);
  const head = Buffer.allocUnsafe(4);
  head.writeUInt32BE(body.length, 0);
  return Buffer.concat([head, body]);
}
