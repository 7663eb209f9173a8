// Profiles one provider's free appending (no flush per event) under DSH's write-behind.
// Usage: node --cpu-prof bench/free-profile.mjs [dshdb|jsonl-zstd|none] [eventsPerSession]
import { Context } from '@deepseek-ai/cordis'
import { mount, DshdbSessionPersistence, JsonlSessionPersistence, SessionStore, tempDir } from '../test/helpers.mjs'
const name = process.argv[2] ?? 'dshdb'
const perSession = Number(process.argv[3] ?? 2000)
const text = 'x'.repeat(192)
const { dir, cleanup } = await tempDir('dshdb-prof-')
let sessions
let dispose = async () => {}
if (name === 'none') {
  const ctx = new Context()
  await ctx.plugin(SessionStore)
  sessions = ctx.sessions
} else {
  const mounted = name === 'dshdb' ? await mount(DshdbSessionPersistence, { path: dir }) : await mount(JsonlSessionPersistence, { root: dir, compression: 'zstd' })
  sessions = mounted.sessions
  dispose = mounted.dispose
}
const live = Array.from({ length: 64 }, (_, i) => sessions.create(`p-${i}`, { meta: { cwd: '/p' } }))
for (const session of live) { session.append('turn/start', { turn: 1 }); session.append('step/start', { turn: 1, step: 1 }) }
await Promise.all(live.map((session) => sessions.flush(session)))
const start = performance.now()
for (let index = 0; index < perSession; index++) {
  for (const session of live) session.append('assistant/chunk', { turn: 1, step: 1, chunk: { type: 'text-delta', index: 0, text: `${text}${index}` } })
  if (index % 64 === 63) await new Promise((resolve) => setImmediate(resolve))
}
await Promise.all(live.map((session) => sessions.flush(session)))
const seconds = (performance.now() - start) / 1000
console.log(`${name} free: ${Math.round((64 * perSession) / seconds)} events/s`)
await dispose()
await cleanup()
