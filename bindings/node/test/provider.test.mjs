// The dshdb provider through DSH's real SessionStore and PersistenceCoordinator (npm
// 0.1.0-rc.8): the write path, reloads, repair, refusals, cancellation, revisions,
// lossless JSON and ids, and remounts in one process.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Context } from '@deepseek-ai/cordis'
import { testTearLastBatch } from '../native/index.js'
import { appendTurn, assistantMessage, completedTurn, DshdbSessionPersistence, events, mountDshdb, SessionStore, T0, tempDir, userMessage } from './helpers.mjs'
import { storeId, dshId } from '../lib/index.js'


/** An interrupted turn: one tool call recorded as started, one not, no results, no turn/end. */
function interruptedTurn() {
  const user = userMessage('run the tools')
  return events(0, [
    ['turn/start', { turn: 1 }],
    ['user/message', user, { surfaceOp: 'append' }],
    ['step/start', { turn: 1, step: 1 }],
    ['assistant/message', { turn: 1, step: 1, message: assistantMessage('calling', ['call-a', 'call-b']) }, { sourceEventSeqs: [1], surfaceOp: 'append' }],
    ['tool/call', { turn: 1, step: 1, callId: 'call-a', name: 'bash', arguments: {} }],
  ])
}


async function withStore(run) {
  const { dir, cleanup } = await tempDir()
  try {
    await run(dir)
  } finally {
    await cleanup()
  }
}

test('live append, flush and reload through SessionStore', () =>
  withStore(async (dir) => {
    const first = await mountDshdb(dir)
    const session = first.sessions.create('live-1', { meta: { cwd: '/work/project' } })
    appendTurn(session, 1)
    appendTurn(session, 2)
    assert.equal(await first.sessions.flush(session), true)
    const live = session.events.map((event) => JSON.stringify(event))
    const messages = session.deriveMessages()
    await first.dispose()

    const second = await mountDshdb(dir)
    const loaded = await second.persistence.load('live-1')
    assert.deepEqual(
      loaded.events.map((event) => JSON.stringify(event)),
      live,
    )
    assert.equal(loaded.meta.cwd, '/work/project')
    assert.deepEqual(loaded.meta.delegationDepth, 0)
    const preparation = await second.persistence.prepare('live-1')
    assert.deepEqual(preparation.session.deriveMessages(), messages)
    preparation[Symbol.dispose]()
    const listed = await second.persistence.list()
    assert.deepEqual(
      listed.map((header) => header.id),
      ['live-1'],
    )
    await second.dispose()
  }))

test('lazy materialization: a created session without events is not stored', () =>
  withStore(async (dir) => {
    const mounted = await mountDshdb(dir)
    await mounted.persistence.create({ version: 0, id: 'lazy', createdAt: T0 })
    assert.deepEqual(await mounted.persistence.list(), [])
    await mounted.persistence.append('lazy', [])
    assert.deepEqual(await mounted.persistence.listSnapshots(), [])
    await mounted.persistence.append('lazy', completedTurn(0, 1))
    assert.deepEqual(
      (await mounted.persistence.list()).map((header) => header.id),
      ['lazy'],
    )
    await mounted.dispose()
  }))

test('a fork persists its seed once and resumes without re-appending it', () =>
  withStore(async (dir) => {
    const first = await mountDshdb(dir)
    const parent = first.sessions.create('parent', { meta: { cwd: '/work/p' } })
    appendTurn(parent, 1)
    await first.sessions.flush(parent)
    const child = first.sessions.fork(parent, parent.events.length - 1, 'child')
    appendTurn(child, 2)
    await first.sessions.flush(child)
    const childEvents = child.events.map((event) => JSON.stringify(event))
    await first.dispose()

    const second = await mountDshdb(dir)
    const stored = await second.persistence.readFrom('child', 0)
    assert.deepEqual(
      stored.events.map((event) => JSON.stringify(event)),
      childEvents,
    )
    assert.equal(stored.meta.parentSession, 'parent')
    assert.equal(stored.meta.seedLength, parent.events.length)
    // Resume: the prepared session holds the log once; a new turn continues after it.
    const preparation = await second.persistence.prepare('child')
    const resumed = preparation.session
    assert.equal(resumed.events.filter((event) => event.type === 'turn/start').length, 2)
    await second.dispose()
  }))

