// Two Node processes on one store (`shared: true`, format-spec/08-many-processes.md), each
// through DSH's real SessionStore and coordinator: both write their own sessions, each sees
// what the other committed, a session the other process is writing is refused naming its
// pid, and once that process has gone the session continues at the next seq.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { completedTurn, mountDshdb, T0, tempDir } from './helpers.mjs'

const HELPERS = fileURLToPath(new URL('./helpers.mjs', import.meta.url))

/** Runs `body` (an async function body with `mounted` and `completedTurn` in scope) in a
 * second Node process that mounts the shared store `dir`; returns what it printed as JSON. */
function inAnotherProcess(dir, body) {
  const child = spawnSync(process.execPath, ['--input-type=module', '-e', `
    import { completedTurn, mountDshdb } from ${JSON.stringify(HELPERS)}
    const mounted = await mountDshdb(${JSON.stringify(dir)}, { shared: true })
    const out = await (async () => { ${body} })()
    await mounted.dispose()
    console.log(JSON.stringify(out))`], { encoding: 'utf8', timeout: 60_000 })
  assert.equal(child.status, 0, `the other process failed: ${child.stderr}`)
  return JSON.parse(child.stdout.trim().split('\n').pop())
}

test('two processes share one store: their own sessions, each other\'s commits, busy sessions', async () => {
  const { dir, cleanup } = await tempDir()
  const mine = await mountDshdb(dir, { shared: true })
  try {
    await mine.persistence.create({ version: 0, id: 'mine', createdAt: T0 })
    await mine.persistence.append('mine', completedTurn(0, 1))

    const other = inAnotherProcess(dir, `
      const seen = await mounted.persistence.loadStored('mine')
      await mounted.persistence.create({ version: 0, id: 'theirs', createdAt: ${T0} })
      await mounted.persistence.append('theirs', completedTurn(0, 1))
      let busy = 'appended'
      try { await mounted.persistence.append('mine', completedTurn(3, 2)) } catch (error) { busy = String(error?.message ?? error) }
      return { seen: seen?.events.length, busy, pid: process.pid }`)
    assert.equal(other.seen, 3, 'the other process reads what this one committed')
    assert.match(other.busy, new RegExp(`is being written by process ${process.pid}\\b`))

    // What the other process committed is here, without a remount.
    const theirs = await mine.persistence.loadStored('theirs')
    assert.deepEqual(theirs?.events.map((event) => event.seq), [0, 1, 2])
    const ids = (await mine.persistence.list()).map((header) => header.id).sort()
    assert.deepEqual(ids, ['mine', 'theirs'])
    // The other process has gone: its session continues here at the next seq.
    await mine.persistence.append('theirs', completedTurn(3, 2))
    const continued = await mine.persistence.loadStored('theirs')
    assert.deepEqual(continued?.events.map((event) => event.seq), [0, 1, 2, 3, 4, 5])
  } finally {
    await mine.dispose()
  }
  // Both processes' events survive a reopen (exclusive this time).
  const reopened = await mountDshdb(dir)
  const mineAgain = await reopened.persistence.loadStored('mine')
  const theirsAgain = await reopened.persistence.loadStored('theirs')
  assert.equal(mineAgain?.events.length, 3)
  assert.equal(theirsAgain?.events.length, 6)
  await reopened.dispose()
  await cleanup()
})
