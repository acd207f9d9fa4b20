/**
 * Answer normalisation as Search-R1 (`verl/utils/reward_score/qa_em.py`) and the SQuAD / HotpotQA
 * evaluation scripts do it, so that scores here match the numbers those projects report:
 *
 *   white_space_fix(remove_articles(remove_punc(lower(s))))
 *
 * - lower: `str.lower()` (JS `toLowerCase()`: the same Unicode mapping for everything that matters);
 * - remove_punc: drop every character of Python's `string.punctuation` (ASCII only: `–`, `’`, `«`
 *   stay);
 * - remove_articles: `re.sub(r"\b(a|an|the)\b", " ", text)`. Python's `\b` is Unicode-aware on str
 *   (letters and digits of every script are word characters) while JS's `\b` is ASCII-only, so the
 *   word boundary is written as look-arounds over `[\p{L}\p{N}_]`: "éthe" keeps its "the";
 * - white_space_fix: `" ".join(text.split())`, where `split()` splits on Python's whitespace set
 *   (which includes \x1c-\x1f and excludes U+FEFF, unlike JS `\s`).
 */

/** Python's `string.punctuation`. */
const PUNCTUATION = '!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~';

const PUNCT_SET = new Set(PUNCTUATION);

/** Python 3 `str.isspace()` characters (what `str.split()` with no argument splits on). */
const PY_WHITESPACE = '\\t\\n\\x0b\\x0c\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000';
const WS_RUN = new RegExp(`[${PY_WHITESPACE}]+`, 'gu');

/** `\b(a|an|the)\b` with Python's Unicode word characters. */
const ARTICLES = /(?<![\p{L}\p{N}_])(?:a|an|the)(?![\p{L}\p{N}_])/gu;

function removePunctuation(s: string): string {
  let out = '';
  for (const ch of s) if (!PUNCT_SET.has(ch)) out += ch;
  return out;
}

function removeArticles(s: string): string {
  return s.replace(ARTICLES, ' ');
}

/** `" ".join(s.split())`: runs of whitespace become one space, none at either end. */
function collapseWhitespace(s: string): string {
  return s.replace(WS_RUN, ' ').replace(/^ | $/g, '');
}

/** The Search-R1 / SQuAD normalisation: lowercase, no punctuation, no articles, single spaces. */
export function normalizeAnswer(s: string): string {
  return collapseWhitespace(removeArticles(removePunctuation(s.toLowerCase())));
}

/** The tokens F1 and ROUGE-L count: `normalize_answer(s).split()`. */
export function answerTokens(s: string): string[] {
  const n = normalizeAnswer(s);
  return n === '' ? [] : n.split(' ');
}
