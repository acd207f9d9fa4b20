/**
 * The small HTTP pieces slm-train's servers share (the OpenAI-compatible model server and the
 * Search-R1-compatible retriever server): a JSON body reader with a size limit, an error that maps
 * to a status code, JSON replies, and listening with a clear PORT_IN_USE.
 */
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { SlmError, describe } from '../errors.js';

/** An error answered as `status` with an OpenAI-style `{error: {message, type, param, code}}` body. */
export class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly type = 'invalid_request_error',
    /** The request parameter at fault (OpenAI's `param`). */
    readonly param: string | null = null,
    readonly code: string | null = null,
  ) {
    super(message);
  }

  /** `e` as it is when an HttpError, else a 500 server_error with its message. */
  static from(e: unknown): HttpError {
    return e instanceof HttpError ? e : new HttpError(500, (e as Error)?.message ?? String(e), 'server_error');
  }

  /** The OpenAI error body. */
  body(): { error: { message: string; type: string; param: string | null; code: string | null } } {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

/** The largest request body the servers read by default (32 MiB; their `maxBodyBytes` option). */
export const DEFAULT_MAX_BODY_BYTES = 32 << 20;

/** `--max-body-mb` of serve and serve-retriever, checked, in bytes (at most 4 GiB: Buffer's limit). */
export function maxBodyBytes(mb: number): number {
  if (typeof mb !== 'number' || !(mb > 0 && mb <= 4096))
    throw new SlmError('ARGUMENT_INVALID', `--max-body-mb expects a number of MiB above 0 and at most 4096, found ${describe(mb)}.`);
  return Math.floor(mb * 2 ** 20);
}

/**
 * The request body parsed as JSON (400 when it is not JSON). A body over `limit` bytes is a 413
 * (`code: request_too_large`) as soon as its Content-Length says so or its bytes pass the limit:
 * nothing past the limit is kept, and sendJson closes the connection after the 413 is sent.
 */
export function readBody(req: IncomingMessage, limit = DEFAULT_MAX_BODY_BYTES): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const tooLarge = (found: string) =>
      new HttpError(
        413,
        `the request body is over this server's limit of ${limit} bytes (${(limit / 2 ** 20).toFixed(1)} MiB): ${found}. Send less per request (split a batch), or start the server with a larger --max-body-mb.`,
        'invalid_request_error',
        null,
        'request_too_large',
      );
    const declared = Number(req.headers['content-length']);
    if (declared > limit) return reject(tooLarge(`Content-Length is ${declared}`));
    let size = 0;
    const parts: Buffer[] = [];
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size <= limit) return void parts.push(chunk);
      req.off('data', onData);
      req.pause();
      parts.length = 0;
      reject(tooLarge(`${size} bytes received so far`));
    };
    req.on('data', onData);
    req.on('end', () => {
      if (size > limit) return;
      try {
        resolve(JSON.parse(Buffer.concat(parts).toString('utf8') || 'null'));
      } catch (e) {
        reject(new HttpError(400, `the body is not valid JSON: ${(e as Error).message}`));
      }
    });
    req.on('error', reject);
  });
}

/** A JSON reply; after a 413 the connection is closed (the rest of the refused body is not read). */
export function sendJson(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { 'content-type': 'application/json', ...(status === 413 ? { connection: 'close' } : {}) });
  res.end(JSON.stringify(body));
}

/** Listens on host:port (0 = any free port) and returns the port; PORT_IN_USE when it is taken. */
export async function listen(server: Server, port: number, host = '127.0.0.1'): Promise<number> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', (e: NodeJS.ErrnoException) =>
      reject(
        e.code === 'EADDRINUSE'
          ? new SlmError('PORT_IN_USE', `port ${port} is already in use; pick another with --port N (0 = any free port).`)
          : e,
      ),
    );
    server.listen(port, host, () => resolve());
  });
  return (server.address() as AddressInfo).port;
}

/** Closes the server and its open connections. */
export function closeServer(server: Server): Promise<void> {
  return new Promise((resolve) => {
    server.closeAllConnections();
    server.close(() => resolve());
  });
}
