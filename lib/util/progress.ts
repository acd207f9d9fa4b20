/**
 * Progress of the long phases (indexing, rollouts, training steps, evaluation) on stderr.
 *
 * - On a terminal (`stream.isTTY`): a cli-progress bar redrawn in place — counts, percent, rate,
 *   elapsed, ETA, the live mean reward and what the phase is doing now (e.g. `rollouts 12/16`).
 *   Log lines written through `progressLog` appear above the bar instead of tearing it.
 * - Anywhere else (CI logs, a pipe): plain lines, never redraws — one when the phase starts, one
 *   each time the count passes a new tenth or `intervalMs` (10 s) has gone by since the last line,
 *   and one when it ends. The clock is a parameter, so tests drive it.
 *
 * Progress never writes to stdout: `--json` output stays clean.
 */
import cliProgress from 'cli-progress';

/** What progress writes to: process.stderr, or a fake stream in tests. */
export interface ProgressStream {
  write(s: string): unknown;
  isTTY?: boolean;
  columns?: number;
}

/** Where a phase's progress goes; undefined or `false` for none (library callers, tests). */
export interface ProgressTo {
  stream: ProgressStream;
  /** Force the mode (default: the stream's isTTY). */
  tty?: boolean;
  /** Non-TTY mode: the longest gap between lines, ms (default 10 000). */
  intervalMs?: number;
  /** Milliseconds; default performance.now. */
  now?: () => number;
}

export interface ProgressFields {
  /** Live mean reward (shown as `reward X`). */
  reward?: number;
  /** Live accuracy (shown as `acc X %`). */
  accuracy?: number;
  /** What the phase does now (`rollouts 3/16`, `train`...); shown on the bar, not a reason for a line. */
  detail?: string;
}

/** Bars active on a stream, innermost last: a nested phase (an eval during training) suspends the outer bar. */
const active = new WeakMap<ProgressStream, Progress[]>();

function fmtDuration(s: number): string {
  if (!Number.isFinite(s) || s < 0) return '?';
  if (s < 60) return `${s < 10 ? s.toFixed(1) : s.toFixed(0)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m${String(Math.round(s - 60 * m)).padStart(2, '0')}s`;
  return `${Math.floor(m / 60)}h${String(m % 60).padStart(2, '0')}m`;
}

function fmtRate(perS: number, unit: string): string {
  if (!(perS > 0) || !Number.isFinite(perS)) return `- ${unit}/s`;
  const one = unit.replace(/s$/, '');
  return perS >= 1 ? `${perS >= 100 ? perS.toFixed(0) : perS.toFixed(2)} ${unit}/s` : `${(1 / perS).toFixed(1)} s/${one}`;
}

export class Progress {
  readonly label: string;
  readonly total: number;
  readonly unit: string;
  readonly tty: boolean;
  value = 0;
  fields: ProgressFields = {};
  private readonly stream: ProgressStream | null;
  private readonly now: () => number;
  private readonly intervalMs: number;
  private readonly t0: number;
  private readonly startValue: number;
  private lastLineAt: number;
  private lastDecile: number;
  private lastLineValue = -1;
  private bar: cliProgress.SingleBar | null = null;
  private stopped = false;

  /** `to` undefined/false: a silent bar (the same calls, no output). */
  constructor(label: string, total: number, unit: string, to?: ProgressTo | false, startValue = 0) {
    this.label = label;
    this.total = Math.max(0, total);
    this.unit = unit;
    this.stream = to ? to.stream : null;
    this.tty = to ? (to.tty ?? to.stream.isTTY === true) : false;
    this.now = (to ? to.now : undefined) ?? (() => performance.now());
    this.intervalMs = to && to.intervalMs !== undefined ? to.intervalMs : 10_000;
    this.t0 = this.now();
    this.lastLineAt = this.t0;
    this.value = this.startValue = Math.min(startValue, this.total);
    this.lastDecile = this.decile();
    if (!this.stream) return;
    const stack = active.get(this.stream) ?? [];
    if (this.tty) stack.at(-1)?.suspend();
    stack.push(this);
    active.set(this.stream, stack);
    if (this.tty) this.startBar();
    else this.line(this.startValue ? `resuming at ${this.startValue}/${this.total} ${unit}` : `${this.total} ${unit}`);
  }

  /** Sets the count (and fields); in line mode, prints a line when a new tenth or the interval is reached. */
  update(value: number, fields: ProgressFields = {}): void {
    if (this.stopped) return;
    this.value = Math.max(0, Math.min(value, this.total));
    Object.assign(this.fields, fields);
    if (!this.stream) return;
    if (this.tty) {
      this.bar?.update(this.value);
      return;
    }
    const d = this.decile();
    if (d > this.lastDecile || this.now() - this.lastLineAt >= this.intervalMs) {
      this.lastDecile = d;
      if (this.value < this.total) this.line(this.status());
    }
  }

  increment(n = 1, fields: ProgressFields = {}): void {
    this.update(this.value + n, fields);
  }

  /** Sets fields (reward, detail) without moving the count. */
  set(fields: ProgressFields): void {
    this.update(this.value, fields);
  }

