// Runs one GGUF file through llama.cpp (node-llama-cpp 3.21.1's prebuilt
// CPU binary) and prints what the Go tests compare with lmpack's runtime.
//
// Usage: node run.mjs < request.json > result.json
//
// Request (JSON on stdin):
//   {
//     "model": "/path/to/model.gguf",
//     "threads": 1,               // CPU threads (default 1)
//     "context_size": 256,        // KV cache length in tokens (default 256)
//     "requests": [
//       // Greedy decode: prompt text (tokenized by llama.cpp from the
//       // GGUF's tokenizer metadata, BOS prepended when
//       // tokenizer.ggml.add_bos_token says so) or token ids (used as
//       // given), then `generate` tokens at temperature 0.
//       {"prompt": "Once upon a time", "generate": 32, "probs": true},
//       {"tokens": [1, 403, 407], "generate": 32},
//       // Teacher-forced scoring of a token sequence: the probability of
//       // tokens[t+1] under the distribution after tokens[0..t], for
//       // t = 0..n-2 (a perplexity window).
//       {"tokens": [1, 403, 407, 9], "score": true}
//     ]
//   }
//
// Result (JSON on stdout), one entry per request in order:
//   {
//     "model": {"bos": 1, "eos": 2, "add_bos": true, "n_vocab": 512,
//               "vocab_type": "spm", "train_context": 512},
//     "results": [
//       {"prompt_ids": [...], "ids": [...generated...], "text": "...",
//        "probs": [[p_0..p_{V-1}] after the prompt, then after each
//                  generated token but the last]},      // when "probs"
//       {"target_probs": [p(tokens[1]|tokens[0]), ...]}  // when "score"
//     ]
//   }
//
// Probabilities are what node-llama-cpp exposes: the softmax (float32) of
// llama.cpp's raw logits at temperature 0 (greedy sampler, no penalties,
// full vocabulary), so log(p) equals the logits less their log-sum-exp.
// The KV cache is kept in F32 so that the comparison measures the weights
// and the graph, not llama.cpp's default F16 cache. Everything runs on the
// CPU (gpu: false) with the prebuilt binary only (build: "never"): a
// missing binary fails at once with node-llama-cpp's message.
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

async function readStdin() {
    const chunks = [];
    for await (const c of process.stdin)
        chunks.push(c);
    return Buffer.concat(chunks).toString("utf8");
}

function fail(msg) {
    process.stderr.write("run.mjs: " + msg + "\n");
    process.exit(1);
}

const req = JSON.parse(await readStdin());
if (typeof req.model !== "string" || req.model === "")
    fail('request: "model" (the GGUF path) is missing');
if (!Array.isArray(req.requests))
    fail('request: "requests" must be an array');
const threads = req.threads ?? 1;
const contextSize = req.context_size ?? 256;

const logs = [];
const llama = await getLlama({
    gpu: false,
    build: "never",
    maxThreads: threads,
    logLevel: LlamaLogLevel.warn,
    logger: (level, message) => {
        logs.push(`[${level}] ${message}`.trimEnd());
    },
    progressLogs: false,
});

let model;
try {
    model = await llama.loadModel({modelPath: req.model, gpuLayers: 0, useMmap: true});
} catch (e) {
    fail(`llama.cpp did not load ${req.model}: ${e?.message ?? e}\n` + logs.join("\n"));
}
const V = model.fileInsights.vocabularySize ?? model.fileInfo.metadata?.tokenizer?.ggml?.tokens?.length;
const context = await model.createContext({
    contextSize,
    batchSize: contextSize,
    threads,
    sequences: 1,
    flashAttention: false,
    experimentalKvCacheKeyType: "F32",
    experimentalKvCacheValueType: "F32",
});
const seq = context.getSequence();

// dense returns the probabilities of a Map<token, p> as an array over the
// vocabulary (0 where llama.cpp gave none).
function dense(m) {
    const out = new Array(V).fill(0);
    for (const [tok, p] of m)
        out[tok] = p;
    return out;
}

const greedy = {temperature: 0};

async function generate(r) {
    let prompt;
    if (Array.isArray(r.tokens)) {
        prompt = r.tokens;
    } else if (typeof r.prompt === "string") {
        prompt = model.tokenize(r.prompt, false);
        if (model.tokens.shouldPrependBosToken && model.tokens.bos != null)
            prompt = [model.tokens.bos, ...prompt];
    } else {
        fail('request: need "tokens" or "prompt"');
    }
    const n = r.generate;
    const wantProbs = r.probs === true;
    await seq.clearHistory();
    const ids = [];
    const probs = [];
    let input = prompt.map((t, i) => i === prompt.length - 1
        ? [t, {generateNext: {token: true, probabilities: wantProbs, options: greedy}}]
        : t);
    for (let k = 0; k < n; k++) {
        const out = await seq.controlledEvaluate(input);
        const last = out[input.length - 1];
        if (last?.next?.token == null)
            fail(`no token generated at step ${k}`);
        const tok = last.next.token;
        ids.push(tok);
        if (wantProbs)
            probs.push(dense(last.next.probabilities));
        if (k + 1 < n)
            input = [[tok, {generateNext: {token: true, probabilities: wantProbs, options: greedy}}]];
    }
    const res = {prompt_ids: prompt, ids, text: model.detokenize(ids, false, prompt)};
    if (wantProbs)
        res.probs = probs;
    return res;
}

async function score(r) {
    const toks = r.tokens;
    if (!Array.isArray(toks) || toks.length < 2)
        fail('request: "score" needs "tokens" with at least 2 ids');
    await seq.clearHistory();
    const input = toks.map((t, i) => i + 1 < toks.length
        ? [t, {generateNext: {probabilities: true, options: greedy}}]
        : t);
    const out = await seq.controlledEvaluate(input);
    const target = [];
    for (let i = 0; i + 1 < toks.length; i++) {
        const p = out[i]?.next?.probabilities;
        if (p == null)
            fail(`no probabilities at position ${i}`);
        target.push(p.get(toks[i + 1]) ?? 0);
    }
    return {target_probs: target};
}

const results = [];
for (const r of req.requests) {
    if (r.score === true)
        results.push(await score(r));
    else if (Number.isInteger(r.generate) && r.generate > 0)
        results.push(await generate(r));
    else
        fail('request: each item needs "score": true or "generate": N > 0');
}

const t = model.tokens;
process.stdout.write(JSON.stringify({
    model: {
        bos: t.bos,
        eos: t.eos,
        add_bos: t.shouldPrependBosToken,
        n_vocab: V,
        vocab_type: model.vocabularyType,
        train_context: model.trainContextSize,
        context_size: context.contextSize,
    },
    results,
    logs,
}) + "\n");
await context.dispose();
await model.dispose();
await llama.dispose();
