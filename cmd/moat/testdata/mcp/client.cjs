// An agent's work through the real MCP TypeScript SDK
// (@modelcontextprotocol/sdk, pinned by package-lock.json), against
// `moat mcp` (MCP_TRANSPORT=stdio: MOAT_BIN is started with MOAT_API_KEY)
// or `moat serve --mcp` (MCP_TRANSPORT=http: MCP_URL with the key as
// bearer token). Driven by TestMCPTypeScriptSDK (cmd/moat/mcp_test.go).
// Prints "ok <check>" for each check that passed, "sandbox <id>" for the
// sandbox it kept across calls, and PASS at the end.
//
// Environment: MOAT_API_KEY (the key), MCP_OTHER_KEY (another key),
// MCP_SMALL_KEY (a key that may hold one sandbox).

const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StdioClientTransport } = require("@modelcontextprotocol/sdk/client/stdio.js");
const { StreamableHTTPClientTransport } = require("@modelcontextprotocol/sdk/client/streamableHttp.js");
const fs = require("fs");
const path = require("path");

// The package's exports map hides its package.json: read it from
// NODE_PATH, where the test put the pinned install.
const sdkVersion = JSON.parse(fs.readFileSync(path.join(process.env.NODE_PATH, "@modelcontextprotocol", "sdk", "package.json"), "utf8")).version;

const env = process.env;
const mode = env.MCP_TRANSPORT;

function fail(msg) {
  throw new Error(msg);
}

function check(cond, what, detail) {
  if (!cond) fail(what + ": " + JSON.stringify(detail));
}

async function connect(key) {
  const client = new Client({ name: "moat-ts-test", version: "1.0.0" });
  let transport;
  if (mode === "stdio") {
    transport = new StdioClientTransport({
      command: env.MOAT_BIN,
      args: ["mcp"],
      env: { ...env, MOAT_API_KEY: key },
      stderr: "inherit",
    });
  } else if (mode === "http") {
    transport = new StreamableHTTPClientTransport(new URL(env.MCP_URL), {
      requestInit: { headers: { Authorization: "Bearer " + key } },
    });
  } else {
    fail("MCP_TRANSPORT must be stdio or http, not " + mode);
  }
  await client.connect(transport);
  return client;
}

// call calls a tool and returns its result; the SDK throws on a protocol
// error, which a refusal must never be.
async function call(client, name, args) {
  return client.callTool({ name, arguments: args });
}

async function ok(client, name, args) {
  const res = await call(client, name, args);
  check(!res.isError, name + " failed", res.content);
  check(res.structuredContent && typeof res.structuredContent === "object", name + " has no structured content", res);
  check(res.content[0].type === "text" && res.content[0].text.length > 0, name + " has no summary", res.content);
  return res;
}

async function refused(client, name, args, code, field) {
  const res = await call(client, name, args);
  check(res.isError === true, name + " was not refused", res);
  const e = res.structuredContent && res.structuredContent.error;
  check(e && e.code === code && (field === undefined || e.field === field), name + " refusal", e);
  check(res.content[0].text.includes(e.message), name + " text does not carry the message", res.content);
  if (field) check(e.message.includes(field), name + " message does not name " + field, e);
  return e;
}

