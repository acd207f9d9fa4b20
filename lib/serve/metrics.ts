/**
 * The server's counters as `GET /metrics` returns them, in Prometheus' text exposition format
 * (version 0.0.4): requests by endpoint and status, prompt and generated tokens, requests in flight,
 * and a histogram of request latency (from the request's arrival to the end of its reply or stream).
 */

/** Upper bounds of the latency histogram's buckets, in seconds (vLLM's e2e latency buckets, shortened). */
export const LATENCY_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640];

const PREFIX = 'slm_train_';

/** A label value escaped as the format asks (backslash, double quote, newline). */
const esc = (v: string) => v.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');

export class ServeMetrics {
  /** `endpoint\0status` -> count. */
  private readonly requests = new Map<string, number>();
  private promptTokens = 0;
  private generationTokens = 0;
  inFlight = 0;
  private readonly buckets = LATENCY_BUCKETS.map(() => 0);
  private latencySum = 0;
  private latencyCount = 0;

  /** A request to a completion endpoint arrived. */
  start(): void {
    this.inFlight++;
  }

  /** It ended (answered, failed or its client left) with this status after `seconds`. */
  finish(endpoint: string, status: number, seconds: number): void {
    this.inFlight--;
    const key = `${endpoint}\0${status}`;
    this.requests.set(key, (this.requests.get(key) ?? 0) + 1);
    LATENCY_BUCKETS.forEach((b, i) => {
      if (seconds <= b) this.buckets[i]++;
    });
    this.latencySum += seconds;
    this.latencyCount++;
  }

  /** Tokens of a request that was run (prompt tokens of all its prompts; tokens generated for all its rows). */
  tokens(prompt: number, generated: number): void {
    this.promptTokens += prompt;
    this.generationTokens += generated;
  }

  /** The exposition text. */
  render(model: string): string {
    const m = `model_name="${esc(model)}"`;
    const out: string[] = [];
    const head = (name: string, type: string, help: string) =>
      out.push(`# HELP ${PREFIX}${name} ${help}`, `# TYPE ${PREFIX}${name} ${type}`);
    head('requests_total', 'counter', 'Completion requests that ended, by endpoint and HTTP status.');
    for (const [key, n] of [...this.requests].sort()) {
      const [endpoint, status] = key.split('\0');
      out.push(`${PREFIX}requests_total{${m},endpoint="${esc(endpoint)}",status="${status}"} ${n}`);
    }
    head('prompt_tokens_total', 'counter', 'Prompt tokens of the requests run.');
    out.push(`${PREFIX}prompt_tokens_total{${m}} ${this.promptTokens}`);
    head('generation_tokens_total', 'counter', 'Tokens generated, all rows of all requests.');
    out.push(`${PREFIX}generation_tokens_total{${m}} ${this.generationTokens}`);
    head('requests_in_flight', 'gauge', 'Completion requests being answered now (queued or generating).');
    out.push(`${PREFIX}requests_in_flight{${m}} ${this.inFlight}`);
    head('request_duration_seconds', 'histogram', 'Time from a completion request arriving to the end of its reply or stream.');
    LATENCY_BUCKETS.forEach((b, i) => out.push(`${PREFIX}request_duration_seconds_bucket{${m},le="${b}"} ${this.buckets[i]}`));
    out.push(`${PREFIX}request_duration_seconds_bucket{${m},le="+Inf"} ${this.latencyCount}`);
    out.push(`${PREFIX}request_duration_seconds_sum{${m}} ${this.latencySum}`);
    out.push(`${PREFIX}request_duration_seconds_count{${m}} ${this.latencyCount}`);
    return `${out.join('\n')}\n`;
  }
}
