// Drives the real E2B JavaScript SDK against `moat serve --e2b`: each
// check prints "ok <name>" or "FAIL <name>: <why>"; the Go test
// (cmd/moat/e2b_test.go) requires every expected name to be ok. The SDK
// is found through NODE_PATH (scripts/setup installs it, pinned).
const { Sandbox, Volume, CommandExitError, NotFoundError, SandboxError, AuthenticationError, InvalidArgumentError, TimeoutError } = require('e2b')
const sdkVersion = require('e2b/package.json').version

const only = process.env.E2B_CHECKS ? process.env.E2B_CHECKS.split(',') : null
let failed = 0
async function check(name, fn) {
  if (only && !only.includes(name)) return
  try {
    await fn()
    console.log(`ok ${name}`)
  } catch (e) {
    failed++
    console.log(`FAIL ${name}: ${(e && e.stack) || e}`)
  }
}
function eq(got, want, what) {
  if (JSON.stringify(got) !== JSON.stringify(want)) throw new Error(`${what}: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`)
}
// status is an API error's HTTP status: statusCode from e2b 2.51, the
// "<code>: " its message starts with before.
function status(e) {
  if (e && e.statusCode) return e.statusCode
  const m = /^(\d{3}): /.exec((e && e.message) || '')
  return m ? Number(m[1]) : undefined
}
const before251 = (() => { const [ma, mi] = sdkVersion.split('.').map(Number); return ma < 2 || (ma === 2 && mi < 51) })()
async function rejects(p, cls, what) {
  try { await p } catch (e) {
    if (cls && !(e instanceof cls)) throw new Error(`${what}: threw ${e && e.constructor && e.constructor.name}: ${e.message}, want ${cls.name}`)
    return e
  }
  throw new Error(`${what}: did not throw`)
}