async function main() {
  console.log("mcp sdk " + sdkVersion + " over " + mode);
  const client = await connect(env.MOAT_API_KEY);

  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name).sort();
  for (const want of ["run_code", "create_sandbox", "exec", "write_file", "read_file", "list_files", "download", "kill_sandbox"]) {
    check(names.includes(want), "tool " + want + " is listed", names);
  }
  for (const t of tools) {
    check(t.inputSchema.type === "object" && t.description.length > 40, "tool " + t.name + " schema and description", t);
  }
  console.log("ok list-tools");

  let res = await ok(client, "run_code", { language: "python", code: "import sys\nprint(6*7)\nprint('warn', file=sys.stderr)" });
  const run = res.structuredContent;
  check(run.result.exit_code === 0 && run.result.stdout.data === "42\n" && run.result.stderr.data === "warn\n", "run_code result", run.result);
  check(res.content[0].text.includes("42"), "run_code summary", res.content[0]);
  console.log("ok run-code");

  res = await ok(client, "create_sandbox", { ttl: "5m", metadata: { agent: "ts" } });
  const id = res.structuredContent.id;
  check(typeof id === "string" && id.length > 0, "create_sandbox id", res.structuredContent);
  console.log("sandbox " + id);
  await ok(client, "write_file", { sandbox_id: id, path: "data/in.csv", content: "x\n10\n32\n" });
  res = await ok(client, "exec", {
    sandbox_id: id,
    language: "python",
    code: "import csv\ns = sum(int(r['x']) for r in csv.DictReader(open('data/in.csv')))\nopen('out.txt', 'w').write(str(s))\nprint(s)",
  });
  check(res.structuredContent.result.exit_code === 0 && res.structuredContent.result.stdout.data === "42\n", "exec result", res.structuredContent);
  // State persists across calls: a second command sees the first's file.
  res = await ok(client, "exec", { sandbox_id: id, argv: ["cat", "out.txt"] });
  check(res.structuredContent.result.stdout.data === "42", "exec sees the earlier file", res.structuredContent.result);
  console.log("ok keep-sandbox");

  res = await ok(client, "read_file", { sandbox_id: id, path: "out.txt" });
  check(res.structuredContent.content === "42" && res.structuredContent.encoding === "utf-8", "read_file", res.structuredContent);
  res = await ok(client, "list_files", { sandbox_id: id });
  check(res.structuredContent.entries.some((e) => e.path === "out.txt"), "list_files", res.structuredContent);
  console.log("ok read-file");

  // A binary file comes back as an embedded resource with its type.
  await ok(client, "write_file", { sandbox_id: id, path: "chart.png", content: "iVBORw0KGgo=", encoding: "base64" });
  res = await ok(client, "download", { sandbox_id: id, path: "chart.png" });
  const r = res.content.find((c) => c.type === "resource");
  check(r && r.resource.mimeType === "image/png" && r.resource.blob === "iVBORw0KGgo=" && r.resource.uri === res.structuredContent.uri, "download", res.content);
  // The resource's URI reads the file again.
  const rr = await client.readResource({ uri: r.resource.uri });
  check(rr.contents.length === 1 && rr.contents[0].blob === "iVBORw0KGgo=" && rr.contents[0].mimeType === "image/png", "resources/read", rr);
  console.log("ok download");

  await refused(client, "run_code", { language: "cobol", code: "x" }, "invalid_field", "language");
  await refused(client, "run_code", { language: "python", code: "1", files: [{ path: "/etc/passwd", content: "" }] }, "invalid_field", "files[0].path");
  await refused(client, "write_file", { sandbox_id: id, path: "../x", content: "" }, "invalid_field", "path");
  await refused(client, "exec", { argv: ["ls"] }, "invalid_field", "sandbox_id");
  await refused(client, "create_sandbox", { ttl: "forever" }, "invalid_field", "ttl");
  await refused(client, "run_code", { language: "python", code: "1", manifest: { resources: { memory: "lots" } } }, "invalid_field", "manifest.resources.memory");
  console.log("ok bad-arguments");

  const other = await connect(env.MCP_OTHER_KEY);
  await refused(other, "read_file", { sandbox_id: id, path: "out.txt" }, "not_found");
  await refused(other, "kill_sandbox", { sandbox_id: id }, "not_found");
  await other.close();
  console.log("ok other-key");

  const small = await connect(env.MCP_SMALL_KEY);
  res = await ok(small, "create_sandbox", {});
  const e = await refused(small, "create_sandbox", {}, "quota_exceeded");
  check(e.retry_after > 0, "quota retry_after", e);
  await ok(small, "kill_sandbox", { sandbox_id: res.structuredContent.id });
  await small.close();
  console.log("ok quota");

  res = await ok(client, "kill_sandbox", { sandbox_id: id });
  check(res.structuredContent.state === "deleted", "kill_sandbox", res.structuredContent);
  await refused(client, "exec", { sandbox_id: id, argv: ["true"] }, "not_found");
  console.log("ok kill");

  await client.close();
  console.log("PASS");
}

main().catch((err) => {
  console.log("FAIL " + (err && err.stack ? err.stack : err));
  process.exit(1);
});
