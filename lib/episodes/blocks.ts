/**
 * Finding the action in a generated turn: the tag scanning both protocols share (pure functions).
 *
 * Rules, in order:
 * 1. `<think>…</think>` spans are ignored (masked, keeping character positions). A `</think>` with
 *    no opener ends a think span that began in the prompt (templates whose generation prompt opens
 *    `<think>`). An unclosed `<think>` hides everything after it.
 * 2. The action is the complete block whose opening tag comes first.
 * 3. An *opaque* block (code) that is opened and never closed swallows the rest of the text: tags
 *    after `<python>` are program text, so `<python>print("<answer>x</answer>")` is unclosed code,
 *    never an answer. One exception: a line that *starts* with an opening tag of a non-opaque block
 *    (`\n<answer>`) ends the unclosed program, since no program line starts with `<` (one of the
 *    reference's own expert trajectories closes its code with `</python_output>` and then answers on
 *    a new line). A tag at a line start inside a triple-quoted string is misread this way; rare.
 *    An unclosed non-opaque block (`<answer>`, `<search>`) is skipped and the scan goes on, as
 *    Search-R1's `re.search(r'<(search|answer)>(.*?)</\1>')` does.
 * 4. Anything after the first complete block is not parsed (a second answer, a hallucinated
 *    `<python_output>`, …): the first action wins. With the protocols' stop strings the generation
 *    ends at the first closing tag anyway, so the first-wins rule gives the same result whether or
 *    not a generator honours stop strings.
 */

export interface BlockSpec {
  /** Tag name without brackets: `python`, `answer`, `search`. */
  tag: string;
  /** An unclosed opening swallows the rest of the text (code). */
  opaque?: boolean;
}

/** Why a turn has no action, shared by the protocols. */
export type NoActionReason =
  /** No action tag at all. */
  | 'no_action'
  /** A block was opened and never closed (see `open`). */
  | 'unclosed'
  /** `<python></python>` with nothing but whitespace inside. */
  | 'empty_code'
  /** `<search></search>` with nothing but whitespace inside. */
  | 'empty_query';

/** `open`: the block left open (`python`, `answer`, `search`, `think`) when reason is `unclosed`. */
export interface NoAction {
  kind: 'none';
  reason: NoActionReason;
  open?: string;
}

export type ScanResult =
  | {
      found: true;
      tag: string;
      /** The text between the tags, untrimmed. */
      content: string;
      /** Index of the opening `<` and of the first character after the closing tag. */
      start: number;
      end: number;
    }
  | {
      found: false;
      /** The block left open at the end of the text (`think` included), or undefined when no tag was seen. */
      open?: string;
      /** Index of that opening tag. */
      openAt?: number;
    };

/**
 * `text` with every think span replaced by spaces (same length, so indices carry over), and where an
 * unclosed `<think>` starts (or -1).
 */
export function maskThink(text: string): { masked: string; unclosedAt: number } {
  let out = text;
  const blank = (a: number, b: number) => {
    out = out.slice(0, a) + ' '.repeat(b - a) + out.slice(b);
  };
  const firstOpen = text.indexOf('<think>');
  const firstClose = text.indexOf('</think>');
  let pos = 0;
  // A leading `</think>` closes a span opened by the prompt.
  if (firstClose >= 0 && (firstOpen < 0 || firstClose < firstOpen)) {
    blank(0, firstClose + '</think>'.length);
    pos = firstClose + '</think>'.length;
  }
  for (;;) {
    const open = text.indexOf('<think>', pos);
    if (open < 0) return { masked: out, unclosedAt: -1 };
    const close = text.indexOf('</think>', open + '<think>'.length);
    if (close < 0) {
      blank(open, text.length);
      return { masked: out, unclosedAt: open };
    }
    blank(open, close + '</think>'.length);
    pos = close + '</think>'.length;
  }
}

/** The first complete action block of `text` (see the module comment for the rules). */
export function scanBlocks(text: string, specs: readonly BlockSpec[]): ScanResult {
  const { masked, unclosedAt } = maskThink(text);
  let pos = 0;
  let skipped: { tag: string; at: number } | undefined;
  for (;;) {
    let best: { spec: BlockSpec; at: number } | undefined;
    for (const spec of specs) {
      const at = masked.indexOf(`<${spec.tag}>`, pos);
      if (at >= 0 && (!best || at < best.at)) best = { spec, at };
    }
    if (!best) {
      if (skipped) return { found: false, open: skipped.tag, openAt: skipped.at };
      if (unclosedAt >= 0) return { found: false, open: 'think', openAt: unclosedAt };
      return { found: false };
    }
    const { spec, at } = best;
    const bodyStart = at + spec.tag.length + 2;
    const close = masked.indexOf(`</${spec.tag}>`, bodyStart);
    if (close >= 0) {
      return { found: true, tag: spec.tag, content: text.slice(bodyStart, close), start: at, end: close + spec.tag.length + 3 };
    }
    skipped ??= { tag: spec.tag, at };
    pos = bodyStart;
    if (spec.opaque) {
      // No program line starts with `<`: a later line that opens a non-opaque block ends the
      // unclosed program (the model forgot `</python>`); otherwise the rest of the text is program.
      const next = lineStartOpening(masked, bodyStart, specs);
      if (next < 0) return { found: false, open: spec.tag, openAt: at };
      pos = next;
    }
  }
}

/** Index of the first `<tag>` of a non-opaque block that starts a line at or after `from`, or -1. */
function lineStartOpening(text: string, from: number, specs: readonly BlockSpec[]): number {
  const tags = specs.filter((s) => !s.opaque).map((s) => s.tag.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'));
  if (!tags.length) return -1;
  const re = new RegExp(`\\n[ \\t]*<(?:${tags.join('|')})>`, 'g');
  re.lastIndex = from;
  const m = re.exec(text);
  return m ? m.index + m[0].indexOf('<') : -1;
}

/**
 * Strips the newline that usually follows an opening tag and precedes a closing one in code
 * blocks (`<python>\ncode\n</python>`), keeping indentation of the first line.
 */
export function trimCode(code: string): string {
  return code.replace(/^[ \t]*\r?\n/, '').replace(/\s+$/, '');
}