test('crash repair: inspect leaves the revision, load commits the closers, appends continue after them', () =>
  withStore(async (dir) => {
    const first = await mountDshdb(dir)
    await first.persistence.create({ version: 0, id: 'crashed', createdAt: T0 })
    await first.persistence.append('crashed', interruptedTurn())
    await first.dispose()

    const second = await mountDshdb(dir)
    const [before] = await second.persistence.listSnapshots()
    const inspected = await second.persistence.inspect('crashed')
    const closerTypes = inspected.events.slice(5).map((event) => event.type)
    assert.deepEqual(closerTypes, ['tool/result', 'tool/result', 'step/end', 'turn/end'])
    assert.deepEqual(
      inspected.events.slice(5, 7).map((event) => event.data.error.code),
      ['TOOL_OUTCOME_UNKNOWN', 'TOOL_NOT_STARTED'],
    )
    const [afterInspect] = await second.persistence.listSnapshots()
    assert.equal(afterInspect.revision, before.revision)
    assert.equal((await second.persistence.readFrom('crashed', 0)).events.length, 5)

    const loaded = await second.persistence.load('crashed')
    assert.equal(loaded.events.length, 9)
    const [afterLoad] = await second.persistence.listSnapshots()
    assert.notEqual(afterLoad.revision, before.revision)
    assert.equal((await second.persistence.readFrom('crashed', 0)).events.length, 9)
    await assert.rejects(second.persistence.append('crashed', completedTurn(9, 2).map((e) => ({ ...e, seq: e.seq + 1 }))))
    await second.persistence.append('crashed', completedTurn(9, 2))
    await second.dispose()

    const third = await mountDshdb(dir)
    assert.equal((await third.persistence.readFrom('crashed', 0)).events.length, 12)
    await third.dispose()
  }))

test('torn tail: reported as a torn marker until commitRepair, inspect and readFrom leave it', () =>
  withStore(async (dir) => {
    const first = await mountDshdb(dir)
    await first.persistence.create({ version: 0, id: 'torn', createdAt: T0 })
    await first.persistence.append('torn', completedTurn(0, 1))
    await first.persistence.append('torn', completedTurn(3, 2).slice(0, 2))
    await first.dispose()
    // A crash while the last batch was being written: its commit record is cut short (20
    // bytes reach into its seq and count; its last bytes are often zero already).
    assert.ok(testTearLastBatch(dir, 20) > 0)

    const second = await mountDshdb(dir)
    const persistence = second.persistence
    const stored = await persistence.loadStored('torn')
    assert.deepEqual(stored.tornMarker, { discardedAtOpen: true })
    assert.equal(stored.events.length, 3)
    const revision = stored.revision
    assert.equal((await persistence.inspect('torn')).events.length, 3)
    assert.equal((await persistence.readFrom('torn', 0)).events.length, 3)
    assert.equal(await persistence.readStoredRevision('torn'), revision)
    assert.ok((await persistence.loadStored('torn')).tornMarker)

    await persistence.load('torn')
    const repaired = await persistence.loadStored('torn')
    assert.equal(repaired.tornMarker, undefined)
    assert.notEqual(repaired.revision, revision)
    await persistence.append('torn', completedTurn(3, 2))
    await second.dispose()
  }))

test('version and unknown-type refusals; ignorable unknown events are kept', () =>
  withStore(async (dir) => {
    const first = await mountDshdb(dir)
    const p = first.persistence
    await p.create({ version: 7, id: 'newer', createdAt: T0 })
    await p.append('newer', completedTurn(0, 1))
    await p.create({ version: -1, id: 'older', createdAt: T0 })
    await p.append('older', completedTurn(0, 1))
    await p.create({ version: 0, id: 'unknown', createdAt: T0 })
    await p.append('unknown', [...completedTurn(0, 1), ...events(3, [['future/thing', { x: 1 }]])])
    await p.create({ version: 0, id: 'ignorable', createdAt: T0 })
    await p.append('ignorable', [...completedTurn(0, 1), ...events(3, [['future/thing', { x: 1 }, { ignorable: true }]])])
    await first.dispose()

    const second = await mountDshdb(dir)
    const q = second.persistence
    await assert.rejects(q.load('newer'), (error) => error.name === 'SessionFormatUnsupportedError' && /written by a newer harness.*upgrade the harness/.test(error.message))
    await assert.rejects(q.load('older'), /older than the supported v0/)
    await assert.rejects(q.inspect('unknown'), /contains event type "future\/thing" \(seq 3\) unknown to this harness and not marked ignorable/)
    const kept = await q.load('ignorable')
    assert.deepEqual(kept.events[3], { type: 'future/thing', seq: 3, time: T0 + 3, data: { x: 1 }, ignorable: true })
    await second.dispose()
  }))

