// Shared fixtures for the provider tests: mounting DSH's real SessionStore with a provider
// (dshdb or DSH's own JSONL one), temporary stores, and a small DSH conversation writer.
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Context } from '@deepseek-ai/cordis'
import SessionStore from '@deepseek-ai/dsh-session'
import JsonlSessionPersistence from '@deepseek-ai/dsh-session-persistence-jsonl'
import DshdbSessionPersistence from '../lib/index.js'

export { DshdbSessionPersistence, JsonlSessionPersistence, SessionStore }

/** A fresh temporary directory, removed by the returned cleanup. */
export async function tempDir(label = 'dshdb-node-') {
  const dir = await mkdtemp(join(tmpdir(), label))
  return { dir, cleanup: () => rm(dir, { recursive: true, force: true }) }
}

/**
 * Mounts DSH's SessionStore and a persistence provider in a new root context. Resolves
 * once `ctx.sessionPersistence` is the provider. `dispose()` unloads both (DSH's dispose
 * drain, then the provider's close).
 */
export async function mount(Provider, config) {
  const ctx = new Context()
  await ctx.plugin(SessionStore)
  const fiber = ctx.plugin(Provider, config)
  await fiber
  if (!(ctx.sessionPersistence instanceof Provider)) {
    throw new Error(`provider ${Provider.name} was not mounted (config rejected?)`)
  }
  return {
    ctx,
    persistence: ctx.sessionPersistence,
    sessions: ctx.sessions,
    async dispose() {
      await fiber.dispose()
    },
  }
}

export function mountDshdb(path, extra = {}) {
  return mount(DshdbSessionPersistence, { path, writeBatchMaxDelayMs: 5, ...extra })
}

export function mountJsonl(root, extra = {}) {
  return mount(JsonlSessionPersistence, { root, writeBatchMaxDelayMs: 5, ...extra })
}

/** The time of the tests' first events (ms). */
export const T0 = 1_790_000_000_000

/** Plain DSH events for the provider's public `append`, seqs from `first`. */
export function events(first, specs) {
  return specs.map(([type, data, envelope = {}], index) => ({ type, seq: first + index, time: T0 + first + index, data, ...envelope }))
}

/** A completed turn (`turn/start`, a user message, `turn/end`) from seq `first`. */
export function completedTurn(first, turn) {
  return events(first, [
    ['turn/start', { turn }],
    ['user/message', userMessage(`q${turn}`), { surfaceOp: 'append' }],
    ['turn/end', { turn, reason: { kind: 'completed' } }],
  ])
}

let messageCounter = 0

/** A user message payload as DSH's loop records it. */
export function userMessage(text) {
  messageCounter += 1
  return { id: `m-${messageCounter}`, role: 'user', content: [{ type: 'text', text }], source: { kind: 'user' } }
}

/** An assistant message payload, optionally with tool calls. */
export function assistantMessage(text, toolCalls = []) {
  messageCounter += 1
  return {
    id: `a-${messageCounter}`,
    role: 'assistant',
    content: [{ type: 'text', text }, ...toolCalls.map((call) => ({ type: 'tool-call', id: call, name: 'bash', arguments: '{}' }))],
    source: { kind: 'model', provider: 'test', model: 'test' },
  }
}

/** Appends one complete turn (user message, step with streamed chunks, reply) to a live session. */
export function appendTurn(session, turn, { chunks = 3, close = true } = {}) {
  session.append('turn/start', { turn })
  const user = session.append('user/message', userMessage(`question ${turn}`), { surfaceOp: 'append' })
  session.append('step/start', { turn, step: 1 })
  for (let index = 0; index < chunks; index++) {
    session.append('assistant/chunk', { turn, step: 1, chunk: { type: 'text-delta', index: 0, text: `tok${index} ` } })
  }
  session.append('assistant/message', { turn, step: 1, message: assistantMessage(`answer ${turn}`) }, {
    surfaceOp: 'append',
    sourceEventSeqs: [user.seq],
  })
  session.append('step/end', { turn, step: 1 })
  if (close) session.append('turn/end', { turn, reason: { kind: 'completed' } })
}