async function main() {
if (process.env.E2B_BENCH_LIFECYCLE) {
  // pause() and connect() (resume) of a sandbox holding E2B_BENCH_MB
  // MiB of files, N times, and fork({ count: 10 }) N times; in ms.
  const n = Number(process.env.E2B_BENCH_LIFECYCLE)
  const mb = Number(process.env.E2B_BENCH_MB || 0)
  const box = await Sandbox.create({ timeoutMs: 600_000 })
  // Files of 1 MiB: Moat's default limit per file is 64 MiB.
  if (mb > 0) await box.commands.run(`mkdir data && for i in $(seq ${mb}); do head -c 1048576 /dev/urandom > data/$i.bin; done`)
  await box.files.write('marker.txt', 'm')
  const pause = [], resume = [], fork = []
  for (let i = 0; i <= n; i++) {
    let t0 = performance.now()
    if (!(await box.pause())) throw new Error('pause answered false')
    const p = performance.now() - t0
    t0 = performance.now()
    const again = await Sandbox.connect(box.sandboxId, { timeoutMs: 600_000 })
    const r = performance.now() - t0
    if ((await again.files.read('marker.txt')) !== 'm') throw new Error('resume lost the files')
    if (i > 0) { pause.push(p); resume.push(r) } // the first round is untimed
  }
  for (let i = 0; i <= n; i++) {
    const t0 = performance.now()
    const forks = await box.fork({ count: 10, timeoutMs: 60_000 })
    const f = performance.now() - t0
    for (const x of forks) { if (x instanceof Error) throw x; await x.kill() }
    if (i > 0) fork.push(f)
  }
  await box.kill()
  console.log('bench-lifecycle ' + JSON.stringify({ pause, resume, fork }))
  process.exit(0)
}
if (process.env.E2B_BENCH) {
  // Sandbox.create() -> first commands.run('echo hi') result, in ms: N
  // times in a row, or (E2B_BENCH_BURST) N at once. Kills are not timed.
  const n = Number(process.env.E2B_BENCH)
  const one = async () => {
    const t0 = performance.now()
    const sbx = await Sandbox.create({ timeoutMs: 60_000 })
    const r = await sbx.commands.run('echo hi')
    const ms = performance.now() - t0
    if (r.stdout !== 'hi\n') throw new Error('bench: stdout ' + JSON.stringify(r.stdout))
    return { ms, sbx }
  }
  // One untimed round first: node's first calls (JIT, connection setup)
  // cost some hundred ms that no later call pays.
  await (await one()).sbx.kill()
  let times = []
  if (process.env.E2B_BENCH_BURST) {
    const all = await Promise.all(Array.from({ length: n }, one))
    for (const { ms, sbx } of all) { times.push(ms); await sbx.kill() }
  } else {
    for (let i = 0; i < n; i++) {
      const { ms, sbx } = await one()
      times.push(ms)
      await sbx.kill()
      // Let the warm pool refill, as a user's think time would.
      if (process.env.E2B_BENCH_PAUSE_MS) await new Promise(r => setTimeout(r, Number(process.env.E2B_BENCH_PAUSE_MS)))
    }
  }
  console.log('bench ' + JSON.stringify(times))
  process.exit(0)
}

console.log('e2b ' + sdkVersion)
const sbx = await Sandbox.create({ timeoutMs: 120_000, metadata: { suite: 'moat-e2b', run: process.env.E2B_RUN || 'x' }, envs: { FROM_CREATE: 'created' } })
console.log('sandbox ' + sbx.sandboxId)

await check('run', async () => {
  const r = await sbx.commands.run('echo out; echo err >&2')
  eq(r.stdout, 'out\n', 'stdout'); eq(r.stderr, 'err\n', 'stderr'); eq(r.exitCode, 0, 'exit code')
})
await check('run-fails', async () => {
  const e = await rejects(sbx.commands.run('echo bye; exit 3'), CommandExitError, 'exit 3')
  eq(e.exitCode, 3, 'exitCode'); eq(e.stdout, 'bye\n', 'stdout')
})
await check('envs', async () => {
  const r = await sbx.commands.run('echo "$FROM_CREATE $FROM_RUN"', { envs: { FROM_RUN: 'run' } })
  eq(r.stdout, 'created run\n', 'env')
})
await check('background', async () => {
  const h = await sbx.commands.run('sleep 0.3; echo done', { background: true })
  if (!(h.pid > 0)) throw new Error('pid ' + h.pid)
  const r = await h.wait()
  eq(r.stdout, 'done\n', 'stdout'); eq(r.exitCode, 0, 'exit')
})
await check('kill', async () => {
  const h = await sbx.commands.run('sleep 60', { background: true })
  const list = await sbx.commands.list()
  if (!list.some(p => p.pid === h.pid)) throw new Error('not listed: ' + JSON.stringify(list))
  eq(await h.kill(), true, 'kill')
  await rejects(h.wait(), CommandExitError, 'wait after kill')
  eq(await sbx.commands.kill(h.pid), false, 'second kill')
})
await check('stdin', async () => {
  const h = await sbx.commands.run('read line; echo "got $line"', { background: true, stdin: true })
  await sbx.commands.sendStdin(h.pid, 'hello\n')
  const r = await h.wait()
  eq(r.stdout, 'got hello\n', 'stdout')
})
await check('files', async () => {
  const info = await sbx.files.write('/home/user/dir/a.txt', 'alpha')
  eq(info.path, '/home/user/dir/a.txt', 'written path')
  eq(await sbx.files.read('/home/user/dir/a.txt'), 'alpha', 'read')
  eq(await sbx.files.read('dir/a.txt'), 'alpha', 'read relative')
  await sbx.files.write([{ path: 'dir/b.txt', data: 'beta' }, { path: 'dir/c.bin', data: new Uint8Array([0, 1, 2, 255]).buffer }])
  const bytes = await sbx.files.read('dir/c.bin', { format: 'bytes' })
  eq(Array.from(bytes), [0, 1, 2, 255], 'bytes')
  const names = (await sbx.files.list('/home/user/dir')).map(e => e.name).sort()
  eq(names, ['a.txt', 'b.txt', 'c.bin'], 'list')
  eq(await sbx.files.exists('dir/b.txt'), true, 'exists')
  await sbx.files.remove('dir/b.txt')
  eq(await sbx.files.exists('dir/b.txt'), false, 'exists after remove')
  eq(await sbx.files.makeDir('/home/user/new/deep'), true, 'makeDir')
  eq(await sbx.files.makeDir('/home/user/new/deep'), false, 'makeDir again')
  const st = await sbx.files.getInfo('/home/user/new/deep')
  eq(st.type, 'dir', 'type')
  await sbx.files.rename('dir/a.txt', 'dir/z.txt')
  eq(await sbx.files.read('dir/z.txt'), 'alpha', 'renamed')
  const r = await sbx.commands.run('cat dir/z.txt')
  eq(r.stdout, 'alpha', 'the command sees the file')
  await rejects(sbx.files.read('dir/missing'), NotFoundError, 'missing file')
})
await check('gzip-upload', async () => {
  await sbx.files.write('gz.txt', 'squeezed', { gzip: true })
  eq(await sbx.files.read('gz.txt'), 'squeezed', 'read')
})
await check('remove-missing', async () => {
  // E2B's envd removes with RemoveAll: a missing path is no error.
  await sbx.files.remove('never/was/here.txt')
  eq(await sbx.files.exists('never/was/here.txt'), false, 'exists')
})
await check('user-root', async () => {
  // Moat runs everything as the sandbox's unprivileged user and refuses
  // root by name rather than ignore it.
  const e = await rejects(sbx.commands.run('id -u', { user: 'root' }), InvalidArgumentError, 'run as root')
  if (!/root/.test(e.message)) throw new Error('message does not name root: ' + e.message)
  await rejects(sbx.files.read('dir/z.txt', { user: 'root' }), InvalidArgumentError, 'read as root')
  await rejects(sbx.files.write('root.txt', 'x', { user: 'root' }), InvalidArgumentError, 'write as root')
  eq(await sbx.files.exists('root.txt'), false, 'nothing written as root')
  eq(await sbx.files.read('dir/z.txt', { user: 'user' }), 'alpha', 'read as user')
})
await check('not-served', async () => {
  // A route Moat does not serve is a 501 with the reason, not the SDK's
  // misleading "sandbox not found".
  const e = await rejects(Volume.list(), null, 'volumes')
  if (e instanceof NotFoundError || !/not implemented by Moat/.test(e.message)) throw new Error('volumes: ' + e.constructor.name + ': ' + e.message)
})
// waitFor polls got() until it matches re (a terminal's output arrives
// in pieces), failing with what it showed after ms.
async function waitFor(got, re, what, ms = 10_000) {
  const end = Date.now() + ms
  while (Date.now() < end) {
    if (re.test(got())) return
    await new Promise(r => setTimeout(r, 20))
  }
  throw new Error(`${what}: the terminal never showed ${re}; it showed ${JSON.stringify(got())}`)
}
await check('pty', async () => {
  // As E2B's own PTY tests: a login bash on a terminal, typed into,
  // resized, exited.
  let out = ''
  const dec = new TextDecoder()
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: d => { out += dec.decode(d) } })
  if (!(term.pid > 0)) throw new Error('pid ' + term.pid)
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('export ABC=123 && echo "v=$ABC"; stty size; tty\n'))
  await waitFor(() => out, /v=123\r\n24 80\r\n\/dev\/pts\/\d+/, 'input')
  await sbx.pty.resize(term.pid, { cols: 132, rows: 40 })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size\n'))
  await waitFor(() => out, /40 132\r\n/, 'resize')
  // TIOCSTI cannot type into the terminal.
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode(`python3 -c "import fcntl,termios; fcntl.ioctl(0, termios.TIOCSTI, b'x')" 2>&1 | tail -1\n`))
  await waitFor(() => out, /PermissionError: \[Errno 1\] Operation not permitted/, 'TIOCSTI')
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('exit 0\n'))
  const r = await term.wait()
  eq(r.exitCode, 0, 'exit code')
})
await check('pty-connect-kill', async () => {
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: () => {}, timeoutMs: 0 })
  let seen = ''
  const again = await sbx.pty.connect(term.pid, { onData: d => { seen += new TextDecoder().decode(d) } })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('echo "connected $((6*7))"\n'))
  await waitFor(() => seen, /connected 42/, 'connect')
  eq(await sbx.pty.kill(term.pid), true, 'kill')
  await rejects(term.wait(), CommandExitError, 'wait after kill')
  await rejects(again.wait(), CommandExitError, 'the connected handle after kill')
  eq(await sbx.pty.kill(term.pid), false, 'second kill')
})
await check('pty-bad-size', async () => {
  const e = await rejects(sbx.pty.create({ cols: 0, rows: 24, onData: () => {} }), null, 'pty.create with 0 cols')
  if (!/pty\.size is 0 cols by 24 rows/.test(e.message)) throw new Error('message: ' + e.message)
  await rejects(sbx.pty.resize(999999, { cols: 80, rows: 24 }), NotFoundError, 'resize of an unknown pid')
})
await check('watchDir', async () => {
  await sbx.files.makeDir('watched')
  const seen = []
  const w = await sbx.files.watchDir('watched', ev => seen.push(ev.type + ':' + ev.name))
  await sbx.files.write('watched/x.txt', 'x')
  for (let i = 0; i < 400 && !seen.includes('create:x.txt'); i++) await new Promise(r => setTimeout(r, 50))
  await w.stop()
  if (!seen.includes('create:x.txt')) throw new Error('events ' + JSON.stringify(seen))
})
await check('path-traversal', async () => {
  await rejects(sbx.files.read('/etc/passwd'), SandboxError, '/etc/passwd')
  await rejects(sbx.files.read('/home/user/../../etc/passwd'), SandboxError, 'dot-dot')
  await rejects(sbx.files.write('../../escape.txt', 'x'), SandboxError, 'write dot-dot')
})
await check('oversized-upload', async () => {
  const big = new Uint8Array(Number(process.env.E2B_MAX_BODY || 1048576) + 1024)
  await rejects(sbx.files.write('big.bin', big.buffer), SandboxError, 'oversized')
  eq(await sbx.files.exists('big.bin'), false, 'nothing left of it')
})
await check('list', async () => {
  const page = await Sandbox.list({ query: { metadata: { suite: 'moat-e2b' } } }).nextItems()
  if (!page.some(s => s.sandboxId === sbx.sandboxId)) throw new Error('not listed: ' + JSON.stringify(page))
  eq(page.find(s => s.sandboxId === sbx.sandboxId).metadata.suite, 'moat-e2b', 'metadata')
  const none = await Sandbox.list({ query: { metadata: { suite: 'other' } } }).nextItems()
  eq(none.length, 0, 'filtered out')
  const paused = await Sandbox.list({ query: { state: ['paused'] } }).nextItems()
  eq(paused.length, 0, 'paused')
})
await check('list-order', async () => {
  // Newest first, as E2B lists; startedAfter and template honoured.
  const metadata = { suite: 'moat-e2b', run: process.env.E2B_RUN || 'x' }
  const before = new Date()
  const newer = await Sandbox.create({ timeoutMs: 60_000, metadata })
  try {
    const page = await Sandbox.list({ query: { metadata } }).nextItems()
    eq(page.map(s => s.sandboxId), [newer.sandboxId, sbx.sandboxId], 'newest first')
    const asc = await Sandbox.list({ query: { metadata }, order: 'asc' }).nextItems()
    eq(asc.map(s => s.sandboxId), [sbx.sandboxId, newer.sandboxId], 'asc')
    const after = await Sandbox.list({ query: { metadata, startedAfter: before } }).nextItems()
    eq(after.map(s => s.sandboxId), [newer.sandboxId], 'startedAfter')
    eq((await Sandbox.list({ query: { metadata, template: 'no-such-template' } }).nextItems()).length, 0, 'template')
    eq((await Sandbox.list({ query: { metadata, template: 'base' } }).nextItems()).length, 2, 'template base')
    const pager = Sandbox.list({ query: { metadata }, limit: 1 })
    const seen = []
    while (pager.hasNext) seen.push(...(await pager.nextItems()).map(s => s.sandboxId))
    eq(seen, [newer.sandboxId, sbx.sandboxId], 'pages of one')
  } finally {
    await newer.kill()
  }
})
await check('setTimeout', async () => {
  await sbx.setTimeout(300_000)
  const info = await sbx.getInfo()
  const left = info.endAt.getTime() - Date.now()
  if (left < 200_000 || left > 310_000) throw new Error('endAt in ' + left + ' ms')
})
await check('connect', async () => {
  // connect's timeout (here 60 s) only extends: the 300 s setTimeout gave
  // stays.
  const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 })
  const left = (await again.getInfo()).endAt.getTime() - Date.now()
  if (left < 200_000) throw new Error('connect shortened the sandbox: endAt in ' + left + ' ms')
  const r = await again.commands.run('cat ~/dir/z.txt')
  eq(r.stdout, 'alpha', 'same sandbox')
})
await check('wrong-key', async () => {
  await rejects(Sandbox.create({ apiKey: 'moat_nope_nope' }), AuthenticationError, 'create')
  await rejects(Sandbox.connect(sbx.sandboxId, { apiKey: 'moat_nope_nope' }), AuthenticationError, 'connect')
})
await check('other-key', async () => {
  const other = process.env.E2B_OTHER_KEY
  await rejects(Sandbox.connect(sbx.sandboxId, { apiKey: other }), SandboxError, 'connect')
  await rejects(Sandbox.kill(sbx.sandboxId, { apiKey: other }).then(ok => { if (!ok) throw new SandboxError('not found') }), SandboxError, 'kill')
  eq((await Sandbox.list({ apiKey: other }).nextItems()).length, 0, 'list')
})
await check('never-existed', async () => {
  await rejects(Sandbox.connect('sbx-never-existed'), SandboxError, 'connect')
  eq(await Sandbox.kill('sbx-never-existed'), false, 'kill')
  await rejects(Sandbox.getInfo('sbx-never-existed'), SandboxError, 'getInfo')
})
await check('refused-fields', async () => {
  await rejects(Sandbox.create('no-such-template'), SandboxError, 'template')
  // A pause keeps no memory: asking for it on timeout is refused.
  const e = await rejects(Sandbox.create({ lifecycle: { onTimeout: { action: 'pause', keepMemory: true } } }), SandboxError, 'autoPause with memory')
  if (status(e) !== 400 || !/filesystem-only/.test(e.message)) throw new Error('autoPause with memory: ' + status(e) + ' ' + e.message)
})
// The lifecycle checks (issue 22 §2) run in sandboxes of their own, so
// that the main sandbox's commands stay those the Go test counts.
const other = process.env.E2B_OTHER_KEY
const sleep = ms => new Promise(r => setTimeout(r, ms))
async function waitState(id, state) {
  for (let i = 0; i < 300; i++) {
    const info = await Sandbox.getInfo(id).catch(() => null)
    if (info && info.state === state) return info
    await sleep(100)
  }
  throw new Error(`sandbox ${id} never became ${state}`)
}
await check('pause-resume', async () => {
  const box = await Sandbox.create({ timeoutMs: 120_000, metadata: { suite: 'moat-e2b-pause' } })
  try {
    await box.files.write('keep.txt', 'kept', { metadata: { owner: 'agent' } })
    await box.commands.run('sleep 600', { background: true })
    // Moat pauses filesystem-only: keepMemory true is refused, not
    // silently downgraded (before 2.51 the SDK sends it on every pause,
    // chosen or not: that pause is filesystem-only, with a notice).
    if (!before251) {
      const mem = await rejects(box.pause({ keepMemory: true }), SandboxError, 'pause keepMemory')
      if (status(mem) !== 400 || !/filesystem-only/.test(mem.message)) throw new Error('keepMemory: ' + status(mem) + ' ' + mem.message)
    }
    eq(await box.betaPause(), true, 'betaPause')
    eq(await box.pause(), false, 'pause of a paused sandbox')
    eq((await Sandbox.getInfo(box.sandboxId)).state, 'paused', 'state')
    eq(await box.isRunning(), false, 'isRunning while paused')
    await rejects(Sandbox.pause('sbx-never-existed'), NotFoundError, 'pause never existed')
    await rejects(Sandbox.pause(box.sandboxId, { apiKey: other }), NotFoundError, 'pause other key')
    await rejects(Sandbox.connect(box.sandboxId, { apiKey: other }), NotFoundError, 'resume other key')
    eq((await Sandbox.getInfo(box.sandboxId)).state, 'paused', 'still paused after the other key tried')
    const again = await Sandbox.connect(box.sandboxId, { timeoutMs: 60_000 })
    eq(again.sandboxId, box.sandboxId, 'same id')
    eq((await Sandbox.getInfo(box.sandboxId)).state, 'running', 'resumed')
    eq(await again.files.read('keep.txt'), 'kept', 'files kept')
    eq((await again.files.getInfo('keep.txt')).metadata, { owner: 'agent' }, 'file metadata kept')
    eq((await again.commands.list()).length, 0, 'processes gone')
    eq((await again.commands.run('cat keep.txt')).stdout, 'kept', 'runs after resume')
  } finally {
    await Sandbox.kill(box.sandboxId)
  }
})
await check('snapshots', async () => {
  const box = await Sandbox.create({ timeoutMs: 120_000 })
  const name = 'moat-snap-' + (process.env.E2B_RUN || 'x').replace(/[^A-Za-z0-9]/g, '-')
  try {
    await box.files.write('snap.txt', 'from the snapshot')
    const named = await box.createSnapshot({ name })
    if (!named.snapshotId || !named.names.includes(name)) throw new Error('named snapshot ' + JSON.stringify(named))
    const anon = await Sandbox.createSnapshot(box.sandboxId)
    eq(anon.names, [], 'unnamed snapshot names')
    const all = (await Sandbox.listSnapshots().nextItems()).map(s => s.snapshotId)
    if (!all.includes(named.snapshotId) || !all.includes(anon.snapshotId)) throw new Error('list all ' + JSON.stringify(all))
    eq((await box.listSnapshots().nextItems()).map(s => s.snapshotId).sort(), [named.snapshotId, anon.snapshotId].sort(), 'list by sandbox')
    eq((await Sandbox.listSnapshots({ name }).nextItems()).map(s => s.snapshotId), [named.snapshotId], 'list by name')
    eq((await Sandbox.listSnapshots({ sandboxId: 'sbx-never-existed' }).nextItems()).length, 0, 'list by another sandbox')
    const pager = Sandbox.listSnapshots({ limit: 1 })
    const seen = []
    while (pager.hasNext) seen.push(...(await pager.nextItems()).map(s => s.snapshotId))
    eq(seen.sort(), all.slice().sort(), 'pages of one')
    await box.files.write('snap.txt', 'changed after')
    // Many sandboxes from one snapshot, each with its files.
    const boxes = []
    try {
      for (let i = 0; i < 3; i++) boxes.push(await Sandbox.create(named.snapshotId, { timeoutMs: 60_000 }))
      for (const b of boxes) eq(await b.files.read('snap.txt'), 'from the snapshot', 'file in ' + b.sandboxId)
      eq(new Set(boxes.map(b => b.sandboxId)).size, 3, 'three sandboxes')
    } finally {
      for (const b of boxes) await b.kill()
    }
    // Another key sees none of it.
    eq((await Sandbox.listSnapshots({ apiKey: other }).nextItems()).length, 0, 'other key lists')
    eq(await Sandbox.deleteSnapshot(named.snapshotId, { apiKey: other }), false, 'other key deletes')
    await rejects(Sandbox.create(named.snapshotId, { apiKey: other }), SandboxError, 'other key creates from it')
    await rejects(Sandbox.createSnapshot(box.sandboxId, { apiKey: other }), NotFoundError, 'other key snapshots')
    await rejects(Sandbox.createSnapshot('sbx-never-existed'), NotFoundError, 'snapshot never existed')
    const dup = await rejects(box.createSnapshot({ name }), SandboxError, 'duplicate name')
    if (status(dup) !== 409) throw new Error('duplicate name: ' + status(dup) + ' ' + dup.message)
    const bad = await rejects(box.createSnapshot({ name: '../escape' }), SandboxError, 'bad name')
    if (status(bad) !== 400) throw new Error('bad name: ' + status(bad) + ' ' + bad.message)
    eq(await Sandbox.deleteSnapshot(anon.snapshotId), true, 'delete')
    eq(await Sandbox.deleteSnapshot(anon.snapshotId), false, 'delete again')
    eq(await Sandbox.deleteSnapshot(named.snapshotId), true, 'delete named')
    await rejects(Sandbox.create(named.snapshotId), SandboxError, 'create from a deleted snapshot')
    eq((await box.listSnapshots().nextItems()).length, 0, 'none left')
  } finally {
    await box.kill()
  }
})
await check('fork', async () => {
  const box = await Sandbox.create({ timeoutMs: 120_000 })
  try {
    await box.files.write('fork.txt', 'forked')
    const forks = await box.fork({ count: 2, timeoutMs: 60_000 })
    eq(forks.length, 2, 'forks')
    try {
      for (const f of forks) {
        if (f instanceof Error) throw f
        if (f.sandboxId === box.sandboxId) throw new Error('a fork has its parent id')
        eq(await f.files.read('fork.txt'), 'forked', 'fork file')
        eq((await f.commands.run('cat fork.txt')).stdout, 'forked', 'fork runs')
      }
      // A fork is its own sandbox: its writes stay its own.
      await forks[0].files.write('fork.txt', 'changed')
      eq(await forks[1].files.read('fork.txt'), 'forked', 'forks apart')
      eq(await box.files.read('fork.txt'), 'forked', 'parent apart')
    } finally {
      for (const f of forks) if (!(f instanceof Error)) await f.kill()
    }
    // A count below 1: e2b before 2.51 raises InvalidArgumentError
    // itself; 2.51 sends it, and Moat's 400 is a SandboxError (status
    // 400) naming count. Above Moat's 64: a 400 from every release.
    for (const count of [0, -1, 1000]) {
      const local = before251 && count < 1
      const e = await rejects(box.fork({ count }), local ? InvalidArgumentError : SandboxError, 'count ' + count)
      if (!local && (status(e) !== 400 || !/count/.test(e.message))) throw new Error(`count ${count}: ${status(e)} ${e.message}`)
    }
    await rejects(Sandbox.fork('sbx-never-existed'), NotFoundError, 'fork never existed')
    await rejects(Sandbox.fork(box.sandboxId, { apiKey: other }), NotFoundError, 'fork other key')
  } finally {
    await box.kill()
  }
})
await check('kill-during-command', async () => {
  // E2B's envd drops the stream and the SDK raises an actionable error;
  // Moat ends it with one naming what happened, never an empty
  // CommandExitError -1.
  const box = await Sandbox.create({ timeoutMs: 120_000 })
  const running = box.commands.run('sleep 600; echo never').then(() => null, e => e)
  for (let i = 0; i < 300 && (await box.commands.list()).length === 0; i++) await sleep(50)
  await box.kill()
  const e = await running
  if (!e) throw new Error('the command succeeded')
  if (e instanceof CommandExitError || !(e instanceof NotFoundError) || !/killed/.test(e.message) || !e.message.includes(box.sandboxId)) throw new Error('got ' + e.constructor.name + ': ' + e.message)
})
await check('command-timeout', async () => {
  // As E2B's envd: a command is bounded by its own timeoutMs (the
  // request's Connect-Timeout-Ms) and otherwise lives as long as its
  // sandbox, not by Moat's 30 s default.
  const box = await Sandbox.create({ timeoutMs: 60_000 })
  try {
    const cpu = Number((await box.commands.run('ulimit -t')).stdout.trim())
    if (!(cpu > 3600)) throw new Error(`CPU-time limit ${cpu} s: want one as long as the sandbox may live`)
    const e = await box.commands.run('sleep 600', { timeoutMs: 1500 }).then(() => null, e => e)
    if (!(e instanceof TimeoutError)) throw new Error('got ' + (e && e.constructor.name) + ': ' + (e && e.message))
    for (let i = 0; i < 200 && (await box.commands.list()).length > 0; i++) await sleep(50)
    eq((await box.commands.list()).length, 0, 'the command ended with its timeoutMs')
  } finally {
    await box.kill()
  }
})
await check('timeout-during-command', async () => {
  const box = await Sandbox.create({ timeoutMs: 3_000 })
  const e = await box.commands.run('sleep 600').then(() => null, e => e)
  if (!(e instanceof TimeoutError) || !/reached its timeout/.test(e.message)) throw new Error('got ' + (e && e.constructor.name) + ': ' + (e && e.message))
})
await check('auto-pause', async () => {
  // lifecycle.onTimeout 'pause': paused (filesystem-only) when the
  // timeout passes, then resumed by connect with its files.
  const box = await Sandbox.create({ timeoutMs: 3_000, lifecycle: { onTimeout: 'pause' } })
  try {
    const info = await box.getInfo()
    if (!info.lifecycle || info.lifecycle.onTimeout !== 'pause' || info.lifecycle.autoResume !== false) throw new Error('lifecycle ' + JSON.stringify(info.lifecycle))
    await box.files.write('auto.txt', 'auto')
    await waitState(box.sandboxId, 'paused')
    await rejects(Sandbox.connect(box.sandboxId, { apiKey: other }), NotFoundError, 'other key resumes')
    const again = await Sandbox.connect(box.sandboxId, { timeoutMs: 60_000 })
    eq((await Sandbox.getInfo(box.sandboxId)).state, 'running', 'resumed')
    eq(await again.files.read('auto.txt'), 'auto', 'files kept')
  } finally {
    await Sandbox.kill(box.sandboxId)
  }
})
await check('internet', async () => {
  // allowInternetAccess true (what e2b before 2.51 sends by default) gets
  // what the operator calls internet: by default nothing beyond loopback.
  const box = await Sandbox.create({ allowInternetAccess: true, timeoutMs: 60_000 })
  try {
    const r = await box.commands.run('echo in')
    eq(r.stdout, 'in\n', 'runs')
  } finally {
    await box.kill()
  }
})
await check('signed-urls', async () => {
  // downloadUrl/uploadUrl: plain HTTP, no token, in path mode
  // (E2B_SANDBOX_URL): the signature names the sandbox.
  await sbx.files.write('signed.txt', 'signed content')
  const down = await sbx.downloadUrl('signed.txt')
  const got = await fetch(down)
  eq(got.status, 200, 'download'); eq(await got.text(), 'signed content', 'downloaded')
  const up = await sbx.uploadUrl('via-url.txt', { useSignatureExpiration: 60 })
  const form = new FormData()
  form.append('file', new Blob(['uploaded by url']), 'via-url.txt')
  const put = await fetch(up, { method: 'POST', body: form })
  eq(put.status, 200, 'upload')
  eq(await sbx.files.read('via-url.txt'), 'uploaded by url', 'uploaded')
  const other = new URL(down); other.searchParams.set('path', 'via-url.txt')
  eq((await fetch(other)).status, 401, 'signature for another path')
  const unsigned = new URL(down); unsigned.searchParams.delete('signature')
  eq((await fetch(unsigned)).status, 401, 'no signature')
  eq((await fetch(await sbx.downloadUrl('signed.txt', { useSignatureExpiration: -5 }))).status, 401, 'expired')
  eq((await fetch(down, { method: 'POST', body: form })).status, 401, 'read signature used to write')
})
await check('ports', async () => {
  // getHost(port) with the traffic token reaches a server in the sandbox
  // (host routing, --e2b-domain); without the token 401, a closed port 502.
  const http = require('node:http')
  const base = new URL(process.env.E2B_SANDBOX_URL)
  const get = (port, headers) => new Promise((resolve, reject) => {
    const req = http.request({ host: base.hostname, port: base.port, path: '/port.txt', headers: { Host: sbx.getHost(port), ...headers } }, res => {
      let body = ''
      res.on('data', d => { body += d })
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
    req.end()
  })
  await sbx.files.write('port.txt', 'served from inside')
  const server = await sbx.commands.run('python3 -m http.server 8000', { background: true })
  try {
    const token = { 'e2b-traffic-access-token': sbx.trafficAccessToken }
    if (!sbx.trafficAccessToken) throw new Error('no trafficAccessToken')
    let r
    for (let i = 0; i < 200; i++) {
      r = await get(8000, token)
      if (r.status !== 502) break
      await new Promise(res => setTimeout(res, 100))
    }
    eq([r.status, r.body], [200, 'served from inside'], 'with the token')
    eq((await get(8000, {})).status, 401, 'without the token')
    eq((await get(8000, { 'e2b-traffic-access-token': 'x' + sbx.trafficAccessToken })).status, 401, 'wrong token')
    const closed = await get(8001, token)
    if (closed.status !== 502 || !/not open/.test(closed.body)) throw new Error('closed port: ' + closed.status + ' ' + closed.body)
  } finally {
    await server.kill()
  }
})
await check('kill-sandbox', async () => {
  await sbx.kill()
  eq(await sbx.isRunning(), false, 'isRunning')
  await rejects(sbx.commands.run('echo hi'), SandboxError, 'run after kill')
})
await check('times-out', async () => {
  // No command in it: under load one could outlast the 2 s. Creation
  // succeeded; the Go test checks its audit record.
  const short = await Sandbox.create({ timeoutMs: 2_000 })
  console.log('timeout-sandbox ' + short.sandboxId)
  for (let i = 0; i < 300 && await short.isRunning(); i++) await new Promise(r => setTimeout(r, 100))
  eq(await short.isRunning(), false, 'still running after its timeout')
})
console.log(failed ? `FAILED ${failed}` : 'PASS')
process.exit(failed ? 1 : 0)
}
main().catch(e => { console.log('FAIL main: ' + ((e && e.stack) || e)); process.exit(1) })
