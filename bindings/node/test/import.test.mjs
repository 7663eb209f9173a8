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

test('DSH fixtures import and cold-load to the messages DSH derived', { skip: cases.length === 0 && 'no fixtures' }, async () => {
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