test('a pre-aborted signal rejects with exactly its reason', () =>
  withStore(async (dir) => {
    const mounted = await mountDshdb(dir)
    const p = mounted.persistence
    await p.create({ version: 0, id: 's', createdAt: T0 })
    await p.append('s', completedTurn(0, 1))
    const reason = new Error('stop now')
    const signal = AbortSignal.abort(reason)
    for (const call of [
      () => p.list(signal),
      () => p.listSnapshots(signal),
      () => p.inspect('s', signal),
      () => p.readFrom('s', 0, signal),
      () => p.readRaw('s', signal),
      () => p.prepare('s', signal),
    ]) {
      await assert.rejects(call(), (error) => error === reason)
    }
    await mounted.dispose()
  }))

test("DSH's error texts", () =>
  withStore(async (dir) => {
    const mounted = await mountDshdb(dir)
    const p = mounted.persistence
    await assert.rejects(p.create({ version: 0, id: 'frac', createdAt: 1.5 }), { message: 'session metadata createdAt must be a non-negative safe integer' })
    await p.create({ version: 0, id: 'frac', createdAt: T0 })
    await p.create({ version: 0, id: 'dup', createdAt: T0 })
    await p.append('dup', completedTurn(0, 1))
    await assert.rejects(p.create({ version: 0, id: 'dup', createdAt: T0 }), /already exists in this backend|already has a persisted log on disk/)
    await assert.rejects(p.readFrom('missing', 0), /not found/)
    await assert.rejects(p.readFrom('dup', -1), /non-negative safe integer/)
    await assert.rejects(p.readFrom('dup', 1.5), /non-negative safe integer/)
    assert.deepEqual((await p.readFrom('dup', 3)).events, [])
    assert.deepEqual(
      (await p.readFrom('dup', 1)).events.map((event) => event.seq),
      [1, 2],
    )
    await assert.rejects(p.append('dup', events(4, [['x/y', {}]])), /seq/)
    await assert.rejects(p.append('dup', [...events(3, [['x/y', {}]]), ...events(5, [['x/y', {}]])]), /seq/)
    for (const bad of [1n, undefined, Infinity, () => 1, Symbol('s'), new Map(), (() => { const o = {}; o.self = o; return o })()]) {
      await assert.rejects(p.append('dup', events(3, [['x/y', { bad }]])), /losslessly JSON-serializable/)
    }
    await mounted.dispose()
  }))

test('revisions: stable while unchanged, changed by append and repair, never by maintenance, per store', () =>
  withStore(async (dir) => {
    const { dir: otherDir, cleanup } = await tempDir()
    try {
      const first = await mountDshdb(dir)
      const other = await mountDshdb(otherDir)
      for (const m of [first, other]) {
        await m.persistence.create({ version: 0, id: 'r', createdAt: T0 })
        await m.persistence.append('r', completedTurn(0, 1))
      }
      const [a1] = await first.persistence.listSnapshots()
      const [a2] = await first.persistence.listSnapshots()
      assert.equal(a1.revision, a2.revision)
      assert.equal(await first.persistence.readStoredRevision('r'), a1.revision)
      assert.equal((await first.persistence.loadStored('r')).revision, a1.revision)
      const [b1] = await other.persistence.listSnapshots()
      assert.notEqual(b1.revision, a1.revision)
      await first.persistence.maintain()
      assert.equal(await first.persistence.readStoredRevision('r'), a1.revision)
      await first.persistence.append('r', completedTurn(3, 2))
      const [a3] = await first.persistence.listSnapshots()
      assert.notEqual(a3.revision, a1.revision)
      await first.dispose()
      const reopened = await mountDshdb(dir)
      assert.equal(await reopened.persistence.readStoredRevision('r'), a3.revision)
      await reopened.dispose()
      await other.dispose()
    } finally {
      await cleanup()
    }
  }))

