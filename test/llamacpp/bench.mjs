// Times llama.cpp (node-llama-cpp 3.21.1's prebuilt CPU binary) on one
// GGUF file for `make bench-compare` (internal/benchcmp): prefill of P
// tokens from an empty KV cache (llama-bench pp512: one batch of P tokens)
// and decode of N single tokens from an empty cache (llama-bench tg128).
//
// Usage: node bench.mjs, then JSON lines on stdin, one answer line each on
// stdout:
//   {"model": "/path/model.gguf", "threads": 1, "context_size": 640, "batch_size": 512}
//       -> {"ready": true, "load_seconds": s}
//   {"op": "prefill", "tokens": [ids...]}
//       -> {"op": "prefill", "tokens": P, "seconds": s, "wall_seconds": w}
//   {"op": "decode", "n": 128, "start": 1}
//       -> {"op": "decode", "tokens": N, "seconds": s, "wall_seconds": w, "ids": [greedy ids]}
//   {"op": "quit"}
//       -> {"vmhwm_kib": peak RSS of this process (/proc/self/status VmHWM)}
//
// Timing: "seconds" is llama.cpp's own timer (llama_perf_context: the
// "prompt eval time" of decode calls with more than one token for prefill,
// the "eval time" of single-token calls for decode), read from the lines
// that LlamaContext.printTimings() logs (it prints and resets the
// counters); it covers llama_decode only, as llama-bench's figures do.
// "wall_seconds" is the wall clock around the evaluate calls (it adds
// node-llama-cpp's JavaScript, the greedy sampling and the event loop).
// The decode feeds back the greedy (temperature 0) token, starting from
// "start". The KV cache is F32 (lmpack's is float32 too), flash attention
// off, CPU only, prebuilt binary only (build: "never").
import {getLlama, LlamaLogLevel} from "node-llama-cpp";
import {readFileSync} from "node:fs";
import {createInterface} from "node:readline";

function fail(msg) {
    process.stderr.write("bench.mjs: " + msg + "\n");
    process.exit(1);
}

function send(obj) {
    process.stdout.write(JSON.stringify(obj) + "\n");
}

function vmhwmKiB() {
    const m = /^VmHWM:\s+(\d+)\s+kB/m.exec(readFileSync("/proc/self/status", "utf8"));
    if (m == null)
        fail("no VmHWM line in /proc/self/status");
    return Number(m[1]);
}

const lines = createInterface({input: process.stdin, crlfDelay: Infinity})[Symbol.asyncIterator]();

async function nextRequest() {
    const {value, done} = await lines.next();
    if (done)
        fail("stdin closed before {\"op\": \"quit\"}");
    try {
        return JSON.parse(value);
    } catch (e) {
        fail(`bad JSON request ${JSON.stringify(value)}: ${e.message}`);
    }
}

const setup = await nextRequest();
if (typeof setup.model !== "string" || setup.model === "")
    fail('first request: "model" (the GGUF path) is missing');
const threads = setup.threads ?? 1;
if (!Number.isInteger(threads) || threads < 1)
    fail(`first request: "threads" ${threads}: want an integer >= 1`);
const contextSize = setup.context_size ?? 640;
const batchSize = setup.batch_size ?? 512;

// perf collects llama_perf_context_print's lines; other messages of level
// warn and above go to logs (printed with a failure).
let perf = [];
const logs = [];
const t0 = performance.now();
const llama = await getLlama({
    gpu: false,
    build: "never",
    maxThreads: threads,
    logLevel: LlamaLogLevel.info,
    logger: (level, message) => {
        if (message.includes("llama_perf_context_print"))
            perf.push(message);
        else if (level === LlamaLogLevel.warn || level === LlamaLogLevel.error || level === LlamaLogLevel.fatal)
            logs.push(`[${level}] ${message}`.trimEnd());
    },
    progressLogs: false,
});
let model, context;
try {
    model = await llama.loadModel({modelPath: setup.model, gpuLayers: 0, useMmap: true});
    context = await model.createContext({
        contextSize,
        batchSize,
        threads,
        sequences: 1,
        flashAttention: false,
        performanceTracking: true,
        experimentalKvCacheKeyType: "F32",
        experimentalKvCacheValueType: "F32",
    });
} catch (e) {
    fail(`llama.cpp did not load ${setup.model}: ${e?.message ?? e}\n` + logs.join("\n"));
}
const seq = context.getSequence();
const greedy = {generateNext: {token: true, options: {temperature: 0}}};

