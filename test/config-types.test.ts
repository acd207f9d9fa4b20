// The TypeScript shape of a resolved config (lib/config/types.ts) and the JSON Schema that fills and
// checks it (lib/config/schema.ts) describe the same thing: the compiler's view of ResolvedConfig is
// compared with the schema key by key (names, value types, enum values, list items, fixed lengths),
// and every schema default has the type both sides give its key. A key, a type or an enum value
// added to one side only fails here. The only allowed difference: the keys the loader derives after
// validation (null in the schema, filled from other keys), which the test checks are filled.
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import ts from 'typescript';
import { validateConfig } from '../lib/config/load.js';
import { CONFIG_SCHEMA, sectionDefaults } from '../lib/config/schema.js';
import { algorithms, stageNames } from '../lib/train/rl/registry.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

/** Keys null in the schema (their default) that lib/config/load.ts `derive` fills from other keys. */
const DERIVED = ['protocol.max_turns_eval', 'algorithm.kind', 'algorithm.clip_high', 'algorithm.kl_in', 'algorithm.kl_estimator'];

/** A value type in words both sides can be reduced to. */
interface Desc {
  kinds: Set<string>; // null, number, string, boolean, array, object, unknown
  /** String values allowed, when the strings are a closed set (an enum / a union of literals). */
  literals?: Set<string>;
  items?: Desc;
  /** A list of exactly this many items (a tuple / minItems = maxItems). */
  length?: number;
  /** The keys of an object with a fixed set of keys; undefined = a free mapping. */
  props?: Record<string, Desc>;
}

function merge(ds: Desc[]): Desc {
  const out: Desc = { kinds: new Set() };
  let openString = false;
  for (const d of ds) {
    for (const k of d.kinds) out.kinds.add(k);
    if (d.kinds.has('string')) {
      if (d.literals) for (const l of d.literals) (out.literals ??= new Set()).add(l);
      else openString = true;
    }
    if (d.items) out.items = out.items ? merge([out.items, d.items]) : d.items;
    if (d.length !== undefined) out.length = d.length;
    if (d.props) out.props = d.props;
  }
  if (openString) delete out.literals;
  return out;
}

// ---------------------------------------------------------------------------------------------
// The schema's side

type Schema = Record<string, unknown>;

function fromSchema(s: Schema): Desc {
  if (Array.isArray(s.anyOf)) return merge((s.anyOf as Schema[]).map(fromSchema));
  const types = (Array.isArray(s.type) ? s.type : [s.type]) as string[];
  const d: Desc = { kinds: new Set(types.map((x) => (x === 'integer' ? 'number' : x))) };
  if (Array.isArray(s.enum)) d.literals = new Set(s.enum.filter((v): v is string => typeof v === 'string'));
  if (types.includes('array')) {
    d.items = s.items ? fromSchema(s.items as Schema) : { kinds: new Set(['unknown']) };
    if (s.minItems !== undefined && s.minItems === s.maxItems) d.length = s.minItems as number;
  }
  if (types.includes('object') && s.properties)
    d.props = Object.fromEntries(Object.entries(s.properties as Record<string, Schema>).map(([k, v]) => [k, fromSchema(v)]));
  return d;
}

// ---------------------------------------------------------------------------------------------
// The compiler's side

function compilerView(): Desc {
  const configFile = ts.findConfigFile(root, ts.sys.fileExists, 'tsconfig.json')!;
  const parsed = ts.parseJsonConfigFileContent(ts.readConfigFile(configFile, ts.sys.readFile).config, ts.sys, root);
  const file = join(root, 'lib', 'config', 'types.ts');
  const program = ts.createProgram([file], { ...parsed.options, noEmit: true });
  const checker = program.getTypeChecker();
  const source = program.getSourceFile(file)!;
  const decl = source.statements.find(
    (s): s is ts.InterfaceDeclaration => ts.isInterfaceDeclaration(s) && s.name.text === 'ResolvedConfig',
  );
  if (!decl) throw new Error('lib/config/types.ts has no interface ResolvedConfig');
  const describeType = (type: ts.Type): Desc => {
    const parts = type.isUnion() ? type.types : [type];
    return merge(
      parts.map((p): Desc => {
        const f = p.flags;
        if (f & ts.TypeFlags.Null) return { kinds: new Set(['null']) };
        if (f & (ts.TypeFlags.Number | ts.TypeFlags.NumberLiteral)) return { kinds: new Set(['number']) };
        if (f & ts.TypeFlags.StringLiteral) return { kinds: new Set(['string']), literals: new Set([(p as ts.StringLiteralType).value]) };
        if (f & ts.TypeFlags.String) return { kinds: new Set(['string']) };
        if (f & (ts.TypeFlags.Boolean | ts.TypeFlags.BooleanLiteral)) return { kinds: new Set(['boolean']) };
        if (f & (ts.TypeFlags.Unknown | ts.TypeFlags.Any)) return { kinds: new Set(['unknown']) };
        if (checker.isTupleType(p)) {
          const args = checker.getTypeArguments(p as ts.TypeReference);
          return { kinds: new Set(['array']), items: merge(args.map(describeType)), length: args.length };
        }
        if (checker.isArrayType(p))
          return { kinds: new Set(['array']), items: describeType(checker.getTypeArguments(p as ts.TypeReference)[0]) };
        if (f & ts.TypeFlags.Object) {
          const props = checker.getPropertiesOfType(p);
          if (!props.length && checker.getIndexInfosOfType(p).length) return { kinds: new Set(['object']) };
          return {
            kinds: new Set(['object']),
            props: Object.fromEntries(props.map((s) => [s.name, describeType(checker.getTypeOfSymbol(s))])),
          };
        }
        throw new Error(`lib/config/types.ts: a type this test does not know: ${checker.typeToString(p)}`);
      }),
    );
  };
  return describeType(checker.getDeclaredTypeOfSymbol(checker.getSymbolAtLocation(decl.name)!));
}

