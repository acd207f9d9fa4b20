/**
 * The small HTTP pieces slm-train's servers share (the OpenAI-compatible model server and the
 * Search-R1-compatible retriever server): a JSON body reader with a size limit, an error that maps
 * to a status code, JSON replies, and listening with a clear PORT_IN_USE.
 */
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { SlmError } from '../errors.js';

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

/** The request body parsed as JSON (413 past `limit` bytes, 400 when it is not JSON). */
export function readBody(req: IncomingMessage, limit = 16 << 20): Promise<unknown> {
  return new Promise((resolve, reject) => {
    let size = 0;
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => {
      size += c.length;
      if (size > limit) {
        reject(new HttpError(413, `request body over ${limit} bytes`));
        req.destroy();
      } else parts.push(c);
    });
    req.on('end', () => {
      try {
        resolve(JSON.parse(Buffer.concat(parts).toString('utf8') || 'null'));
      } catch (e) {
        reject(new HttpError(400, `the body is not valid JSON: ${(e as Error).message}`));
      }
    });
    req.on('error', reject);
  });
}

export function sendJson(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
}

/** Listens on host:port (0 = any free port) and returns the port; PORT_IN_USE when it is taken. */
export async function listen(server: Server, port: number, host = '127.0.0.1'): Promise<number> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', (e: NodeJS.ErrnoException) =>
      reject(e.code === 'EADDRINUSE' ? new SlmError('PORT_IN_USE', `port ${port} is already in use; pick another with --port N (0 = any free port).`) : e),
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
