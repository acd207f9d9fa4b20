/**
 * A chat template rendered within a budget of time, string sizes and list lengths (TEMPLATE_BUDGET),
 * by @huggingface/jinja's interpreter with the clock read as it works: a hostile or broken template
 * ends in BudgetExceeded (ChatTemplate turns it into CHAT_TEMPLATE_ERROR) instead of a hang.
 */
import { Environment, Interpreter, Template } from '@huggingface/jinja';

/**
 * What rendering a chat template may take, so that a hostile or broken template (a loop of 1e8 x 1e8
 * iterations, a string doubled in a loop) fails with CHAT_TEMPLATE_ERROR instead of hanging and
 * growing to gigabytes: `timeMs` of rendering, `maxChars` for any one string (the output included;
 * all the strings made while rendering: 8 x maxChars) and `maxItems` for a list (`range()` included).
 */
export interface TemplateBudget {
  timeMs: number;
  maxChars: number;
  maxItems: number;
}
// maxItems 65,536: @huggingface/jinja sets up every iteration of a loop (a scope each) before it runs
// the first, which the clock cannot interrupt: measured ~12 us an item on the 2-core EPYC at load ~13,
// so a loop over a million items overran a 300 ms budget by 9-14 s; a conversation is far shorter.
export const TEMPLATE_BUDGET: TemplateBudget = { timeMs: 5000, maxChars: 16 << 20, maxItems: 1 << 16 };

export class BudgetExceeded extends Error {}

/** @huggingface/jinja's interpreter as far as it is used here (its .d.ts imports './runtime' without an extension, which NodeNext cannot resolve). */
type RuntimeValue = { type: string; value: unknown };
const JinjaInterpreter = Interpreter as unknown as new (
  env: Environment,
) => {
  evaluate(node: unknown, env: unknown): RuntimeValue;
  evaluateBlock(statements: unknown, env: unknown): RuntimeValue;
  run(program: unknown): RuntimeValue;
};

/**
 * The template interpreter with a budget: the clock is read every 1,024 units of work (a node, a
 * loop iteration's block, even an empty one, an item of a list) and the sizes of what it makes are
 * checked.
 */
class BudgetedInterpreter extends JinjaInterpreter {
  readonly #b: TemplateBudget;
  readonly #deadline: number;
  /** Nodes evaluated plus the lengths of the lists made, and when to look at the clock next. */
  #work = 0;
  #check = 1024;
  #chars = 0;
  constructor(env: Environment, b: TemplateBudget) {
    super(env);
    this.#b = b;
    this.#deadline = performance.now() + b.timeMs;
  }
  #tick(): void {
    if (this.#work >= this.#check) {
      if (performance.now() > this.#deadline) throw new BudgetExceeded(`it ran past its time budget of ${this.#b.timeMs} ms`);
      this.#check = this.#work + 1024;
    }
    this.#work++;
  }
  /** A loop runs its body through here once per iteration, whether or not the body has a node. */
  override evaluateBlock(statements: unknown, env: unknown): RuntimeValue {
    this.#tick();
    return super.evaluateBlock(statements, env);
  }
  override evaluate(node: unknown, env: unknown): RuntimeValue {
    this.#tick();
    const v = super.evaluate(node, env);
    // A list or mapping costs its length again when a loop walks it (an empty loop body evaluates nothing).
    if (v.type === 'ArrayValue') this.#work += (v.value as unknown[]).length;
    else if (v.type === 'ObjectValue') this.#work += (v.value as Map<unknown, unknown>).size;
    if (v.type === 'StringValue') {
      const n = (v.value as string).length;
      if (n > this.#b.maxChars) throw new BudgetExceeded(`it made a string of ${n} characters, past its budget of ${this.#b.maxChars}`);
      if ((this.#chars += n) > 8 * this.#b.maxChars)
        throw new BudgetExceeded(
          `it made more than ${8 * this.#b.maxChars} characters of text in all (8 x its budget of ${this.#b.maxChars})`,
        );
    } else if (v.type === 'ArrayValue' && (v.value as unknown[]).length > this.#b.maxItems)
      throw new BudgetExceeded(`it made a list of ${(v.value as unknown[]).length} items, past its budget of ${this.#b.maxItems}`);
    return v;
  }
}

/** `strftime_now` as @huggingface/jinja defines it (its globals are not exported). */
const STRFTIME = new Template('{{ strftime_now(f) }}');

/** Renders a parsed template as Template.render does (the same globals), within budget `b`. */
// The template is taken as `{ parsed }` (a Template has it), not as @huggingface/jinja's Template type:
// this module's declarations then import nothing from that package, whose .d.ts does not resolve under
// NodeNext in a user's project (the library's types are checked that way: test/library-types).
export function renderBudgeted(t: { parsed: unknown }, vars: Record<string, unknown>, templateBudget: TemplateBudget): string {
  const env = new Environment();
  const range = (start: number, stop?: number, step = 1) => {
    const [lo, hi] = stop === undefined ? [0, start] : [start, stop];
    if (step === 0) throw new Error('range() step must not be zero');
    const n = Math.max(0, Math.ceil((hi - lo) / step));
    if (n > templateBudget.maxItems) throw new BudgetExceeded(`range() of ${n} items is past its budget of ${templateBudget.maxItems}`);
    return Array.from({ length: n }, (_, i) => lo + i * step);
  };
  const globals: Record<string, unknown> = {
    false: false,
    true: true,
    none: null,
    raise_exception: (args: unknown) => {
      throw new Error(String(args));
    },
    range,
    strftime_now: (f: string) => STRFTIME.render({ f }),
    True: true,
    False: false,
    None: null,
  };
  for (const [k, v] of Object.entries({ ...globals, ...vars })) env.set(k, v);
  return new BudgetedInterpreter(env, templateBudget).run(t.parsed).value as string;
}
