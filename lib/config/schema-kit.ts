/** The small builders the config schema is written with (lib/config/schema.ts, and the RL algorithms' own keys). */
export type Schema = Record<string, unknown>;

const described = (description?: string) => (description ? { description } : {});

export const num = (d: number | null, extra: Schema = {}, description?: string): Schema => ({
  type: d === null ? ['number', 'null'] : 'number',
  default: d,
  ...extra,
  ...described(description),
});
export const int = (d: number | null, extra: Schema = {}, description?: string): Schema => ({
  type: d === null ? ['integer', 'null'] : 'integer',
  default: d,
  ...extra,
  ...described(description),
});
export const bool = (d: boolean, description?: string): Schema => ({ type: 'boolean', default: d, ...described(description) });
export const str = (d: string | null, description?: string): Schema => ({
  type: d === null ? ['string', 'null'] : 'string',
  default: d,
  ...described(description),
});
export const oneOf = (values: readonly string[], d: string | null, description?: string): Schema => ({
  ...(d === null ? { type: ['string', 'null'], enum: [...values, null] } : { type: 'string', enum: values }),
  default: d,
  ...described(description),
});
export const section = (properties: Record<string, Schema>, required: string[] = []): Schema => ({
  type: 'object',
  additionalProperties: false,
  default: {},
  properties,
  ...(required.length ? { required } : {}),
});
