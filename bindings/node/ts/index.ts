/**
 * DeepSeek Harness session persistence on dshdb.
 *
 * A cordis plugin that registers as `ctx.sessionPersistence`. It composes DSH's own
 * {@link PersistenceCoordinator} (write-behind, per-id serialization, lazy materialization,
 * crash-repair sequencing, preparation cache, live adoption, legacy upgrades, version and
 * vocabulary refusals) and implements only the storage hooks over the dshdb engine, as
 * DSH's JSONL and SQLite providers do.
 * @module
 */
import { resolve } from 'node:path'
import z from '@deepseek-ai/schemastery'
import type { Context } from '@deepseek-ai/cordis'
import {
  DEFAULT_PREPARED_SESSION_CACHE_SIZE,
  DEFAULT_WRITE_BATCH_MAX_DELAY_MS,
  MAX_WRITE_BATCH_DELAY_MS,
  PersistenceCoordinator,
  SessionPersistence,
  SessionPersistenceRevision,
} from '@deepseek-ai/dsh-session-persistence'
import type {
  PersistenceBackend,
  SessionInspection,
  SessionLocation,
  SessionPersistenceSnapshot,
  SessionRawArtifact,
  StoredPrefix,
  StoredSuffix,
} from '@deepseek-ai/dsh-session-persistence'
import { decodeStorageRecord, type SessionEvent, type SessionHeader, type SessionId, type SessionPreparation } from '@deepseek-ai/dsh-session'
import { openStore, type NativeRead, type NativeStore } from '../native/index.js'
import { logicalHeader, storedHeader, storeId } from './ids.js'

export { dshId, ID_PREFIX, logicalHeader, storedHeader, storeId } from './ids.js'

/** How durable an append is when its promise resolves. */
export type Durability = 'sync' | 'buffered'

/** Plugin configuration. */
export interface DshdbPersistenceConfig {
  /** The store directory (created when missing). */
  path: string
  /** `sync` (default): fdatasync'd; `buffered`: written to the OS (survives a process crash, not a power cut). */
  durability?: Durability
  /** Completed unpublished preparations DSH's coordinator keeps for reuse. */
  preparedSessionCacheSize?: number
  /** DSH's fixed write-behind window, in milliseconds. */
  writeBatchMaxDelayMs?: number
  /**
   * `true`: other processes (a second DSH terminal, a web server, subagents) may mount the
   * same store too; each session has one writing process at a time (appending to a session
   * another live process writes is refused with the holder's pid), and every process sees
   * the others' commits. `false` (default): this process holds the store alone.
   */
  shared?: boolean
}

/**
 * The torn-tail marker: the store's open discarded an unacknowledged batch of this session
 * (an interrupted write). The bytes are gone already; `commitRepair` records that DSH saw
 * it, which changes the revision.
 */
/**
 * Where the last `loadStored` spent its time, in milliseconds. The engine reads on its own
 * thread while JavaScript parses the chunks it already handed over, so the parts overlap:
 * `engineMs` is the engine's walk (off the JavaScript thread), `waitMs` the time the
 * JavaScript thread waited for the engine (the open and first chunk, any chunk not ready
 * yet, and the N-API round trips), `parseMs` the `JSON.parse` and row expansion of the
 * events on the JavaScript thread. Diagnostics for the cold-restore benchmark.
 */
export interface DshdbLoadTimings {
  engineMs: number
  waitMs: number
  parseMs: number
}

export interface DshdbTornMarker {
  readonly discardedAtOpen: true
}

/** The name of the file `readRaw` returns, as DSH's session export expects. */
const RAW_FILENAME = 'session.jsonl'

/** Closes still running per store path: a remount in the same process waits for them. */
const closing = new Map<string, Promise<void>>()

/** A streamed read's header, revision and torn flag, and its events as fresh, unaliased objects. */
interface StreamedRead {
  read: NativeRead
  events: SessionEvent[]
  timings: DshdbLoadTimings
}

/**
 * Drains a streamed read: each chunk is one JSON array text; a chunk with packed chunk rows
 * (an imported log's) is expanded by DSH's own decoder, as its JSONL provider does. The
 * engine reads the next chunk meanwhile. An abort between chunks cancels the read.
 */
async function drain(read: NativeRead, opened: number, signal: AbortSignal | undefined): Promise<StreamedRead> {
  const events: SessionEvent[] = []
  let waitMs = performance.now() - opened
  let parseMs = 0
  try {
    for (;;) {
      const asked = performance.now()
      const chunk = await read.next()
      const received = performance.now()
      waitMs += received - asked
      if (chunk === null) break
      signal?.throwIfAborted()
      const records = JSON.parse(chunk.lines.toString('utf8')) as SessionEvent[]
      if (chunk.packed) {
        for (const record of records) {
          for (const event of decodeStorageRecord(record)) events.push(event as SessionEvent)
        }
      } else {
        for (const record of records) events.push(record)
      }
      parseMs += performance.now() - received
    }
  } finally {
    read.cancel()
  }
  return { read, events, timings: { engineMs: read.engineMillis ?? 0, waitMs, parseMs } }
}

