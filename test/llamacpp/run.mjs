// Runs GGUF files through llama.cpp (node-llama-cpp 3.21.1's prebuilt CPU
// binary) and prints what the Go tests (internal/llamacpp) compare with
// lmpack's runtime.
//
// Usage: node run.mjs < request.json > result.json
//
// Request (JSON on stdin): one or more jobs, each a GGUF file and its
// requests, run in order in one process (llama.cpp's binary is loaded
// once):
//   {
//     "threads": 1,                 // CPU threads (default 1)
//     "jobs": [{
//       "model": "/path/to/model.gguf",
//       "context_size": 256,        // KV cache length in tokens (default 256)
//       "requests": [
//         // Greedy decode: prompt text (tokenized by llama.cpp from the
//         // GGUF's tokenizer metadata, BOS prepended when
//         // tokenizer.ggml.add_bos_token says so) or token ids (used as
//         // given), then `generate` tokens at temperature 0.
//         // "special": true parses special-token text ("<|im_start|>") as
//         // those tokens, as Hugging Face tokenizers do by default.
//         {"prompt": "Once upon a time", "generate": 32, "probs": true},
//         {"tokens": [1, 403, 407], "generate": 32},
//         // Teacher-forced scoring of a token sequence: the probability
//         // of tokens[t+1] under the distribution after tokens[0..t], for
//         // t = 0..n-2 (a perplexity window).
//         {"tokens": [1, 403, 407, 9], "score": true}
//       ]
//     }]
//   }
//
// Result (JSON on stdout): {"jobs": [one entry per job, in order]}, each
//   {
//     "model": {"bos": 1, "eos": 2, "add_bos": true, "n_vocab": 512,
//               "vocab_type": "spm", "train_context": 512, "context_size": 256},
//     "results": [one per request, in order:
//       {"prompt_ids": [...], "ids": [...generated...], "text": "...",
//        "probs": [[p_0..p_{V-1}] before each generated token]},  // "probs"
//       {"target_probs": [p(tokens[1]|tokens[0]), ...]}            // "score"
//     ],
//     "logs": [llama.cpp's messages of level warn and above]
//   }
// A job whose file llama.cpp refuses ends the run: exit status 1 with the
// file, node-llama-cpp's reason and llama.cpp's log on stderr.
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
if (!Array.isArray(req.jobs))
    fail('request: "jobs" must be an array');
const threads = req.threads ?? 1;

let logs = [];
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

const greedy = {temperature: 0};

async function runJob(job) {
    if (typeof job.model !== "string" || job.model === "")
        fail('request: a job\'s "model" (the GGUF path) is missing');
    if (!Array.isArray(job.requests))
        fail(`request: job ${job.model}: "requests" must be an array`);
    const contextSize = job.context_size ?? 256;
    logs = [];
    let model;
    try {
        model = await llama.loadModel({modelPath: job.model, gpuLayers: 0, useMmap: true});
    } catch (e) {
        fail(`llama.cpp did not load ${job.model}: ${e?.message ?? e}\n` + logs.join("\n"));
    }
    // llama.cpp's n_vocab: the number of tokenizer.ggml.tokens.
    const V = model.fileInfo.metadata?.tokenizer?.ggml?.tokens?.length;
    let context;
    try {
        context = await model.createContext({
            contextSize,
            batchSize: contextSize,
            threads,
            sequences: 1,
            flashAttention: false,
            experimentalKvCacheKeyType: "F32",
            experimentalKvCacheValueType: "F32",
        });
    } catch (e) {
        fail(`llama.cpp could not create a context for ${job.model}: ${e?.message ?? e}\n` + logs.join("\n"));
    }
    const seq = context.getSequence();

    // dense returns the probabilities of a Map<token, p> (llama.cpp gives
    // one for every token of the vocabulary) as an array over the
    // vocabulary (0 where it gave none).
    function dense(m) {
        if (!Number.isInteger(V) || m.size !== V)
            fail(`${job.model}: llama.cpp gave ${m.size} probabilities for a vocabulary of ${V} tokens`);
        const out = new Array(V).fill(0);
        for (const [tok, p] of m)
            out[tok] = p;
        return out;
    }

    async function generate(r) {
        let prompt;
        if (Array.isArray(r.tokens)) {
            prompt = r.tokens;
        } else if (typeof r.prompt === "string") {
            prompt = model.tokenize(r.prompt, r.special === true);
            if (model.tokens.shouldPrependBosToken && model.tokens.bos != null)
                prompt = [model.tokens.bos, ...prompt];
        } else {
            fail('request: need "tokens" or "prompt"');
        }
        const n = r.generate;
        const wantProbs = r.probs === true;
        const next = {generateNext: {token: true, probabilities: wantProbs, options: greedy}};
        await seq.clearHistory();
        const ids = [];
        const probs = [];
        let input = prompt.map((t, i) => i === prompt.length - 1 ? [t, next] : t);
        for (let k = 0; k < n; k++) {
            const out = await seq.controlledEvaluate(input);
            const last = out[input.length - 1];
            if (last?.next?.token == null)
                fail(`${job.model}: no token generated at step ${k}`);
            const tok = last.next.token;
            ids.push(tok);
            if (wantProbs)
                probs.push(dense(last.next.probabilities));
            input = [[tok, next]];
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
                fail(`${job.model}: no probabilities at position ${i}`);
            target.push(p.get(toks[i + 1]) ?? 0);
        }
        return {target_probs: target};
    }

    const results = [];
    for (const r of job.requests) {
        if (r.score === true)
            results.push(await score(r));
        else if (Number.isInteger(r.generate) && r.generate > 0)
            results.push(await generate(r));
        else
            fail('request: each item needs "score": true or "generate": N > 0');
    }
    const t = model.tokens;
    const res = {
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
    };
    await context.dispose();
    await model.dispose();
    return res;
}

const jobs = [];
for (const job of req.jobs)
    jobs.push(await runJob(job));
process.stdout.write(JSON.stringify({jobs}) + "\n");
await llama.dispose();
