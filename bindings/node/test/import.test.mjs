// Legacy DSH JSONL logs imported into the store (what `dshdb import` does), then cold-loaded
// through DSH's coordinator: the messages equal what DSH itself derived from the same files.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { existsSync, readdirSync, readFileSync } from 'node:fs'
import { mountDshdb, tempDir } from './helpers.mjs'

const FIXTURES = process.env.DSH_FIXTURES ?? new URL('../../../../shared/fixtures/dsh/', import.meta.url).pathname

const cases = existsSync(FIXTURES)
  ? readdirSync(FIXTURES)
      .filter((name) => name.endsWith('.input.jsonl'))
      .map((name) => name.slice(0, -'.input.jsonl'.length))
      .filter((name) => existsSync(`${FIXTURES}${name}.messages.json`))
  : []

// The fixtures are not in the repository: without them this test is skipped, saying so,
// except under CI=true, where the DSH conformance suite must run.
const skip = cases.length === 0 && `no DSH fixtures at ${FIXTURES} (set DSH_FIXTURES)`
if (skip && process.env.CI === 'true') throw new Error(`CI=true but ${skip}`)

test('DSH fixtures import and cold-load to the messages DSH derived', { skip }, async () => {
  const { dir, cleanup } = await tempDir()
  const mounted = await mountDshdb(dir)
  try {
    for (const name of cases) {
      const id = await mounted.persistence.importLog(readFileSync(`${FIXTURES}${name}.input.jsonl`))
      const preparation = await mounted.persistence.prepare(id)
      const expected = JSON.parse(readFileSync(`${FIXTURES}${name}.messages.json`, 'utf8'))
      assert.deepEqual(JSON.parse(JSON.stringify(preparation.session.deriveMessages())), expected, name)
      preparation[Symbol.dispose]()
    }
  } finally {
    await mounted.dispose()
    await cleanup()
  }
})

test('packed chunk rows of an imported log: every readFrom suffix equals the expanded log from that seq', { skip }, async () => {
  const { dir, cleanup } = await tempDir()
  const mounted = await mountDshdb(dir)
  try {
    let rows = 0
    for (const name of cases) {
      const text = readFileSync(`${FIXTURES}${name}.input.jsonl`, 'utf8')
      if (!/"type":"(text|reasoning|tool-call)-chunks"/.test(text)) continue
      rows += 1
      const id = await mounted.persistence.importLog(Buffer.from(text))
      const all = (await mounted.persistence.readFrom(id, 0)).events.map((event) => JSON.stringify(event))
      for (let from = 0; from <= all.length; from++) {
        const suffix = (await mounted.persistence.readFrom(id, from)).events.map((event) => JSON.stringify(event))
        assert.deepEqual(suffix, all.slice(from), `${name} from seq ${from}`)
      }
    }
    assert.ok(rows > 0, 'no fixture has packed chunk rows')
  } finally {
    await mounted.dispose()
    await cleanup()
  }
})