// ---------------------------------------------------------------------------------------------

const sorted = (s?: Set<string>) => (s ? [...s].sort() : undefined);

/** Every difference between the schema's and the compiler's view of the value at `path`. */
function differences(path: string, schema: Desc, type: Desc, out: string[] = []): string[] {
  const kinds = new Set(schema.kinds);
  if (DERIVED.includes(path)) kinds.delete('null');
  const at = path || '(top level)';
  if (JSON.stringify(sorted(kinds)) !== JSON.stringify(sorted(type.kinds)))
    out.push(`${at}: schema ${sorted(kinds)!.join(' | ')}, type ${sorted(type.kinds)!.join(' | ')}`);
  if (JSON.stringify(sorted(schema.literals)) !== JSON.stringify(sorted(type.literals)))
    out.push(
      `${at}: schema values ${JSON.stringify(sorted(schema.literals) ?? 'any string')}, type values ${JSON.stringify(sorted(type.literals) ?? 'any string')}`,
    );
  if (schema.length !== type.length) out.push(`${at}: schema length ${schema.length ?? 'any'}, type length ${type.length ?? 'any'}`);
  if (schema.items && type.items) differences(`${path}[]`, schema.items, type.items, out);
  if (!!schema.props !== !!type.props)
    out.push(
      `${at}: ${schema.props ? 'the schema lists keys, the type is a free mapping' : 'the type lists keys, the schema is a free mapping'}`,
    );
  if (schema.props && type.props) {
    const sk = Object.keys(schema.props),
      tk = Object.keys(type.props);
    for (const k of sk) if (!tk.includes(k)) out.push(`${path ? `${path}.` : ''}${k}: in the schema, not in the type`);
    for (const k of tk) if (!sk.includes(k)) out.push(`${path ? `${path}.` : ''}${k}: in the type, not in the schema`);
    for (const k of sk) if (tk.includes(k)) differences(path ? `${path}.${k}` : k, schema.props[k], type.props[k], out);
  }
  return out;
}

/** Whether `v` is a value of `d` (kinds, enum values, list items and length, keys). */
function fits(v: unknown, d: Desc, integer = false): boolean {
  if (d.kinds.has('unknown')) return true;
  if (v === null) return d.kinds.has('null');
  if (typeof v === 'number') return d.kinds.has('number') && (!integer || Number.isInteger(v));
  if (typeof v === 'boolean') return d.kinds.has('boolean');
  if (typeof v === 'string') return d.kinds.has('string') && (!d.literals || d.literals.has(v));
  if (Array.isArray(v))
    return (
      d.kinds.has('array') &&
      (d.length === undefined || v.length === d.length) &&
      v.every((x) => fits(x, d.items ?? { kinds: new Set(['unknown']) }))
    );
  if (typeof v === 'object') return d.kinds.has('object') && (!d.props || Object.keys(v).every((k) => k in d.props!));
  return false;
}

/** Every schema default that is not a value of its key (schema side and type side). */
function badDefaults(s: Schema, type: Desc | undefined, path: string, out: string[] = []): string[] {
  if ('default' in s) {
    const d = fromSchema(s);
    const integer = s.type === 'integer' || (Array.isArray(s.type) && s.type.includes('integer'));
    if (!fits(s.default, d, integer)) out.push(`${path}: default ${JSON.stringify(s.default)} is not a value the schema accepts`);
    const typeSide = type && DERIVED.includes(path) ? { ...type, kinds: new Set([...type.kinds, 'null']) } : type;
    if (typeSide && !fits(s.default, typeSide))
      out.push(`${path}: default ${JSON.stringify(s.default)} is not a value of its TypeScript type`);
  }
  for (const [k, sub] of Object.entries((s.properties ?? {}) as Record<string, Schema>))
    badDefaults(sub, type?.props?.[k], path ? `${path}.${k}` : k, out);
  return out;
}