test('fresh unaliased events; lossless key order, numbers and lone surrogates; arbitrary ids', () =>
  withStore(async (dir) => {
    const first = await mountDshdb(dir)
    const p = first.persistence
    const data = { z: 1, a: { y: [1e21, 1e-7, 0.1, -5, 123456789012345], x: 'lone \ud800 and \udc00 pair \ud83d\ude00' }, '7': 'integer key', m: 'line\nbreak "quoted" \u2028 \u0001' }
    const ids = ['plain', '\ud800', 'x\udfffy', `${'dshdb-utf16:'}0041`, 'A', '', 'line\nbreak', 'tab\t\u007f', 'ünï/../cödé ☃']
    for (const id of ids) {
      await p.create({ version: 0, id, createdAt: T0, cwd: '/w', parentSession: '\udbff' })
      await p.append(id, [...events(0, [['x/data', data], ['user/message', userMessage('hi'), { surfaceOp: 'append', sourceEventSeqs: [0] }]])])
    }
    const lines = events(0, [['x/data', data]]).map((event) => JSON.stringify(event))
    await first.dispose()

    const second = await mountDshdb(dir)
    const q = second.persistence
    assert.deepEqual(
      (await q.list()).map((header) => header.id).sort(),
      [...ids].sort(),
    )
    assert.equal(new Set(ids.map(storeId)).size, ids.length)
    for (const id of ids) assert.equal(dshId(storeId(id)), id)
    for (const id of ids) {
      const stored = await q.loadStored(id)
      assert.equal(stored.meta.id, id)
      assert.equal(stored.meta.parentSession, '\udbff')
      assert.equal(JSON.stringify(stored.events[0]), lines[0])
      // Envelope member order as written (sourceEventSeqs after surfaceOp here).
      assert.deepEqual(Object.keys(stored.events[1]), ['type', 'seq', 'time', 'data', 'surfaceOp', 'sourceEventSeqs'])
      const again = await q.loadStored(id)
      assert.notEqual(again.events[0], stored.events[0])
      assert.notEqual(again.events[0].data, stored.events[0].data)
      assert.notEqual(again.meta, stored.meta)
      stored.events[0].data.z = 'mutated'
      assert.equal((await q.loadStored(id)).events[0].data.z, 1)
    }
    const raw = await q.readRaw('plain')
    assert.equal(raw.filename, 'session.jsonl')
    assert.equal(raw.content.split('\n')[1], lines[0])
    assert.match(raw.content, /1e\+21/)
    assert.match(raw.content, /\\ud800/)
    await second.dispose()
  }))

test('hot reload: the provider is disposed and remounted under a live session, which continues', () =>
  withStore(async (dir) => {
    const ctx = new Context()
    await ctx.plugin(SessionStore)
    let fiber = ctx.plugin(DshdbSessionPersistence, { path: dir, writeBatchMaxDelayMs: 5 })
    await fiber
    const session = ctx.sessions.create('hmr', { meta: { cwd: '/w' } })
    appendTurn(session, 1)
    await ctx.sessions.flush(session)
    appendTurn(session, 2, { close: false })
    await fiber.dispose()
    fiber = ctx.plugin(DshdbSessionPersistence, { path: dir, writeBatchMaxDelayMs: 5 })
    await fiber
    assert.ok(ctx.sessionPersistence instanceof DshdbSessionPersistence)
    session.append('turn/end', { turn: 2, reason: { kind: 'completed' } })
    appendTurn(session, 3)
    await ctx.sessions.flush(session)
    const stored = await ctx.sessionPersistence.readFrom('hmr', 0)
    assert.deepEqual(
      stored.events.map((event) => JSON.stringify(event)),
      session.events.map((event) => JSON.stringify(event)),
    )
    await fiber.dispose()
    // And a plain dispose-then-mount of the whole pair, many times over.
    for (let round = 0; round < 5; round++) {
      const mounted = await mountDshdb(dir)
      assert.equal((await mounted.persistence.readFrom('hmr', 0)).events.length, session.events.length)
      await mounted.dispose()
    }
  }))