/** Opens a streamed read of `id` from `fromSeq` and drains it; `undefined` when absent. */
async function readStream(store: NativeStore, id: string, fromSeq: number, signal: AbortSignal | undefined): Promise<StreamedRead | undefined> {
  const opened = performance.now()
  const read = await store.openRead(id, fromSeq)
  if (read === null) return undefined
  if (signal?.aborted) {
    read.cancel()
    signal.throwIfAborted()
  }
  return drain(read, opened, signal)
}

/** DSH event JSON texts joined by newlines (JSON.stringify never emits a raw newline). */
function eventLines(events: readonly SessionEvent[]): string {
  let lines = ''
  for (let index = 0; index < events.length; index++) {
    if (index > 0) lines += '\n'
    lines += JSON.stringify(events[index])
  }
  return lines
}

/** DSH's session persistence service over a dshdb store. */
export class DshdbSessionPersistence extends SessionPersistence implements PersistenceBackend<DshdbTornMarker> {
  static inject = ['sessions']
  static Config: z<DshdbPersistenceConfig> = z.object({
    path: z.string().required(),
    durability: z.union([z.const('sync' as const), z.const('buffered' as const)]).default('sync'),
    preparedSessionCacheSize: z.number().step(1).min(1).default(DEFAULT_PREPARED_SESSION_CACHE_SIZE),
    writeBatchMaxDelayMs: z
      .number()
      .step(1)
      .min(1)
      .max(MAX_WRITE_BATCH_DELAY_MS)
      .default(DEFAULT_WRITE_BATCH_MAX_DELAY_MS),
    shared: z.boolean().default(false),
  })

  readonly supportsRawArtifacts = true
  /** Backend label for the coordinator's diagnostics (the service key stays `sessionPersistence`). */
  override name = 'session-persistence-dshdb'
  /** The absolute store directory. */
  readonly path: string
  readonly durability: Durability
  /** Whether other processes may open the store too ({@link DshdbPersistenceConfig.shared}). */
  readonly shared: boolean
  readonly coordinator: PersistenceCoordinator<DshdbTornMarker>
  private opening: Promise<NativeStore> | undefined
  /** Where the last `loadStored` spent its time (see {@link DshdbLoadTimings}). */
  lastLoadTimings: DshdbLoadTimings | undefined

  /** Synchronous: the store opens on first use. */
  constructor(ctx: Context, config: DshdbPersistenceConfig) {
    super(ctx)
    this.path = resolve(config.path)
    this.durability = config.durability ?? 'sync'
    this.shared = config.shared ?? false
    this.coordinator = new PersistenceCoordinator(ctx, this, {
      preparedSessionCacheSize: config.preparedSessionCacheSize ?? DEFAULT_PREPARED_SESSION_CACHE_SIZE,
      writeBatchMaxDelayMs: config.writeBatchMaxDelayMs ?? DEFAULT_WRITE_BATCH_MAX_DELAY_MS,
    })
  }

  /** The open store, opening it on first use (after a close of the same path still running). */
  private store(): Promise<NativeStore> {
    if (this.opening === undefined) {
      const pending = closing.get(this.path)
      const opening = (async () => {
        await pending
        return openStore(this.path, this.durability, this.shared)
      })()
      this.opening = opening
      // A failed open (e.g. another process holds the store) is retried by the next call.
      opening.catch(() => {
        if (this.opening === opening) this.opening = undefined
      })
    }
    return this.opening
  }

  // The service surface: DSH's coordinator does the work.
  create(meta: SessionHeader): Promise<void> {
    return this.coordinator.create(meta)
  }
  append(id: SessionId, events: readonly SessionEvent[]): Promise<void> {
    return this.coordinator.append(id, events)
  }
  override prepare(id: SessionId, signal?: AbortSignal): Promise<SessionPreparation> {
    return this.coordinator.prepare(id, signal)
  }
  load(id: SessionId): Promise<SessionInspection> {
    return this.coordinator.load(id)
  }
  inspect(id: SessionId, signal?: AbortSignal): Promise<SessionInspection> {
    return this.coordinator.inspect(id, signal)
  }
  readFrom(id: SessionId, fromSeq: number, signal?: AbortSignal): Promise<{ meta: SessionHeader; events: SessionEvent[] }> {
    return this.coordinator.readFrom(id, fromSeq, signal)
  }

  /** One database, no per-session artifact: DSH then exports no transcript path to tools. */
  locate(_meta: SessionHeader): SessionLocation | undefined {
    return undefined
  }