const schemaView = fromSchema(CONFIG_SCHEMA);
const typeView = compilerView();
// stage and algorithm.kind take the registry's names (lib/train/rl/registry.ts: an algorithm registered
// later adds its own), so the type says string; the schema's enums are checked against the registry.
for (const path of [['stage'], ['algorithm', 'kind']]) delete path.reduce((d: Desc, k) => d.props![k], schemaView).literals;

t.test("stage and algorithm.kind: the schema enums are the registry's names", async (t) => {
  const top = CONFIG_SCHEMA.properties as Record<string, Schema>;
  t.same(top.stage.enum, stageNames(), 'stage: sft, the algorithms, eval');
  t.same(
    (top.algorithm.properties as Record<string, Schema>).kind.enum,
    [...algorithms().map((a) => a.name), 'sft', null],
    'algorithm.kind: the algorithms, sft (null: the stage)',
  );
  t.ok(stageNames().includes('rloo') && stageNames().includes('ppo'), 'the built-in algorithms are registered');
});

t.test('lib/config/types.ts and the schema agree on every key, value type and enum value', async (t) => {
  t.same(differences('', schemaView, typeView), []);
  // The walk reaches the nested sections (a comparison of names only would pass with no props).
  t.ok(typeView.props?.algorithm?.props?.fallbacks?.props?.zero_variance?.literals?.has('center'), 'nested sections are compared');
  t.same(sorted(typeView.props?.model?.props?.dtype?.literals), ['bfloat16', 'float16', 'float32']);
});

t.test('every schema default is a value of its key on both sides', async (t) => {
  t.same(badDefaults(CONFIG_SCHEMA, typeView, ''), []);
});

t.test('the derived keys are null by default in the schema and filled by the loader', async (t) => {
  const c = validateConfig(
    { stage: 'grpo', model: { path: 'unused' }, data: { questions: 'q.jsonl', corpus: 'c.jsonl' } },
    'test',
  ) as unknown as Record<string, Record<string, unknown>>;
  for (const key of DERIVED) {
    const [sec, k] = key.split('.');
    const s = (CONFIG_SCHEMA.properties as Record<string, Schema>)[sec].properties as Record<string, Schema>;
    t.equal(s[k].default, null, `${key}: null in the schema`);
    t.not(c[sec][k], null, `${key}: filled by the loader`);
    t.notOk(typeView.props![sec].props![k].kinds.has('null'), `${key}: never null in the type`);
  }
});

t.test('sectionDefaults: what validation fills in a section left out', async (t) => {
  const given = { stage: 'grpo', model: { path: 'unused' }, data: { questions: 'q.jsonl', corpus: 'c.jsonl' } };
  const c = validateConfig(given, 'test') as unknown as Record<string, Record<string, unknown>>;
  for (const sec of Object.keys(CONFIG_SCHEMA.properties as object).filter((k) => k !== 'stage')) {
    const d = sectionDefaults(sec as never) as Record<string, unknown>;
    t.same(Object.keys(d), Object.keys(c[sec]), `${sec}: every key`);
    for (const [k, v] of Object.entries(d)) {
      if (DERIVED.includes(`${sec}.${k}`) || (given as unknown as Record<string, Record<string, unknown>>)[sec]?.[k] !== undefined)
        continue;
      t.same(v, c[sec][k], `${sec}.${k}`);
    }
  }
  const a = sectionDefaults('reward');
  a.parts.push({ kind: 'f1' });
  t.same(sectionDefaults('reward').parts, [{ kind: 'em', weight: 1 }], 'a copy: changing it leaves the schema as it is');
});

t.test('the comparison finds a key, a type or an enum value on one side only', async (t) => {
  // The same walk over altered copies: each alteration must be reported.
  const schema = structuredClone(CONFIG_SCHEMA) as Schema;
  const props = schema.properties as Record<string, Schema>;
  const lora = props.lora.properties as Record<string, Schema>;
  lora.extra = { type: 'integer', default: 1 };
  (props.algorithm.properties as Record<string, Schema>).std = { type: 'string', enum: ['group', 'none', 'batch'], default: 'group' };
  (props.train.properties as Record<string, Schema>).seed = { type: 'string', default: '0' };
  const found = differences('', fromSchema(schema), typeView);
  t.match(found.join('\n'), /lora\.extra: in the schema, not in the type/);
  t.match(found.join('\n'), /algorithm\.std: schema values \["batch","group","none"\], type values \["group","none"\]/);
  t.match(found.join('\n'), /train\.seed: schema string, type number/);
  const typed = structuredClone({
    ...typeView,
    props: {
      ...typeView.props,
      run: { kinds: new Set(['object']), props: { ...typeView.props!.run.props, extra: { kinds: new Set(['string']) } } },
    },
  });
  t.match(differences('', schemaView, typed).join('\n'), /run\.extra: in the type, not in the schema/);
  t.match(
    badDefaults(
      { properties: { x: { type: 'integer', default: 0.5 }, y: { type: 'string', enum: ['a'], default: 'b' } } },
      undefined,
      '',
    ).join('\n'),
    /x: default 0\.5[\s\S]*y: default "b"/,
  );
});
