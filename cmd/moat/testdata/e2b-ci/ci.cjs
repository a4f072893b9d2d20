// Drives E2B's code interpreter SDK (@e2b/code-interpreter, pinned)
// against `moat serve --e2b`: each check prints "ok <name>", "skip <name>:
// <why>" or "FAIL <name>: <why>"; the Go test (cmd/moat/e2b_ci_test.go)
// requires every expected name to be ok (png may be skipped, with its
// reason, on an image without matplotlib). The SDK is found through
// NODE_PATH (scripts/setup installs it).
const { Sandbox, NotFoundError, InvalidArgumentError, TimeoutError } = require('@e2b/code-interpreter')
const version = require('@e2b/code-interpreter/package.json').version

let failed = 0
async function check(name, fn) {
  try {
    const skip = await fn()
    if (typeof skip === 'string') console.log(`skip ${name}: ${skip}`)
    else console.log(`ok ${name}`)
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

async function main() {
  console.log(`code-interpreter ${version}`)
  // CI_TEMPLATE: another template than the SDK's default
  // (code-interpreter-v1), e.g. python: the same checks on a plain kernel.
  const template = process.env.CI_TEMPLATE
  const sbx = template ? await Sandbox.create(template, { timeoutMs: 300_000 }) : await Sandbox.create({ timeoutMs: 300_000 })
  console.log(`template ${template || 'code-interpreter-v1 (the SDK default)'}`)
  console.log(`sandbox ${sbx.sandboxId}`)

  await check('state', async () => {
    const a = await sbx.runCode('x = 1')
    eq(a.error, undefined, 'x = 1 error')
    const b = await sbx.runCode('x + 1')
    eq(b.text, '2', 'x + 1 (state kept)')
    eq(b.results.length, 1, 'results')
    eq(b.results[0].isMainResult, true, 'isMainResult')
    if (!(b.executionCount >= 2)) throw new Error(`executionCount ${b.executionCount}, want >= 2`)
  })

  await check('callbacks', async () => {
    const out = [], err = [], res = []
    const ex = await sbx.runCode('import sys\nprint("to out")\nprint("to err", file=sys.stderr)\n6 * 7', {
      onStdout: (m) => out.push(m.line),
      onStderr: (m) => err.push(m.line),
      onResult: (r) => res.push(r.text),
    })
    eq(out.join(''), 'to out\n', 'onStdout')
    eq(err.join(''), 'to err\n', 'onStderr')
    eq(res, ['42'], 'onResult')
    eq(ex.logs.stdout.join(''), 'to out\n', 'logs.stdout')
    eq(ex.logs.stderr.join(''), 'to err\n', 'logs.stderr')
  })

  await check('error', async () => {
    const errs = []
    const ex = await sbx.runCode('def f():\n    return 1 / 0\nf()', { onError: (e) => errs.push(e.name) })
    if (!ex.error) throw new Error('no execution.error')
    eq(ex.error.name, 'ZeroDivisionError', 'error.name')
    eq(ex.error.value, 'division by zero', 'error.value')
    if (typeof ex.error.traceback !== 'string' || !ex.error.traceback.includes('ZeroDivisionError')) throw new Error(`traceback ${JSON.stringify(ex.error.traceback)}`)
    eq(errs, ['ZeroDivisionError'], 'onError')
    eq(ex.results.length, 0, 'results of a failed cell')
  })

  await check('html', async () => {
    const ex = await sbx.runCode([
      'try:',
      '    from IPython.display import HTML, display as show',
      '    show(HTML("<b>moat</b>"))',
      'except ImportError:',
      '    class H:',
      '        def _repr_html_(self):',
      '            return "<b>moat</b>"',
      '    display(H())',
    ].join('\n'))
    eq(ex.error, undefined, 'error')
    const html = ex.results.filter((r) => r.html)
    eq(html.map((r) => [r.html, r.isMainResult]), [['<b>moat</b>', false]], 'html results')
    if (!html[0].formats().includes('html')) throw new Error(`formats ${html[0].formats()}`)
  })

  await check('json', async () => {
    const ex = await sbx.runCode('class J:\n    def _repr_json_(self):\n        return {"a": [1, 2]}\nJ()')
    eq(ex.error, undefined, 'error')
    eq(ex.results.length, 1, 'results')
    eq(ex.results[0].json, { a: [1, 2] }, 'json')
    eq(ex.results[0].isMainResult, true, 'isMainResult')
  })

  await check('contexts', async () => {
    const ctx = await sbx.createCodeContext()
    eq([ctx.language, ctx.cwd], ['python', '/home/user'], 'context')
    await sbx.runCode('y = "mine"', { context: ctx })
    await sbx.runCode('y = "default"')
    eq((await sbx.runCode('y', { context: ctx })).text, "'mine'", 'y in its context')
    eq((await sbx.runCode('y', { language: 'python' })).text, "'default'", 'y in the default context')
    const list = await sbx.listCodeContexts()
    if (!list.some((c) => c.id === ctx.id)) throw new Error(`listCodeContexts ${JSON.stringify(list)} lacks ${ctx.id}`)
    await sbx.restartCodeContext(ctx)
    const after = await sbx.runCode('y', { context: ctx })
    eq(after.error && after.error.name, 'NameError', 'y after restartCodeContext')
    await sbx.removeCodeContext(ctx.id)
    await rejects(sbx.runCode('1', { context: ctx }), NotFoundError, 'runCode in a removed context')
    if ((await sbx.listCodeContexts()).some((c) => c.id === ctx.id)) throw new Error('removed context still listed')
  })

  await check('bad-input', async () => {
    const e = await rejects(sbx.runCode('1', { context: { id: 'nope', language: 'python', cwd: '/home/user' } }), NotFoundError, 'unknown context')
    if (!e.message.includes('nope')) throw new Error(`message ${e.message} does not name the context`)
    const l = await rejects(sbx.runCode('1', { language: 'r' }), NotFoundError, 'language r')
    if (!l.message.includes('"r"') || !l.message.includes('python')) throw new Error(`message ${l.message}`)
    await rejects(sbx.createCodeContext({ language: 'js' }), NotFoundError, 'a js context')
    await rejects(sbx.runCode('1', { language: 'python', context: { id: 'default' } }), InvalidArgumentError, 'context and language')
  })

  await check('timeout', async () => {
    await rejects(sbx.runCode('import time\ntime.sleep(60)', { timeoutMs: 1500 }), TimeoutError, 'a cell past its timeoutMs')
    // The left cell is interrupted: the context, with its state, runs the
    // next one (retrying while the interrupt lands).
    const t0 = Date.now()
    for (;;) {
      try {
        eq((await sbx.runCode('x')).text, '1', 'x after the timeout')
        break
      } catch (e) {
        if (Date.now() - t0 > 20_000) throw e
        await new Promise((r) => setTimeout(r, 200))
      }
    }
  })

  await check('png', async () => {
    const has = await sbx.runCode('import importlib.util\nimportlib.util.find_spec("matplotlib") is not None')
    if (has.text !== 'True') return `the sandbox's image has no matplotlib (${has.text || (has.error && has.error.value)}); the image code-interpreter has it`
    // An app's multi-step work: upload a CSV, load and compute in one
    // cell, plot in the next (the DataFrame kept), read the PNG.
    await sbx.files.write('/home/user/sales.csv', 'month,units\n1,10\n2,32\n3,7\n')
    const load = await sbx.runCode('import pandas as pd\ndf = pd.read_csv("sales.csv")\nint(df["units"].sum())')
    eq(load.error, undefined, 'load error')
    eq(load.text, '49', 'the sum of the CSV')
    const ex = await sbx.runCode([
      'import matplotlib.pyplot as plt',
      'df.plot(x="month", y="units")',
      'plt.show()',
    ].join('\n'))
    eq(ex.error, undefined, 'error')
    const png = ex.results.filter((r) => r.png)
    if (png.length !== 1 || !png[0].png.startsWith('iVBORw0KGgo')) throw new Error(`png results: ${JSON.stringify(ex.results.map((r) => r.formats()))}`)
    if (Buffer.from(png[0].png, 'base64').length < 1000) throw new Error('the PNG is too small to be a chart')
  })

  await sbx.kill()
  console.log(failed ? `FAILED ${failed}` : 'PASS')
  process.exit(failed ? 1 : 0)
}

main().catch((e) => { console.log(`FAIL main: ${(e && e.stack) || e}`); process.exit(1) })
