// Mounting the way a profile's cordis patch does, as far as npm allows: DSH's Loader and
// Include are not published, so this imports the provider by its package name (the Loader
// does a plain import()) and mounts it with the patch row's config through cordis, which
// validates the config against the plugin's own schema. The JSONL provider row is disabled,
// so it is never mounted and its root never created.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { existsSync } from 'node:fs'
import { join } from 'node:path'
import { Context } from '@deepseek-ai/cordis'
import SessionStore from '@deepseek-ai/dsh-session'
import { tempDir } from './helpers.mjs'

const PATCH = [
  { id: 'session-persistence-jsonl', name: '@deepseek-ai/dsh-session-persistence-jsonl', disabled: true, config: { root: 'sessions' } },
  { id: 'session-persistence-dshdb', name: '@dshdb/dsh-session-persistence-dshdb', config: { path: 'sessions.dshdb' } },
]

test('the patch rows mount the dshdb provider by package name; the JSONL row stays off', async () => {
  const { dir, cleanup } = await tempDir()
  const ctx = new Context()
  await ctx.plugin(SessionStore)
  const fibers = []
  for (const row of PATCH) {
    if (row.disabled) continue
    const module = await import(row.name)
    const config = { ...row.config, path: join(dir, row.config.path) }
    fibers.push(ctx.plugin(module.default, config))
  }
  await Promise.all(fibers)
  assert.equal(ctx.sessionPersistence?.name, 'session-persistence-dshdb')
  const session = ctx.sessions.create('via-patch')
  session.append('turn/start', { turn: 1 })
  await ctx.sessions.flush(session)
  assert.deepEqual(
    (await ctx.sessionPersistence.list()).map((header) => header.id),
    ['via-patch'],
  )
  assert.equal(existsSync(join(dir, 'sessions')), false)
  assert.equal(existsSync(join(dir, 'sessions.dshdb', 'MANIFEST')), true)
  for (const fiber of fibers) await fiber.dispose()
  await cleanup()
})

test('a config the schema rejects leaves the service unmounted', async () => {
  const ctx = new Context()
  await ctx.plugin(SessionStore)
  const module = await import('@dshdb/dsh-session-persistence-dshdb')
  const fiber = ctx.plugin(module.default, { path: 42 })
  await Promise.resolve(fiber).catch(() => undefined)
  assert.equal(ctx.sessionPersistence, undefined)
})
