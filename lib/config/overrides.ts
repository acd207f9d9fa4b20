/**
 * `key=value` command-line overrides of a config: parsed against the schema (unknown keys are
 * errors with a suggestion) and applied in order to the raw config, a later one winning.
 */
import YAML from 'yaml';
import { SlmError, describe } from '../errors.js';
import { dotted, fail, schemaAt, suggestKey, type Obj, type Problem, type Schema } from './problems.js';

export interface Override {
  /** Dotted path split into keys (numeric keys index lists). */
  path: string[];
  value: unknown;
  /** The argument as given, for messages. */
  text: string;
}

// ---------------------------------------------------------------------------------------------
// Overrides

const OVERRIDE = /^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)=([\s\S]*)$/;

function acceptsArray(s: Schema): boolean {
  const types = Array.isArray(s.type) ? s.type : [s.type];
  return types.includes('array') || (Array.isArray(s.anyOf) && (s.anyOf as Schema[]).some(acceptsArray));
}

function parseScalar(text: string): unknown {
  try {
    return YAML.parse(text);
  } catch {
    return text; // not valid YAML (e.g. "a: b: c"): keep the text; validation says if a string is wrong here
  }
}

/**
 * `key=value` arguments -> overrides. Values are YAML scalars or flow collections (`1e-5`, `true`,
 * `null`, `[0.7, 1.15]`); for a key that takes a list, `a,b,c` is the list [a, b, c]. Unknown keys
 * are errors with a suggestion.
 */
export function parseOverrides(args: readonly string[]): Override[] {
  const problems: Problem[] = [];
  const out: Override[] = [];
  for (const text of args) {
    const m = OVERRIDE.exec(text);
    if (!m) {
      problems.push({ path: [], message: `override ${JSON.stringify(text)} is not key=value with a dotted key (e.g. optim.lr=1e-5)` });
      continue;
    }
    const path = m[1].split('.');
    const s = schemaAt(path);
    if (s === undefined) {
      let i = 0;
      while (i < path.length && schemaAt(path.slice(0, i + 1)) !== undefined) i++;
      const hint = suggestKey(path.slice(0, i), path[i]);
      problems.push({
        path: path.slice(0, i + 1),
        unknownKey: true,
        message: `unknown key in override ${JSON.stringify(text)}; ${hint ? `did you mean ${hint}?` : 'no such key'}`,
      });
      continue;
    }
    let value = parseScalar(m[2]);
    if (s !== 'free' && typeof value === 'string' && value.includes(',') && acceptsArray(s))
      value = value.split(',').map((x) => parseScalar(x.trim()));
    out.push({ path, value, text });
  }
  if (problems.length) fail('command line', problems);
  return out;
}

/** A copy of `obj` with the overrides set, in order (a later one wins). */
export function applyOverrides(obj: Obj, overrides: readonly Override[]): Obj {
  const root = structuredClone(obj);
  for (const o of overrides) {
    let cur: Obj | unknown[] = root;
    for (let i = 0; i < o.path.length - 1; i++) {
      const k = o.path[i];
      const next: unknown = Array.isArray(cur) ? cur[Number(k)] : cur[k];
      if (next === undefined || next === null) {
        const created: Obj | unknown[] = /^\d+$/.test(o.path[i + 1]) ? [] : {};
        if (Array.isArray(cur)) cur[Number(k)] = created;
        else cur[k] = created;
        cur = created;
      } else if (typeof next === 'object') cur = next as Obj | unknown[];
      else
        throw new SlmError(
          'CONFIG_INVALID',
          `override ${o.text}: ${dotted(o.path.slice(0, i + 1))} is ${describe(next)}, not a section that can hold ${o.path[i + 1]}.`,
        );
    }
    const last = o.path[o.path.length - 1];
    if (Array.isArray(cur)) cur[Number(last)] = o.value;
    else cur[last] = o.value;
  }
  return root;
}