  /** Ends the phase: the final state on one line (both modes), the bar removed from its stream. */
  stop(): void {
    if (this.stopped) return;
    this.stopped = true;
    if (!this.stream) return;
    if (this.tty) {
      this.bar?.stop(); // ends with a newline below the bar's last state
      this.bar = null;
    } else if (this.lastLineValue !== this.value || this.value < this.total) this.line(`${this.status()}, done`);
    const stack = active.get(this.stream) ?? [];
    const i = stack.indexOf(this);
    if (i >= 0) stack.splice(i, 1);
    if (this.tty && i === stack.length) stack.at(-1)?.resume();
  }

  /** counts, percent, rate, elapsed, ETA and the fields: the text of a line and of the bar. */
  status(withDetail = false): string {
    const elapsed = (this.now() - this.t0) / 1e3;
    const done = this.value - this.startValue;
    const rate = elapsed > 0 ? done / elapsed : 0;
    const left = this.total - this.value;
    const pct = this.total ? Math.floor((100 * this.value) / this.total) : 100;
    const parts = [`${this.value}/${this.total} ${this.unit} (${pct} %)`, fmtRate(rate, this.unit), `elapsed ${fmtDuration(elapsed)}`];
    if (left > 0) parts.push(`ETA ${rate > 0 ? fmtDuration(left / rate) : '?'}`);
    const f = this.fields;
    if (f.reward !== undefined && Number.isFinite(f.reward)) parts.push(`reward ${f.reward.toFixed(3)}`);
    if (f.accuracy !== undefined && Number.isFinite(f.accuracy)) parts.push(`acc ${(100 * f.accuracy).toFixed(1)} %`);
    if (withDetail && f.detail) parts.push(f.detail);
    return parts.join(', ');
  }

  /** A log line above the bar (TTY) or as it is (line mode). */
  log(line: string): void {
    if (!this.stream) return;
    if (!this.tty || !this.bar) {
      this.stream.write(line + '\n');
      return;
    }
    // Clear the bar's line, print the log line there, save the cursor (cli-progress restores the saved
    // position when the bar stops) and draw the bar again on the next line.
    this.stream.write('\r\x1b[2K' + line + '\n\x1b7');
    this.bar.render();
  }

  private decile(): number {
    return this.total ? Math.floor((10 * this.value) / this.total) : 10;
  }

  private line(text: string): void {
    this.lastLineAt = this.now();
    this.lastLineValue = this.value;
    this.stream!.write(`[progress] ${this.label}: ${text}\n`);
  }

  private startBar(): void {
    const bar = new cliProgress.SingleBar({
      stream: this.stream as NodeJS.WritableStream,
      hideCursor: false,
      forceRedraw: true,
      gracefulExit: false,
      barsize: 24,
      barCompleteChar: '\u2588',
      barIncompleteChar: '\u2591',
      format: (options, params) => `${this.label} ${cliProgress.Format.BarFormat(params.progress, options)} ${this.status(true)}`,
    });
    // The bar redraws itself on a timer; unref it so that a bar never keeps the process alive.
    const render = bar.render.bind(bar);
    bar.render = () => {
      render();
      (bar as unknown as { timer?: NodeJS.Timeout }).timer?.unref?.();
    };
    bar.start(this.total, this.value);
    this.bar = bar;
  }

  private suspend(): void {
    if (!this.bar) return;
    this.bar.stop(); // leaves the bar's last state as a line; the inner bar draws below it
    this.bar = null;
  }

  private resume(): void {
    if (!this.stopped && this.tty && !this.bar) this.startBar();
  }
}

/** A log function writing `prefix + line` above the innermost active bar of `stream` (or plainly). */
export function progressLog(stream: ProgressStream, prefix: string | (() => string) = ''): (line: string) => void {
  return (line) => {
    const text = (typeof prefix === 'function' ? prefix() : prefix) + line;
    const bar = active.get(stream)?.at(-1);
    if (bar) bar.log(text);
    else stream.write(text + '\n');
  };
}

/** Runs `fn` with a bar that is stopped however `fn` ends. */
export async function withProgress<T>(
  label: string,
  total: number,
  unit: string,
  to: ProgressTo | false | undefined,
  fn: (p: Progress) => Promise<T>,
  startValue = 0,
): Promise<T> {
  const p = new Progress(label, total, unit, to, startValue);
  try {
    return await fn(p);
  } finally {
    p.stop();
  }
}

/**
 * A phase made of named sub-phases, each with its own count (e.g. indexing: `embed` then `graph`):
 * `update(phase, done, total)` starts a new bar whenever the phase changes; `stop()` ends the last.
 */
export function phasedProgress(
  label: string,
  unit: string,
  to: ProgressTo | false | undefined,
): { update(phase: string, done: number, total: number): void; stop(): void } {
  let cur: { phase: string; bar: Progress } | undefined;
  return {
    update(phase, done, total) {
      if (cur?.phase !== phase) {
        cur?.bar.stop();
        cur = { phase, bar: new Progress(`${label} ${phase}`, total, unit, to) };
      }
      cur.bar.update(done);
    },
    stop() {
      cur?.bar.stop();
      cur = undefined;
    },
  };
}
