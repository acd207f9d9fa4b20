/**
 * What a config problem says: the schema walked by key path (unknown keys with "did you mean"),
 * what a schema accepts in words, ajv's errors turned into one line per offending value, and the one
 * SlmError that reports them all (CONFIG_UNKNOWN_KEY when every problem is an unknown key,
 * CONFIG_INVALID otherwise).
 */
import type { ErrorObject } from 'ajv';
import { SlmError, closest, describe } from '../errors.js';
import { ALIASES } from './aliases.js';
import { CONFIG_SCHEMA } from './schema.js';

export type Schema = Record<string, unknown>;
export type Obj = Record<string, unknown>;

// ---------------------------------------------------------------------------------------------
// Schema walking

export function isObj(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

export function props(s: Schema | undefined): Record<string, Schema> | undefined {
  return s && isObj(s.properties) ? (s.properties as Record<string, Schema>) : undefined;
}

/** The schema of the value at a config path; undefined for an unknown key, 'free' inside a loosely typed value. */
export function schemaAt(path: string[]): Schema | 'free' | undefined {
  let s: Schema = CONFIG_SCHEMA;
  for (const key of path) {
    const p = props(s);
    if (p) {
      if (!(key in p)) return s.additionalProperties === false ? undefined : 'free';
      s = p[key];
    } else if (s.items && /^\d+$/.test(key)) s = s.items as Schema;
    else if (s.type === 'object' || (Array.isArray(s.type) && s.type.includes('object'))) return 'free';
    else return undefined;
  }
  return s;
}

export function dotted(path: string[]): string {
  return path.reduce((acc, k) => (/^\d+$/.test(k) ? `${acc}[${k}]` : acc ? `${acc}.${k}` : k), '');
}

function aliasesOf(section: string[]): Record<string, string> {
  return ALIASES[section.join('.')] ?? {};
}

/** Every object path in the schema with its property names. */
function allSections(): Array<{ path: string[]; keys: string[] }> {
  const out: Array<{ path: string[]; keys: string[] }> = [];
  const walk = (schema: Schema, path: string[]) => {
    const p = props(schema);
    if (!p) return;
    out.push({ path, keys: Object.keys(p) });
    for (const [k, sub] of Object.entries(p)) walk(sub, [...path, k]);
  };
  walk(CONFIG_SCHEMA, []);
  return out;
}

/** "did you mean" for an unknown key: a close name or known alias in the same section, else the same name elsewhere. */
export function suggestKey(section: string[], key: string): string | undefined {
  const here = props(schemaAt(section) as Schema | undefined);
  const aliases = aliasesOf(section);
  if (here) {
    if (aliases[key]) return dotted([...section, aliases[key]]);
    const c = closest(key, [...Object.keys(here), ...Object.keys(aliases)]);
    if (c) return dotted([...section, aliases[c] ?? c]);
  }
  for (const s of allSections()) {
    if (s.keys.includes(key)) return dotted([...s.path, key]);
    const a = aliasesOf(s.path)[key];
    if (a) return dotted([...s.path, a]);
  }
  return undefined;
}

// ---------------------------------------------------------------------------------------------
// Messages

function range(schema: Schema): string {
  const r: string[] = [];
  if (typeof schema.minimum === 'number') r.push(`>= ${schema.minimum}`);
  if (typeof schema.exclusiveMinimum === 'number') r.push(`> ${schema.exclusiveMinimum}`);
  if (typeof schema.maximum === 'number') r.push(`<= ${schema.maximum}`);
  if (typeof schema.exclusiveMaximum === 'number') r.push(`< ${schema.exclusiveMaximum}`);
  return r.length ? ' ' + r.join(' and ') : '';
}

function quoteList(xs: unknown[]): string {
  const named = xs.filter((x) => x !== null).map((x) => JSON.stringify(x));
  return named.join(', ') + (xs.includes(null) ? ' or null' : '');
}

/** What a schema accepts, in words: "a number > 0", "one of "a", "b"", "a list of 2 numbers >= 0". */
export function expectedOf(schema: Schema): string {
  if (Array.isArray(schema.enum)) return `one of ${quoteList(schema.enum)}`;
  if (Array.isArray(schema.anyOf)) return (schema.anyOf as Schema[]).map(expectedOf).join(' or ');
  const types = Array.isArray(schema.type) ? (schema.type as string[]) : typeof schema.type === 'string' ? [schema.type] : [];
  const words = types.map((t) => {
    if (t === 'number') return `a number${range(schema)}`;
    if (t === 'integer') return `an integer${range(schema)}`;
    if (t === 'boolean') return 'true or false';
    if (t === 'string') return schema.pattern ? `a string matching ${schema.pattern}` : 'a string';
    if (t === 'null') return 'null';
    if (t === 'object') return 'a mapping (key: value)';
    if (t === 'array') {
      const it = (schema.items ?? {}) as Schema;
      const n = schema.minItems !== undefined && schema.minItems === schema.maxItems ? `${schema.minItems} ` : '';
      if (Array.isArray(it.enum)) return `a list of ${n}names, each one of ${quoteList(it.enum)}`;
      const t2 =
        it.type === 'number'
          ? 'numbers'
          : it.type === 'integer'
            ? 'integers'
            : it.type === 'string'
              ? 'strings'
              : it.type === 'object'
                ? 'mappings'
                : 'values';
      return `a list of ${n}${t2}${range(it)}`;
    }
    return t;
  });
  return words.join(' or ') || 'a value';
}

function schemaFromPointer(pointer: string): Schema | undefined {
  let s: unknown = CONFIG_SCHEMA;
  for (const raw of pointer.replace(/^#\/?/, '').split('/').filter(Boolean)) {
    const k = raw.replace(/~1/g, '/').replace(/~0/g, '~');
    if (Array.isArray(s)) s = s[Number(k)];
    else if (isObj(s)) s = s[k];
    else return undefined;
  }
  return isObj(s) ? s : undefined;
}

function valueAt(data: unknown, path: string[]): unknown {
  let v = data;
  for (const k of path) {
    if (Array.isArray(v)) v = v[Number(k)];
    else if (isObj(v)) v = v[k];
    else return undefined;
  }
  return v;
}

function instancePath(p: string): string[] {
  return p
    .split('/')
    .slice(1)
    .map((k) => k.replace(/~1/g, '/').replace(/~0/g, '~'));
}

export interface Problem {
  path: string[];
  message: string;
  unknownKey?: boolean;
}

/** ajv's errors -> one problem per offending value, in words. */
export function problemsFromAjv(errors: ErrorObject[], data: unknown): Problem[] {
  const anyOfs = errors.filter((e) => e.keyword === 'anyOf').map((e) => e.schemaPath + '/');
  const seen = new Set<string>();
  const out: Problem[] = [];
  for (const e of errors) {
    if (anyOfs.some((p) => e.schemaPath.startsWith(p))) continue; // the anyOf error speaks for its branches
    const path = instancePath(e.instancePath);
    const parent = schemaFromPointer(e.schemaPath.slice(0, e.schemaPath.lastIndexOf('/'))) ?? {};
    if (e.keyword === 'additionalProperties') {
      const key = String((e.params as { additionalProperty: string }).additionalProperty);
      const full = [...path, key];
      const hint = suggestKey(path, key);
      const keys = Object.keys(props(parent) ?? {});
      out.push({
        path: full,
        unknownKey: true,
        message: `unknown key; ${hint ? `did you mean ${hint}?` : `expected one of ${keys.join(', ')}`}`,
      });
      continue;
    }
    if (e.keyword === 'required') {
      const key = String((e.params as { missingProperty: string }).missingProperty);
      const sub = props(parent)?.[key] ?? {};
      const what = sub.description ? ` (${sub.description})` : '';
      out.push({ path: [...path, key], message: `missing; expected ${expectedOf(sub)}${what}` });
      continue;
    }
    const id = path.join('/');
    if (seen.has(id)) continue;
    seen.add(id);
    const s = e.keyword === 'anyOf' ? { anyOf: parent.anyOf ?? schemaFromPointer(e.schemaPath)?.anyOf } : parent;
    const found = valueAt(data, path);
    let hint = '';
    if (e.keyword === 'enum' && typeof found === 'string') {
      const c = closest(
        found,
        ((parent.enum ?? []) as unknown[]).filter((x): x is string => typeof x === 'string'),
      );
      if (c) hint = `; did you mean "${c}"?`;
    }
    if (e.keyword === 'uniqueItems') {
      out.push({ path, message: `expected ${expectedOf(s)} without repeats, found a repeated item` });
      continue;
    }
    out.push({ path, message: `expected ${expectedOf(s)}, found ${describeValue(found)}${hint}` });
  }
  return out;
}

export function describeValue(v: unknown): string {
  if (Array.isArray(v)) return `a list of ${v.length} (${JSON.stringify(v).slice(0, 60)})`;
  if (isObj(v)) return 'a mapping';
  return describe(v);
}

export function fail(where: string, problems: Problem[], fromCli: Set<string> = new Set()): never {
  const lines = problems.map((p) => {
    const key = dotted(p.path);
    const cli = [...fromCli].some((o) => key === o || key.startsWith(o + '.') || key.startsWith(o + '['))
      ? ' (set on the command line)'
      : '';
    return `${key || '(top level)'}: ${p.message}${cli}`;
  });
  const code = problems.every((p) => p.unknownKey) ? 'CONFIG_UNKNOWN_KEY' : 'CONFIG_INVALID';
  const msg = lines.length === 1 ? `${where}: ${lines[0]}` : `${where}: ${lines.length} problems:\n  - ${lines.join('\n  - ')}`;
  throw new SlmError(code, msg, { problems: lines });
}