// takeTimings prints and resets llama.cpp's counters and returns
// {prompt: [ms, tokens], eval: [ms, runs]}.
async function takeTimings() {
    perf = [];
    await context.printTimings();
    // The log lines come back through a thread-safe callback: wait for the
    // last one ("total time"), up to 30 s on a loaded machine.
    for (let waited = 0; !perf.join("\n").includes("total time"); waited += 5) {
        if (waited > 30000)
            fail(`llama.cpp's timings did not arrive within 30 s:\n${perf.join("\n")}`);
        await new Promise((accept) => setTimeout(accept, 5));
    }
    const text = perf.join("\n");
    const num = (re) => {
        const m = re.exec(text);
        if (m == null)
            fail(`no ${re} in llama.cpp's timings:\n${text}`);
        return [Number(m[1]), Number(m[2])];
    };
    return {
        prompt: num(/prompt eval time =\s*([\d.]+) ms \/\s*(\d+) tokens/),
        eval: num(/\beval time =\s*([\d.]+) ms \/\s*(\d+) runs/),
    };
}

send({ready: true, load_seconds: (performance.now() - t0) / 1000});
for (;;) {
    const r = await nextRequest();
    if (r.op === "quit")
        break;
    await seq.clearHistory();
    await takeTimings(); // reset
    if (r.op === "prefill") {
        const toks = r.tokens;
        if (!Array.isArray(toks) || toks.length < 2 || toks.length > batchSize)
            fail(`prefill: "tokens" must hold 2..${batchSize} ids (one batch)`);
        const w0 = performance.now();
        await seq.controlledEvaluate(toks.map((t, i) => i === toks.length - 1 ? [t, greedy] : t));
        const wall = (performance.now() - w0) / 1000;
        const t = await takeTimings();
        // llama_perf_context_print prints a count of 0 as 1 (max(1, n)):
        // no single-token run happened when the eval time is 0.
        if (t.prompt[1] !== toks.length || t.eval[1] > 1 || t.eval[0] > 0)
            fail(`prefill of ${toks.length} tokens: llama.cpp timed ${t.prompt[1]} prompt tokens and ${t.eval[1]} single-token runs of ${t.eval[0]} ms (want one batch)`);
        send({op: "prefill", tokens: toks.length, seconds: t.prompt[0] / 1000, wall_seconds: wall});
    } else if (r.op === "decode") {
        const n = r.n;
        if (!Number.isInteger(n) || n < 1 || n > contextSize)
            fail(`decode: "n" ${n}: want 1..${contextSize}`);
        let tok = r.start ?? 1;
        const ids = [];
        const w0 = performance.now();
        for (let k = 0; k < n; k++) {
            const out = await seq.controlledEvaluate([[tok, greedy]]);
            const next = out[0]?.next?.token;
            if (next == null)
                fail(`decode: no token at step ${k}`);
            tok = next;
            ids.push(tok);
        }
        const wall = (performance.now() - w0) / 1000;
        const t = await takeTimings();
        if (t.eval[1] !== n)
            fail(`decode of ${n} tokens: llama.cpp timed ${t.eval[1]} single-token runs`);
        send({op: "decode", tokens: n, seconds: t.eval[0] / 1000, wall_seconds: wall, ids});
    } else {
        fail(`unknown op ${JSON.stringify(r.op)}: want prefill, decode or quit`);
    }
}
await context.dispose();
await model.dispose();
send({vmhwm_kib: vmhwmKiB()});
await llama.dispose();
