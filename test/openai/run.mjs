// Drives an OpenAI-compatible server (lmpack serve) with the official
// `openai` npm client (pinned in package-lock.json) for the Go tests in
// internal/openaijs.
//
// Usage: node run.mjs [--url URL] [--api-key KEY] < cases.json
//   URL defaults to $LMPACK_OPENAI_URL (the server's base URL, e.g.
//   http://127.0.0.1:8000/v1), KEY to $OPENAI_API_KEY (any non-empty string
//   when the server has no keys).
//
// stdin: a JSON array of cases {name, kind, params, api_key}:
//   kind "completion"         client.completions.create(params)
//   kind "chat"               client.chat.completions.create(params)
//   kind "completion_stream"  the same with stream: true (params as given),
//   kind "chat_stream"        every chunk collected in order
//   kind "models"             client.models.list()
//   api_key, when set, overrides the key for that case (auth failures).
// stdout: one JSON array, a result per case in order:
//   {name, kind, ok, response?, chunks?, error?}
//   error: {class, status, message, type, param, code, body,
//           bad_request, authentication, api_error} where the three booleans
//   are `instanceof` tests against the client's BadRequestError,
//   AuthenticationError and APIError classes.
// Exit status 0 when every case ran (a case answered with an API error is
// still a result); 2 on bad usage or input.
import OpenAI from 'openai';
import { readFileSync } from 'node:fs';

function arg(name) {
  const i = process.argv.indexOf(name);
  if (i < 0) return undefined;
  if (i + 1 >= process.argv.length) {
    console.error(`run.mjs: ${name} needs a value`);
    process.exit(2);
  }
  return process.argv[i + 1];
}

const baseURL = arg('--url') ?? process.env.LMPACK_OPENAI_URL;
const apiKey = arg('--api-key') ?? process.env.OPENAI_API_KEY ?? 'none';
if (!baseURL) {
  console.error('run.mjs: give the server URL with --url or $LMPACK_OPENAI_URL');
  process.exit(2);
}

let cases;
try {
  cases = JSON.parse(readFileSync(0, 'utf8'));
} catch (e) {
  console.error(`run.mjs: stdin is not a JSON array of cases: ${e.message}`);
  process.exit(2);
}
if (!Array.isArray(cases)) {
  console.error('run.mjs: stdin must be a JSON array of cases');
  process.exit(2);
}

function client(key) {
  // No retries: a 503 or 401 must reach the test as it was answered.
  return new OpenAI({ baseURL, apiKey: key ?? apiKey, maxRetries: 0, timeout: 600_000 });
}

function describeError(e) {
  const out = {
    class: e?.constructor?.name ?? typeof e,
    message: String(e?.message ?? e),
    bad_request: e instanceof OpenAI.BadRequestError,
    authentication: e instanceof OpenAI.AuthenticationError,
    api_error: e instanceof OpenAI.APIError,
  };
  if (e instanceof OpenAI.APIError) {
    out.status = e.status ?? null;
    out.type = e.type ?? null;
    out.param = e.param ?? null;
    out.code = e.code ?? null;
    out.body = e.error ?? null;
  }
  return out;
}

async function runCase(c) {
  const res = { name: c.name, kind: c.kind, ok: false };
  const cl = client(c.api_key);
  try {
    switch (c.kind) {
      case 'completion':
        res.response = await cl.completions.create(c.params);
        break;
      case 'chat':
        res.response = await cl.chat.completions.create(c.params);
        break;
      case 'completion_stream':
      case 'chat_stream': {
        const api = c.kind === 'chat_stream' ? cl.chat.completions : cl.completions;
        const stream = await api.create({ ...c.params, stream: true });
        res.chunks = [];
        for await (const chunk of stream) res.chunks.push(chunk);
        break;
      }
      case 'models': {
        const page = await cl.models.list();
        res.response = { data: page.data };
        break;
      }
      default:
        throw new Error(`unknown case kind ${JSON.stringify(c.kind)}`);
    }
    res.ok = true;
  } catch (e) {
    res.error = describeError(e);
  }
  return res;
}

const results = [];
for (const c of cases) results.push(await runCase(c));
process.stdout.write(JSON.stringify(results) + '\n');
