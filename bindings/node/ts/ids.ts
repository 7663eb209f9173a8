/**
 * How DSH session ids and headers map to the dshdb store.
 *
 * A DSH `SessionId` is any JavaScript string, lone surrogates included, but a store id is
 * UTF-8 text that is not empty and holds no control character (the engine refuses those,
 * since they make `dshdb ls` ambiguous). A well-formed id without control characters is its
 * own store id, so `dshdb ls` and `dshdb export` show it as DSH does. Any other id (or one
 * that starts with {@link ID_PREFIX}) is stored as the prefix plus the hex of its UTF-16
 * code units, 4 digits each. The mapping is injective: an unmapped id never starts with
 * the prefix.
 * @module
 */
import type { SessionHeader, SessionId } from '@deepseek-ai/dsh-session'

/** Prefix of a store id that encodes a DSH id as UTF-16 code units. */
export const ID_PREFIX = 'dshdb-utf16:'
/** Stored-header member holding the DSH header text when the store cannot hold it as is. */
export const WRAPPED_HEADER_KEY = 'dshdb:header'
/** Hex digits per UTF-16 code unit. */
const UNIT_HEX_DIGITS = 4
/** A JSON escape of a surrogate code unit (JSON.stringify emits one only for a lone one). */
const SURROGATE_ESCAPE = /\\ud[89a-f]/i

/** C0 controls and DEL: characters a store id may not hold. */
const CONTROL_CHARACTER = /[\u0000-\u001f\u007f]/

/** The store id of a DSH session id. */
export function storeId(id: string): string {
  const storable = id.length > 0 && id.isWellFormed() && !CONTROL_CHARACTER.test(id)
  if (storable && !id.startsWith(ID_PREFIX)) return id
  let hex = ID_PREFIX
  for (let index = 0; index < id.length; index++) {
    hex += id.charCodeAt(index).toString(16).padStart(UNIT_HEX_DIGITS, '0')
  }
  return hex
}

/** The DSH session id of a store id (the inverse of {@link storeId}). */
export function dshId(stored: string): SessionId {
  if (!stored.startsWith(ID_PREFIX)) return stored as SessionId
  const hex = stored.slice(ID_PREFIX.length)
  let id = ''
  for (let at = 0; at + UNIT_HEX_DIGITS <= hex.length; at += UNIT_HEX_DIGITS) {
    id += String.fromCharCode(Number.parseInt(hex.slice(at, at + UNIT_HEX_DIGITS), 16))
  }
  return id as SessionId
}

/**
 * The header text the store keeps for a DSH header: DSH's own `JSON.stringify` text when
 * the store can hold it as a session header (version 0, a safe non-negative `createdAt`, an
 * id that is its own store id, no lone surrogate anywhere), otherwise a store header that
 * carries the DSH text whole under {@link WRAPPED_HEADER_KEY}. DSH's `create` admits any
 * version (it refuses foreign versions on load), so such headers must be storable too.
 */
export function storedHeader(meta: SessionHeader): string {
  const text = JSON.stringify(meta)
  const createdAt = meta.createdAt
  const safeCreatedAt = Number.isSafeInteger(createdAt) && createdAt >= 0
  const plain = meta.version === 0 && safeCreatedAt && storeId(meta.id) === meta.id && !SURROGATE_ESCAPE.test(text)
  if (plain) return text
  return JSON.stringify({
    version: 0,
    id: storeId(meta.id),
    createdAt: safeCreatedAt ? createdAt : 0,
    [WRAPPED_HEADER_KEY]: text,
  })
}

/**
 * The logical DSH header of a stored header text, as DSH's JSONL provider reads its header
 * line: the known fields in DSH's order, `delegationDepth` defaulting to 0, other members
 * (DSH's line `type`, a store's own fields) dropped. So switching from the JSONL provider
 * changes nothing DSH sees.
 */
export function logicalHeader(text: string): SessionHeader {
  const stored = JSON.parse(text) as Record<string, unknown>
  const wrapped = stored[WRAPPED_HEADER_KEY]
  const source = typeof wrapped === 'string' ? (JSON.parse(wrapped) as Record<string, unknown>) : stored
  const header: Record<string, unknown> = {
    version: source.version,
    id: typeof wrapped === 'string' ? source.id : typeof source.id === 'string' ? dshId(source.id) : source.id,
    createdAt: source.createdAt,
  }
  for (const key of ['cwd', 'parentSession', 'seedLength', 'origin'] as const) {
    if (source[key] !== undefined) header[key] = source[key]
  }
  header.delegationDepth = source.delegationDepth ?? 0
  if (source.agentPreset !== undefined) header.agentPreset = source.agentPreset
  return header as unknown as SessionHeader
}
