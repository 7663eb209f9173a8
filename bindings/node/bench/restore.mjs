// Cold restore through DSH's API (prepare + deriveMessages), each run in a fresh Node process
// so that its peak RSS is the restore's own: the dshdb provider (the log imported and
// maintained first, as after `dshdb import` + `dshdb maintain`) against DSH's JSONL provider
// with zstd and without. For dshdb the time is split into the engine's read (on its own
// thread, overlapping JavaScript), the JavaScript thread's wait on the engine and N-API, and
// JavaScript (JSON.parse of the events, then DSH's own prepare and derive).
//
// Usage: node bench/restore.mjs PROVIDER SESSION_FILE SESSION_ID [--runs N] [--json OUT]
//   PROVIDER: dshdb | jsonl-zstd | jsonl-none. SESSION_FILE: a DSH session.jsonl.zstd (the
//   plain session.jsonl beside it is used for jsonl-none), e.g. from
//   `cargo run --release -p dshdb-benches -- dsh-layout-file DIR`.
// The last stdout line is `median_millis peak_rss_mib cpu_millis`, the format of the Rust
// runner's DSHDB_BENCH_DSH_RESUME hook, so this script can be that hook.
import { spawnSync } from 'node:child_process'
import { copyFileSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { mountDshdb, mountJsonl, tempDir } from '../test/helpers.mjs'

const SCRIPT = fileURLToPath(import.meta.url)
const BYTES_PER_MIB = 1024 * 1024
const KIB_PER_MIB = 1024

/**
 * This process's peak RSS in MiB: `VmHWM` of /proc/self/status, the high-water mark of this
 * process image. Not getrusage's maxRSS: Linux carries the forking parent's peak across
 * exec into it, so a child would report the stager's memory.
 */
function peakRssMib() {
  const status = readFileSync('/proc/self/status', 'utf8')
  const kib = /^VmHWM:\s+(\d+) kB$/m.exec(status)
  return kib === null ? process.resourceUsage().maxRSS / KIB_PER_MIB : Number(kib[1]) / KIB_PER_MIB
}

function mountFor(provider, dir) {
  if (provider === 'dshdb') return mountDshdb(dir)
  if (provider === 'jsonl-zstd') return mountJsonl(dir, { compression: 'zstd' })
  if (provider === 'jsonl-none') return mountJsonl(dir, { compression: 'none' })
  throw new Error(`unknown provider ${JSON.stringify(provider)}: dshdb, jsonl-zstd or jsonl-none`)
}

/** The DSH header of a session file (its first line), without the line's `type`. */
function headerOf(plainPath) {
  const text = readFileSync(plainPath, 'utf8')
  const { type: _type, ...header } = JSON.parse(text.slice(0, text.indexOf('\n')))
  return header
}

function findFile(root, name) {
  for (const entry of readdirSync(root, { withFileTypes: true, recursive: true })) {
    if (entry.isFile() && entry.name === name) return join(entry.parentPath, entry.name)
  }
  throw new Error(`no ${name} under ${root}`)
}

/** Puts the session where the provider reads it; nothing of this is timed. */
async function stage(provider, zstdPath, id, dir) {
  const plainPath = join(dirname(zstdPath), 'session.jsonl')
  const mounted = await mountFor(provider, dir)
  try {
    if (provider === 'dshdb') {
      const imported = await mounted.persistence.importLog(readFileSync(zstdPath))
      if (imported !== id) throw new Error(`imported ${imported}, expected ${id}`)
      await mounted.persistence.maintain()
      return
    }
    // DSH's JSONL provider names the file from the header (project key, encoded id): let it
    // create the session, then put the real log in its place.
    const header = headerOf(plainPath)
    await mounted.persistence.create(header)
    await mounted.persistence.append(id, [{ type: 'turn/start', seq: 0, time: header.createdAt, data: { turn: 1 } }])
  } finally {
    await mounted.dispose()
  }
  const name = provider === 'jsonl-zstd' ? 'session.jsonl.zstd' : 'session.jsonl'
  copyFileSync(provider === 'jsonl-zstd' ? zstdPath : plainPath, findFile(dir, name))
}

/** The measured side, in its own process: open, prepare, derive. */
async function child(provider, dir, id) {
  const cpuBefore = process.cpuUsage()
  const started = performance.now()
  const mounted = await mountFor(provider, dir)
  const preparation = await mounted.persistence.prepare(id)
  const prepared = performance.now()
  const messages = preparation.session.deriveMessages()
  const derived = performance.now()
  const cpu = process.cpuUsage(cpuBefore)
  const report = {
    totalMs: derived - started,
    prepareMs: prepared - started,
    deriveMs: derived - prepared,
    cpuMs: (cpu.user + cpu.system) / 1000,
    peakRssMib: peakRssMib(),
    heapUsedMib: process.memoryUsage().heapUsed / BYTES_PER_MIB,
    events: preparation.session.events.length,
    messages: messages.length,
    load: mounted.persistence.lastLoadTimings,
  }
  preparation[Symbol.dispose]()
  await mounted.dispose()
  process.stdout.write(`${JSON.stringify(report)}\n`)
}

function describe(provider, report) {
  let line = `${provider}: ${report.totalMs.toFixed(0)} ms (prepare ${report.prepareMs.toFixed(0)}, derive ${report.deriveMs.toFixed(0)}), cpu ${report.cpuMs.toFixed(0)} ms, peak RSS ${report.peakRssMib.toFixed(0)} MiB, ${report.events} events, ${report.messages} messages`
  if (report.load !== undefined) {
    // The engine reads while JavaScript parses: the JavaScript thread's own time is the
    // total less the time it waited on the engine.
    const { engineMs, waitMs, parseMs } = report.load
    const javascript = report.totalMs - waitMs
    line += `; split: engine ${engineMs.toFixed(0)} ms (overlapped), JavaScript waited on the engine and N-API ${waitMs.toFixed(0)} ms, JavaScript ${javascript.toFixed(0)} ms (of which JSON.parse and row expansion ${parseMs.toFixed(0)})`
  }
  return line
}

async function main(args) {
  if (args[0] === '--child') return child(args[1], args[2], args[3])
  const [provider, zstdPath, id] = args
  if (id === undefined) throw new Error('usage: node bench/restore.mjs PROVIDER SESSION_FILE SESSION_ID [--runs N] [--json OUT]')
  const runsAt = args.indexOf('--runs')
  const runs = runsAt > 0 ? Number(args[runsAt + 1]) : 1
  const jsonAt = args.indexOf('--json')
  const { dir, cleanup } = await tempDir('dshdb-restore-')
  try {
    await stage(provider, zstdPath, id, dir)
    const reports = []
    for (let run = 0; run < runs; run++) {
      const result = spawnSync(process.execPath, [SCRIPT, '--child', provider, dir, id], { encoding: 'utf8', maxBuffer: 16 * BYTES_PER_MIB })
      if (result.status !== 0) throw new Error(`restore child failed (${result.status}): ${result.stderr}`)
      const report = JSON.parse(result.stdout.trim().split('\n').at(-1))
      reports.push(report)
      process.stderr.write(`${describe(provider, report)}\n`)
    }
    reports.sort((a, b) => a.totalMs - b.totalMs)
    const median = reports[Math.floor(reports.length / 2)]
    if (jsonAt > 0) {
      mkdirSync(dirname(args[jsonAt + 1]), { recursive: true })
      writeFileSync(args[jsonAt + 1], JSON.stringify({ node: process.version, provider, runs: reports }, null, 2))
    }
    process.stdout.write(`${median.totalMs.toFixed(0)} ${median.peakRssMib.toFixed(0)} ${median.cpuMs.toFixed(0)}\n`)
  } finally {
    await cleanup()
  }
}

await main(process.argv.slice(2))