  // The storage hooks.
  async loadStored(id: SessionId, signal?: AbortSignal): Promise<StoredPrefix<DshdbTornMarker> | undefined> {
    signal?.throwIfAborted()
    const store = await this.store()
    signal?.throwIfAborted()
    const streamed = await readStream(store, storeId(id), 0, signal)
    signal?.throwIfAborted()
    if (streamed === undefined) return undefined
    const { read, events, timings } = streamed
    this.lastLoadTimings = timings
    const prefix: StoredPrefix<DshdbTornMarker> = {
      meta: logicalHeader(read.header),
      events,
      revision: SessionPersistenceRevision(read.revision),
    }
    if (read.torn) prefix.tornMarker = { discardedAtOpen: true }
    return prefix
  }

  async readStoredRevision(id: SessionId, signal?: AbortSignal): Promise<SessionPersistenceRevision | undefined> {
    signal?.throwIfAborted()
    const store = await this.store()
    signal?.throwIfAborted()
    const revision = store.revision(storeId(id))
    return revision === null ? undefined : SessionPersistenceRevision(revision)
  }

  async loadStoredFrom(id: SessionId, fromSeq: number, signal?: AbortSignal): Promise<StoredSuffix | undefined> {
    signal?.throwIfAborted()
    const store = await this.store()
    signal?.throwIfAborted()
    const streamed = await readStream(store, storeId(id), fromSeq, signal)
    signal?.throwIfAborted()
    if (streamed === undefined) return undefined
    return { meta: logicalHeader(streamed.read.header), events: streamed.events }
  }

  /** Durable when it resolves; the first batch carries the header in the same atomic commit. */
  async appendBatch(meta: SessionHeader, events: readonly SessionEvent[], isMaterialized: boolean): Promise<void> {
    if (events.length === 0) return
    const store = await this.store()
    const header = isMaterialized ? null : storedHeader(meta)
    await store.append(storeId(meta.id), header, events[0]!.seq, eventLines(events))
  }

  async commitRepair(
    meta: SessionHeader,
    _tornMarker: DshdbTornMarker | undefined,
    closers: readonly SessionEvent[],
  ): Promise<void> {
    const store = await this.store()
    const first = closers[0]
    await store.repair(storeId(meta.id), first?.seq ?? 0, first === undefined ? null : eventLines(closers))
  }

  async list(signal?: AbortSignal): Promise<SessionHeader[]> {
    return (await this.listSnapshots(signal)).map((snapshot) => snapshot.header)
  }

  /** Headers and revisions from the store's catalog: no log is read. */
  async listSnapshots(signal?: AbortSignal): Promise<SessionPersistenceSnapshot[]> {
    signal?.throwIfAborted()
    const store = await this.store()
    signal?.throwIfAborted()
    const rows = JSON.parse(store.list()) as [Record<string, unknown>, string][]
    const snapshots: SessionPersistenceSnapshot[] = []
    for (const [header, revision] of rows) {
      snapshots.push({
        header: logicalHeader(JSON.stringify(header)),
        revision: SessionPersistenceRevision(revision),
      })
    }
    return snapshots
  }

  /** The session's DSH JSONL text, as `dshdb export` writes it (an imported log byte for byte). */
  override async readRaw(id: SessionId, signal?: AbortSignal): Promise<SessionRawArtifact | undefined> {
    signal?.throwIfAborted()
    const store = await this.store()
    signal?.throwIfAborted()
    const sid = storeId(id)
    // A read from past the last seq carries the header and no events.
    const [bytes, stored] = await Promise.all([store.exportJsonl(sid), readStream(store, sid, Number.MAX_SAFE_INTEGER, signal)])
    signal?.throwIfAborted()
    if (bytes === null || stored === undefined) return undefined
    return { meta: logicalHeader(stored.read.header), filename: RAW_FILENAME, content: bytes.toString('utf8') }
  }

  /**
   * Imports one DSH session log (`session.jsonl` or `session.jsonl.zstd` bytes) into the
   * store, validated as DSH's cold load does (nothing is written on a refusal); the same
   * import as `dshdb import`. Resolves with the session id.
   */
  async importLog(bytes: Uint8Array): Promise<SessionId> {
    const store = await this.store()
    return (await store.importJsonl(Buffer.from(bytes))) as SessionId
  }

  /** Runs the store's maintenance once (compaction of the write-ahead log into runs). */
  async maintain(): Promise<void> {
    await (await this.store()).maintain()
  }

  /** After DSH's dispose drain: settles every append, syncs and releases the store. */
  async close(): Promise<void> {
    const opening = this.opening
    this.opening = undefined
    if (opening === undefined) return
    const store = await opening.catch(() => undefined)
    if (store === undefined) return
    const done = store.close()
    const settled = done.then(
      () => undefined,
      () => undefined,
    )
    closing.set(this.path, settled)
    try {
      await done
    } finally {
      if (closing.get(this.path) === settled) closing.delete(this.path)
    }
  }
}

export default DshdbSessionPersistence
