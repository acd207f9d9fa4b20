// A small PNG decoder for the screenshots Chromium takes (8-bit greyscale, RGB, grey+alpha or RGBA,
// not interlaced: what Page.captureScreenshot writes), and an encoder for its test. Node's zlib
// inflates the IDAT stream; the five row filters are undone here.
import { deflateSync, inflateSync } from 'node:zlib';

export interface Image {
  width: number;
  height: number;
  /** RGBA, 4 bytes a pixel, row after row. */
  data: Uint8Array;
}

const SIGNATURE = Buffer.from([137, 80, 78, 71, 13, 10, 26, 10]);
const CHANNELS: Record<number, number> = { 0: 1, 2: 3, 4: 2, 6: 4 };

function paeth(a: number, b: number, c: number): number {
  const p = a + b - c;
  const pa = Math.abs(p - a);
  const pb = Math.abs(p - b);
  const pc = Math.abs(p - c);
  return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

export function decodePng(png: Buffer): Image {
  if (!png.subarray(0, 8).equals(SIGNATURE)) throw new Error('not a PNG');
  let width = 0;
  let height = 0;
  let colorType = -1;
  const idat: Buffer[] = [];
  for (let at = 8; at < png.length; ) {
    const len = png.readUInt32BE(at);
    const type = png.toString('latin1', at + 4, at + 8);
    const body = png.subarray(at + 8, at + 8 + len);
    if (type === 'IHDR') {
      width = body.readUInt32BE(0);
      height = body.readUInt32BE(4);
      const depth = body[8];
      colorType = body[9];
      if (depth !== 8 || CHANNELS[colorType] === undefined || body[12] !== 0)
        throw new Error(`unsupported PNG: depth ${depth}, colour type ${colorType}, interlace ${body[12]}`);
    } else if (type === 'IDAT') idat.push(body);
    else if (type === 'IEND') break;
    at += 12 + len;
  }
  const ch = CHANNELS[colorType];
  const stride = width * ch;
  const raw = inflateSync(Buffer.concat(idat));
  if (raw.length < height * (stride + 1)) throw new Error(`PNG data too short: ${raw.length} bytes for ${width}x${height}`);
  const cur = new Uint8Array(stride);
  const prev = new Uint8Array(stride);
  const data = new Uint8Array(width * height * 4);
  for (let y = 0; y < height; y++) {
    const f = raw[y * (stride + 1)];
    const row = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1));
    for (let i = 0; i < stride; i++) {
      const a = i >= ch ? cur[i - ch] : 0;
      const b = prev[i];
      const c = i >= ch ? prev[i - ch] : 0;
      const x = row[i];
      cur[i] = f === 0 ? x : f === 1 ? x + a : f === 2 ? x + b : f === 3 ? x + ((a + b) >> 1) : f === 4 ? x + paeth(a, b, c) : NaN;
      if (f > 4) throw new Error(`bad PNG filter ${f} on row ${y}`);
    }
    for (let px = 0; px < width; px++) {
      const o = (y * width + px) * 4;
      const s = px * ch;
      if (ch >= 3) (data[o] = cur[s]), (data[o + 1] = cur[s + 1]), (data[o + 2] = cur[s + 2]);
      else data[o] = data[o + 1] = data[o + 2] = cur[s];
      data[o + 3] = ch === 4 ? cur[s + 3] : ch === 2 ? cur[s + 1] : 255;
    }
    prev.set(cur);
  }
  return { width, height, data };
}

/** RGBA PNG with the given filter on each row (filters[y % filters.length]); for the decoder's test. */
export function encodePng(img: Image, filters: number[] = [0]): Buffer {
  const { width, height, data } = img;
  const stride = width * 4;
  const raw = Buffer.alloc(height * (stride + 1));
  for (let y = 0; y < height; y++) {
    const f = filters[y % filters.length];
    raw[y * (stride + 1)] = f;
    for (let i = 0; i < stride; i++) {
      const x = data[y * stride + i];
      const a = i >= 4 ? data[y * stride + i - 4] : 0;
      const b = y > 0 ? data[(y - 1) * stride + i] : 0;
      const c = y > 0 && i >= 4 ? data[(y - 1) * stride + i - 4] : 0;
      const pred = f === 0 ? 0 : f === 1 ? a : f === 2 ? b : f === 3 ? (a + b) >> 1 : paeth(a, b, c);
      raw[y * (stride + 1) + 1 + i] = (x - pred) & 255;
    }
  }
  const chunk = (type: string, body: Buffer) => {
    const len = Buffer.alloc(4);
    len.writeUInt32BE(body.length);
    return Buffer.concat([len, Buffer.from(type, 'latin1'), body, Buffer.alloc(4)]); // CRC not checked by the decoder
  };
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(width, 0);
  ihdr.writeUInt32BE(height, 4);
  ihdr[8] = 8;
  ihdr[9] = 6;
  return Buffer.concat([SIGNATURE, chunk('IHDR', ihdr), chunk('IDAT', deflateSync(raw)), chunk('IEND', Buffer.alloc(0))]);
}

/** Statistics of a rectangle (CSS pixels times `scale`) of an image. */
export function regionStats(
  img: Image,
  r: { x: number; y: number; width: number; height: number },
  colours: Record<string, [number, number, number]>,
  tolerance = 60,
): { pixels: number; background: number; dark: number; near: Record<string, number> } {
  const x0 = Math.max(0, Math.round(r.x));
  const y0 = Math.max(0, Math.round(r.y));
  const x1 = Math.min(img.width, Math.round(r.x + r.width));
  const y1 = Math.min(img.height, Math.round(r.y + r.height));
  const near: Record<string, number> = Object.fromEntries(Object.keys(colours).map((k) => [k, 0]));
  let pixels = 0;
  let background = 0;
  let dark = 0;
  for (let y = y0; y < y1; y++)
    for (let x = x0; x < x1; x++) {
      const o = (y * img.width + x) * 4;
      const [R, G, B] = [img.data[o], img.data[o + 1], img.data[o + 2]];
      pixels++;
      if (R >= 235 && G >= 235 && B >= 235) background++; // white, or the faint grid lines
      if (R < 64 && G < 64 && B < 64) dark++;
      for (const [k, [cr, cg, cb]] of Object.entries(colours)) if (Math.hypot(R - cr, G - cg, B - cb) <= tolerance) near[k]++;
    }
  return { pixels, background, dark, near };
}
