// Drives the real E2B JavaScript SDK against `moat serve --e2b` for the
// surface of issue 22 §4 that envd 0.6.4 implies and the control plane's
// getMetrics and updateNetwork: each check prints "ok <name>" or
// "FAIL <name>: <why>"; cmd/moat/e2b_surface_test.go requires every
// expected name to be ok. The SDK is found through NODE_PATH.
const { Sandbox, CommandExitError, SandboxError } = require('e2b')
const sdkVersion = require('e2b/package.json').version

let failed = 0
async function check(name, fn) {
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
async function rejects(p, cls, what) {
  try { await p } catch (e) {
    if (cls && !(e instanceof cls)) throw new Error(`${what}: threw ${e && e.constructor && e.constructor.name}: ${e.message}, want ${cls.name}`)
    return e
  }
  throw new Error(`${what}: did not throw`)
}
const sleep = ms => new Promise(r => setTimeout(r, ms))

async function main() {
console.log('e2b ' + sdkVersion)
// An allowlisted sandbox (example.com), so that its allowlist can change.
const sbx = await Sandbox.create({ timeoutMs: 120_000, network: { allowOut: ['example.com'], denyOut: ['0.0.0.0/0'] } })
console.log('sandbox ' + sbx.sandboxId)

await check('metadata', async () => {
  const w = await sbx.files.write('m.txt', 'x', { metadata: { owner: 'alice', build: '42' } })
  eq(w.metadata, { build: '42', owner: 'alice' }, 'write')
  eq((await sbx.files.getInfo('m.txt')).metadata, { build: '42', owner: 'alice' }, 'getInfo')
  const listed = (await sbx.files.list('.')).find(e => e.name === 'm.txt')
  eq(listed && listed.metadata, { build: '42', owner: 'alice' }, 'list')
  eq((await sbx.files.rename('m.txt', 'n.txt')).metadata, { build: '42', owner: 'alice' }, 'rename')
  // The sandbox's programs see the same metadata: user xattrs.
  const r = await sbx.commands.run(`python3 -c "import os; print(os.getxattr('n.txt', 'user.owner').decode())"`)
  eq(r.stdout, 'alice\n', 'user.owner inside')
  eq((await sbx.files.getInfo('n.txt')).metadata, { build: '42', owner: 'alice' }, 'getInfo after rename')
})
await check('watch-entry', async () => {
  await sbx.files.makeDir('w')
  const seen = []
  const w = await sbx.files.watchDir('w', ev => seen.push(ev), { includeEntry: true })
  await sbx.files.write('w/a.txt', 'abc')
  for (let i = 0; i < 400 && !seen.some(e => e.type === 'write'); i++) await sleep(50)
  await w.stop()
  const types = seen.filter(e => e.name === 'a.txt').map(e => e.type)
  eq(types.slice(0, 2), ['create', 'write'], 'events')
  const entry = seen[0].entry
  if (!entry || entry.path !== '/home/user/w/a.txt' || entry.size !== 3) throw new Error('entry ' + JSON.stringify(entry))
})
await check('getMetrics', async () => {
  await sbx.files.write('big.bin', 'y'.repeat(10000))
  const ms = await sbx.getMetrics()
  if (!ms.length) throw new Error('no samples')
  const m = ms[ms.length - 1]
  if (!(m.timestamp instanceof Date) || m.cpuCount < 1 || m.memTotal <= 0 || m.diskTotal <= 0 || m.diskUsed < 10000 || m.cpuUsedPct < 0 || m.cpuUsedPct > 100) throw new Error('sample ' + JSON.stringify(m))
  const future = await sbx.getMetrics({ start: new Date(Date.now() + 3600_000) })
  eq(future.length, 0, 'samples after an hour from now')
})
await check('updateNetwork', async () => {
  // What the proxy answers a CONNECT: 403 for a host not allowed; for an
  // allowed one it resolves and dials (502 offline, 200 online).
  const probe = async host => (await sbx.commands.run(`curl -s -o /dev/null -w '%{http_connect}' https://${host}/ || true`)).stdout
  eq(await probe('example.org'), '403', 'example.org before')
  await sbx.updateNetwork({ allowOut: ['example.org'], denyOut: ['0.0.0.0/0'] })
  if (await probe('example.org') === '403') throw new Error('example.org still refused after updateNetwork')
  eq(await probe('example.com'), '403', 'example.com after it was replaced')
  await rejects(sbx.updateNetwork({ allowOut: ['example.org'], denyOut: ['1.2.3.4/32'] }), SandboxError, 'a narrower deny')
  const none = await Sandbox.create({ timeoutMs: 60_000, allowInternetAccess: false })
  try {
    const e = await rejects(none.updateNetwork({ allowOut: ['example.org'], denyOut: ['0.0.0.0/0'] }), SandboxError, 'a sandbox without network')
    if (!/network.mode none/.test(e.message)) throw new Error(e.message)
  } finally {
    await none.kill()
  }
})
await check('kill-by-pid', async () => {
  const h = await sbx.commands.run('sleep 60', { background: true })
  if (!(h.pid > 1)) throw new Error('pid ' + h.pid)
  eq((await sbx.commands.list()).some(p => p.pid === h.pid), true, 'listed')
  // The SDK runs /bin/bash -l -c 'sleep 60', which may exec sleep.
  const comm = (await sbx.commands.run(`cat /proc/${h.pid}/comm`)).stdout
  if (comm !== 'sleep\n' && comm !== 'bash\n') throw new Error(`pid ${h.pid} is ${JSON.stringify(comm)} inside the sandbox`)
  eq((await sbx.commands.run(`kill -9 ${h.pid}`)).exitCode, 0, 'kill -9 from another command')
  await rejects(h.wait(), CommandExitError, 'wait after kill -9')
  const h2 = await sbx.commands.run('sleep 60', { background: true })
  eq(await sbx.commands.kill(h2.pid), true, 'commands.kill(pid)')
  await rejects(h2.wait(), CommandExitError, 'wait after commands.kill')
  // The sandbox's init was never the target: it still runs commands.
  eq((await sbx.commands.run('echo alive')).stdout, 'alive\n', 'after the kills')
})
await check('git', async () => {
  await sbx.git.init('repo', { initialBranch: 'main' })
  await sbx.files.write('repo/README', 'hi')
  await sbx.git.add('repo')
  await sbx.git.commit('repo', 'first', { authorName: 'Moat', authorEmail: 'moat@example.com' })
  const st = await sbx.git.status('repo')
  eq(st.currentBranch, 'main', 'branch')
  eq((await sbx.commands.run('git -C repo log --format=%s')).stdout, 'first\n', 'log')
})
await sbx.kill()
console.log(failed ? `FAILED ${failed}` : 'PASS')
process.exit(failed ? 1 : 0)
}
main().catch(e => { console.log('FAIL main: ' + ((e && e.stack) || e)); process.exit(1) })
