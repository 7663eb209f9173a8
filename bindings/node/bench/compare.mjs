// Throughput through DSH's API: DSH's SessionStore with the dshdb provider, DSH's JSONL
// provider (zstd and none), and no provider (the ceiling), on one event stream: SESSIONS live
// sessions appending 256-byte assistant/chunk events, (a) flushing after every event and
// (b) appending freely under the 200 ms write-behind; "coordinator-only" is DSH's coordinator
// over a backend that drops batches (the ceiling of any provider). Writes JSON results to the path in
// argv[2] (default bench-out/node-compare.json).
// Usage: node bench/compare.mjs [out.json] [eventsPerSessionFlush] [eventsPerSessionFree]
import { mkdirSync, writeFileSync } from 'node:fs'
import { dirname } from 'node:path'
import { Context } from '@deepseek-ai/cordis'
import { mount, DshdbSessionPersistence, JsonlSessionPersistence, SessionStore, tempDir } from '../test/helpers.mjs'

const SESSIONS = 64
const CHUNK_BYTES = 256
const out = process.argv[2] ?? 'bench-out/node-compare.json'
const flushEvents = Number(process.argv[3] ?? 40)
const freeEvents = Number(process.argv[4] ?? 2000)
const text = 'x'.repeat(CHUNK_BYTES - 64)

/**
 * DSH's PersistenceCoordinator over a backend that drops every batch (the dshdb provider
 * with `appendBatch` doing nothing): what DSH's own persistence JavaScript costs (its
 * write-behind copies each event with structuredClone, checks it is lossless JSON, ...),
 * the ceiling of any provider composed as DSH's JSONL and SQLite providers are.
 */
class DroppingPersistence extends DshdbSessionPersistence {
  async appendBatch() {}
}

const providers = {
  dshdb: (dir) => [DshdbSessionPersistence, { path: dir }],
  'coordinator-only': (dir) => [DroppingPersistence, { path: dir }],
  'jsonl-zstd': (dir) => [JsonlSessionPersistence, { root: dir, compression: 'zstd' }],
  'jsonl-none': (dir) => [JsonlSessionPersistence, { root: dir, compression: 'none' }],
  none: undefined,
}

async function setup(name) {
  const { dir, cleanup } = await tempDir('dshdb-bench-')
  const make = providers[name]
  if (make === undefined) {
    const ctx = new Context()
    await ctx.plugin(SessionStore)
    return { sessions: ctx.sessions, dispose: async () => {}, cleanup }
  }
  const [Provider, config] = make(dir)
  const mounted = await mount(Provider, config)
  return { sessions: mounted.sessions, dispose: mounted.dispose, cleanup }
}

function chunk(session, index) {
  session.append('assistant/chunk', { turn: 1, step: 1, chunk: { type: 'text-delta', index: 0, text: `${text}${index}` } })
}

async function run(name, mode, perSession) {
  const env = await setup(name)
  const live = Array.from({ length: SESSIONS }, (_, i) => env.sessions.create(`bench-${i}`, { meta: { cwd: '/bench' } }))
  for (const session of live) {
    session.append('turn/start', { turn: 1 })
    session.append('step/start', { turn: 1, step: 1 })
  }
  await Promise.all(live.map((session) => env.sessions.flush(session)))
  const start = performance.now()
  if (mode === 'flush') {
    // Each session: append, then await its flush, SESSIONS such loops at once.
    await Promise.all(
      live.map(async (session) => {
        for (let index = 0; index < perSession; index++) {
          chunk(session, index)
          await env.sessions.flush(session)
        }
      }),
    )
  } else {
    for (let index = 0; index < perSession; index++) {
      for (const session of live) chunk(session, index)
      if (index % 64 === 63) await new Promise((resolve) => setImmediate(resolve))
    }
    await Promise.all(live.map((session) => env.sessions.flush(session)))
  }
  const seconds = (performance.now() - start) / 1000
  await env.dispose()
  await env.cleanup()
  return { provider: name, mode, events: SESSIONS * perSession, seconds, eventsPerSecond: (SESSIONS * perSession) / seconds }
}

const results = []
for (const name of Object.keys(providers)) {
  results.push(await run(name, 'flush', flushEvents))
  results.push(await run(name, 'free', freeEvents))
  console.log(results.slice(-2).map((r) => `${r.provider} ${r.mode}: ${Math.round(r.eventsPerSecond)} events/s`).join('\n'))
}
// listSnapshots of 10,000 stored sessions (written through the addon, listed through DSH's API).
{
  const { dir, cleanup } = await tempDir('dshdb-bench-list-')
  const { openStore } = await import('../native/index.js')
  const store = await openStore(dir, 'sync')
  const LISTED = 10_000
  const writes = []
  for (let i = 0; i < LISTED; i++) {
    const id = `list-${i}`
    writes.push(store.append(id, JSON.stringify({ version: 0, id, createdAt: 1, cwd: '/bench' }), 0, JSON.stringify({ type: 'turn/start', seq: 0, time: 1, data: { turn: 1 } })))
  }
  await Promise.all(writes)
  await store.close()
  const mounted = await mount(DshdbSessionPersistence, { path: dir })
  await mounted.persistence.listSnapshots()
  const timings = []
  for (let round = 0; round < 5; round++) {
    const start = performance.now()
    const listed = await mounted.persistence.listSnapshots()
    timings.push(performance.now() - start)
    if (listed.length !== LISTED) throw new Error(`listed ${listed.length}`)
  }
  timings.sort((a, b) => a - b)
  results.push({ provider: 'dshdb', mode: 'listSnapshots', sessions: LISTED, medianMs: timings[2] })
  console.log(`dshdb listSnapshots of ${LISTED}: ${timings[2].toFixed(1)} ms (median of 5)`)
  await mounted.dispose()
  await cleanup()
}
mkdirSync(dirname(out), { recursive: true })
writeFileSync(out, JSON.stringify({ node: process.version, sessions: SESSIONS, chunkBytes: CHUNK_BYTES, results }, null, 2))
